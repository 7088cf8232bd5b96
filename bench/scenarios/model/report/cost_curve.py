"""Steps to the target against the trained parameters d: the curve that says when a forward gradient or MeZO pays.

A one-direction estimate of the gradient (a forward gradient along random tangents, MeZO's and its kin's
perturbations: the estimators that draw directions) has a variance that grows about as d, so its stable learning
rate falls as 1/d and its steps to a target grow as d: theory's exponent is 1. An exact gradient's steps do not
depend on how many parameters it trains: 0. Per framework and mode, the exponent is fitted by least squares of
log steps on log d over its tuned winners' fresh seeds at every scope (each seed a point, not the scope's median),
with a 95% bootstrap interval resampling the seeds within each scope (cost_uncertainty.fit_seeds); a seed that
missed the target is dropped from the fit and counted, a scope no seed reached is shown at its cap.
"""

from __future__ import annotations

import math
from collections import defaultdict
from dataclasses import dataclass

from bench import estimators
from bench.report.plots import Chart, Series
from bench.report.tables import md_table, num
from bench.scenarios.model.report.cost_stats import Cost, Group
from bench.scenarios.model.report.cost_uncertainty import CENSORED, SeedFit, fit_seeds
from bench.scenarios.model.select import Context, context_label, framework_order
from bench.spec import FRAMEWORK_NAMES


def theory(mode: str) -> float:
    """Theory's exponent for an estimator: 1 for a one-direction estimate (it draws directions), 0 for an exact
    gradient."""
    return 1.0 if mode in estimators.names() and estimators.get(mode).draws else 0.0


@dataclass(frozen=True)
class Point:
    d: float  # trained parameters
    scope: str
    steps: Cost  # median [lowest-highest] over the winner's fresh seeds; not finite: missed
    cap: float | None  # the step cap, where the target was missed
    diverged: bool = False  # every search trial diverged: the grid never reached a stable learning rate
    unpriced: bool = False  # the search found a winner, not yet run at a fresh seed: no cost, and not a miss
    seeds: tuple[float, ...] = ()  # each fresh seed's steps (INF: missed), the fit's points

    @property
    def reached(self) -> bool:
        return self.steps.finite


def curves(groups: dict[tuple[str, str], Group]) -> dict[tuple[str, str], list[Point]]:
    """{(framework, mode without its scope): its scopes as Points, smallest d first} of one table's groups."""
    out: dict = defaultdict(list)
    for g in groups.values():
        row = g.winner or (g.rows[0] if g.rows else None)
        if row is None or not num(row, "n_trainable"):
            continue
        steps = g.cost("steps_to_target") if g.winner else Cost()
        every = bool(g.search) and g.diverged == len(g.search)
        unpriced = g.winner is not None and not g.seeds()
        seeds = tuple(v for arm in g.values("steps_to_target") for v in arm) if g.winner else ()
        out[(g.framework, g.mode)].append(
            Point(num(row, "n_trainable"), g.scope, steps, num(row, "target_max_steps"), every, unpriced, seeds)
        )
    return {k: sorted(v, key=lambda p: p.d) for k, v in out.items()}


def fit_of(points: list[Point]) -> SeedFit | None:
    return fit_seeds({p.d: list(p.seeds) for p in points})


def _steps_cell(p: Point) -> str:
    if p.reached:
        c = p.steps
        return (
            f"{c.median:.0f}"
            + CENSORED * c.censored
            + ("" if c.lo == c.hi else f" [{c.lo:.0f}–{'∞' if math.isinf(c.hi) else f'{c.hi:.0f}'}]")
        )
    if p.diverged:
        return "diverged at every lr"
    if p.unpriced:
        return "reached in the search; no fresh seed yet"
    return f"not reached (cap {p.cap:.0f})" if p.cap else "not reached"


def _exponent(x: float) -> str:
    text = f"{x:.2f}"
    return "0.00" if text == "-0.00" else text  # a flat line's rounding error is no sign


def _fit_cell(fit: SeedFit | None) -> str:
    if fit is None:
        return "-"
    if fit.lo is None:
        return f"{_exponent(fit.exponent)} (one seed a scope: no interval)"
    return f"{_exponent(fit.exponent)} [{_exponent(fit.lo)}, {_exponent(fit.hi)}]"


def _fitted_cell(fit: SeedFit | None, scopes: int) -> str:
    """12 seeds at 4 of 4 scopes (2 missed: dropped)"""
    if fit is None:
        return f"0 of {scopes} scopes"
    missed = f" ({fit.dropped} missed: dropped)" if fit.dropped else ""
    return f"{fit.points} seeds at {fit.scopes} of {scopes} scopes{missed}"


