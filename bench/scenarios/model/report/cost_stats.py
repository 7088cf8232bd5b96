"""What the "Cost to target" section computes, apart from how it shows it: the groups trials are compared in, each
group's winner, the winner's cost over fresh seeds, how precisely steps to the target are known, the costs in
forward passes and FLOPs, and a performance profile across modes and problems.

A group is one way of differentiating at one target: the comparison context (select.context_key) and the mode as
select.variant() names it (every setting that changes the numbers, the trainable scope included), less what its
tuning search varied (read from its rows: the knobs its search trials differ in) and, for a tuning sweep's rows,
less its optimizer, which each mode brings as a submission does (named in its label where it is not plain SGD),
plus the whole target (metric, value, held-out examples, step cap, evaluation interval and resolution, warm-up
steps). Within a group, as AlgoPerf and MLPerf score a submission:

- the search (`tuning=search`) picks the winner, the trial that reached the target with the lowest value of the
  sweeper's objective (the rows' `tune_objective`; wall_to_target_s, the sweeper's default, for rows written
  before that column), ties broken as the sweeper breaks them (its `best_of`: the middle learning rate);
- with the sweeper's `confirm` seeds (`tuning=confirm` rows), the winner is the confirmed point whose worst over its
  search and confirming seeds is lowest (a miss is infinite), as the sweeper picks it;
- the winner's cost is the median, with the lowest and highest, over its repeats (`tuning=repeat`) at seeds the
  search did not use; a repeat that missed the target counts as infinitely slow (censored: it would have taken
  more than the cap). The search trial that chose the winner is never among them: the best of N trials is biased
  low, and N differs between modes. Where the sweeper ran several independent searches (`tune_study`), the median
  over the studies of each one's winner's median;
- reruns (`tuning=rerun`: `python -m bench rerun`) are kept apart: listed, never searched or counted;
- target trials run without a sweep (no `tuning`) are one fixed point each, nothing chosen: all are its seeds.
"""

from __future__ import annotations

import math
import statistics
from collections import defaultdict
from dataclasses import dataclass, field

from bench import estimators
from bench.config import default
from bench.harness.tuning import best_of
from bench.harness.tuning import reached as reached_row  # the sweeper's test: ended ok, target reached
from bench.report.tables import num
from bench.scenarios.model.schedule import previous_evaluation
from bench.scenarios.model.select import (
    KNOB_DEFAULTS,
    KNOB_NAMES,
    OPTIMIZER_KNOBS,
    Context,
    context_key,
    knob,
    mode_label,
    non_default,
    scope_label,
    variant,
)
from bench.scenarios.model.target import parse_levels, replay_levels
from bench.store.read import read_history

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
# A tuning sweep's optimizer is part of what each mode submits, as an AlgoPerf submission brings its own: backprop
# on momentum SGD is compared with the estimators on plain SGD in one table, each mode's optimizer in its label. The
# learning rate is every tuned point's own (its column), out of the context where any search varied it.
SUBMITTED = ("optimizer", *(k for k in OPTIMIZER_KNOBS if k != "lr"))
DEFAULT_OPTIMIZER = default("optimizer.name")
DEFAULT_OBJECTIVE = "wall_to_target_s"  # the sweeper's default: what picked winners before rows named it
INF = math.inf


def levels(row: dict) -> dict[float, float | None]:
    """{target level: steps to hold it, None where it never was} from the row's `levels_to_target` ("0.3:40;0.35:;
    0.4:120"), the main target's steps its own column; rows from before the column know the main target only."""
    # a damaged pair prices nothing; the target's own level stands on its column
    out: dict[float, float | None] = dict(parse_levels(row.get("levels_to_target")))
    main = num(row, "target_value")
    if main is not None:
        out[main] = num(row, "steps_to_target")
    return out


# Easier levels of an accuracy target (a loss target's: the value over each), replayed from the evaluation history of
# a row that recorded none (target.levels unset): the profile needs more problems than scopes x frameworks, and
# the levels below a reached target follow from the kept evaluations exactly (target.replay_levels).
EASIER = (0.75, 0.875)


