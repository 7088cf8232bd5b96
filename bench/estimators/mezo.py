"""mezo: SPSA as MeZO runs it (Malladi et al. 2023, Algorithm 1): two forward passes at theta + eps z and
theta - eps z, the projection (L+ - L-) / (2 eps) times z, z regenerated from its seed rather than stored."""

from __future__ import annotations

from bench.estimators.base import CommContext, CommTerms, Estimator, FlopContext, FlopTerms, MemoryContext, MemoryTerms


class Mezo(Estimator):
    name, label = "mezo", "mezo"
    summary = "zeroth order: SPSA along one seeded perturbation, two forward passes (Malladi et al. 2023)"
    dropout, passes = False, "2 forward"  # eval mode, as the reference: both passes see the same function

    def memory(self, c: MemoryContext) -> MemoryTerms:
        # one tensor's direction at a time, in the perturbation and in the update
        return MemoryTerms(directions=c.largest, temp=c.forward_temp)

    def flops(self, c: FlopContext) -> FlopTerms:
        return FlopTerms(forward=2 * c.every)  # the perturbations are elementwise

    def comm(self, c: CommContext) -> CommTerms:
        return CommTerms(per_micro=2 * c.gather, per_update=2 * c.scalar)  # the loss and the projection


ESTIMATOR = Mezo()
