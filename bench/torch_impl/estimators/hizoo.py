"""hizoo in torch: HiZOO (bench/estimators/hizoo.py has the rule): the loss at theta and at theta +- eps z / sqrt(H)
with in-place perturbations, then a unit at a time the Hessian estimate's update and g = proj z / sqrt(H), z
redrawn from its seed where the optimizer reaches the unit (foreach ops over its tensors). Mirror of
jax_impl/estimators/hizoo.py."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from bench.torch_impl.directions import draw, materialize, observe, units_of
from bench.torch_impl.loss import identity, loss_fn


def init_state(trainer) -> dict[str, torch.Tensor]:
    """The diagonal Hessian estimate H, ones, flat per tensor (as the foreach ops read it): made by the first step,
    as optimizer state is (excess memory)."""
    return {name: observe("directions", torch.ones_like(p).view(-1)) for name, p in trainer.params.items()}


def gradient(trainer, micro_batches, tangents=None, in_step=False):
    s, settings = trainer.spec, trainer.estimator.settings_of(trainer.spec)
    return hizoo_gradient(
        lambda batch: loss_fn(trainer.module, batch),
        trainer.units,
        trainer.state,
        micro_batches,
        eps=settings.eps,
        alpha=settings.alpha,
        seed=s.seed,
        step=trainer.step_count,
        reduce=trainer.reduce,
        kind=s.directions,
        commit=in_step,
        tangents=tangents,
    )


def hizoo_passes(loss_of, move, micro_batches, *, eps: float) -> list[torch.Tensor]:
    """HiZOO's three passes per micro-batch: [L0, the projection (L+ - L-) / (2 eps), the second difference
    L+ + L- - 2 L0], perturbing in place by +eps, -2eps, +eps with `move(scale)`."""
    total = proj = second = 0.0
    m = len(micro_batches)
    for batch in micro_batches:
        loss0 = loss_of(batch)
        move(+eps)
        loss_plus = loss_of(batch)
        move(-2 * eps)
        loss_minus = loss_of(batch)
        move(+eps)
        total = total + loss0 / m
        proj = proj + (loss_plus - loss_minus) / (2 * eps) / m
        second = second + (loss_plus + loss_minus - 2 * loss0) / m
    return [torch.as_tensor(x) for x in (total, proj, second)]


@torch.no_grad()
def hizoo_gradient(
    loss_of,
    params,
    hessian,
    micro_batches,
    *,
    eps: float,
    alpha: float,
    seed: int,
    step: int,
    reduce=identity,
    kind: str = "gaussian",
    commit: bool = False,
    tangents=None,
):
    """HiZOO's three passes of `loss_of(batch)` per micro-batch: at theta, and at theta +- eps z / sqrt(H) by
    in-place perturbations +eps, -2eps, +eps of `params`. Returns L0 (the loss at theta) as the step's loss, and
    the estimate, drawn a unit at a time where the update needs it: H's update, then g = proj z / sqrt(H). `commit`
    (the timed step): H keeps its update; else it is left as it was (gradient() computes, never updates).
    `tangents`: a given direction z (one dict like params, tests) instead of the seeded one. `reduce` averages
    [L0, proj, second difference] over devices. `params`: the trainer's Units, or a dict of tensors; `hessian`:
    H by name, each tensor's flat (init_state)."""
    units = units_of(params)
    draws = dict(seed=seed, step=step, kind=kind, tangents=tangents)

    def move(scale):
        for unit in units:
            zs = torch._foreach_mul(unit_direction(unit, **draws), torch._foreach_rsqrt(held(hessian, unit)))
            torch._foreach_add_(unit.held, zs, alpha=scale)

    total, proj, second = reduce(torch.stack(hizoo_passes(loss_of, move, micro_batches, eps=eps)))
    curvature = abs(float(second)) / (2 * eps * eps)
    return total, HessianScaledGradient(units, hessian, float(proj), curvature, alpha, draws, commit)


def unit_direction(unit, *, seed: int, step: int, kind: str, tangents=None) -> list[torch.Tensor]:
    """z over a unit's tensors, the flat parts this device holds: drawn from its seed, or the given tangent's."""
    if tangents is not None:
        return unit.parts(torch.cat([tangents[0][n].reshape(-1) for n in unit.names]))
    return unit.parts(draw(unit, seed, step, 0, kind))


def held(hessian: dict[str, torch.Tensor], unit) -> list[torch.Tensor]:
    """H over a unit's tensors (init_state keeps each flat, as the parts of a draw are)."""
    return [hessian[n] for n in unit.names]


@dataclass
class HessianScaledGradient:
    """g = proj z / sqrt(H'), H' = (1 - alpha) H + alpha curvature H z^2, z regenerated from its seed (or the given
    tangent) on demand, a unit at a time; `commit`: H' is written over H as each unit is drawn."""

    units: list
    hessian: dict[str, torch.Tensor]
    proj: float
    curvature: float
    alpha: float
    draws: dict
    commit: bool = False

    def __iter__(self):
        for unit in self.units:
            zs, hs = unit_direction(unit, **self.draws), held(self.hessian, unit)
            # H' = H (alpha curvature z^2 + 1 - alpha)
            updated = torch._foreach_mul(
                hs,
                torch._foreach_add(
                    torch._foreach_mul(torch._foreach_mul(zs, zs), self.alpha * self.curvature), 1 - self.alpha
                ),
            )
            if self.commit:
                torch._foreach_copy_(hs, updated)
            torch._foreach_rsqrt_(updated)
            torch._foreach_mul_(zs, updated)  # z is this unit's draw (or a copy of the tangent): scaled in place
            torch._foreach_mul_(zs, self.proj)
            yield unit, zs
            del zs, hs, updated  # before the next unit is drawn

    def materialize(self) -> dict[str, torch.Tensor]:
        return materialize(self)
