"""backprop: the exact gradient by reverse mode (remat: each encoder layer's activations recomputed in its
backward instead of kept)."""

from __future__ import annotations

from bench.estimators.base import CommContext, CommTerms, Estimator, FlopContext, FlopTerms, MemoryContext, MemoryTerms


class Backprop(Estimator):
    name, label = "backprop", "backprop"
    rank = 1
    color = "#1f77b4"
    summary = "exact gradient by reverse mode (remat=true: activation checkpointing per encoder layer)"
    backward, remat, passes = True, True, "1 forward + 1 backward"

    def memory(self, c: MemoryContext) -> MemoryTerms:
        grads = c.param_bytes * c.n // c.share
        if c.step.remat:
            # each layer keeps its input across the step; its own activations are recomputed during its backward,
            # one layer at a time, as working memory (torch's checkpoint and JAX's remat hold them apart)
            saved, temp = c.layer_inputs, c.forward_temp + c.one_layer
        else:
            saved, temp = c.saved, c.forward_temp
        if c.step.dtype == "bf16":  # autocast's bf16 copies of the Linear weights, kept for the backward
            saved += c.bf16_weight_copies
        return MemoryTerms(grads=grads, saved=saved, temp=temp)

    def flops(self, c: FlopContext) -> FlopTerms:
        return FlopTerms(forward=c.every, backward=c.derivative, recompute=c.recompute if c.step.remat else 0.0)

    def comm(self, c: CommContext) -> CommTerms:
        return CommTerms(per_micro=c.gather * (2 if c.regathers else 1), per_update=c.gradient + c.scalar)


ESTIMATOR = Backprop()
