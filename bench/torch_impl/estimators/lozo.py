"""lozo in torch: LOZO (bench/estimators/lozo.py has the rule): in-place perturbations +eps, -2eps, +eps along U V^T
per weight matrix (z per other tensor), two forward passes, g = proj U V^T, the factors regenerated from their
seeds a unit at a time where the update reaches it. Mirror of jax_impl/estimators/lozo.py."""

from __future__ import annotations

import weakref
from dataclasses import dataclass

import torch

from bench.torch_impl.directions import direction_seed, materialize, observe, random, units_of
from bench.torch_impl.estimators.mezo import spsa_projection
from bench.torch_impl.loss import identity, loss_fn


def gradient(trainer, micro_batches, tangents=None, in_step=False):
    s, settings = trainer.spec, trainer.estimator.settings_of(trainer.spec)
    return lozo_gradient(
        lambda batch: loss_fn(trainer.module, batch),
        trainer.units,
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


def low_rank_parts(unit, *, rank: int, interval: int, seed: int, step: int, kind: str, tangents=None) -> list:
    """A unit's perturbation at `step`, one flat part per tensor: U V^T for a matrix (p's first dimension by the
    rest, so V runs along a Linear's input, as the authors keep it), U drawn for the step and V for its block of
    `interval` steps; z, MeZO's, for any other tensor; or the given tangent's. The unit's matrices of one shape are
    drawn and multiplied together (one U, one V, one batched matmul per shape), its vectors by one draw."""
    if tangents is not None:
        return [tangents[0][n].reshape(-1).clone() for n in unit.names]
    vectors, groups = _plan(unit)
    parts = [None] * len(unit.names)
    g = torch.Generator(device=unit.device)
    if vectors:
        g.manual_seed(direction_seed(seed, step, 0, unit.index, 0))
        z = observe("directions", random((sum(unit.sizes[i] for i in vectors),), g, unit.device, unit.dtype, kind))
        for i, x in zip(vectors, z.split([unit.sizes[i] for i in vectors])):
            parts[i] = x
    for j, ((m, n), members) in enumerate(groups):
        g.manual_seed(direction_seed(seed, step, 0, unit.index, 1 + 2 * j))
        u = observe("directions", random((len(members), m, rank), g, unit.device, unit.dtype, kind))
        g.manual_seed(direction_seed(seed, step // interval, 0, unit.index, 2 + 2 * j))
        v = observe("directions", random((len(members), n, rank), g, unit.device, unit.dtype, kind))
        products = observe("directions", torch.bmm(u, v.transpose(1, 2)))  # (G, m, n)
        for i, x in zip(members, products.view(len(members), -1).unbind(0)):
            parts[i] = x
    return parts


_PLANS: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def _plan(unit) -> tuple[list[int], list[tuple[tuple[int, int], list[int]]]]:
    """(the unit's vectors, its matrices grouped by shape (m, n) in order of first appearance), made once a unit."""
    if unit not in _PLANS:
        vectors, groups = [], {}
        for i, shape in enumerate(unit.shapes):
            if len(shape) < 2:
                vectors.append(i)
            else:
                groups.setdefault((shape[0], shape[1:].numel()), []).append(i)
        _PLANS[unit] = vectors, list(groups.items())
    return _PLANS[unit]


def low_rank_directions(params, *, rank: int, interval: int, seed: int, step: int, kind: str = "gaussian"):
    """Every tensor's perturbation at `step`, by name, in its shape (tests)."""
    draw = dict(rank=rank, interval=interval, seed=seed, step=step, kind=kind)
    return {
        n: x.view(s)
        for unit in units_of(params)
        for n, x, s in zip(unit.names, low_rank_parts(unit, **draw), unit.shapes)
    }


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
    """LOZO's two passes of `loss_of(batch)` per micro-batch, perturbing `params` (the trainer's Units, or a dict of
    tensors) in place by +eps, -2eps, +eps along each tensor's low-rank direction, a unit at a time. Returns the
    mean of L+ and L- as the step's loss and the estimate proj Z, drawn a unit at a time where the update needs
    it. `tangents`: a given direction (one dict like params, tests) instead of the seeded one. `reduce` averages
    [loss, proj] over devices."""
    units = units_of(params)
    draw = dict(rank=rank, interval=interval, seed=seed, step=step, kind=kind, tangents=tangents)

    def move(scale, k):
        for unit in units:
            torch._foreach_add_(unit.held, low_rank_parts(unit, **draw), alpha=scale)

    total, (proj,) = spsa_projection(loss_of, move, micro_batches, eps=eps)
    total, proj = reduce(torch.stack([torch.as_tensor(total), torch.as_tensor(proj)]))
    return total, LowRankGradient(units, float(proj), draw)


@dataclass
class LowRankGradient:
    """g = proj Z, Z regenerated (low_rank_parts) on demand, a unit at a time."""

    units: list
    proj: float
    draw: dict

    def __iter__(self):
        for unit in self.units:
            parts = low_rank_parts(unit, **self.draw)
            torch._foreach_mul_(parts, self.proj)
            yield unit, parts
            del parts  # before the next unit is drawn

    def materialize(self) -> dict[str, torch.Tensor]:
        return materialize(self)
