"""What holds a JAX trial's memory, from JAX's and XLA's own accounting. Mirror image of torch_impl/memory.py.

Nothing is run: the step's programs are traced and compiled already (Trainer.compile), and the categories come
from them and from the pytrees, per device (the fullest, where a world shards them). Each estimator's module
(bench/jax_impl/estimators/<name>.py, memory()) says which of them its step holds:

    saved       the residuals of the loss's vjp (jax.ad_checkpoint's saved_residuals: what the linearised
                function keeps for the backward pass, before XLA's fusion; arguments and constants excluded:
                the parameters and frozen state are resident before the step)
    grads       a gradient pytree where the step makes one (the parameters' shapes, sharded as they are);
                estimates regenerated leaf by leaf inside the fused update hold none
    directions  random or basis directions: as much of jvp's tangent as the program's temporaries can hold (XLA
                draws each leaf's tangent where the forward pass reaches it, so it is never whole); MeZO's largest
                leaf (one leaf's direction at a time, fused into the perturbation); jacfwd's (chunk, n) basis block
    temp        XLA's temporaries of the largest program of the step (compiled.memory_analysis(), per device),
                less what of the categories above lives inside that program: the working memory itself

`tracked_peak`: the categories XLA holds together in the step's largest program, as its temporaries tell.
"""

from __future__ import annotations

import jax
import numpy as np
from jax._src.ad_checkpoint import saved_residuals  # jax.ad_checkpoint.print_saved_residuals, as data

from bench.jax_impl.loss import dropout_key


def per_device_bytes(tree) -> int:
    """Bytes of `tree`'s arrays on the device that holds the most of them, from their own shards."""
    held: dict = {}
    for x in jax.tree.leaves(tree):
        for shard in x.addressable_shards:
            held[shard.device] = held.get(shard.device, 0) + shard.data.nbytes
    return max(held.values(), default=0)


def saved_bytes(trainer, micro_batches) -> int:
    """Residuals the vjp of one micro-batch's loss keeps, beyond its arguments and constants."""
    key = dropout_key(trainer.spec.seed, 0)  # traced only: the loss's closed-over frozen state is never run
    found = saved_residuals(lambda p: trainer.loss_of(p, micro_batches[0], key), trainer.params)
    return sum(
        int(np.prod(aval.shape)) * aval.dtype.itemsize
        for aval, why in found
        if not why.startswith(("from the argument", "from a constant", "from a literal"))
    )


def breakdown(trainer, micro_batches) -> dict:
    """Bytes per category of the trial's step on `micro_batches` (device batches), with their method: the
    estimator's own categories (its module's memory()), and the largest program's temporaries beyond them."""
    program = max((compiled.memory_analysis().temp_size_in_bytes for compiled, _ in trainer.programs()), default=0)
    held = trainer.impl.memory(trainer, micro_batches, program)
    return {
        "trainable": per_device_bytes(trainer.params),
        "saved": held.saved,
        "grads": held.grads,
        "directions": held.directions,
        "tracked_peak": min(held.inside, program) + held.beside,
        "temp": max(program - held.inside, 0),
        "method": "jax_saved_residuals+xla_memory_analysis",
    }
