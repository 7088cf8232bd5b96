"""What the "Cost to target" section computes, apart from how it shows it: the groups trials are compared in, each
group's winner, the winner's cost over fresh seeds, how precisely steps to the target are known, the costs in
forward passes and FLOPs, and a performance profile across modes and problems.

A group is one way of differentiating at one target: the comparison context (select.context_key) and the mode as
select.variant() names it (every setting that changes the numbers, the trainable scope included), less what its
tuning search varied (read from its rows: the knobs its search trials differ in), plus the whole target (metric,
value, held-out examples, step cap, evaluation interval and resolution, warm-up steps). Within a group, as AlgoPerf
and MLPerf score a submission:

- the search (`tuning=search`) picks the winner, the trial that reached the target with the lowest value of the
  sweeper's objective (the rows' `tune_objective`; wall_to_target_s, the sweeper's default, for rows written
  before that column), ties broken as the sweeper breaks them (its `best_of`: the middle learning rate);
- with the sweeper's `confirm` seeds (`tuning=confirm` rows), the winner is the confirmed point whose worst over its
  search and confirming seeds is lowest (a miss is infinite), as the sweeper picks it;
- the winner's cost is the median, with the lowest and highest, over its repeats (`tuning=repeat`) at seeds the
  search did not use; a repeat that missed the target counts as infinitely slow. The search trial that chose the
  winner is never among them: the best of N trials is biased low, and N differs between modes;
- reruns (`tuning=rerun`: `python -m bench rerun`) are kept apart: listed, never searched or counted;
- target trials run without a sweep (no `tuning`) are one fixed point each, nothing chosen: all are its seeds.
"""

from __future__ import annotations

import math
import statistics
from collections import defaultdict
from dataclasses import dataclass, field

from bench import estimators
from bench.harness.tuning import best_of
from bench.harness.tuning import reached as reached_row  # the sweeper's test: ended ok, target reached
from bench.report.tables import num
from bench.scenarios.model.schedule import previous_evaluation
from bench.scenarios.model.select import (
    KNOB_DEFAULTS,
    OPTIMIZER_KNOBS,
    Context,
    context_key,
    knob,
    mode_label,
    scope_label,
    variant,
)

# What a tuning search may vary (the sweeper's points set them); which of them a search did vary is read from its rows
TUNABLE = (*OPTIMIZER_KNOBS, *estimators.setting_columns())
TARGET_COLUMNS = (
    "target_metric",
    "target_value",
    "target_max_steps",
    "eval_every",
    "eval_resolution",
    "eval_examples",
    "warmup_steps",
    "target_hold",
)
# a target column's value where its cell is empty: rows from before eval_resolution evaluated every eval_every steps,
# and rows from before target.hold met the target at one evaluation
TARGET_DEFAULTS = {"eval_resolution": 0.0, "target_hold": 1}
REFERENCE = estimators.EXACT  # costs are given relative to backprop's, in the same framework, scope and context
DEFAULT_OBJECTIVE = "wall_to_target_s"  # the sweeper's default: what picked winners before rows named it
INF = math.inf


def value(row: dict, column: str) -> float | None:
    """A cost of a row: a column, or one derived from them. flops_to_target: the counted FLOPs of a step x its
    steps to the target; forwards_to_target: the same in forward passes of the model (flops_forward each), FLOP
    equivalents; passes_to_target: steps x the forward passes its estimator declares a step runs (rows from before
    the column: from the estimator and the row's settings)."""
    steps, flops, forward = num(row, "steps_to_target"), num(row, "flops_per_step"), num(row, "flops_forward")
    if column == "passes_to_target" and num(row, column) is None and steps is not None:
        mode = row.get("mode", "")
        passes = estimators.get(mode).forward_passes_for(row) if mode in estimators.names() else None
        return None if passes is None else steps * passes
    if column == "flops_to_target":
        return None if steps is None or flops is None else steps * flops
    if column == "forwards_to_target":
        return None if steps is None or flops is None or not forward else steps * flops / forward
    return num(row, column)


def ran_dropout(row: dict) -> float:
    """The dropout a trial trained with: the model's (its `dropout` column, the default for rows without it)
    where its estimator trains with dropout on, 0 where it runs the model in eval mode (MeZO and its kin)."""
    mode = row.get("mode", "")
    on = estimators.get(mode).dropout if mode in estimators.names() else True
    return float(knob(row, "dropout")) if on else 0.0


