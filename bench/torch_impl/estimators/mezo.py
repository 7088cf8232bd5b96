"""mezo in torch: SPSA as MeZO runs it (Malladi et al. 2023, Algorithm 1), in-place seeded perturbations +eps,
-2eps, +eps, two forward passes, g = (L+ - L-)/(2 eps) z with z regenerated from its seed. Mirror of
jax_impl/estimators/mezo.py."""

from __future__ import annotations

import torch

from bench.torch_impl.directions import SeededGradient, perturb
from bench.torch_impl.loss import identity, loss_fn


def gradient(trainer, micro_batches, tangents=None, in_step=False):
    s = trainer.spec
    return spsa_gradient(
        trainer.module,
        trainer.params,
        micro_batches,
        eps=s.mezo_eps,
        seed=s.seed,
        step=trainer.step_count,
        reduce=trainer.reduce,
        kind=s.directions,
        restore=not in_step,
    )


@torch.no_grad()
def spsa_gradient(
    model,
    params,
    micro_batches,
    *,
    eps: float,
    seed: int,
    step: int,
    reduce=identity,
    kind: str = "gaussian",
    restore: bool = True,
):
    """MeZO: projected gradient (L(theta + eps z) - L(theta - eps z)) / (2 eps) along one seeded z, two forward
    passes with in-place perturbations +eps, -2eps, +eps. Returns the mean of L+ and L- as the step's loss.
    `reduce` averages [loss, projection] over devices (each device's L+ - L- taken first: the cancellation loses
    no more than on one device). restore=False: the last +eps is left to the estimate, which restores each tensor
    with the z it draws anyway when the update reaches it (SeededGradient's shift): one draw of z fewer."""
    proj, total = 0.0, 0.0
    for n, batch in enumerate(micro_batches):
        perturb(params, +eps, seed, step, kind)
        loss_plus = loss_fn(model, batch)
        perturb(params, -2 * eps, seed, step, kind)
        loss_minus = loss_fn(model, batch)
        if restore or n < len(micro_batches) - 1:
            perturb(params, +eps, seed, step, kind)
        proj = proj + (loss_plus - loss_minus) / (2 * eps) / len(micro_batches)
        total = total + (loss_plus + loss_minus) / 2 / len(micro_batches)
    total, proj = reduce(torch.stack([total, proj]))
    return total, SeededGradient(params, [float(proj)], seed, step, kind, shift=0.0 if restore else eps)