def curve_table(groups: dict[tuple[str, str], Group]) -> str:
    """A row per framework and mode: its steps at each scope (the scopes as columns, smallest d first), the fitted
    exponent with its interval and theory's; "" where no mode ran at two scopes."""
    found = curves(groups)
    if not any(len(points) >= 2 for points in found.values()):
        return ""
    sizes = {p.scope: p.d for points in found.values() for p in points}
    scopes = sorted(sizes, key=lambda s: sizes[s])
    body = []
    for fw, mode in sorted(found, key=lambda k: (framework_order(k[0]), theory(_base(k[1])), k[1])):
        at = {p.scope: p for p in found[(fw, mode)]}
        fit = fit_of(found[(fw, mode)])
        body.append(
            [
                FRAMEWORK_NAMES.get(fw, fw),
                mode,
                *(_steps_cell(at[s]) if s in at else "-" for s in scopes),
                _fit_cell(fit),
                f"{theory(_base(mode)):.0f}",
                _fitted_cell(fit, len(at)),
            ]
        )
    head = [
        "framework",
        "mode",
        *(f"{s} ({sizes[s]:,.0f})" for s in scopes),
        "exponent [95% bootstrap]",
        "theory",
        "fitted on",
    ]
    return md_table(head, body, "ll" + "r" * (len(head) - 2))


def _base(label: str) -> str:
    """The estimator a mode label names: jvp(K=4)[lazy] -> jvp."""
    return label.split("+")[0].split("(")[0].split("[")[0]


def params_chart(key: Context, groups: dict[tuple[str, str], Group]) -> Chart | None:
    """Steps to the target against the trained parameters, log-log, a line per mode over the scopes it reached the
    target at (its fitted exponent in the table beside), the step cap as a guide where a mode missed a scope, and
    theory's slope 1 from the smallest scope a one-direction estimate reached."""
    found = curves(groups)
    series, missed, anchor = [], {}, None
    for (fw, mode), points in found.items():
        reached = [p for p in points if p.reached]
        for p in points:
            if not p.reached and p.cap and not p.unpriced:
                missed[p.d] = p.cap
        if len(points) < 2 or not reached:
            continue
        line = Series(fw, mode, [p.d for p in reached], [p.steps.median for p in reached])
        # jvp and MeZO draw the same directions: their medians can be the same at every scope, one line over the other
        if same := [s.mode for s in series if (s.framework, s.xs, s.ys) == (fw, line.xs, line.ys)]:
            line.note = f" (= {', '.join(same)})"
        series.append(line)
        if theory(_base(mode)) == 1 and (anchor is None or reached[0].d < anchor[0]):
            anchor = (reached[0].d, reached[0].steps.median)
    if not series:
        return None
    ds = sorted({p.d for points in found.values() for p in points})
    if missed:  # across every scope, so that one missed scope is a visible line: a mode's line stops short of it
        cap = max(missed.values())
        series.append(Series("", "", [ds[0], ds[-1]], [cap, cap], guide="the step cap"))
    if anchor and ds[-1] > anchor[0]:
        xs = [d for d in ds if d >= anchor[0]]
        series.append(Series("", "", xs, [anchor[1] * x / anchor[0] for x in xs], guide="theory: steps ∝ d"))
    return Chart(context_label(key[:-1]), "trained parameters", "steps to the target", series, logx=10, logy=True)


CURVE_TEXT = (
    "Per framework and mode, the median steps to the target over its winner's fresh seeds [lowest–highest] at each "
    "trained scope (its trained parameters d in the heading), and the exponent of steps ∝ d^b: least squares of log "
    "steps on log d with a point per fresh seed (not a scope's median: the seeds' spread is the fit's noise), with "
    "a 95% percentile-bootstrap interval (each scope's seeds resampled, the fit redone). A seed that missed the "
    "target is dropped from the fit and counted in **fitted on**, so a mode that misses at its largest scopes has a "
    "fitted exponent that is too low; a scope no seed reached is shown at its cap (or as diverged, where every "
    "learning rate of its search did). **theory**: 1 for a one-direction estimate (a forward gradient's or MeZO's "
    "variance grows about as d, so its stable learning rate falls as 1/d and its steps grow as d), 0 for an exact "
    "gradient. For scale: MeZO's paper runs about 100x fine-tuning's steps when it trains all of RoBERTa-large (355 M "
    "parameters)."
)