def _setting(row: dict, column: str) -> str:
    """A tunable knob's value as canonical text (1e-3 and 0.001 are one value)."""
    return knob(row, column) if column in OPTIMIZER_KNOBS or column in KNOB_DEFAULTS else str(row.get(column) or "")


def point(row: dict) -> tuple:
    """The tuned point of a trial: its learning rate and the mode's own tunable knobs."""
    return tuple(_setting(row, c) for c in TUNABLE)


def searched(rows: list[dict]) -> dict[str, tuple[str, ...]]:
    """Per tune_group, the knobs its search trials differ in: what the search varied."""
    seen: dict = defaultdict(lambda: defaultdict(set))
    for r in rows:
        if r.get("tune_group") and r.get("tuning") == "search":
            for c in TUNABLE:
                seen[r["tune_group"]][c].add(_setting(r, c))
    return {g: tuple(c for c in TUNABLE if len(values[c]) > 1) for g, values in seen.items()}


def _without(row: dict, knobs: tuple[str, ...]) -> dict:
    return {**row, **dict.fromkeys(knobs, "")}  # an empty cell reads as the knob's default


def _text(v) -> str:
    try:
        return repr(float(v))  # "0.5" and "0.50" are one target
    except (TypeError, ValueError):
        return str(v or "")


def target_of(row: dict) -> tuple:
    return tuple((c, _text(row.get(c) or TARGET_DEFAULTS.get(c))) for c in TARGET_COLUMNS)


def held_out_error(accuracy: float, examples: float) -> float:
    """The standard error of an accuracy measured on `examples` held-out examples where the true one is
    `accuracy` (binomial): how far a model short of a target can score past it by the sample alone."""
    return math.sqrt(accuracy * (1 - accuracy) / examples)


def target_label(key: Context) -> str:
    """eval_accuracy 0.5 on 128 held-out examples (standard error 0.044 there) · cap 501 steps · evaluated every
    25 steps · 1 warm-up step"""
    t = {c: v if c == "target_metric" else num({c: v}, c) for c, v in dict(key)["target"]}
    parts = [f"{t['target_metric']} {t['target_value']:g}" if t["target_value"] is not None else t["target_metric"]]
    n = t["eval_examples"]  # none in rows from before the column
    if n:
        parts[0] += f" on {n:.0f} held-out examples"
    if n and t["target_metric"] == "eval_accuracy" and t["target_value"]:
        parts[0] += f" (standard error {held_out_error(t['target_value'], n):.3f} there)"
    if t["target_max_steps"] is not None:
        parts.append(f"cap {t['target_max_steps']:.0f} steps")
    every = f"evaluated every {t['eval_every']:.0f} steps" if t["eval_every"] else "evaluation interval unknown"
    if t["eval_every"] and t["eval_resolution"]:
        every += f" and in between within {t['eval_resolution']:.0%} of the count"
    parts.append(every)
    if (t["target_hold"] or 1) > 1:
        parts.append(f"held at {t['target_hold']:.0f} evaluations in a row")
    if t["warmup_steps"] is not None:
        parts.append(f"{t['warmup_steps']:.0f} warm-up step{'' if t['warmup_steps'] == 1 else 's'}")
    return " · ".join(parts)


def group_key(row: dict, tuned: tuple[str, ...] = ()) -> tuple[Context, tuple[str, str]]:
    """(the table a row's group is in: its context and target, (framework, the mode as variant() names it)): the
    knobs `tuned` (what its search varied) left out of both."""
    free = _without(row, tuned)
    return (*context_key(free, drop=tuned), ("target", target_of(row))), (row.get("framework", ""), variant(free))


def reference_label(row: dict) -> str:
    """The backprop a mode is compared with: backprop (no remat) with the row's other settings and scope."""
    return variant({**row, "mode": REFERENCE, "remat": "False"})


@dataclass(frozen=True)
class Cost:
    """A cost over a winner's seeds: median, lowest, highest (INF: a seed that missed), how many seeds."""

    median: float | None = None
    lo: float | None = None
    hi: float | None = None
    seeds: int = 0

    @property
    def finite(self) -> bool:
        return self.median is not None and math.isfinite(self.median)


