"""lozo in JAX: LOZO (bench/estimators/lozo.py has the rule): perturbations +eps, -2eps, +eps along U V^T per weight
matrix (z per other tensor), two forward passes, g = proj U V^T, each factor regenerated from its key. Mirror of
torch_impl/estimators/lozo.py; a stacked layer's matrix (scan_layers) gets factors of its own per layer. V, the
factor kept for `interval` steps, runs along a Linear's input side in both frameworks, as the authors keep it: a
JAX kernel is (in, out), the transpose of torch's weight, so its V runs along its first axis and U along the rest
(an embedding table is laid out as torch's: U along its rows). Across the steps V is kept, the perturbations span
`rank` input directions, not `rank` output ones.

The timed step runs MeZO's programs (each perturbation fused with the loss after it, the parameters donated; a
move alone between micro-batches; the update, which restores the last +eps and takes eps as an argument); the
update builds the estimate whole, where MeZO's regenerates it a stack's layer at a time. Where the trained state is
small (ONE_PROGRAM_BELOW, as MeZO's), the same bodies run as one program.
"""

from __future__ import annotations

from functools import partial

import jax
import jax.numpy as jnp
import numpy as np
import optax

from bench.jax_impl.directions import PRNG_IMPL, layer_direction
from bench.jax_impl.estimators import Held, one_program
from bench.jax_impl.estimators.mezo import evaluated, spsa_passes, spsa_projections
from bench.jax_impl.loss import dropout_key
from bench.jax_impl.models.common import stack_of


def memory(trainer, micro_batches, temp) -> Held:
    # one leaf's perturbation at a time in the perturbations; the update's whole estimate is in its temporaries
    return Held(directions=max((x.nbytes for x in jax.tree.leaves(trainer.params)), default=0))


def gradient(trainer, params, micro_batches, step, tangents=None):
    s, settings = trainer.spec, trainer.estimator.settings_of(trainer.spec)
    return lozo_gradient(
        trainer.loss_of,
        params,
        micro_batches,
        dropout_key(s.seed, step),
        eps=settings.eps,
        rank=settings.rank,
        interval=settings.interval,
        seed=s.seed,
        step=step,
        kind=s.directions,
        tangents=tangents,
    )


def lozo_gradient(
    loss_of, params, micro_batches, key, *, eps, rank, interval, seed, step, kind="gaussian", tangents=None
):
    """LOZO's two passes per micro-batch along each leaf's low-rank direction and the estimate proj Z, whole:
    (restored parameters, the mean of L+ and L-, the estimate). `tangents`: a given direction (one pytree like
    params, tests) instead of the seeded one."""
    draw = dict(rank=rank, interval=interval, seed=seed, step=step, kind=kind)
    z = tangents[0] if tangents is not None else low_rank_directions(params, **draw)
    move_fn = lambda p, scale, k: jax.tree.map(lambda x, z: x + scale * z, p, z)  # noqa: E731
    params, losses = spsa_passes(*evaluated(loss_of, move_fn, key), params, micro_batches, eps=eps)
    total, projs = spsa_projections(losses, eps)
    return params, total, jax.tree.map(lambda z: projs[0] * z, z)


def prepare(trainer, shardings) -> None:
    sh = shardings
    trainer._one_program = one_program(trainer)  # decided once: the timed step reads it
    if trainer._one_program:
        arguments = (sh.frozen, sh.params, sh.opt, sh.scalar, sh.scalar, sh.batch)
        trainer._whole = trainer.jit(partial(whole, trainer), (1, 2), arguments, (sh.params, sh.opt, sh.scalar))
        return
    trainer._move_loss = trainer.jit(
        partial(move_loss, trainer),
        (1,),
        (sh.frozen, sh.params, sh.scalar, sh.scalar, sh.batch),
        (sh.params, sh.scalar),
    )
    trainer._move = trainer.jit(partial(move, trainer), (0,), (sh.params, sh.scalar, sh.scalar), sh.params)
    trainer._update = trainer.jit(
        partial(update, trainer),
        (0, 1),
        (sh.params, sh.opt, sh.scalar, sh.scalar, sh.scalar),
        (sh.params, sh.opt, sh.scalar),
    )


def lower(trainer, micro_batches) -> dict:
    step, zero, params, m = np.int32(0), np.float32(0), trainer.params, len(micro_batches)
    opt_state = jax.eval_shape(trainer.optimizer.init, params)
    if trainer._one_program:
        return {"_whole": trainer._whole.lower(trainer.frozen, params, opt_state, 0.0, step, micro_batches)}
    lowered = {
        "_move_loss": trainer._move_loss.lower(trainer.frozen, params, 0.0, step, micro_batches[0]),
        "_update": trainer._update.lower(params, opt_state, [[(zero, zero)] * m], 0.0, step),
    }
    if m > 1:  # the moves back between micro-batches
        lowered["_move"] = trainer._move.lower(params, 0.0, step)
    return lowered


def programs(trainer) -> list[tuple]:
    if trainer._one_program:
        return [(trainer._whole, 1)]
    m = trainer.micro_batches
    return [(trainer._move_loss, 2 * m), *([(trainer._move, m - 1)] if m > 1 else []), (trainer._update, 1)]


def step(trainer, micro_batches):
    step, eps = np.int32(trainer.step_count), trainer.estimator.settings_of(trainer.spec).eps
    if trainer._one_program:
        args = (trainer.frozen, trainer.params, trainer.opt_state, eps, step, micro_batches)
        trainer.params, trainer.opt_state, total = trainer._whole(*args)
        return total
    trainer.params, losses = spsa_passes(
        lambda p, scale, k, batch: trainer._move_loss(trainer.frozen, p, scale, step, batch),
        lambda p, scale, k: trainer._move(p, scale, step),
        trainer.params,
        micro_batches,
        eps=eps,
        restore=False,  # the update puts the last +eps back with the Z it draws anyway
    )
    trainer.params, trainer.opt_state, total = trainer._update(trainer.params, trainer.opt_state, losses, eps, step)
    return total


