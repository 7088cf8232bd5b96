"""jvp: the forward gradient (Baydin et al. 2022): K seeded tangents v_k, d_k = grad . v_k by one forward-mode pass
each, the estimate 1/K sum_k d_k v_k, unbiased.

Reference code (K = 1): ZO-Bench/ZO-LLM@bf210fa, zo-bench/trainer.py (forward_grad_step). Where the suite differs:
docs/estimators.md#references."""

from __future__ import annotations

from dataclasses import dataclass, replace

from bench.estimators.base import (
    CommContext,
    CommTerms,
    Estimator,
    FlopContext,
    FlopTerms,
    MemoryContext,
    MemoryTerms,
    TrialContext,
    choice,
    integer,
    setting,
)
from bench.spec import StepSpec

# How the forward-mode pass is built: torch's four ways ("naive" reproduces the UMass forward-AD study's
# pathology), JAX's one (jax.jvp, named func as torch.func.jvp is). auto: each framework's fastest, torch's dual
# (forward_ad's dual tensors on the model's own modules: torch.func.jvp runs each op through functorch's
# interpreter, the most host time of a pass; docs/methodology.md) and JAX's func.
IMPLS = ("auto", "dual", "func", "lazy", "naive")
AUTO_IMPL = {"torch": "dual", "jax": "func"}
# one tangent: keep it for the update (drawn once) or redraw it from its seed (never held after the pass); auto
# keeps it where that costs no peak memory (keeps_tangent)
TANGENTS = ("auto", "keep", "redraw")


MAX_TANGENTS = (
    1024  # K forward-mode passes a step, as mezo.q's 2q: past this a step is hours at any size worth measuring
)


@dataclass
class JvpSettings:
    impl: str = setting(
        "auto",
        "auto (torch: dual, jax: func) | dual (forward_ad) | func (torch.func.jvp, jax.jvp) | lazy (tangent per "
        "module) | naive; all but auto and func are torch's",
        IMPLS,
    )
    num_tangents: int = setting(
        1, f"tangents K per step (looped; memory does not grow with K), integer in [1, {MAX_TANGENTS}]"
    )
    tangent: str = setting("auto", "one tangent: auto | keep (drawn once, held for the update) | redraw", TANGENTS)