def with_levels(row: dict) -> dict:
    """The row, with a levels_to_target cell replayed from its history where it recorded none; as it is where it
    has one, no target, or no kept history with its metric."""
    metric, value = row.get("target_metric"), num(row, "target_value")
    if row.get("levels_to_target") or metric not in ("eval_accuracy", "eval_loss") or value is None:
        return row
    evaluations = (read_history(row) or {}).get(metric)
    if not evaluations:
        return row
    easier = [round(value * f if metric == "eval_accuracy" else value / f, 6) for f in EASIER]
    hold = int(num(row, "target_hold") or TARGET_DEFAULTS["target_hold"])
    cell = replay_levels(evaluations, easier, metric, hold, int(num(row, "warmup_steps") or 0))
    return {**row, "levels_to_target": cell}


# the costs a lower (or higher) level of the target is priced in: those that follow from its steps alone, and the
# times that follow from them and the trial's kept step times (history/: timed_through)
LEVEL_COSTS = ("steps_to_target", "passes_to_target", "forwards_to_target", "flops_to_target")
TIMED_LEVEL_COSTS = ("seconds_to_target", "wall_to_target_s")


def value(row: dict, column: str, level: float | None = None) -> float | None:
    """A cost of a row: a column, or one derived from them. flops_to_target: the counted FLOPs of a step x its
    steps to the target; forwards_to_target: the same in forward passes of the model (flops_forward each), FLOP
    equivalents; passes_to_target: steps x the forward passes its estimator declares a step runs (rows from before
    the column: from the estimator and the row's settings). At another `level` of the target than the row's own,
    the steps to it (levels()), the costs derived from them, and its times (timed_through)."""
    steps, flops, forward = num(row, "steps_to_target"), num(row, "flops_per_step"), num(row, "flops_forward")
    other_level = level is not None and level != num(row, "target_value")
    if other_level and column in TIMED_LEVEL_COSTS:
        return timed_through(row, levels(row).get(level), column)
    if other_level:
        if column not in LEVEL_COSTS:
            return None  # a time or memory at another level is not recorded
        steps = levels(row).get(level)
        if column == "steps_to_target":
            return steps
    if column == "passes_to_target" and (other_level or num(row, column) is None):
        mode = row.get("mode", "")
        passes = estimators.get(mode).forward_passes_for(row) if mode in estimators.names() else None
        return None if passes is None or steps is None else steps * passes
    if column == "flops_to_target":
        return None if steps is None or flops is None else steps * flops
    if column == "forwards_to_target":
        return None if steps is None or flops is None or not forward else steps * flops / forward
    return num(row, column)


def timed_through(row: dict, steps: float | None, column: str) -> float | None:
    """A time to a level of the target from the trial's kept per-step times: the row's own time to the target less
    the steps it took after the level's count (so a level held at the target's step costs the target's time), or
    where the trial missed the target, the first `steps` steps' seconds and for wall_to_target_s the compilation
    before them (the evaluations are in neither, as in the target's own columns); None without a count or a history
    that long."""
    times = (read_history(row) or {}).get("step_time_s")
    if steps is None or not times or len(times) < steps:
        return None
    own, main = num(row, column), num(row, "steps_to_target")
    if reached_row(row) and own is not None and main is not None and steps <= main <= len(times):
        return own - float(sum(times[int(steps) : int(main)]))
    seconds = float(sum(times[: int(steps)]))
    if column == "seconds_to_target":
        return seconds
    compiled = num(row, "compile_time_s")
    return None if compiled is None else compiled + seconds


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


def group_key(row: dict, tuned: tuple[str, ...] = (), submitted: bool = False) -> tuple[Context, tuple[str, str]]:
    """(the table a row's group is in: its context and target, (framework, the mode as variant() names it)): the
    knobs `tuned` (what its search varied) left out of both; `submitted` (a tuning sweep's row): its optimizer out
    of the context and in the label where it is not plain SGD ("backprop[bias] · sgd (momentum 0.9)")."""
    free = _without(row, tuned)
    label, drop = variant(free), tuned
    if submitted:
        drop = (*tuned, *SUBMITTED)
        if optimizer := submitted_optimizer(free):
            label += f" · {optimizer}"
    return (*context_key(free, drop=drop), ("target", target_of(row))), (row.get("framework", ""), label)


