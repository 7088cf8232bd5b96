"""lozo: LOZO (Chen et al. 2024, "Enhancing Zeroth-Order Fine-Tuning for Language Models with Low-Rank Structures",
arXiv 2410.07698, Algorithm 1 with the paper's lazy sampling): MeZO's two passes along a low-rank perturbation.
Each weight matrix W (m x n) is perturbed by Z = U V^T with U (m x r) drawn every step and V (n x r) kept for
`interval` steps; every other tensor (biases, LayerNorm) by z ~ N(0, I) as in MeZO:

    g = (L(theta + eps Z) - L(theta - eps Z)) / (2 eps) Z

Given V, the estimate's mean is G V V^T; over V's draws r G: the gradient scaled by the rank, as the paper's
estimator (no 1/r: the learning rate absorbs it). V is regenerated from its seed and the step's block
(step // interval) rather than stored, so LOZO holds what MeZO holds: one tensor's perturbation at a time.

Reference code: optsuite/LOZO@5d1ade5, large_models/LOZOtrainer.py (lowrank_zo_perturb_parameters,
lowrank_zo_update). Where the suite differs: docs/estimators.md#references.
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
from bench.estimators.mezo import round_trip_refusal

MAX_RANK = 1024  # a perturbation's factors beyond this are no longer low rank at any width this suite runs


@dataclass
class LozoSettings:
    eps: float = setting(1e-3, "perturbation scale, a finite number > 0 (MeZO's 1e-3)")
    rank: int = setting(
        2,
        f"rank r of each weight matrix's perturbation U V^T, integer in [1, {MAX_RANK}] and at most the widest "
        "trained matrix's smaller side (the paper's r)",
    )
    interval: int = setting(
        50, "steps V is kept before it is drawn again, integer >= 1 (the paper's lazy sampling, nu)"
    )


class Lozo(Estimator):
    name, label = "lozo", "lozo"
    rank = 6
    compared_with = "inference"  # the forward passes it is made of
    draws = True  # its perturbations
    summary = (
        "zeroth order, low-rank: SPSA along U V^T per weight matrix, V kept for `interval` steps (Chen et al. 2024)"
    )
    dropout, passes = False, "2 forward"  # eval mode, as MeZO: both passes see the same function
    forward_passes = 2
    settings = LozoSettings

    def check(self, s: LozoSettings) -> str | None:
        return (
            positive("lozo.eps", s.eps)
            or integer("lozo.rank", s.rank, 1, MAX_RANK)
            or integer("lozo.interval", s.interval, 1)
        )

    def refuses(self, c: TrialContext) -> str | None:
        if c.parallel == "fsdp":  # a sharded matrix's U V^T would have to be drawn whole and cut to its rows
            return (
                f"mode=lozo with parallel=fsdp, framework={c.framework}: lozo draws each weight matrix's U V^T whole; "
                "accepted: parallel=none | ddp"
            )
        return round_trip_refusal(c)

    def memory(self, c: MemoryContext) -> MemoryTerms:
        # a unit's U V^T at a time in torch, with their factors: for a unit of one matrix, the word embeddings
        # (vocab x H), U is vocab x r and V is H x r; JAX's update builds the estimate whole (its module)
        r, P, H = self.settings_of(c.step).rank, c.param_bytes, c.hidden
        directions = P * c.n if c.framework == "jax" else c.unit + c.unit * r // H + P * r * H
        return MemoryTerms(directions=directions, temp=c.forward_temp)

    def flops(self, c: FlopContext) -> FlopTerms:
        return FlopTerms(forward=2 * c.every)  # U V^T is r m n per matrix, negligible beside the passes at r << B T

    def comm(self, c: CommContext) -> CommTerms:
        return CommTerms(per_micro=2 * c.gather, per_update=2 * c.scalar)


ESTIMATOR = Lozo()
