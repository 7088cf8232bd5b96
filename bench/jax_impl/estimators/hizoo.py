"""hizoo in JAX: HiZOO (bench/estimators/hizoo.py has the rule): the loss at theta and at theta +- eps z / sqrt(H),
then the Hessian estimate's update and g = proj z / sqrt(H), z regenerated from its key. Mirror of
torch_impl/estimators/hizoo.py.

The timed step runs separate programs, as MeZO's: the loss at theta, then each perturbation fused with the loss
after it, the parameters donated (XLA writes theta +- eps z / sqrt(H) over them, in place as torch's add_), and an
update that takes the losses, redraws z, puts the last +eps back, updates H (donated, so in place too) and applies
g; eps and alpha are its arguments, not constants. Unlike MeZO's update, which draws a stack's z one layer at a
time, it draws z whole: one parameter-sized temporary more inside the update program. Where the trained state is
small (ONE_PROGRAM_BELOW, as MeZO's), the same bodies run as one program.
"""

from __future__ import annotations

from functools import partial

import jax
import jax.numpy as jnp
import numpy as np
import optax

from bench.jax_impl.directions import held_bytes, perturb, sample_tangent
from bench.jax_impl.estimators import Held, one_program
from bench.jax_impl.loss import dropout_key


def init_state(trainer):
    """The diagonal Hessian estimate H, ones: made by the first step, as optimizer state is (excess memory)."""
    return jax.tree.map(jnp.ones_like, trainer.params)


def memory(trainer, micro_batches, temp) -> Held:
    # a unit of the direction at a time in the perturbations (H is state, counted with the optimizer's:
    # Trainer.state_bytes)
    return Held(directions=held_bytes(trainer.params))


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
    sh = shardings
    trainer._one_program = one_program(trainer)  # decided once: the timed step reads it
    if trainer._one_program:
        arguments = (sh.frozen, sh.params, sh.opt, sh.params, sh.scalar, sh.scalar, sh.scalar, sh.batch)
        outputs = (sh.params, sh.opt, sh.params, sh.scalar)
        trainer._whole = trainer.jit(partial(whole, trainer), (1, 2, 3), arguments, outputs)
        return
    trainer._loss = trainer.jit(partial(loss, trainer), (), (sh.frozen, sh.params, sh.scalar, sh.batch), sh.scalar)
    trainer._move_loss = trainer.jit(
        partial(move_loss, trainer),
        (1,),
        (sh.frozen, sh.params, sh.params, sh.scalar, sh.scalar, sh.batch),
        (sh.params, sh.scalar),
    )
    trainer._move = trainer.jit(partial(move, trainer), (0,), (sh.params, sh.params, sh.scalar, sh.scalar), sh.params)
    trainer._update = trainer.jit(
        partial(update, trainer),
        (0, 1, 2),
        (sh.params, sh.opt, sh.params, sh.scalar, sh.scalar, sh.scalar, sh.scalar),
        (sh.params, sh.opt, sh.params, sh.scalar),
    )


def lower(trainer, micro_batches) -> dict:
    step, zero, params, m = np.int32(0), np.float32(0), trainer.params, len(micro_batches)
    opt_state = jax.eval_shape(trainer.optimizer.init, params)
    # H has the parameters' shapes
    if trainer._one_program:
        return {
            "_whole": trainer._whole.lower(trainer.frozen, params, opt_state, params, 0.0, 0.0, step, micro_batches)
        }
    lowered = {
        "_loss": trainer._loss.lower(trainer.frozen, params, step, micro_batches[0]),
        "_move_loss": trainer._move_loss.lower(trainer.frozen, params, params, 0.0, step, micro_batches[0]),
        "_update": trainer._update.lower(params, opt_state, params, [(zero, zero, zero)] * m, 0.0, 0.0, step),
    }
    if m > 1:  # the moves back between micro-batches
        lowered["_move"] = trainer._move.lower(params, params, 0.0, step)
    return lowered


def programs(trainer) -> list[tuple]:
    if trainer._one_program:
        return [(trainer._whole, 1)]
    m = trainer.micro_batches
    moves = [(trainer._move, m - 1)] if m > 1 else []
    return [(trainer._loss, m), (trainer._move_loss, 2 * m), *moves, (trainer._update, 1)]


def step(trainer, micro_batches):
    step, settings = np.int32(trainer.step_count), trainer.estimator.settings_of(trainer.spec)
    if trainer._one_program:
        args = (trainer.frozen, trainer.params, trainer.opt_state, trainer.state, settings.eps, settings.alpha, step)
        trainer.params, trainer.opt_state, trainer.state, total = trainer._whole(*args, micro_batches)
        return total
    trainer.params, losses = hizoo_passes(
        lambda p, batch: trainer._loss(trainer.frozen, p, step, batch),
        lambda p, scale, batch: trainer._move_loss(trainer.frozen, p, trainer.state, scale, step, batch),
        lambda p, scale: trainer._move(p, trainer.state, scale, step),
        trainer.params,
        micro_batches,
        eps=settings.eps,
        restore=False,  # the update puts the last +eps back with the z it draws anyway
    )
    trainer.params, trainer.opt_state, trainer.state, total = trainer._update(
        trainer.params, trainer.opt_state, trainer.state, losses, settings.eps, settings.alpha, step
    )
    return total