def submitted_optimizer(row: dict) -> str:
    """The optimizer a tuned mode ran with, where it is not the default one at its defaults: "sgd (momentum 0.9)",
    "adamw", "adamw (weight decay 0.1)"; "" for plain SGD. Knobs its search tuned are left out (empty in `row`)."""
    name = row.get("optimizer") or DEFAULT_OPTIMIZER
    hyper = [f"{KNOB_NAMES.get(k, k)} {v}" for k in SUBMITTED[1:] if (v := non_default(row, k))]
    if hyper:
        return f"{name} ({', '.join(hyper)})"
    return "" if name == DEFAULT_OPTIMIZER else name


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
    censored: bool = False  # some seed missed: the median is over a cost known only to exceed the cap there

    @property
    def finite(self) -> bool:
        return self.median is not None and math.isfinite(self.median)


@dataclass(eq=False)  # compared (and hashed) by identity
class Group:
    """The trials of one way of differentiating at one target: its search, its winner's repeats, its reruns, and
    target trials run on their own."""

    framework: str
    label: str  # variant(), less what the search varied (with the optimizer a tuned mode brought)
    mode: str = ""  # the same without the trainable scope
    scope: str = ""
    base: str = ""  # variant() alone: the label without the optimizer
    search: list[dict] = field(default_factory=list)
    confirms: list[dict] = field(default_factory=list)  # a winner at the sweeper's confirming seeds (its choice)
    repeats: list[dict] = field(default_factory=list)
    reruns: list[dict] = field(default_factory=list)
    fixed: list[dict] = field(default_factory=list)  # no tuning: one point, nothing chosen
    _memo: dict = field(default_factory=dict, init=False, repr=False)

    def _cached(self, name: str, compute):
        """`compute()` once per state of the rows: every table cell asks for the seeds, and finding them compares
        each repeat's tuned point with the winner's (rows are only ever added, so their counts mark a state)."""
        state = (name, len(self.search), len(self.confirms), len(self.repeats), len(self.reruns), len(self.fixed))
        if state not in self._memo:
            self._memo[state] = compute()
        return self._memo[state]

    @property
    def rows(self) -> list[dict]:
        return [*self.search, *self.confirms, *self.repeats, *self.reruns, *self.fixed]

    def studies(self) -> list[Group]:
        """The group's independent searches (the sweeper's `tune_study`), each with its own winner and fresh seeds;
        [self] where it ran one (rows from before the column are one study)."""
        return self._cached("studies", self._studies)

    def _studies(self) -> list[Group]:
        ids = sorted({study(r) for r in self.rows}, key=lambda s: (len(s), s))
        if len(ids) <= 1:
            return [self]
        kinds = ("search", "confirms", "repeats", "reruns", "fixed")
        return [
            Group(
                self.framework,
                self.label,
                self.mode,
                self.scope,
                self.base,
                **{k: [r for r in getattr(self, k) if study(r) == s] for k in kinds},
            )
            for s in ids
        ]

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
        """The search's pick (the first study's, where several ran)."""
        if len(studies := self.studies()) > 1:
            return studies[0].winner
        if not self.search:
            return self.fixed[-1] if self.fixed else None
        reached = [r for r in self.search if reached_row(r) and value(r, self.objective) is not None]
        if self.confirms:  # the sweeper's confirm: a confirmed point's cost is its worst over its seeds (a miss: INF)
            worst = lambda r: max(  # noqa: E731
                value(c, self.objective) if reached_row(c) and value(c, self.objective) is not None else INF
                for c in (r, *(c for c in self.confirms if point(c) == point(r)))
            )
            confirmed = {point(c) for c in self.confirms}
            held = [r for r in reached if point(r) in confirmed and math.isfinite(worst(r))]  # as the sweeper's
            return best_of(held, worst, lambda r: value(r, "lr"))
        return best_of(reached, lambda r: value(r, self.objective), lambda r: value(r, "lr"))

    def seeds(self) -> list[dict]:
        """The rows the winner's cost is taken over: its repeats at seeds the search did not use (never the search
        trial itself); for target trials run on their own, every one. Every study's, where several ran."""
        return list(self._cached("seeds", self._seeds))

    def _seeds(self) -> list[dict]:
        if len(studies := self.studies()) > 1:
            return [r for s in studies for r in s.seeds()]
        if not self.search:
            return list(self.fixed)
        w = self.winner
        if w is None:
            return []
        used = {str(r.get("seed")) for r in (*self.search, *self.confirms)}
        return [r for r in self.repeats if point(r) == point(w) and str(r.get("seed")) not in used]

    def values(self, column: str, level: float | None = None) -> list[list[float]]:
        """Per study, `column` at each of its winner's seeds (at `level` of the target: its own where None); a seed
        that missed is INF (censored: it would have taken more than the cap), one whose cell is empty (a column its
        row predates) is left out."""
        out = []
        for s in self.studies():
            seen = [seed_value(r, column, level) for r in s.seeds()]
            out.append([v for v in seen if v is not None])
        return [v for v in out if v]

    def cost(self, column: str, level: float | None = None) -> Cost:
        """Median, lowest and highest of `column` over the winner's seeds (a missed seed INF); where several
        studies ran, the median over the studies of each one's median."""
        arms = self.values(column, level)
        if not arms:
            return Cost()
        every = [v for arm in arms for v in arm]
        mid = statistics.median(statistics.median(arm) for arm in arms)
        return Cost(mid, min(every), max(every), len(every), censored=INF in every)

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
    whose search kept the learning rate fixed is still compared with those that tuned it), and its optimizer goes
    from the context to its label (SUBMITTED); a target trial run without a sweep leaves out nothing."""
    rows = [with_levels(r) for r in rows if r.get("target_metric") and r.get("status") != "damaged"]
    varied = searched(rows)
    optimizer = tuple(c for c in OPTIMIZER_KNOBS if any(c in v for v in varied.values()))
    out: dict = defaultdict(dict)
    for r in rows:
        tuned = (*optimizer, *varied.get(r.get("tune_group") or "", ())) if r.get("tuning") else ()
        key, cell = group_key(r, tuned, submitted=bool(r.get("tuning")))
        free = _without(r, tuned)
        group = out[key].setdefault(cell, Group(*cell, mode=mode_label(free), scope=scope_label(r), base=variant(free)))
        # a kind the sweeper does not write (a rerun, or one added later) is kept apart, never searched or counted
        kinds = {"search": group.search, "confirm": group.confirms, "repeat": group.repeats, "": group.fixed}
        kinds.get(r.get("tuning") or "", group.reruns).append(r)
    return dict(out)


def study(row: dict) -> str:
    return str(row.get("tune_study") or 0)  # rows from before the column: one study


def seed_value(row: dict, column: str, level: float | None = None) -> float | None:
    """A fresh seed's cost: INF where its trial did not reach the target, or at another `level` of it did not end
    ok or never held that level (a seed that missed the target can have held a lower level)."""
    if level is None or level == num(row, "target_value"):
        return value(row, column) if reached_row(row) else INF
    if row.get("status") != "ok" or (level in levels(row) and levels(row)[level] is None):
        return INF
    return value(row, column, level)


def reference(groups: dict[tuple[str, str], Group], g: Group) -> Group | None:
    """The backprop g is compared with: the one with g's settings and optimizer, else the one backprop of g's
    framework and settings in the table, whatever optimizer it brought (None where there are several)."""
    rows = g.rows
    if not rows:
        return None
    want = reference_label(rows[0])
    if (exact := groups.get((g.framework, want))) is not None:
        return exact
    found = [h for (framework, _), h in groups.items() if framework == g.framework and h.base == want]
    return found[0] if len(found) == 1 else None


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


def target_levels(g: Group, column: str) -> list[float | None]:
    """The levels of the target a group's cost in `column` is known at: its own (None), then the others its seeds'
    rows recorded (levels_to_target) where the cost follows from their steps (and kept step times)."""
    if column not in LEVEL_COSTS + TIMED_LEVEL_COSTS:
        return [None]
    rows = g.seeds()
    own = {num(r, "target_value") for r in rows}
    return [None, *sorted({level for r in rows for level in levels(r)} - own)]


def problems(found: dict[Context, dict], column: str) -> dict[tuple, dict[str, float]]:
    """{(table key, scope, framework, level of the target): {mode: median cost}} over every group (the target's own
    level None); INF where a mode's winner missed at every seed, or no trial of it reached the target. A framework
    is a problem, not a solver: the profile compares ways of differentiating, each framework's runs problems apart."""
    out: dict = defaultdict(dict)
    for key, groups in found.items():
        for g in groups.values():
            for level in target_levels(g, column):
                c = g.cost(column, level)
                out[(key, g.scope, g.framework, level)][g.mode] = c.median if c.median is not None else INF
    return dict(out)


def performance_profile(costs: dict[tuple, dict], taus=TAUS) -> dict:
    """AlgoPerf's performance profile: per solver (a mode), the fraction of the problems it solved within
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
