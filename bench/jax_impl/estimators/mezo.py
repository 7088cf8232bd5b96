"""mezo in JAX: SPSA as MeZO runs it (Malladi et al. 2023, Algorithm 1), perturbations +eps, -2eps, +eps, two
forward passes, g = (L+ - L-)/(2 eps) z with z regenerated from its key. Mirror of torch_impl/estimators/mezo.py.

The timed step runs separate programs: each perturbation donates the parameters, so it overwrites them in place as
torch's add_ does (inside one jit XLA cannot write theta + eps z over the donated input and holds a second
parameter-sized buffer); the loss; and an update that regenerates z, restoring the last +eps with it.
"""

from __future__ import annotations

from functools import partial

import jax
import jax.numpy as jnp
import numpy as np

from bench.jax_impl.directions import perturb, seeded_gradient, seeded_update
from bench.jax_impl.estimators import Held
from bench.jax_impl.loss import dropout_key


def memory(trainer, micro_batches, temp) -> Held:
    # one leaf's direction at a time, fused into the perturbation
    return Held(directions=max((x.nbytes for x in jax.tree.leaves(trainer.params)), default=0))


def gradient(trainer, params, micro_batches, step, tangents=None):
    s = trainer.spec
    return spsa_gradient(
        trainer.loss_of,
        params,
        micro_batches,
        dropout_key(s.seed, step),
        eps=s.mezo_eps,
        seed=s.seed,
        step=step,
        kind=s.directions,
    )


def prepare(trainer, shardings) -> None:
    sh, s = shardings, trainer.spec
    trainer._perturb = trainer.jit(
        lambda p, scale, step: perturb(p, scale, s.seed, step, s.directions, trainer.gather),
        (0,),
        (sh.params, sh.scalar, sh.scalar),
        sh.params,
    )
    trainer._loss = trainer.jit(partial(loss, trainer), (), (sh.frozen, sh.params, sh.batch, sh.scalar), sh.scalar)
    trainer._update = trainer.jit(
        partial(update, trainer), (0, 1), (sh.params, sh.opt, sh.scalar, sh.scalar), (sh.params, sh.opt)
    )


def lower(trainer, micro_batches) -> dict:
    step, params = np.int32(0), trainer.params
    opt_state = jax.eval_shape(trainer.optimizer.init, params)
    key = dropout_key(trainer.spec.seed, step)
    return {
        "_perturb": trainer._perturb.lower(params, 0.0, step),
        "_loss": trainer._loss.lower(trainer.frozen, params, micro_batches[0], key),
        "_update": trainer._update.lower(params, opt_state, np.zeros(1, np.float32), step),
    }


def programs(trainer) -> list[tuple]:
    m = trainer.micro_batches  # the last +eps is restored in _update
    return [(trainer._perturb, 3 * m - 1), (trainer._loss, 2 * m), (trainer._update, 1)]


def step(trainer, micro_batches):
    step = np.int32(trainer.step_count)
    trainer.params, total, proj = spsa_projection(
        lambda p, batch, key: trainer._loss(trainer.frozen, p, batch, key),
        lambda p, scale: trainer._perturb(p, scale, step),
        trainer.params,
        micro_batches,
        dropout_key(trainer.spec.seed, step),
        eps=trainer.spec.mezo_eps,
        restore=False,  # the update restores the last +eps with the z it draws anyway (seeded_update)
    )
    trainer.params, trainer.opt_state = trainer._update(
        trainer.params, trainer.opt_state, jnp.reshape(proj, (1,)), step
    )
    return total


def loss(trainer, frozen, params, batch, key):
    """One forward pass (L+ or L-)."""
    return trainer.on(frozen).loss_of(params, batch, key)


def update(trainer, params, opt_state, coeffs, step):
    """Optimizer update with g = coeffs[0] z, z regenerated from the step, the last +eps z restored in it."""
    s = trainer.spec
    return seeded_update(
        trainer.optimizer, params, opt_state, coeffs, s.seed, step, s.directions, trainer.gather, s.mezo_eps
    )


def spsa_projection(loss_of, perturb_fn, params, micro_batches, key, *, eps: float, restore: bool = True):
    """MeZO's two forward passes: (restored parameters, mean of L+ and L-, projected gradient
    (L(theta + eps z) - L(theta - eps z)) / (2 eps)), perturbing by +eps, -2eps, +eps with `perturb_fn(params,
    scale)` (the restored parameters carry the same rounding as torch's in-place round trip). restore=False: the
    last +eps is left to the update (seeded_update's shift), which draws z anyway: the parameters come back at
    theta - eps z."""
    proj, total = 0.0, 0.0
    for n, batch in enumerate(micro_batches):
        params = perturb_fn(params, +eps)
        loss_plus = loss_of(params, batch, key)
        params = perturb_fn(params, -2 * eps)
        loss_minus = loss_of(params, batch, key)
        if restore or n < len(micro_batches) - 1:
            params = perturb_fn(params, +eps)
        proj = proj + (loss_plus - loss_minus) / (2 * eps) / len(micro_batches)
        total = total + (loss_plus + loss_minus) / 2 / len(micro_batches)
    return params, total, proj


def spsa_gradient(loss_of, params, micro_batches, key, *, eps: float, seed: int, step, kind: str = "gaussian"):
    """MeZO (Malladi et al. 2023): the projection along one seeded z, and the estimate proj * z regenerated from
    its keys. Returns the restored parameters, the step's loss and the estimate."""
    params, total, proj = spsa_projection(
        loss_of, lambda p, scale: perturb(p, scale, seed, step, kind), params, micro_batches, key, eps=eps
    )
    return params, total, seeded_gradient(params, jnp.reshape(proj, (1,)), seed, step, kind)
