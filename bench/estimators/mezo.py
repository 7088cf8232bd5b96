"""mezo: SPSA as MeZO runs it (Malladi et al. 2023, Algorithm 1), with q perturbations averaged per step as
ZO-Bench's ZO-SGD takes them (Zhang et al. 2024, arXiv 2402.11592, eq. 2):

    g = 1/q sum_{i=1..q} (L(theta + eps z_i) - L(theta - eps z_i)) / (2 eps) z_i,    z_i ~ N(0, I)

two forward passes per perturbation, each z_i regenerated from its seed rather than stored. q=1 is MeZO; larger q
lowers the estimate's variance by q at q times the passes (the same memory: one direction at a time).

Reference code: princeton-nlp/MeZO@552cb1b, large_models/trainer.py (zo_step, zo_update); q > 1:
ZO-Bench/ZO-LLM@bf210fa, zo-bench/trainer.py (zo_step_v1). Where the suite differs: docs/estimators.md#references.
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
    integer,
    positive,
    setting,
)


def round_trip_refusal(c: TrialContext) -> str | None:
    """The estimators that perturb the parameters in place and back (MeZO's +eps, -2eps, +eps) need fp32 ones."""
    if c.step.dtype != "bf16_pure":
        return None
    return (
        f"mode={c.step.mode} with dtype=bf16_pure: MeZO's in-place +eps, -2eps, +eps round trip does not bring bf16 "
        "parameters back (three steps at lr=0 move them by 0.6%, fp32's by 1e-7); accepted: dtype=bf16 (fp32 "
        "parameters, bf16 compute) or dtype=fp32"
    )


MAX_Q = 1024  # 2q forward passes a step: past this a step is hours at any size worth measuring


@dataclass
class MezoSettings:
    eps: float = setting(1e-3, "perturbation scale, a finite number > 0 (Malladi et al. 2023 use 1e-3)")
    q: int = setting(
        1, f"perturbations averaged per step, two forward passes each (ZO-Bench's q; 1: MeZO), integer in [1, {MAX_Q}]"
    )


class Mezo(Estimator):
    name, label = "mezo", "mezo"
    rank = 4
    color = "#9467bd"
    compared_with = "inference"  # the forward passes it is made of
    draws = True  # its perturbations
    summary = "zeroth order: SPSA along q seeded perturbations, two forward passes each (Malladi et al. 2023)"
    dropout, passes = False, "2q forward"  # eval mode, as the reference: both passes see the same function
    settings, moved = MezoSettings, {"mezo_eps": "eps"}

    def passes_for(self, row: dict) -> str:
        return f"{self.forward_passes_for(row)} forward"

    def forward_passes_for(self, row: dict) -> int:
        q = row.get("mezo_q")
        return 2 * int(float(q)) if q not in (None, "") else 2  # rows from before mezo.q ran q=1

    def check(self, s: MezoSettings) -> str | None:
        return positive("mezo.eps", s.eps) or integer("mezo.q", s.q, 1, MAX_Q)

    def refuses(self, c: TrialContext) -> str | None:
        return round_trip_refusal(c)

    def memory(self, c: MemoryContext) -> MemoryTerms:
        # one unit of a direction at a time in the perturbations (torch: a unit of tensors, bench.spec.draw_units;
        # JAX: a leaf, or a stacked layer's); summing q > 1 of them in the update holds the estimate and the next one
        held = c.unit if c.framework == "torch" else c.largest
        return MemoryTerms(directions=held * (1 if self.settings_of(c.step).q == 1 else 2), temp=c.forward_temp)

    def flops(self, c: FlopContext) -> FlopTerms:
        return FlopTerms(forward=2 * self.settings_of(c.step).q * c.every)  # the perturbations are elementwise

    def comm(self, c: CommContext) -> CommTerms:
        q = self.settings_of(c.step).q
        return CommTerms(per_micro=2 * q * c.gather, per_update=(q + 1) * c.scalar)  # the loss and q projections


ESTIMATOR = Mezo()