def _draw(trainer, step) -> dict:
    s, settings = trainer.spec, trainer.estimator.settings_of(trainer.spec)
    return dict(rank=settings.rank, interval=settings.interval, seed=s.seed, step=step, kind=s.directions)


def move(trainer, params, scale, step):
    """theta + scale Z, Z regenerated from its keys, written over the donated theta."""
    return jax.tree.map(lambda x, z: x + scale * z, params, low_rank_directions(params, **_draw(trainer, step)))


def move_loss(trainer, frozen, params, scale, step, batch):
    """The move, then one forward pass there (L+ or L-): (the moved parameters, the loss)."""
    params = move(trainer, params, scale, step)
    return params, trainer.on(frozen).loss_of(params, batch, dropout_key(trainer.spec.seed, step))


def update(trainer, params, opt_state, losses, eps, step):
    """The projection from the passes' losses; the last +eps Z restored, then the optimizer's update with
    g = proj Z, Z regenerated from its keys: (params, opt_state, the step's loss)."""
    total, projs = spsa_projections(losses, eps)
    z = low_rank_directions(params, **_draw(trainer, step))
    params = jax.tree.map(lambda x, z: x + eps * z, params, z)
    updates, opt_state = trainer.optimizer.update(jax.tree.map(lambda z: projs[0] * z, z), opt_state, params)
    return optax.apply_updates(params, updates), opt_state, total


def whole(trainer, frozen, params, opt_state, eps, step, micro_batches):
    """The step's programs as one, the same bodies in the same order: the passes (move_loss), the restoring moves
    between micro-batches (move), then the update: (params, opt_state, the step's loss)."""
    params, losses = spsa_passes(
        lambda p, scale, k, batch: move_loss(trainer, frozen, p, scale, step, batch),
        lambda p, scale, k: move(trainer, p, scale, step),
        params,
        micro_batches,
        eps=eps,
        restore=False,
    )
    return update(trainer, params, opt_state, losses, eps, step)


def low_rank_directions(params, *, rank: int, interval: int, seed: int, step, kind: str = "gaussian"):
    """Every leaf's perturbation at `step`: U V^T for a matrix (a stacked leaf's per layer), U drawn for the step
    and V for its block of `interval` steps, each matrix from keys of its own; z, MeZO's, for the other leaves,
    one draw cut into their shapes (biases and norms: a few MiB at most, held whole)."""
    flat, treedef = jax.tree_util.tree_flatten_with_path(params)
    lead = [1 if stack_of(path) is not None else 0 for path, _ in flat]  # a stack's leading axis is its layers
    vectors = [i for i, (_, x) in enumerate(flat) if x.ndim - lead[i] < 2]
    matrices = [i for i in range(len(flat)) if i not in vectors]
    u_keys, v_keys = _keys(seed, step, interval, len(matrices) + 1)
    out = dict(zip(vectors, layer_direction([flat[i][1] for i in vectors], u_keys[-1], kind) if vectors else []))
    for i, u_key, v_key in zip(matrices, u_keys, v_keys):
        path, x = flat[i]
        layers, (first, *rest) = x.shape[: lead[i]], x.shape[lead[i] :]
        transposed = _transposed(path)  # (in, out): V along the first axis, the input; U along the rest
        m, n = (int(np.prod(rest)), first) if transposed else (first, int(np.prod(rest)))
        u = _sample(u_key, (*layers, m, rank), x.dtype, kind)
        v = _sample(v_key, (*layers, n, rank), x.dtype, kind)
        a, b = (v, u) if transposed else (u, v)
        out[i] = jnp.matmul(a, jnp.swapaxes(b, -1, -2)).reshape(x.shape)
    return jax.tree.unflatten(treedef, [out[i] for i in range(len(flat))])


# The leaves nnx stores as the transpose of torch's weight (jax_impl/models/common.py): a Linear's kernel and
# LoRA's two factors
TRANSPOSED = ("kernel", "lora_a", "lora_b")


def _transposed(path) -> bool:
    last = path[-1]
    return getattr(last, "key", getattr(last, "name", None)) in TRANSPOSED


def _keys(seed: int, step, interval: int, n: int):
    """(U's keys, V's keys), n each: key i of U's is fold_in(fold_in(fold_in(seed's, step), 0), i), of V's the same
    at step // interval and 1. The two streams in one vectorised hash per level, with the rbg generator's bits, as
    the other directions' (bench/jax_impl/directions.py: on XLA:CPU each threefry hash is a loop of its own)."""
    root = jax.random.key(seed, impl=PRNG_IMPL)
    steps, streams = jnp.stack([jnp.asarray(step), jnp.asarray(step) // interval]), jnp.arange(2, dtype=jnp.uint32)
    bases = jax.vmap(lambda s, k: jax.random.fold_in(jax.random.fold_in(root, s), k))(steps, streams)
    keys = jax.vmap(lambda b: jax.vmap(lambda i: jax.random.fold_in(b, i))(jnp.arange(n, dtype=jnp.uint32)))(bases)
    return keys[0], keys[1]


def _sample(key, shape, dtype, kind: str):
    if kind == "rademacher":
        return jax.random.rademacher(key, shape, dtype)
    return jax.random.normal(key, shape, dtype)