def loss(trainer, frozen, params, step, batch):
    """One forward pass at theta (L0)."""
    return trainer.on(frozen).loss_of(params, batch, dropout_key(trainer.spec.seed, step))


def move(trainer, params, hessian, scale, step):
    """theta + scale z / sqrt(H), z regenerated from its keys, written over the donated theta."""
    s = trainer.spec
    return perturb(params, scale, s.seed, step, s.directions, trainer.gather, hessian=hessian)


def move_loss(trainer, frozen, params, hessian, scale, step, batch):
    """The move, then one forward pass there (L+ or L-): (the moved parameters, the loss)."""
    params = move(trainer, params, hessian, scale, step)
    return params, loss(trainer, frozen, params, step, batch)


def update(trainer, params, opt_state, hessian, losses, eps, alpha, step):
    """The last +eps z / sqrt(H) put back, H's update and the optimizer's with g = proj z / sqrt(H), z regenerated
    from the step: (params, opt_state, H, the step's loss L0)."""
    s = trainer.spec
    total, proj, second = hizoo_differences(losses, eps)
    z = sample_tangent(params, s.seed, step, 0, s.directions, trainer.gather)
    params = jax.tree.map(lambda x, z, h: x + eps * (z * jax.lax.rsqrt(h)), params, z, hessian)  # as perturb's
    curvature = jnp.abs(second) / (2 * eps**2)
    hessian, g = hessian_scaled(hessian, z, proj, curvature, alpha)
    updates, opt_state = trainer.optimizer.update(g, opt_state, params)
    return optax.apply_updates(params, updates), opt_state, hessian, total


def whole(trainer, frozen, params, opt_state, hessian, eps, alpha, step, micro_batches):
    """The step's programs as one, the same bodies in the same order: the passes (loss, move_loss), the restoring
    moves between micro-batches (move), then the update: (params, opt_state, H, the step's loss L0)."""
    params, losses = hizoo_passes(
        lambda p, batch: loss(trainer, frozen, p, step, batch),
        lambda p, scale, batch: move_loss(trainer, frozen, p, hessian, scale, step, batch),
        lambda p, scale: move(trainer, p, hessian, scale, step),
        params,
        micro_batches,
        eps=eps,
        restore=False,
    )
    return update(trainer, params, opt_state, hessian, losses, eps, alpha, step)


def hizoo_passes(loss_fn, move_loss_fn, move_fn, params, micro_batches, *, eps, restore=True):
    """HiZOO's three passes per micro-batch: (parameters after the round trip, losses[n] = (L0, L+, L-)),
    perturbing by +eps, -2eps, +eps with `move_loss_fn(params, scale, batch)` -> (moved, loss) and
    `move_fn(params, scale)`; restore=False leaves the last +eps to the update."""
    losses, m = [], len(micro_batches)
    for n, batch in enumerate(micro_batches):
        loss0 = loss_fn(params, batch)
        params, loss_plus = move_loss_fn(params, +eps, batch)
        params, loss_minus = move_loss_fn(params, -2 * eps, batch)
        if restore or n < m - 1:
            params = move_fn(params, +eps)
        losses.append((loss0, loss_plus, loss_minus))
    return params, losses


def hizoo_differences(losses, eps):
    """(the mean L0, the projection (L+ - L-) / (2 eps), the second difference L+ + L- - 2 L0), each averaged over
    the micro-batches of hizoo_passes' losses, in the order the passes ran."""
    total = proj = second = 0.0
    m = len(losses)
    for loss0, loss_plus, loss_minus in losses:
        total = total + loss0 / m
        proj = proj + (loss_plus - loss_minus) / (2 * eps) / m
        second = second + (loss_plus + loss_minus - 2 * loss0) / m
    return total, proj, second


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

    def move_loss_fn(p, scale, batch):
        p = move(p, scale)
        return p, loss_of(p, batch, key)

    params, losses = hizoo_passes(
        lambda p, batch: loss_of(p, batch, key), move_loss_fn, move, params, micro_batches, eps=eps
    )
    total, proj, second = hizoo_differences(losses, eps)
    z = z if z is not None else sample_tangent(params, seed, step, 0, kind)
    hessian, g = hessian_scaled(hessian, z, proj, jnp.abs(second) / (2 * eps**2), alpha)
    return params, total, g, hessian
