"""lozo in JAX: LOZO (bench/estimators/lozo.py has the rule): perturbations +eps, -2eps, +eps along U V^T per weight
matrix (z per other tensor), two forward passes, g = proj U V^T, each factor regenerated from its key. Mirror of
torch_impl/estimators/lozo.py; a stacked layer's matrix (scan_layers) gets factors of its own per layer, and a
matrix's U runs along its first dimension (a JAX kernel's input side, a torch weight's output side: the estimate's
statistics are the same either way).

The timed step runs MeZO's separate programs (the perturbations donating the parameters, the loss, the update);
the update builds the estimate whole, where MeZO's regenerates it a stack's layer at a time.
"""

from __future__ import annotations

from functools import partial

import jax
import jax.numpy as jnp
import numpy as np
import optax

from bench.jax_impl.estimators import Held
from bench.jax_impl.estimators.mezo import spsa_projection
from bench.jax_impl.loss import dropout_key
from bench.jax_impl.params import stack_of


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
    params, total, projs = spsa_projection(
        loss_of, lambda p, scale, k: jax.tree.map(lambda x, z: x + scale * z, p, z), params, micro_batches, key, eps=eps
    )
    return params, total, jax.tree.map(lambda z: projs[0] * z, z)


def prepare(trainer, shardings) -> None:
    sh = shardings
    trainer._perturb = trainer.jit(partial(perturb, trainer), (0,), (sh.params, sh.scalar, sh.scalar), sh.params)
    trainer._loss = trainer.jit(partial(loss, trainer), (), (sh.frozen, sh.params, sh.batch, sh.scalar), sh.scalar)
    trainer._update = trainer.jit(
        partial(update, trainer), (0, 1), (sh.params, sh.opt, sh.scalar, sh.scalar), (sh.params, sh.opt)
    )


def lower(trainer, micro_batches) -> dict:
    step, params = np.int32(0), trainer.params
    opt_state = jax.eval_shape(trainer.optimizer.init, params)
    key = dropout_key(trainer.spec.seed, step)
    return {
        "_perturb": trainer._perturb.lower(params, np.float32(0), step),
        "_loss": trainer._loss.lower(trainer.frozen, params, micro_batches[0], key),
        "_update": trainer._update.lower(params, opt_state, np.float32(0), step),
    }


def programs(trainer) -> list[tuple]:
    m = trainer.micro_batches
    return [(trainer._perturb, 3 * m), (trainer._loss, 2 * m), (trainer._update, 1)]


def step(trainer, micro_batches):
    step, eps = np.int32(trainer.step_count), trainer.estimator.settings_of(trainer.spec).eps
    trainer.params, total, projs = spsa_projection(
        lambda p, batch, key: trainer._loss(trainer.frozen, p, batch, key),
        lambda p, scale, k: trainer._perturb(p, scale, step),
        trainer.params,
        micro_batches,
        dropout_key(trainer.spec.seed, step),
        eps=eps,
    )
    trainer.params, trainer.opt_state = trainer._update(trainer.params, trainer.opt_state, projs[0], step)
    return total


def _draw(trainer, step) -> dict:
    s, settings = trainer.spec, trainer.estimator.settings_of(trainer.spec)
    return dict(rank=settings.rank, interval=settings.interval, seed=s.seed, step=step, kind=s.directions)


def perturb(trainer, params, scale, step):
    """theta + scale Z, Z regenerated from its keys."""
    return jax.tree.map(lambda x, z: x + scale * z, params, low_rank_directions(params, **_draw(trainer, step)))


def loss(trainer, frozen, params, batch, key):
    """One forward pass (L+ or L-)."""
    return trainer.on(frozen).loss_of(params, batch, key)


def update(trainer, params, opt_state, proj, step):
    """The optimizer's update with g = proj Z, Z regenerated from its keys."""
    g = jax.tree.map(lambda z: proj * z, low_rank_directions(params, **_draw(trainer, step)))
    updates, opt_state = trainer.optimizer.update(g, opt_state, params)
    return optax.apply_updates(params, updates), opt_state


def low_rank_directions(params, *, rank: int, interval: int, seed: int, step, kind: str = "gaussian"):
    """Every leaf's perturbation at `step`: U V^T for a matrix (a stacked leaf's per layer), U drawn for the step
    and V for its block of `interval` steps, each leaf from keys of its own; z, MeZO's, for any other leaf."""
    flat, treedef = jax.tree_util.tree_flatten_with_path(params)
    root = jax.random.key(seed)
    u_keys = jax.random.fold_in(jax.random.fold_in(root, step), 0)
    v_keys = jax.random.fold_in(jax.random.fold_in(root, step // interval), 1)
    out = []
    for i, (path, x) in enumerate(flat):
        lead = 1 if stack_of(path) is not None else 0  # a stack's leading axis is its layers
        u_key, v_key = jax.random.fold_in(u_keys, i), jax.random.fold_in(v_keys, i)
        if x.ndim - lead < 2:
            out.append(_sample(u_key, x.shape, x.dtype, kind))
            continue
        m, n = x.shape[lead], int(np.prod(x.shape[lead + 1 :]))
        u = _sample(u_key, (*x.shape[:lead], m, rank), x.dtype, kind)
        v = _sample(v_key, (*x.shape[:lead], n, rank), x.dtype, kind)
        out.append(jnp.matmul(u, jnp.swapaxes(v, -1, -2)).reshape(x.shape))
    return jax.tree.unflatten(treedef, out)


def _sample(key, shape, dtype, kind: str):
    if kind == "rademacher":
        return jax.random.rademacher(key, shape, dtype)
    return jax.random.normal(key, shape, dtype)
