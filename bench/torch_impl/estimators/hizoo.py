"""hizoo in torch: HiZOO (bench/estimators/hizoo.py has the rule): the loss at theta and at theta +- eps z / sqrt(H)
with in-place perturbations, then per tensor the Hessian estimate's update and g = proj z / sqrt(H), z redrawn
from its seed where the optimizer reaches the tensor. Mirror of jax_impl/estimators/hizoo.py."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from bench.torch_impl.directions import direction, direction_seed, observe
from bench.torch_impl.loss import identity, loss_fn


def init_state(trainer) -> dict[str, torch.Tensor]:
    """The diagonal Hessian estimate H, ones: made by the first step, as optimizer state is (excess memory)."""
    return {name: observe("directions", torch.ones_like(p)) for name, p in trainer.params.items()}


def gradient(trainer, micro_batches, tangents=None, in_step=False):
    s, settings = trainer.spec, trainer.estimator.settings_of(trainer.spec)
    return hizoo_gradient(
        lambda batch: loss_fn(trainer.module, batch),
        trainer.params,
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
    the estimate, drawn tensor by tensor where the update needs it: H's update, then g = proj z / sqrt(H). `commit`
    (the timed step): H keeps its update; else it is left as it was (gradient() computes, never updates).
    `tangents`: a given direction z (one dict like params, tests) instead of the seeded one. `reduce` averages
    [L0, proj, second difference] over devices."""

    def z_of(i, name, p):
        return tangents[0][name] if tangents is not None else direction(p, direction_seed(seed, step, 0, i), kind=kind)

    def move(scale):
        for i, (name, p) in enumerate(params.items()):
            p.add_(z_of(i, name, p) * hessian[name].rsqrt(), alpha=scale)

    total, proj, second = reduce(torch.stack(hizoo_passes(loss_of, move, micro_batches, eps=eps)))
    curvature = abs(float(second)) / (2 * eps * eps)
    return total, HessianScaledGradient(
        params, hessian, float(proj), curvature, alpha, seed, step, kind, commit, tangents
    )


@dataclass
class HessianScaledGradient:
    """g[name] = proj z / sqrt(H'), H' = (1 - alpha) H + alpha curvature H z^2, z regenerated from its seed (or the
    given tangent) on demand, one tensor at a time; `commit`: H' is written over H as each tensor is drawn."""

    params: dict[str, torch.Tensor]
    hessian: dict[str, torch.Tensor]
    proj: float
    curvature: float
    alpha: float
    seed: int
    step: int
    kind: str = "gaussian"
    commit: bool = False
    tangents: list | None = None

    def __iter__(self):
        for i, (name, p) in enumerate(self.params.items()):
            if self.tangents is not None:
                z = self.tangents[0][name].clone()
            else:
                z = direction(p, direction_seed(self.seed, self.step, 0, i), kind=self.kind)
            h = self.hessian[name]
            updated = h * z.square() * (self.alpha * self.curvature) + h * (1 - self.alpha)
            if self.commit:
                h.copy_(updated)
            yield name, z.mul_(updated.rsqrt_()).mul_(self.proj)

    def materialize(self) -> dict[str, torch.Tensor]:
        return dict(iter(self))
