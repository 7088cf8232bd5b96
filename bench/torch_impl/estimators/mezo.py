"""mezo in torch: SPSA as MeZO runs it (Malladi et al. 2023, Algorithm 1), with q perturbations averaged per step
(ZO-Bench's q; bench/estimators/mezo.py has the rule): for each seeded z_k, in-place perturbations +eps, -2eps, +eps
and two forward passes, g = 1/q sum_k (L+ - L-)/(2 eps) z_k with each z_k regenerated from its seed. Mirror of
jax_impl/estimators/mezo.py."""

from __future__ import annotations

import torch

from bench.torch_impl.directions import SeededGradient, TangentGradient, perturb, units_of
from bench.torch_impl.loss import identity, loss_fn


def gradient(trainer, micro_batches, tangents=None, in_step=False):
    s, settings = trainer.spec, trainer.estimator.settings_of(trainer.spec)
    return spsa_gradient(
        lambda batch: loss_fn(trainer.module, batch),
        trainer.units,
        micro_batches,
        eps=settings.eps,
        q=settings.q,
        seed=s.seed,
        step=trainer.step_count,
        reduce=trainer.reduce,
        kind=s.directions,
        restore=not in_step,
        tangents=tangents,
    )


@torch.no_grad()
def spsa_gradient(
    loss_of,
    params,
    micro_batches,
    *,
    eps: float,
    seed: int,
    step: int,
    q: int = 1,
    reduce=identity,
    kind: str = "gaussian",
    restore: bool = True,
    tangents=None,
):
    """SPSA along q seeded z_k: the projected gradients (L(theta + eps z_k) - L(theta - eps z_k)) / (2 eps) of
    `loss_of(batch)`, two forward passes each with in-place perturbations +eps, -2eps, +eps of `params`. Returns
    the mean of the L+ and L- as the step's loss and the estimate 1/q sum_k proj_k z_k, drawn where the update
    needs it. The directions go from z_{q-1} down to z_0, so the step's last perturbation is z_0's: restore=False
    leaves its last +eps to the estimate, which restores each tensor with the z_0 it draws anyway
    (SeededGradient's shift), one draw fewer. `tangents`: given directions (dicts like params, tests) instead of
    seeded ones, one per perturbation. `reduce` averages [loss, proj_0..proj_{q-1}] over devices (each device's
    L+ - L- taken first: the cancellation loses no more than on one device). `params`: the trainer's Units, or
    a dict of tensors."""
    units = units_of(params)
    if tangents is not None:
        q, restore = len(tangents), True

        def move(scale, k):
            for name, p in units.params.items():
                p.add_(tangents[k][name], alpha=scale)
    else:

        def move(scale, k):
            perturb(units, scale, seed, step, kind, k)

    total, projs = spsa_projection(loss_of, move, micro_batches, eps=eps, q=q, restore=restore)
    total, *projs = reduce(torch.stack([torch.as_tensor(x) for x in (total, *projs)]))
    coeffs = [float(p) / q for p in projs]
    if tangents is not None:
        return total, TangentGradient(units, tangents, coeffs)
    return total, SeededGradient(units, coeffs, seed, step, kind, shift=0.0 if restore else eps)


def spsa_projection(loss_of, move, micro_batches, *, eps: float, q: int = 1, restore: bool = True):
    """SPSA's forward passes, as jax_impl's spsa_projection: (mean of the L+ and L-, the q projected gradients
    (L(theta + eps z_k) - L(theta - eps z_k)) / (2 eps)), perturbing in place by +eps, -2eps, +eps with
    `move(scale, k)`, from z_{q-1} down to z_0. restore=False: z_0's last +eps is left to the update."""
    projs, total, m = [0.0] * q, 0.0, len(micro_batches)
    for k in reversed(range(q)):
        for n, batch in enumerate(micro_batches):
            move(+eps, k)
            loss_plus = loss_of(batch)
            move(-2 * eps, k)
            loss_minus = loss_of(batch)
            if restore or k > 0 or n < m - 1:
                move(+eps, k)
            projs[k] = projs[k] + (loss_plus - loss_minus) / (2 * eps) / m
            total = total + (loss_plus + loss_minus) / 2 / m / q
    return total, projs
