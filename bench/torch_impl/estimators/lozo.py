"""lozo in torch: LOZO (bench/estimators/lozo.py has the rule): in-place perturbations +eps, -2eps, +eps along U V^T
per weight matrix (z per other tensor), two forward passes, g = proj U V^T, each factor regenerated from its seed
where the optimizer reaches the tensor. Mirror of jax_impl/estimators/lozo.py."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from bench.torch_impl.directions import direction, direction_seed, observe
from bench.torch_impl.estimators.mezo import spsa_projection
from bench.torch_impl.loss import identity, loss_fn


def gradient(trainer, micro_batches, tangents=None, in_step=False):
    s, settings = trainer.spec, trainer.estimator.settings_of(trainer.spec)
    return lozo_gradient(
        lambda batch: loss_fn(trainer.module, batch),
        trainer.params,
        micro_batches,
        eps=settings.eps,
        rank=settings.rank,
        interval=settings.interval,
        seed=s.seed,
        step=trainer.step_count,
        reduce=trainer.reduce,
        kind=s.directions,
        tangents=tangents,
    )


def low_rank_direction(
    p: torch.Tensor, i: int, name: str, *, rank: int, interval: int, seed: int, step: int, kind: str, tangents=None
):
    """Tensor i's perturbation at `step`: U V^T for a matrix (p's first dimension by the rest), U drawn for the step
    and V for its block of `interval` steps; z, MeZO's, for any other tensor; or the given tangent's."""
    if tangents is not None:
        return tangents[0][name].clone()
    if p.ndim < 2:
        return direction(p, direction_seed(seed, step, 0, i), kind=kind)
    m, n = p.shape[0], p[0].numel()
    u = direction(p.new_empty(m, rank), direction_seed(seed, step, 0, i), whole=True, kind=kind)
    v = direction(p.new_empty(n, rank), direction_seed(seed, step // interval, 1, i), whole=True, kind=kind)
    return observe("directions", (u @ v.T).view_as(p))


@torch.no_grad()
def lozo_gradient(
    loss_of,
    params,
    micro_batches,
    *,
    eps: float,
    rank: int,
    interval: int,
    seed: int,
    step: int,
    reduce=identity,
    kind: str = "gaussian",
    tangents=None,
):
    """LOZO's two passes of `loss_of(batch)` per micro-batch, perturbing `params` in place by +eps, -2eps, +eps along
    each tensor's low-rank direction. Returns the mean of L+ and L- as the step's loss and the estimate proj Z,
    drawn tensor by tensor where the update needs it. `tangents`: a given direction (one dict like params, tests)
    instead of the seeded one. `reduce` averages [loss, proj] over devices."""
    draw = dict(rank=rank, interval=interval, seed=seed, step=step, kind=kind, tangents=tangents)

    def move(scale, k):
        for i, (name, p) in enumerate(params.items()):
            p.add_(low_rank_direction(p, i, name, **draw), alpha=scale)

    total, (proj,) = spsa_projection(loss_of, move, micro_batches, eps=eps)
    total, proj = reduce(torch.stack([torch.as_tensor(total), torch.as_tensor(proj)]))
    return total, LowRankGradient(params, float(proj), draw)


@dataclass
class LowRankGradient:
    """g[name] = proj Z[name], Z regenerated (low_rank_direction) on demand, one tensor at a time."""

    params: dict[str, torch.Tensor]
    proj: float
    draw: dict

    def __iter__(self):
        for i, (name, p) in enumerate(self.params.items()):
            yield name, low_rank_direction(p, i, name, **self.draw).mul_(self.proj)

    def materialize(self) -> dict[str, torch.Tensor]:
        return dict(iter(self))
