"""jvp: the forward gradient (Baydin et al. 2022): K seeded tangents v_k, d_k = grad . v_k by one forward-mode pass
each, the estimate 1/K sum_k d_k v_k, unbiased."""

from __future__ import annotations

from bench.estimators.base import CommContext, CommTerms, Estimator, FlopContext, FlopTerms, MemoryContext, MemoryTerms
from bench.spec import StepSpec, keeps_tangent


class Jvp(Estimator):
    name, label = "jvp", "jvp"
    summary = "forward gradient: K seeded tangents, one forward-mode pass each (Baydin et al. 2022)"
    passes = "K forward-mode passes"

    def passes_for(self, row: dict) -> str:
        k = row.get("num_tangents")
        k = int(float(k)) if k not in (None, "") else 1
        return f"{k} forward-mode pass{'es' if k > 1 else ''}"

    def records_graph(self, step: StepSpec) -> bool:
        return step.jvp_impl == "naive"  # the forward-AD study's pathology: a graph for a backward never run

    def memory(self, c: MemoryContext) -> MemoryTerms:
        s, P = c.step, c.param_bytes
        temp, saved = 2 * c.forward_temp, 0  # primal and tangent activations, dropped as the pass goes
        if c.framework == "jax" and keeps_tangent(s, c.framework):
            directions = P * c.n  # jvp_tangent=keep: the pass returns its tangent whole for the update
        elif c.framework == "jax":
            # XLA draws each leaf's tangent just before the pass reaches it and frees it after: about the largest
            # leaf (the word embeddings) beside one layer's
            directions = min(P * c.n, c.largest + P * c.layer_params)
        else:
            directions = P * c.n if s.jvp_impl != "lazy" else c.largest
            # torch's make_dual returns a view of the parameter, so the tangent is copied onto the parameter's
            # base (zeros, then the view's part): a second tangent-sized buffer, per dual made
            temp += directions
        if s.jvp_impl == "naive":
            # autograd records the primal and the tangent computations for a backward that never comes: 2.5x
            # backprop's saved activations (docs/memory.md has the measurement)
            saved = 5 * c.saved // 2
        return MemoryTerms(directions=directions, saved=saved, temp=temp)

    def flops(self, c: FlopContext) -> FlopTerms:
        K = c.step.num_tangents
        return FlopTerms(forward=c.every if c.hoists else K * c.every, tangent=K * (c.derivative + c.zero_terms))

    def comm(self, c: CommContext) -> CommTerms:
        # torch's FSDP2 gathers once per tangent's pass, XLA once for all K; the K derivatives and the loss
        K = c.step.num_tangents
        return CommTerms(per_micro=(K if c.framework == "torch" else 1) * c.gather, per_update=c.scalar * (K + 1))


ESTIMATOR = Jvp()
