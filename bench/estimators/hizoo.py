"""hizoo: HiZOO (Zhao et al. 2024, "Second-Order Fine-Tuning without Pain for LLMs: A Hessian Informed
Zeroth-Order Optimizer", arXiv 2402.15173, Algorithm 1, as its reference code's zo_Hessian_step_update runs it):
MeZO's two passes along a perturbation shaped by a diagonal Hessian estimate H (ones at first), and one pass at
theta itself:

    L0 = L(theta),  L+- = L(theta +- eps z / sqrt(H)),  z ~ N(0, I)
    H <- (1 - alpha) H + alpha |L+ + L- - 2 L0| / (2 eps^2) H z^2          (elementwise)
    g = (L+ - L-) / (2 eps) z / sqrt(H)                                       (the updated H)

Three forward passes a step and one parameter-sized buffer (H) beyond MeZO. With H fixed, g estimates H^-1 times
the gradient (a diagonal Newton step); at alpha = 0 it is MeZO's estimate with one pass more.

Reference code: Yanjun-Zhao/HiZOO@4f99055, trainer.py (zo_Hessian_step_update). Where the suite differs, and the
authors' values of alpha: docs/estimators.md#references.
"""

from __future__ import annotations

from dataclasses import dataclass

from bench.estimators.base import (
    CommContext,
    CommTerms,
    Estimator,
    FlopContext,
    FlopTerms,
    MemoryContext,
    MemoryTerms,
    TrialContext,
    fraction,
    positive,
    setting,
)
from bench.estimators.mezo import round_trip_refusal


@dataclass
class HizooSettings:
    eps: float = setting(1e-3, "perturbation scale, a finite number > 0 (the paper's mu; MeZO's 1e-3)")
    alpha: float = setting(
        1e-6,
        "smoothing of the diagonal Hessian estimate, a number in [0, 1) (the paper's alpha_t, held constant; "
        "0: H stays ones, MeZO's estimate); 1e-6: the authors' value for full fine-tuning of RoBERTa-large, the "
        "nearest of their setups to this suite's encoders",
    )


class Hizoo(Estimator):
    name, label = "hizoo", "hizoo"
    rank = 5
    compared_with = "inference"  # the forward passes it is made of
    draws = True  # its perturbations
    summary = "zeroth order, Hessian-informed: SPSA along z / sqrt(H), H a diagonal Hessian estimate (Zhao et al. 2024)"
    dropout, passes = False, "3 forward"  # eval mode, as MeZO: the three passes see the same function
    forward_passes = 3
    settings = HizooSettings

    def check(self, s: HizooSettings) -> str | None:
        return positive("hizoo.eps", s.eps) or fraction("hizoo.alpha", s.alpha)

    def refuses(self, c: TrialContext) -> str | None:
        if c.parallel == "fsdp":  # the Hessian estimate would have to be sharded as its parameters are
            return (
                f"mode=hizoo with parallel=fsdp, framework={c.framework}: hizoo keeps a whole diagonal Hessian "
                "estimate per device; accepted: parallel=none | ddp"
            )
        return round_trip_refusal(c)

    def memory(self, c: MemoryContext) -> MemoryTerms:
        # H, whole, kept across steps; a unit of the direction at a time, but JAX's update draws it whole (its module)
        directions = c.param_bytes * c.n if c.framework == "jax" else c.unit
        return MemoryTerms(directions=directions, temp=c.forward_temp, state=c.param_bytes * c.n // c.share)

    def flops(self, c: FlopContext) -> FlopTerms:
        return FlopTerms(forward=3 * c.every)  # the perturbations and the Hessian update are elementwise

    def comm(self, c: CommContext) -> CommTerms:
        return CommTerms(per_micro=3 * c.gather, per_update=3 * c.scalar)  # L0, the projection, the curvature


ESTIMATOR = Hizoo()