class Jvp(Estimator):
    name, label = "jvp", "jvp"
    rank = 2
    color = "#ff7f0e"
    compared_with = "backprop"  # the exact gradient it estimates
    summary = "forward gradient: K seeded tangents, one forward-mode pass each (Baydin et al. 2022)"
    passes, compiles, draws = "K forward-mode passes", False, True
    settings = JvpSettings
    moved = {"num_tangents": "num_tangents", "jvp_impl": "impl", "jvp_tangent": "tangent"}

    def passes_for(self, row: dict) -> str:
        k = self.forward_passes_for(row)
        return f"{k} forward-mode pass{'es' if k > 1 else ''}"

    def forward_passes_for(self, row: dict) -> int:
        k = row.get("num_tangents")
        return int(float(k)) if k not in (None, "") else 1

    def variant(self, off: dict[str, str]) -> tuple[list[str], list[str]]:
        # jvp(K=4, keep)[naive]: K as the literature writes it; torch's impl is how the pass is built, not maths
        shown = [f"K={off['num_tangents']}"] if "num_tangents" in off else []
        return shown + ([off["tangent"]] if "tangent" in off else []), [off["impl"]] if "impl" in off else []

    def check(self, s: JvpSettings) -> str | None:
        return (
            integer("jvp.num_tangents", s.num_tangents, 1, MAX_TANGENTS)
            or choice("jvp.impl", s.impl, IMPLS)
            or choice("jvp.tangent", s.tangent, TANGENTS)
        )

    def refuses(self, c: TrialContext) -> str | None:
        s = self.settings_of(c.step)
        if c.framework == "jax" and s.impl not in ("auto", "func"):
            return f"jvp.impl={s.impl}: torch only; framework=jax accepts jvp.impl=auto | func (jax.jvp)"
        if s.tangent == "keep" and (s.num_tangents != 1 or s.impl == "lazy"):
            return (
                f"jvp.tangent=keep: applies to one tangent and an impl that holds it whole (got jvp.num_tangents="
                f"{s.num_tangents}, jvp.impl={s.impl}); accepted: auto | redraw, or keep with jvp.num_tangents=1"
            )
        if (c.framework, c.parallel) == ("torch", "fsdp") and s.impl != "lazy":
            return (
                f"jvp.impl={s.impl} with parallel=fsdp: forward-mode AD through FSDP2's sharded parameters fails in "
                "torch; accepted: jvp.impl=lazy (the tangent attached module by module to the gathered parameters)"
            )
        return None

    def resolve(self, s: JvpSettings, framework: str, device_kind: str) -> JvpSettings:
        return replace(s, impl=AUTO_IMPL[framework]) if s.impl == "auto" else s

    def records_graph(self, step: StepSpec) -> bool:
        return self.settings_of(step).impl == "naive"  # the forward-AD study's pathology: a graph never used

    def memory(self, c: MemoryContext) -> MemoryTerms:
        s, P = self.settings_of(c.step), c.param_bytes
        temp, saved = 2 * c.forward_temp, 0  # primal and tangent activations, dropped as the pass goes
        if c.framework == "jax" and keeps_tangent(c.step, c.framework):
            directions = P * c.n  # jvp_tangent=keep: the pass returns its tangent whole for the update
        elif c.framework == "jax":
            # XLA draws each leaf's tangent just before the pass reaches it and frees it after: about the largest
            # leaf (the word embeddings) beside one layer's
            directions = min(P * c.n, c.largest + P * c.layer_params)
        else:
            directions = P * c.n if s.impl != "lazy" else c.unit  # lazy: a unit of the tangent at a time
            # torch's make_dual returns a view of the parameter, so the tangent is copied onto the parameter's
            # base (zeros, then the view's part): a second tangent-sized buffer, per dual made
            temp += directions
        if s.impl == "naive":
            # autograd records the primal and the tangent computations for a backward that never comes: 2.5x
            # backprop's saved activations (docs/memory.md has the measurement)
            saved = 5 * c.saved // 2
        return MemoryTerms(directions=directions, saved=saved, temp=temp)

    def flops(self, c: FlopContext) -> FlopTerms:
        K = self.settings_of(c.step).num_tangents
        return FlopTerms(forward=c.every if c.hoists else K * c.every, tangent=K * (c.derivative + c.zero_terms))

    def comm(self, c: CommContext) -> CommTerms:
        # torch's FSDP2 gathers once per tangent's pass, XLA once for all K; the K derivatives and the loss
        K = self.settings_of(c.step).num_tangents
        return CommTerms(per_micro=(K if c.framework == "torch" else 1) * c.gather, per_update=c.scalar * (K + 1))


ESTIMATOR = Jvp()


def keeps_tangent(step: StepSpec, framework: str) -> bool:
    """Whether jvp keeps its one tangent for the update (drawn once per step) rather than redrawing it from its
    seed (drawn twice). jvp.tangent=auto keeps it where the forward-mode pass holds it whole anyway, so keeping it
    adds nothing to the peak: torch's func, dual and naive passes (torch.func.jvp and make_dual take the whole
    tangent). It redraws where the pass never holds it whole: torch's lazy pass (a tensor's tangent at a time)
    and JAX (XLA draws each leaf's tangent as the pass reaches it: keeping it adds one tangent, 4n bytes)."""
    s = ESTIMATOR.settings_of(step)
    if step.mode != "jvp" or s.num_tangents != 1:  # another mode's step: jvp's defaults
        return False
    if s.tangent != "auto":
        return s.tangent == "keep"
    return framework == "torch" and s.impl != "lazy"
