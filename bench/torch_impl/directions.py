"""Seeded random directions: jvp's tangents and MeZO's perturbations, regenerated from their seeds rather than
stored. Mirror of jax_impl/directions.py.

Direction k of parameter tensor i at `step` has the seed direction_seed(seed, step, k, i), so any tensor's direction
can be drawn again alone, and the modes never hold one whole unless they must:

    sample_tangent      the whole direction (tests; the func/dual/naive jvp passes take it whole)
    SeededTangent       a tangent drawn tensor by tensor as the lazy pass reaches each module
    perturb             theta += scale z in place, tensor by tensor (MeZO)
    SeededGradient      g = sum_k c_k z_k, each tensor's drawn when the optimizer reaches it
    TangentGradient     g from tangents held whole (jvp's one kept tangent, tests)
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from bench.torch_impl.parallel import local, local_rows


def direction_seed(seed: int, step: int, k: int, index: int) -> int:
    """Seed of direction k of parameter tensor `index` at `step`: any tensor's direction can be regenerated alone."""
    return int(np.random.SeedSequence([seed, step, k, index]).generate_state(1, np.uint64)[0] >> 1)


# bench.torch_impl.memory's instrumented step watches the buffers the modes make (observe(category, tensor));
# empty on the timed path
WATCHERS: list = []


def observe(category: str, t: torch.Tensor) -> torch.Tensor:
    """Report a new buffer of a memory `category` (directions | grads) to the breakdown, if one is watching."""
    for watch in WATCHERS:
        watch(category, t)
    return t


def direction(p: torch.Tensor, seed: int, whole: bool = False, kind: str = "gaussian") -> torch.Tensor:
    """The seeded direction of p's shape, N(0, I) or (kind="rademacher") +-1 entries from random bits, both with
    E[z z^T] = I; where FSDP2 shards p, the rows this device holds of it (`whole`: all of it, for a forward pass
    through p gathered whole)."""
    g = torch.Generator(device=p.device)
    g.manual_seed(seed)
    if kind == "rademacher":
        z = rademacher(p.shape, g, p.device, p.dtype)
    else:
        z = torch.randn(p.shape, generator=g, device=p.device, dtype=p.dtype)
    observe("directions", z)
    return z if whole else local_rows(z, p)


def rademacher(shape, g: torch.Generator, device, dtype) -> torch.Tensor:
    """+-1 entries, one random bit each: 8 bits per drawn byte, unpacked (torch draws no single bits itself)."""
    n = int(np.prod(shape))
    packed = torch.randint(0, 256, ((n + 7) // 8,), generator=g, device=device, dtype=torch.uint8)
    bits = packed[:, None].bitwise_right_shift(torch.arange(8, device=device, dtype=torch.uint8)).bitwise_and_(1)
    return bits.view(-1)[:n].to(dtype).mul_(2).sub_(1).view(shape)


def sample_tangent(
    params: dict[str, torch.Tensor], seed: int, step: int, k: int, kind: str = "gaussian"
) -> dict[str, torch.Tensor]:
    return {n: direction(p, direction_seed(seed, step, k, i), kind=kind) for i, (n, p) in enumerate(params.items())}


@dataclass
class SeededTangent:
    """Tangent k of `step` drawn tensor by tensor when asked for (tangent[name]), never held whole: the same
    values as sample_tangent(params, seed, step, k)."""

    params: dict[str, torch.Tensor]
    seed: int
    step: int
    k: int
    kind: str = "gaussian"

    def __post_init__(self):
        self.index = {name: i for i, name in enumerate(self.params)}

    def __getitem__(self, name: str) -> torch.Tensor:
        # whole: the pass runs the module with the parameter gathered (under FSDP2, by its unit's forward)
        seed = direction_seed(self.seed, self.step, self.k, self.index[name])
        return direction(self.params[name], seed, whole=True, kind=self.kind)


@dataclass
class SeededGradient:
    """g[name] = sum_k coeffs[k] * z_k[name], z_k regenerated from (seed, step, k, tensor index) on demand; each
    tensor first moved by shift * z_0 (MeZO's last +eps z, which puts theta back: fused, one draw fewer)."""

    params: dict[str, torch.Tensor]
    coeffs: list[float]
    seed: int
    step: int
    kind: str = "gaussian"
    shift: float = 0.0

    def __iter__(self):
        for i, (name, p) in enumerate(self.params.items()):
            z = direction(p, direction_seed(self.seed, self.step, 0, i), kind=self.kind)
            if self.shift:
                with torch.no_grad():
                    local(p).add_(z, alpha=self.shift)
            # the first direction becomes g in place: for K=1 (MeZO) one tensor-sized buffer, not two
            g = z.mul_(self.coeffs[0])
            for k, c in enumerate(self.coeffs[1:], start=1):
                g.add_(direction(p, direction_seed(self.seed, self.step, k, i), kind=self.kind), alpha=c)
            yield name, g

    def materialize(self) -> dict[str, torch.Tensor]:
        return dict(iter(self))


@dataclass
class TangentGradient:
    """g = sum_k coeffs[k] * tangents[k] for tangents held in memory (supplied by tests, or jvp's one tangent)."""

    tangents: list[dict[str, torch.Tensor]]
    coeffs: list[float]
    in_place: bool = False  # scale the one tangent in place (jvp's own tangent, no longer needed): no temporary

    def __iter__(self):
        for name in list(self.tangents[0]):
            if self.in_place and len(self.tangents) == 1:  # each tensor leaves the tangent as it is applied
                yield name, self.tangents[0].pop(name).mul_(self.coeffs[0])
            else:
                yield name, sum(c * t[name] for c, t in zip(self.coeffs, self.tangents))

    def materialize(self) -> dict[str, torch.Tensor]:
        return dict(iter(self))


@torch.no_grad()
def perturb(params, scale: float, seed: int, step: int, kind: str = "gaussian", k: int = 0) -> None:
    """theta += scale * z in place, z (direction k of `step`) regenerated tensor by tensor from its seed (no stored
    noise); under FSDP2 each device perturbs the rows it holds."""
    for i, p in enumerate(params.values()):
        local(p).add_(direction(p, direction_seed(seed, step, k, i), kind=kind), alpha=scale)
