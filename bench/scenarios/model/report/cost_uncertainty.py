"""How sure the "Cost to target" section's numbers are, from the seeds themselves: a bootstrap interval for every
ratio of medians and for the exponent of steps against trained parameters, and a noise band for peak memory.

Every interval is a percentile bootstrap over fresh seeds: each arm's seeds (a group's, per study) are resampled
with replacement, the statistic recomputed, and the interval is the middle CONFIDENCE of RESAMPLES recomputations,
drawn from a generator seeded with SEED so the report reads the same on every run. A seed that missed the target
is right-censored: it would have taken more than the cap, so it ranks above every seed that reached (INF in the
arithmetic). A resampled median that lands on one is known only to exceed the cap: a ratio over it is unbounded
above (below, where it is the denominator), and the interval says so (∞, 0) rather than guess.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from bench.report.tables import num
from bench.scenarios.model.report.cost_stats import INF, Group

RESAMPLES = 2000  # Efron and Tibshirani ask 1,000 or more for a percentile interval's tails; 2,000 take milliseconds
SEED = 0  # fixed: the same rows give the same report
CONFIDENCE = 0.95
MIN_SEEDS = 5  # a median of fewer moves a whole seed's worth on one more; three seeds have ten distinct resamples
TAILS = (100 * (1 - CONFIDENCE) / 2, 100 * (1 + CONFIDENCE) / 2)
CENSORED = "†"  # marks a median over seeds some of which missed: their costs are known only to exceed the cap's


def _resampled_medians(arms: list[list[float]], rng: np.random.Generator) -> np.ndarray:
    """(RESAMPLES,) medians over the studies of each study's median over its seeds resampled with replacement."""
    per_study = []
    for arm in arms:
        values = np.asarray(arm, dtype=float)
        picks = rng.integers(0, len(values), size=(RESAMPLES, len(values)))
        per_study.append(_median(values[picks]))
    return _median(np.stack(per_study, axis=1))


def _median(a: np.ndarray) -> np.ndarray:
    """The median along the last axis, INF (a censored seed) ranking above every finite value: where the middle
    two straddle it the median is INF too, as statistics.median gives on the report's own medians."""
    with np.errstate(invalid="ignore"):
        return np.median(a, axis=-1)


def ratio_interval(a: list[list[float]], b: list[list[float]]) -> tuple[float, float] | None:
    """The 95% percentile-bootstrap interval of median(a) / median(b), seeds resampled within each arm (and
    study). A resample whose numerator median is censored counts as an unbounded ratio (+∞), one whose denominator
    is censored as 0; both censored, unknown: 0 for the lower end, ∞ for the upper. None without seeds in an arm."""
    if not a or not b:
        return None
    rng = np.random.default_rng(SEED)
    top, bottom = _resampled_medians(a, rng), _resampled_medians(b, rng)
    with np.errstate(divide="ignore", invalid="ignore"):
        r = top / bottom  # inf/finite = inf, finite/inf = 0, inf/inf = nan
    low = np.percentile(np.where(np.isnan(r), 0.0, r), TAILS[0], method="lower")
    high = np.percentile(np.where(np.isnan(r), INF, r), TAILS[1], method="higher")
    return float(low), float(high)


def group_ratio(g: Group, ref: Group | None, column: str) -> tuple[float, float] | None:
    """The interval of g's median cost over ref's in `column`, from their seeds."""
    return None if ref is None else ratio_interval(g.values(column), ref.values(column))


# ----------------------------------------------------------------------------------------------------- exponent


@dataclass(frozen=True)
class SeedFit:
    """steps = c d^exponent, least squares on seed-level points; the bootstrap interval None where resampling
    cannot move it (one seed per scope at two scopes)."""

    exponent: float
    lo: float | None
    hi: float | None
    points: int  # seeds fitted
    scopes: int
    dropped: int  # seeds that missed the target: not fitted


def slope(x: np.ndarray, y: np.ndarray) -> np.ndarray:
    """Least-squares slopes of y on x along the last axis (x the same in every row)."""
    dx = x - x.mean(axis=-1, keepdims=True)
    return (dx * (y - y.mean(axis=-1, keepdims=True))).sum(axis=-1) / (dx**2).sum(axis=-1)


def fit_seeds(scopes: dict[float, list[float]]) -> SeedFit | None:
    """The exponent of log steps on log d over every seed that reached the target ({d: its seeds' steps, INF where
    a seed missed}), with its 95% interval from resampling each scope's reached seeds. None under two scopes
    with a reached seed (nothing to fit)."""
    reached = {d: [s for s in steps if math.isfinite(s) and s > 0] for d, steps in scopes.items() if d > 0}
    reached = {d: steps for d, steps in sorted(reached.items()) if steps}
    dropped = sum(len(steps) for steps in scopes.values()) - sum(len(s) for s in reached.values())
    if len(reached) < 2:
        return None
    x = np.concatenate([np.full(len(s), math.log(d)) for d, s in reached.items()])
    logs = [np.log(np.asarray(s, dtype=float)) for s in reached.values()]
    b = float(slope(x, np.concatenate(logs)))
    n = len(x)
    if all(len(s) == 1 for s in logs):
        return SeedFit(b, None, None, n, len(reached), dropped)
    rng = np.random.default_rng(SEED)
    y = np.concatenate([s[rng.integers(0, len(s), size=(RESAMPLES, len(s)))] for s in logs], axis=1)
    slopes = slope(x, y)
    lo, hi = np.percentile(slopes, TAILS[0], method="lower"), np.percentile(slopes, TAILS[1], method="higher")
    return SeedFit(b, float(lo), float(hi), n, len(reached), dropped)


# ------------------------------------------------------------------------------------------------------ memory


def memory_band(groups: list[Group], column: str = "peak_mem_mb") -> float | None:
    """Run-to-run noise of a memory column: the widest spread (highest - lowest) of it over one winner's seeds, the
    same configuration run again, among `groups` (one framework's: its allocator and process are the noise). None
    where no winner has two seeds that recorded it."""
    spreads = []
    for g in groups:
        values = [v for v in (num(r, column) for r in g.seeds()) if v is not None]
        if len(values) >= 2:
            spreads.append(max(values) - min(values))
    return max(spreads) if spreads else None


def ties(budgets: list[float], band: float | None) -> list[list[float]]:
    """Budgets (ascending) gathered into ties: each with those within `band` above the lowest of its tie; no band:
    each its own."""
    out: list[list[float]] = []
    for b in sorted(budgets):
        if out and band is not None and b - out[-1][0] <= band:
            out[-1].append(b)
        else:
            out.append([b])
    return out


def few_seeds(groups: list[Group], least: int = MIN_SEEDS) -> dict[Group, int]:
    """{group: its fresh seeds} for the winners priced over fewer than `least` (a study's fewest, where several
    ran, among the studies that found a winner)."""
    out = {}
    for g in groups:
        if g.winner is None:
            continue
        counts = [len(s.seeds()) for s in g.studies() if s.winner is not None]
        if min(counts) < least:
            out[g] = min(counts)
    return out
