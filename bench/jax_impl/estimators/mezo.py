"""mezo in JAX: SPSA as MeZO runs it (Malladi et al. 2023, Algorithm 1), with q perturbations averaged per step
(ZO-Bench's q; bench/estimators/mezo.py has the rule): for each seeded z_k, perturbations +eps, -2eps, +eps and two
forward passes, g = 1/q sum_k (L+ - L-)/(2 eps) z_k with each z_k regenerated from its key. Mirror of
torch_impl/estimators/mezo.py.

The timed step runs its perturbations and forward passes as separate programs, each perturbation fused with the
loss that follows it: (theta, scale, k) -> (theta + scale z_k, the loss there), the parameters donated, so XLA
writes the move over them in place as torch's add_ does (a whole MeZO step in one jit would hold theta and its
perturbed copy: +1x parameters). Between directions and micro-batches a move alone puts theta back; the update
takes the losses, forms the projections, restores the last +eps with the z_0 it draws anyway, and applies the
optimizer: one direction on one micro-batch is three programs, and no arithmetic runs between them in Python.
Where the trained state is small (under ONE_PROGRAM_BELOW entries: BitFit, a probe, LoRA's adapters) on one device,
the same bodies run as one program: the perturbed copies XLA then holds beside theta are a few of at most 4 MiB,
and there the host's cost of each program call is much of the step (docs/speed.md). eps is an argument of every
program, not a constant, so a trial at another eps compiles nothing new.
"""

from __future__ import annotations

from functools import partial

import jax
import jax.numpy as jnp
import numpy as np

from bench.jax_impl.directions import held_bytes, perturb, seeded_gradient, seeded_update, tangent_gradient
from bench.jax_impl.estimators import Held, one_program
from bench.jax_impl.loss import dropout_key


def memory(trainer, micro_batches, temp) -> Held:
    # a unit of the direction at a time (a big tensor's, the small ones' together, a stack's layer's), fused into
    # the perturbation
    return Held(directions=held_bytes(trainer.params))


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
    sh = shardings
    trainer._one_program = one_program(trainer)  # decided once: the timed step reads it
    if trainer._one_program:
        arguments = (sh.frozen, sh.params, sh.opt, sh.scalar, sh.scalar, sh.batch)
        trainer._whole = trainer.jit(partial(whole, trainer), (1, 2), arguments, (sh.params, sh.opt, sh.scalar))
        return
    trainer._move_loss = trainer.jit(
        partial(move_loss, trainer),
        (1,),
        (sh.frozen, sh.params, sh.scalar, sh.scalar, sh.scalar, sh.batch),
        (sh.params, sh.scalar),
    )
    trainer._move = trainer.jit(partial(move, trainer), (0,), (sh.params, sh.scalar, sh.scalar, sh.scalar), sh.params)
    trainer._update = trainer.jit(
        partial(update, trainer),
        (0, 1),
        (sh.params, sh.opt, sh.scalar, sh.scalar, sh.scalar),
        (sh.params, sh.opt, sh.scalar),
    )


def lower(trainer, micro_batches) -> dict:
    step, zero, params, q = np.int32(0), np.float32(0), trainer.params, trainer.estimator.settings_of(trainer.spec).q
    opt_state = jax.eval_shape(trainer.optimizer.init, params)
    if trainer._one_program:
        return {"_whole": trainer._whole.lower(trainer.frozen, params, opt_state, 0.0, step, micro_batches)}
    losses = [[(zero, zero)] * len(micro_batches)] * q
    lowered = {
        "_move_loss": trainer._move_loss.lower(trainer.frozen, params, 0.0, step, step, micro_batches[0]),
        "_update": trainer._update.lower(params, opt_state, losses, 0.0, step),
    }
    if restores(trainer):
        lowered["_move"] = trainer._move.lower(params, 0.0, step, step)
    return lowered


def restores(trainer) -> int:
    """The moves that put theta back within a step: one after each direction's pair of passes on each micro-batch,
    but the last, which the update makes."""
    return trainer.micro_batches * trainer.estimator.settings_of(trainer.spec).q - 1


def programs(trainer) -> list[tuple]:
    if trainer._one_program:
        return [(trainer._whole, 1)]
    m, q = trainer.micro_batches, trainer.estimator.settings_of(trainer.spec).q
    moves = [(trainer._move, restores(trainer))] if restores(trainer) else []
    return [(trainer._move_loss, 2 * m * q), *moves, (trainer._update, 1)]


def step(trainer, micro_batches):
    step, settings = np.int32(trainer.step_count), trainer.estimator.settings_of(trainer.spec)
    if trainer._one_program:
        args = (trainer.frozen, trainer.params, trainer.opt_state, settings.eps, step, micro_batches)
        trainer.params, trainer.opt_state, total = trainer._whole(*args)
        return total
    trainer.params, losses = spsa_passes(
        lambda p, scale, k, batch: trainer._move_loss(trainer.frozen, p, scale, step, np.int32(k), batch),
        lambda p, scale, k: trainer._move(p, scale, step, np.int32(k)),
        trainer.params,
        micro_batches,
        eps=settings.eps,
        q=settings.q,
        restore=False,  # the update restores the last +eps with the z_0 it draws anyway (seeded_update)
    )
    trainer.params, trainer.opt_state, total = trainer._update(
        trainer.params, trainer.opt_state, losses, settings.eps, step
    )
    return total


