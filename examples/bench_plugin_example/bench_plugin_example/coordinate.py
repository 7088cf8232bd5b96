"""coordinate: a central difference along one random coordinate, scaled by the parameter count n,

    g = n (L(theta + eps e_i) - L(theta - eps e_i)) / (2 eps) e_i,    i ~ U{0, ..., n-1}

an unbiased estimate of the gradient (E[n d_i L e_i] = grad L; exact on a quadratic for each i, the central
difference having no error there). Unscaled, it is the step of random coordinate descent (Nesterov 2012, "Efficiency
of coordinate descent methods on huge-scale optimization problems"). Two forward passes per micro-batch, one
parameter moved and put back exactly.

The coordinate of a step is a hash of (seed, step), not a generator's draw: JAX draws it inside its traced step,
and both frameworks pick the same index of their parameters flattened.
"""

from __future__ import annotations

from dataclasses import dataclass

from bench.estimators.base import Estimator, TrialContext, positive, setting


def uint32(x: int) -> int:
    """A Python int as a 32-bit unsigned one: what JAX's jnp.uint32 is to its arrays."""
    return x & 0xFFFFFFFF


def mix(x, u32=uint32):
    """lowbias32 (C. Wellons' hash prospector): a 32-bit integer to a well-mixed one, in `u32`'s integers (uint32
    for Python's, jnp.uint32 for JAX's traced ones: the same bits in both)."""
    x = u32(x)
    x = x ^ (x >> u32(16))
    x = u32(x * u32(0x7FEB352D))
    x = x ^ (x >> u32(15))
    x = u32(x * u32(0x846CA68B))
    return x ^ (x >> u32(16))


def coordinate(seed: int, step, n: int, u32=uint32):
    """The coordinate (of n) that step `step` differentiates along, in `u32`'s integers (mix); the seed offset by
    the golden ratio's bits (as splitmix's) so that seed 0 mixes to more than 0."""
    return mix(mix(uint32(seed) ^ 0x9E3779B9, u32) ^ u32(step), u32) % u32(n)


@dataclass
class CoordinateSettings:
    eps: float = setting(1e-3, "the coordinate's step in the central difference, a finite number > 0")


class Coordinate(Estimator):
    name, label = "coordinate", "coordinate"
    summary = "zeroth order: a central difference along one random coordinate, times the parameter count (unbiased)"
    compared_with = "inference"  # the forward passes it is made of
    dropout, passes = False, "2 forward"  # eval mode, as MeZO: both passes see the same function
    settings = CoordinateSettings
    implementations = {
        "torch": "bench_plugin_example.torch_coordinate",
        "jax": "bench_plugin_example.jax_coordinate",
    }

    def check(self, s: CoordinateSettings) -> str | None:
        return positive("coordinate.eps", s.eps)

    def refuses(self, c: TrialContext) -> str | None:
        if c.parallel != "none":
            return f"mode=coordinate with parallel={c.parallel}: accepted parallel=none (one coordinate of one device)"
        if c.step.dtype == "bf16_pure":
            return "mode=coordinate with dtype=bf16_pure: eps is lost in a bf16 parameter; accepted dtype=fp32 | bf16"
        return None


ESTIMATOR = Coordinate()
