"""inference: a forward pass, no gradient and no update; the memory and time every other way is measured against."""

from __future__ import annotations

from bench.estimators.base import CommContext, CommTerms, Estimator, FlopContext, FlopTerms, MemoryContext, MemoryTerms


class Inference(Estimator):
    name, label = "inference", "inference"
    rank = 0
    color = "#7f7f7f"
    summary = "forward pass only (the baseline)"
    updates, dropout, passes = False, False, "1 forward"

    def memory(self, c: MemoryContext) -> MemoryTerms:
        return MemoryTerms(temp=c.forward_temp)

    def flops(self, c: FlopContext) -> FlopTerms:
        return FlopTerms(forward=c.every)

    def comm(self, c: CommContext) -> CommTerms:
        return CommTerms(per_micro=c.gather, per_update=c.scalar)  # the loss


ESTIMATOR = Inference()