def move(trainer, params, scale, step, k):
    """theta + scale z_k, z_k regenerated from its keys, written over the donated theta."""
    s = trainer.spec
    return perturb(params, scale, s.seed, step, s.directions, trainer.gather, k)


def move_loss(trainer, frozen, params, scale, step, k, batch):
    """The move, then one forward pass there (L+ or L-): (the moved parameters, the loss)."""
    params = move(trainer, params, scale, step, k)
    return params, trainer.on(frozen).loss_of(params, batch, dropout_key(trainer.spec.seed, step))


def update(trainer, params, opt_state, losses, eps, step):
    """The projections from the passes' losses, then the optimizer's update with g = 1/q sum_k proj_k z_k, the z_k
    regenerated from the step, the last +eps z_0 restored in it: (params, opt_state, the step's loss)."""
    s = trainer.spec
    total, projs = spsa_projections(losses, eps)
    params, opt_state = seeded_update(
        trainer.optimizer, params, opt_state, projs / len(losses), s.seed, step, s.directions, trainer.gather, eps
    )
    return params, opt_state, total


def whole(trainer, frozen, params, opt_state, eps, step, micro_batches):
    """The step's programs as one, the same bodies in the same order: the passes (move_loss), the restoring moves
    between them (move), then the update: (params, opt_state, the step's loss)."""
    params, losses = spsa_passes(
        lambda p, scale, k, batch: move_loss(trainer, frozen, p, scale, step, k, batch),
        lambda p, scale, k: move(trainer, p, scale, step, k),
        params,
        micro_batches,
        eps=eps,
        q=trainer.estimator.settings_of(trainer.spec).q,
        restore=False,
    )
    return update(trainer, params, opt_state, losses, eps, step)


def spsa_passes(move_loss_fn, move_fn, params, micro_batches, *, eps, q: int = 1, restore=True):
    """SPSA's forward passes: (the parameters after them, losses[k][n] = (L+, L-) of direction k on micro-batch
    n), perturbing by +eps, -2eps, +eps with `move_loss_fn(params, scale, k, batch)` -> (moved, loss) and
    `move_fn(params, scale, k)` (the restored parameters carry the same rounding as torch's in-place round trip).
    The directions go from z_{q-1} down to z_0, as in torch; restore=False: z_0's last +eps is left to the update
    (seeded_update's shift), which draws z_0 anyway: the parameters come back at theta - eps z_0."""
    m = len(micro_batches)
    losses = [[None] * m for _ in range(q)]
    for k in reversed(range(q)):
        for n, batch in enumerate(micro_batches):
            params, loss_plus = move_loss_fn(params, +eps, k, batch)
            params, loss_minus = move_loss_fn(params, -2 * eps, k, batch)
            if restore or k > 0 or n < m - 1:
                params = move_fn(params, +eps, k)
            losses[k][n] = (loss_plus, loss_minus)
    return params, losses


def spsa_projections(losses, eps):
    """(mean of the L+ and L-, the q projected gradients (L+ - L-) / (2 eps) averaged over the micro-batches)
    from spsa_passes' losses, summed in the order the passes ran."""
    q, m = len(losses), len(losses[0])
    projs, total = [0.0] * q, 0.0
    for k in reversed(range(q)):
        for loss_plus, loss_minus in losses[k]:
            projs[k] = projs[k] + (loss_plus - loss_minus) / (2 * eps) / m
            total = total + (loss_plus + loss_minus) / 2 / m / q
    return total, jnp.stack([jnp.asarray(p, jnp.float32) for p in projs])


def spsa_gradient(
    loss_of, params, micro_batches, key, *, eps: float, seed: int, step, q: int = 1, kind="gaussian", tangents=None
):
    """SPSA (Malladi et al. 2023; q perturbations as ZO-Bench): the q projections along seeded z_k, and the estimate
    1/q sum_k proj_k z_k regenerated from their keys. `tangents`: given directions (pytrees like params, tests)
    instead of seeded ones, one per perturbation. Returns the restored parameters, the step's loss and the
    estimate."""
    if tangents is not None:
        q = len(tangents)
        move_fn = lambda p, scale, k: jax.tree.map(lambda x, z: x + scale * z, p, tangents[k])  # noqa: E731
    else:
        move_fn = lambda p, scale, k: perturb(p, scale, seed, step, kind, k=k)  # noqa: E731
    params, losses = spsa_passes(*evaluated(loss_of, move_fn, key), params, micro_batches, eps=eps, q=q)
    total, projs = spsa_projections(losses, eps)
    if tangents is not None:
        return params, total, tangent_gradient(tangents, projs / q)
    return params, total, seeded_gradient(params, projs / q, seed, step, kind)


def evaluated(loss_of, move_fn, key):
    """(move_loss_fn, move_fn) for spsa_passes from a loss and a move, traced in one program (the gradient)."""

    def move_loss_fn(params, scale, k, batch):
        params = move_fn(params, scale, k)
        return params, loss_of(params, batch, key)

    return move_loss_fn, move_fn
