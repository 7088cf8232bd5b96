"""mezo in JAX: SPSA as MeZO runs it (Malladi et al. 2023, Algorithm 1), with q perturbations averaged per step
(ZO-Bench's q; bench/estimators/mezo.py has the rule): for each seeded z_k, perturbations +eps, -2eps, +eps and two
forward passes, g = 1/q sum_k (L+ - L-)/(2 eps) z_k with each z_k regenerated from its key. Mirror of
torch_impl/estimators/mezo.py.

The timed step runs separate programs: each perturbation donates the parameters, so it overwrites them in place as
torch's add_ does (inside one jit XLA cannot write theta + eps z over the donated input and holds a second
parameter-sized buffer); the loss; and an update that regenerates the z_k, restoring the last +eps with z_0.
"""

from __future__ import annotations

from functools import partial

import jax
import jax.numpy as jnp
import numpy as np

from bench.jax_impl.directions import perturb, seeded_gradient, seeded_update, tangent_gradient
from bench.jax_impl.estimators import Held
from bench.jax_impl.loss import dropout_key


def memory(trainer, micro_batches, temp) -> Held:
    # one leaf's direction at a time, fused into the perturbation
    return Held(directions=max((x.nbytes for x in jax.tree.leaves(trainer.params)), default=0))


def gradient(trainer, params, micro_batches, step, tangents=None):
    s, settings = trainer.spec, trainer.estimator.settings_of(trainer.spec)
    key = dropout_key(s.seed, step)
    return spsa_gradient(
        trainer.loss_of,
        params,
        micro_batches,
        key,
        eps=settings.eps,
        seed=s.seed,
        step=step,
        q=settings.q,
        kind=s.directions,
        tangents=tangents,
    )


def prepare(trainer, shardings) -> None:
    sh, s = shardings, trainer.spec
    trainer._perturb = trainer.jit(
        lambda p, scale, step, k: perturb(p, scale, s.seed, step, s.directions, trainer.gather, k),
        (0,),
        (sh.params, sh.scalar, sh.scalar, sh.scalar),
        sh.params,
    )
    trainer._loss = trainer.jit(partial(loss, trainer), (), (sh.frozen, sh.params, sh.batch, sh.scalar), sh.scalar)
    trainer._update = trainer.jit(
        partial(update, trainer), (0, 1), (sh.params, sh.opt, sh.scalar, sh.scalar), (sh.params, sh.opt)
    )


def lower(trainer, micro_batches) -> dict:
    step, params, q = np.int32(0), trainer.params, trainer.estimator.settings_of(trainer.spec).q
    opt_state = jax.eval_shape(trainer.optimizer.init, params)
    key = dropout_key(trainer.spec.seed, step)
    return {
        "_perturb": trainer._perturb.lower(params, 0.0, step, np.int32(0)),
        "_loss": trainer._loss.lower(trainer.frozen, params, micro_batches[0], key),
        "_update": trainer._update.lower(params, opt_state, np.zeros(q, np.float32), step),
    }


def programs(trainer) -> list[tuple]:
    m, q = trainer.micro_batches, trainer.estimator.settings_of(trainer.spec).q  # the last +eps: in _update
    return [(trainer._perturb, 3 * m * q - 1), (trainer._loss, 2 * m * q), (trainer._update, 1)]


def step(trainer, micro_batches):
    step, settings = np.int32(trainer.step_count), trainer.estimator.settings_of(trainer.spec)
    trainer.params, total, projs = spsa_projection(
        lambda p, batch, key: trainer._loss(trainer.frozen, p, batch, key),
        lambda p, scale, k: trainer._perturb(p, scale, step, np.int32(k)),
        trainer.params,
        micro_batches,
        dropout_key(trainer.spec.seed, step),
        eps=settings.eps,
        q=settings.q,
        restore=False,  # the update restores the last +eps with the z_0 it draws anyway (seeded_update)
    )
    trainer.params, trainer.opt_state = trainer._update(trainer.params, trainer.opt_state, projs / settings.q, step)
    return total


def loss(trainer, frozen, params, batch, key):
    """One forward pass (L+ or L-)."""
    return trainer.on(frozen).loss_of(params, batch, key)


def update(trainer, params, opt_state, coeffs, step):
    """Optimizer update with g = sum_k coeffs[k] z_k, the z_k regenerated from the step, the last +eps z_0
    restored in it."""
    s, eps = trainer.spec, trainer.estimator.settings_of(trainer.spec).eps
    return seeded_update(trainer.optimizer, params, opt_state, coeffs, s.seed, step, s.directions, trainer.gather, eps)


def spsa_projection(loss_of, perturb_fn, params, micro_batches, key, *, eps: float, q: int = 1, restore=True):
    """SPSA's forward passes: (restored parameters, mean of the L+ and L-, the q projected gradients
    (L(theta + eps z_k) - L(theta - eps z_k)) / (2 eps)), perturbing by +eps, -2eps, +eps with
    `perturb_fn(params, scale, k)` (the restored parameters carry the same rounding as torch's in-place round
    trip). The directions go from z_{q-1} down to z_0, as in torch; restore=False: z_0's last +eps is left to the
    update (seeded_update's shift), which draws z_0 anyway: the parameters come back at theta - eps z_0."""
    projs, total, m = [0.0] * q, 0.0, len(micro_batches)
    for k in reversed(range(q)):
        for n, batch in enumerate(micro_batches):
            params = perturb_fn(params, +eps, k)
            loss_plus = loss_of(params, batch, key)
            params = perturb_fn(params, -2 * eps, k)
            loss_minus = loss_of(params, batch, key)
            if restore or k > 0 or n < m - 1:
                params = perturb_fn(params, +eps, k)
            projs[k] = projs[k] + (loss_plus - loss_minus) / (2 * eps) / m
            total = total + (loss_plus + loss_minus) / 2 / m / q
    return params, total, jnp.stack([jnp.asarray(p, jnp.float32) for p in projs])


def spsa_gradient(
    loss_of, params, micro_batches, key, *, eps: float, seed: int, step, q: int = 1, kind="gaussian", tangents=None
):
    """SPSA (Malladi et al. 2023; q perturbations as ZO-Bench): the q projections along seeded z_k, and the estimate
    1/q sum_k proj_k z_k regenerated from their keys. `tangents`: given directions (pytrees like params, tests)
    instead of seeded ones, one per perturbation. Returns the restored parameters, the step's loss and the
    estimate."""
    if tangents is not None:
        q = len(tangents)
        move = lambda p, scale, k: jax.tree.map(lambda x, z: x + scale * z, p, tangents[k])  # noqa: E731
    else:
        move = lambda p, scale, k: perturb(p, scale, seed, step, kind, k=k)  # noqa: E731
    params, total, projs = spsa_projection(loss_of, move, params, micro_batches, key, eps=eps, q=q)
    if tangents is not None:
        return params, total, tangent_gradient(tangents, projs / q)
    return params, total, seeded_gradient(params, projs / q, seed, step, kind)