@dataclass(eq=False)  # compared (and hashed) by identity
class Group:
    """The trials of one way of differentiating at one target: its search, its winner's repeats, its reruns, and
    target trials run on their own."""

    framework: str
    label: str  # variant(), less what the search varied
    mode: str = ""  # the same without the trainable scope
    scope: str = ""
    search: list[dict] = field(default_factory=list)
    confirms: list[dict] = field(default_factory=list)  # a winner at the sweeper's confirming seeds (its choice)
    repeats: list[dict] = field(default_factory=list)
    reruns: list[dict] = field(default_factory=list)
    fixed: list[dict] = field(default_factory=list)  # no tuning: one point, nothing chosen

    @property
    def rows(self) -> list[dict]:
        return [*self.search, *self.confirms, *self.repeats, *self.reruns, *self.fixed]

    @property
    def diverged(self) -> int:
        """Search trials that diverged: all of them, and the grid did not reach a stable learning rate."""
        return sum(r.get("status") == "diverged" for r in self.search)

    @property
    def capped(self) -> int:
        """Search trials stopped at the steps their group's best took (the sweeper's capping): they could not win."""
        return sum(r.get("target_status") == "capped" for r in self.search)

    @property
    def objective(self) -> str:
        """The column the search picked its winner by, as its latest row names it."""
        return next((r["tune_objective"] for r in reversed(self.search) if r.get("tune_objective")), DEFAULT_OBJECTIVE)

    @property
    def winner(self) -> dict | None:
        if not self.search:
            return self.fixed[-1] if self.fixed else None
        reached = [r for r in self.search if reached_row(r) and value(r, self.objective) is not None]
        if self.confirms:  # the sweeper's confirm: a confirmed point's cost is its worst over its seeds (a miss: INF)
            worst = lambda r: max(  # noqa: E731
                value(c, self.objective) if reached_row(c) and value(c, self.objective) is not None else INF
                for c in (r, *(c for c in self.confirms if point(c) == point(r)))
            )
            confirmed = {point(c) for c in self.confirms}
            return best_of([r for r in reached if point(r) in confirmed], worst, lambda r: value(r, "lr"))
        return best_of(reached, lambda r: value(r, self.objective), lambda r: value(r, "lr"))

    def seeds(self) -> list[dict]:
        """The rows the winner's cost is taken over: its repeats at seeds the search did not use (never the search
        trial itself); for target trials run on their own, every one."""
        if not self.search:
            return list(self.fixed)
        w = self.winner
        if w is None:
            return []
        used = {str(r.get("seed")) for r in (*self.search, *self.confirms)}
        return [r for r in self.repeats if point(r) == point(w) and str(r.get("seed")) not in used]

    def cost(self, column: str) -> Cost:
        """Median, lowest and highest of `column` over the winner's seeds; a seed that missed is INF, one whose
        cell is empty (a column its row predates) is left out."""
        values = [value(r, column) if reached_row(r) else INF for r in self.seeds()]
        values = [v for v in values if v is not None]
        if not values:
            return Cost()
        return Cost(statistics.median(values), min(values), max(values), len(values))

    def steps_bracket(self) -> tuple[float, float] | None:
        """Where the median steps to the target lies, given that each seed's target was checked only at its
        evaluations (every eval_every steps, and in between with eval_resolution: schedule.py) and that its first
        step at the target came after its previous evaluation (the metric, once met, stays met; a noisy held-out
        metric near its target can break that) and at most at its count (step 1 where the target was met at the
        first evaluation): between the median of those lower ends and the median of the counts. None where a
        seed's interval was not recorded."""
        lows, highs = [], []
        for r in self.seeds():
            if not reached_row(r):
                lows.append(INF)
                highs.append(INF)
                continue
            steps, every, warm = num(r, "steps_to_target"), num(r, "eval_every"), int(num(r, "warmup_steps") or 0)
            if steps is None or not every:
                return None
            # timed steps at the evaluation before the one that met it
            resolution = num(r, "eval_resolution") or TARGET_DEFAULTS["eval_resolution"]
            previous = previous_evaluation(int(steps) - warm, int(every), resolution, warm)
            lows.append(warm + previous + 1 if previous > 0 else 1)
            highs.append(steps)
        return (statistics.median(lows), statistics.median(highs)) if lows else None


