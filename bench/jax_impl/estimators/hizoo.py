"""hizoo in JAX: HiZOO (bench/estimators/hizoo.py has the rule): the loss at theta and at theta +- eps z / sqrt(H),
then the Hessian estimate's update and g = proj z / sqrt(H), z regenerated from its key. Mirror of
torch_impl/estimators/hizoo.py.

The timed step runs separate programs, as MeZO's: each perturbation donates the parameters (XLA writes theta +-
eps z / sqrt(H) over them, in place as torch's add_), the loss, and an update that redraws z, updates H (donated,
so in place too) and applies g. Unlike MeZO's update, which draws a stack's z one layer at a time, it draws z
whole: one parameter-sized temporary more inside the update program.
"""

from __future__ import annotations

from functools import partial

import jax
import jax.numpy as jnp
import numpy as np
import optax

from bench.jax_impl.directions import perturb, sample_tangent
from bench.jax_impl.estimators import Held
from bench.jax_impl.loss import dropout_key


def init_state(trainer):
    """The diagonal Hessian estimate H, ones: made by the first step, as optimizer state is (excess memory)."""
    return jax.tree.map(jnp.ones_like, trainer.params)


def memory(trainer, micro_batches, temp) -> Held:
    # one leaf's direction in the perturbations (H is state, counted with the optimizer's: Trainer.state_bytes)
    return Held(directions=max((x.nbytes for x in jax.tree.leaves(trainer.params)), default=0))


def gradient(trainer, params, micro_batches, step, tangents=None):
    s, settings = trainer.spec, trainer.estimator.settings_of(trainer.spec)
    hessian = trainer.state if trainer.state is not None else init_state(trainer)
    params, total, g, _ = hizoo_gradient(
        trainer.loss_of,
        params,
        hessian,
        micro_batches,
        dropout_key(s.seed, step),
        eps=settings.eps,
        alpha=settings.alpha,
        seed=s.seed,
        step=step,
        kind=s.directions,
        tangents=tangents,
    )
    return params, total, g


def prepare(trainer, shardings) -> None:
    sh, s = shardings, trainer.spec
    trainer._perturb = trainer.jit(
        lambda p, h, scale, step: perturb(p, scale, s.seed, step, s.directions, trainer.gather, hessian=h),
        (0,),
        (sh.params, sh.params, sh.scalar, sh.scalar),
        sh.params,
    )
    trainer._loss = trainer.jit(partial(loss, trainer), (), (sh.frozen, sh.params, sh.batch, sh.scalar), sh.scalar)
    trainer._update = trainer.jit(
        partial(update, trainer),
        (0, 1, 2),
        (sh.params, sh.opt, sh.params, sh.scalar, sh.scalar, sh.scalar),
        (sh.params, sh.opt, sh.params),
    )


def lower(trainer, micro_batches) -> dict:
    step, params = np.int32(0), trainer.params
    opt_state = jax.eval_shape(trainer.optimizer.init, params)
    key, zero = dropout_key(trainer.spec.seed, step), np.float32(0)
    return {
        "_perturb": trainer._perturb.lower(params, params, zero, step),  # H has the parameters' shapes
        "_loss": trainer._loss.lower(trainer.frozen, params, micro_batches[0], key),
        "_update": trainer._update.lower(params, opt_state, params, zero, zero, step),
    }


def programs(trainer) -> list[tuple]:
    m = trainer.micro_batches
    return [(trainer._perturb, 3 * m), (trainer._loss, 3 * m), (trainer._update, 1)]


def step(trainer, micro_batches):
    step, eps = np.int32(trainer.step_count), trainer.estimator.settings_of(trainer.spec).eps
    trainer.params, total, proj, second = hizoo_passes(
        lambda p, batch, key: trainer._loss(trainer.frozen, p, batch, key),
        lambda p, scale: trainer._perturb(p, trainer.state, scale, step),
        trainer.params,
        micro_batches,
        dropout_key(trainer.spec.seed, step),
        eps=eps,
    )
    trainer.params, trainer.opt_state, trainer.state = trainer._update(
        trainer.params, trainer.opt_state, trainer.state, proj, second, step
    )
    return total


def loss(trainer, frozen, params, batch, key):
    """One forward pass (L0, L+ or L-)."""
    return trainer.on(frozen).loss_of(params, batch, key)


def update(trainer, params, opt_state, hessian, proj, second, step):
    """H's update and the optimizer's with g = proj z / sqrt(H), z regenerated from the step: (params, opt_state,
    H)."""
    s, settings = trainer.spec, trainer.estimator.settings_of(trainer.spec)
    z = sample_tangent(params, s.seed, step, 0, s.directions, trainer.gather)
    curvature = jnp.abs(second) / (2 * settings.eps**2)
    hessian, g = hessian_scaled(hessian, z, proj, curvature, settings.alpha)
    updates, opt_state = trainer.optimizer.update(g, opt_state, params)
    return optax.apply_updates(params, updates), opt_state, hessian


def hizoo_passes(loss_of, move, params, micro_batches, key, *, eps: float):
    """HiZOO's three passes per micro-batch: (parameters after the round trip, L0, the projection
    (L+ - L-) / (2 eps), the second difference L+ + L- - 2 L0), perturbing by +eps, -2eps, +eps with
    `move(params, scale)`."""
    total = proj = second = 0.0
    m = len(micro_batches)
    for batch in micro_batches:
        loss0 = loss_of(params, batch, key)
        params = move(params, +eps)
        loss_plus = loss_of(params, batch, key)
        params = move(params, -2 * eps)
        loss_minus = loss_of(params, batch, key)
        params = move(params, +eps)
        total = total + loss0 / m
        proj = proj + (loss_plus - loss_minus) / (2 * eps) / m
        second = second + (loss_plus + loss_minus - 2 * loss0) / m
    return params, total, proj, second


def hessian_scaled(hessian, z, proj, curvature, alpha):
    """(H', g): H' = (1 - alpha) H + alpha curvature H z^2 and g = proj z / sqrt(H'), elementwise."""
    updated = jax.tree.map(lambda h, z: h * jnp.square(z) * (alpha * curvature) + h * (1 - alpha), hessian, z)
    return updated, jax.tree.map(lambda z, h: (proj * z * jax.lax.rsqrt(h)).astype(z.dtype), z, updated)


def hizoo_gradient(
    loss_of,
    params,
    hessian,
    micro_batches,
    key,
    *,
    eps: float,
    alpha: float,
    seed: int,
    step,
    kind="gaussian",
    tangents=None,
):
    """HiZOO's estimate, whole: (restored parameters, L0, g, the updated H). `tangents`: a given direction z (one
    pytree like params, tests) instead of the seeded one."""
    if tangents is not None:
        z = tangents[0]
        move = lambda p, scale: jax.tree.map(lambda x, z, h: x + scale * z * jax.lax.rsqrt(h), p, z, hessian)  # noqa: E731
    else:
        z = None
        move = lambda p, scale: perturb(p, scale, seed, step, kind, hessian=hessian)  # noqa: E731
    params, total, proj, second = hizoo_passes(loss_of, move, params, micro_batches, key, eps=eps)
    z = z if z is not None else sample_tangent(params, seed, step, 0, kind)
    hessian, g = hessian_scaled(hessian, z, proj, jnp.abs(second) / (2 * eps**2), alpha)
    return params, total, g, hessian
