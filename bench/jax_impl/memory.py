"""What holds a JAX trial's memory, from JAX's and XLA's own accounting. Mirror image of torch_impl/memory.py.

Nothing is run: the step's programs are traced and compiled already (Trainer.compile), and the categories come
from them and from the pytrees, per device (the fullest, where a world shards them):

    saved       the residuals of the loss's vjp (jax.ad_checkpoint's saved_residuals: what the linearised
                function keeps for the backward pass, before XLA's fusion; arguments and constants excluded:
                the parameters and frozen state are resident before the step)
    grads       the gradient pytree of backprop and jacfwd (the parameters' shapes, sharded as they are);
                jvp's and MeZO's estimates are regenerated leaf by leaf inside the fused update: none
    directions  jvp: the tangent jax.jvp is given, as much of it as the program's temporaries can hold (XLA draws
                each leaf's tangent where the forward pass reaches it, so it is never whole); MeZO: the largest leaf
                (one leaf's direction at a time, fused into the perturbation); jacfwd: the (chunk, n) basis block
    temp        XLA's temporaries of the largest program of the step (compiled.memory_analysis(), per device),
                less what of the categories above lives inside that program: the working memory itself

`tracked_peak`: the categories XLA holds together in the step's largest program, as its temporaries tell.
"""

from __future__ import annotations

import jax
import numpy as np
from jax._src.ad_checkpoint import saved_residuals  # jax.ad_checkpoint.print_saved_residuals, as data

from bench.jax_impl.steps import dropout_key, per_device_bytes


def saved_bytes(trainer, micro_batches) -> int:
    """Residuals the vjp of one micro-batch's loss keeps, beyond its arguments and constants."""
    key = dropout_key(trainer.spec.seed, 0)  # traced only: the loss's closed-over frozen state is never run
    found = saved_residuals(lambda p: trainer.loss_of(p, micro_batches[0], key), trainer.params)
    return sum(int(np.prod(aval.shape)) * aval.dtype.itemsize for aval, why in found
               if not why.startswith(("from the argument", "from a constant", "from a literal")))  # fmt: skip


def breakdown(trainer, micro_batches) -> dict:
    """Bytes per category of the trial's step on `micro_batches` (device batches), with their method."""
    s = trainer.spec
    leaves = jax.tree.leaves(trainer.params)
    n_bytes = sum(x.nbytes for x in leaves)
    trainable = per_device_bytes(trainer.params)
    saved = grads = directions = 0
    if s.mode == "backprop":
        saved, grads = saved_bytes(trainer, micro_batches), trainable
    elif s.mode == "jacfwd":
        grads, directions = trainable, trainer.jacfwd_chunk * n_bytes
    elif s.mode == "jvp":
        directions = n_bytes
    elif s.mode == "mezo":
        directions = max((x.nbytes for x in leaves), default=0)
    program = max((compiled.memory_analysis().temp_size_in_bytes for compiled, _ in trainer.programs()), default=0)
    kept = trainer.keeps_tangent  # jvp_tangent=keep: the tangent is the pass's output, whole, beside its temporaries
    if s.mode == "jvp" and not kept:  # XLA draws each leaf's tangent where the pass reaches it: within its temps
        directions = min(directions, program)
    inside = saved + grads + (directions if s.mode == "jacfwd" or (s.mode == "jvp" and not kept) else 0)
    return {
        "trainable": trainable,
        "saved": saved,
        "grads": grads,
        "directions": directions,
        "tracked_peak": min(inside, program) + (directions if kept else 0),
        "temp": max(program - inside, 0),
        "method": "jax_saved_residuals+xla_memory_analysis",
    }