def cost_groups(rows: list[dict]) -> dict[Context, dict[tuple[str, str], Group]]:
    """{table key (context and target): {(framework, mode label): Group}} of the target trials among `rows`. A
    sweep's trial leaves out what its own search varied, and the optimizer's knobs any search varied (so a mode
    whose search kept the learning rate fixed is still compared with those that tuned it); a target trial run
    without a sweep leaves out nothing."""
    rows = [r for r in rows if r.get("target_metric") and r.get("status") != "damaged"]
    varied = searched(rows)
    optimizer = tuple(c for c in OPTIMIZER_KNOBS if any(c in v for v in varied.values()))
    out: dict = defaultdict(dict)
    for r in rows:
        tuned = (*optimizer, *varied.get(r.get("tune_group") or "", ())) if r.get("tuning") else ()
        key, cell = group_key(r, tuned)
        free = _without(r, tuned)
        group = out[key].setdefault(cell, Group(*cell, mode=mode_label(free), scope=scope_label(r)))
        # a kind the sweeper does not write (a rerun, or one added later) is kept apart, never searched or counted
        kinds = {"search": group.search, "confirm": group.confirms, "repeat": group.repeats, "": group.fixed}
        kinds.get(r.get("tuning") or "", group.reruns).append(r)
    return dict(out)


def reference(groups: dict[tuple[str, str], Group], g: Group) -> Group | None:
    rows = g.rows
    return groups.get((g.framework, reference_label(rows[0]))) if rows else None


def ratio(g: Group, ref: Group | None, column: str) -> tuple[float | None, float | None, float | None]:
    """The group's median cost over the reference's, and for steps_to_target the range the evaluation interval
    allows (its bracket's lowest over the reference's highest, to its highest over the reference's lowest)."""
    if ref is None:
        return None, None, None
    a, b = g.cost(column), ref.cost(column)
    if not a.finite or not b.finite or not b.median:
        return None, None, None
    mid = a.median / b.median
    if column != "steps_to_target":
        return mid, None, None
    ba, bb = g.steps_bracket(), ref.steps_bracket()
    if ba is None or bb is None:
        return mid, None, None
    return mid, ba[0] / bb[1], ba[1] / bb[0]


# ------------------------------------------------------------------------------------------ performance profile

TAUS = (1, 2, 4, 10)  # AlgoPerf's profile is a curve over tau; a table reads it at a few points


def problems(found: dict[Context, dict], column: str) -> dict[tuple, dict[tuple[str, str], float]]:
    """{(table key, scope): {(framework, mode): median cost}} over every group; INF where a mode's winner missed
    at every seed, or no trial of it reached the target."""
    out: dict = defaultdict(dict)
    for key, groups in found.items():
        for g in groups.values():
            c = g.cost(column)
            out[(key, g.scope)][(g.framework, g.mode)] = c.median if c.median is not None else INF
    return dict(out)


def performance_profile(costs: dict[tuple, dict], taus=TAUS) -> dict[tuple[str, str], list[float]]:
    """AlgoPerf's performance profile: per solver (framework, mode), the fraction of the problems it solved within
    tau times the best solver's cost on that problem, at each tau. Problems no solver reached are left out (no best
    to measure against); a problem a solver did not run counts as unsolved by it."""
    solved = {p: c for p, c in costs.items() if any(math.isfinite(v) for v in c.values())}
    solvers = sorted({s for c in costs.values() for s in c})
    profile = {}
    for s in solvers:
        fractions = []
        for tau in taus:
            wins = sum(c.get(s, INF) <= tau * min(c.values()) for c in solved.values())
            fractions.append(wins / len(solved) if solved else 0.0)
        profile[s] = fractions
    return profile


def seed_counts(found: dict[Context, dict]) -> tuple[int, int]:
    """The fewest and most seeds a winner's cost was taken over (0, 0 without winners)."""
    counts = [len(g.seeds()) for groups in found.values() for g in groups.values() if g.winner]
    return (min(counts), max(counts)) if counts else (0, 0)
