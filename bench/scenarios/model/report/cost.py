"""The report's "Cost to target" section: what each way of differentiating costs to reach the same held-out
accuracy (or loss), tuned with the same budget, relative to backprop; at matched memory; a performance profile
across modes and problems; and its plots.

Rows are the trials run with a target (`target.metric`). How they are grouped, which trial wins a group's search
and which seeds its cost is taken over are cost_stats.py's: in short, the search picks a point by the sweeper's
objective, and its cost is the median over fresh seeds (its repeats at seeds the search did not use, a missed seed
infinite), never the search trial that chose it; reruns are listed apart. How sure each number is (bootstrap
intervals over the seeds, the memory noise band) is cost_uncertainty.py's.
"""

from __future__ import annotations

import math
import statistics
from collections import defaultdict
from dataclasses import fields
from pathlib import Path

from bench import estimators
from bench.report.plots import Chart, Plot, Series, save
from bench.report.section import PLOT_DIR, RUNS_CSV, Results, Section
from bench.report.tables import fmt_ratio, fmt_value, md_table, num
from bench.scenarios.model.columns import REQUIRED_COLUMNS
from bench.scenarios.model.report.cost_curve import CURVE_TEXT, curve_table, params_chart
from bench.scenarios.model.report.cost_stats import (
    TAUS,
    Cost,
    Group,
    cost_groups,
    performance_profile,
    point,
    problems,
    ran_dropout,
    ratio,
    reached_row,
    reference,
    seed_counts,
    target_label,
)
from bench.scenarios.model.report.cost_uncertainty import (
    CENSORED,
    MIN_SEEDS,
    few_seeds,
    group_ratio,
    memory_band,
    ratio_interval,
    ties,
)
from bench.scenarios.model.select import (
    Context,
    context_label,
    context_order,
    framework_order,
    knob,
    mode_order,
    non_default,
)
from bench.spec import FRAMEWORK_NAMES, FRAMEWORKS
from bench.store.read import read_history


def point_label(row: dict) -> str:
    parts, mode = [f"lr {knob(row, 'lr')}"], row.get("mode", "")
    if mode in estimators.settings_nodes():  # the row's own estimator's settings
        columns = estimators.columns_of(mode)
        for f in fields(estimators.get(mode).settings):
            if isinstance(f.default, float) or non_default(row, columns[f.name]):  # a scale (eps) always
                parts.append(f"{f.name} {knob(row, columns[f.name])}")
    return ", ".join(parts)


def count(v: float, scale: float = 1.0) -> str:
    return f"{v * scale:.0f}"  # steps and forward passes: whole numbers


def fmt_spread(cost: Cost, scale: float = 1.0, fmt=fmt_value) -> str:
    """median [lowest–highest] over the seeds, † where some seed missed; "not reached" where most seeds missed"""
    if cost.median is None:
        return "-"
    if math.isinf(cost.median):
        return "not reached"
    text = fmt(cost.median, scale) + (CENSORED if cost.censored else "")
    if cost.lo == cost.hi:
        return text
    return f"{text} [{fmt(cost.lo, scale)}–{'∞' if math.isinf(cost.hi) else fmt(cost.hi, scale)}]"


def fmt_interval(interval: tuple[float, float] | None) -> str:
    """[0.52, 1.31]: a bootstrap interval, ∞ where resampled medians were censored"""
    if interval is None:
        return ""
    return " [" + ", ".join("∞" if math.isinf(v) else fmt_value(v) for v in interval) + "]"


def fmt_range(r: tuple, interval: tuple[float, float] | None = None) -> str:
    """a ratio with its bootstrap interval, then the range the evaluation interval allows where known:
    6.90× [4.10, 9.80] (5.20–13.5)"""
    mid, lo, hi = r
    if mid is None:
        return fmt_ratio(mid)
    text = fmt_ratio(mid) + fmt_interval(interval)
    return text if lo is None else f"{text} ({fmt_value(lo)}–{fmt_value(hi)})"


def ratio_cell(g: Group, ref: Group | None, column: str) -> str:
    """The ratio of medians over the reference's, its 95% bootstrap interval over the seeds, † where a median
    includes a missed seed."""
    r = ratio(g, ref, column)
    if r[0] is None or g is ref:  # the reference over itself: 1, exactly
        return fmt_range(r)
    flag = CENSORED if g.cost(column).censored or ref.cost(column).censored else ""
    return fmt_range(r, group_ratio(g, ref, column)) + flag


def seeds_cell(g: Group) -> str:
    """5, 5 (1 missed), or 15 over 3 studies (each its own search and seeds), and how many found no winner"""
    seeds, studies = g.seeds(), len(g.studies())
    missed = sum(not reached_row(r) for r in seeds)
    lost = sum(s.winner is None for s in g.studies()) if studies > 1 else 0
    notes = [f"{missed} missed"] * bool(missed) + [f"{studies} studies"] * (studies > 1)
    notes += [f"{lost} without a winner"] * bool(lost)
    return f"{len(seeds)}" + (f" ({', '.join(notes)})" if notes else "")


def measured(g: Group, column: str) -> float | None:
    """A measurement that does not depend on reaching the target (peak memory): the median over the winner's
    seeds, else the winner's own."""
    values = [v for v in (num(r, column) for r in g.seeds()) if v is not None]
    if values:
        return statistics.median(values)
    return num(g.winner, column) if g.winner else None


HEAD = [
    "framework",
    "mode",
    "trained params",
    "tuned point",
    "reached (search)",
    "seeds",
    "steps",
    "steps known within",
    "forward passes (FLOPs)",
    "forward passes (declared)",
    "GFLOP",
    "timed s",
    "wall s",
    "peak MiB",
    "excess MiB",
    "MiB·s",
    "steps × (range)",
    "forward passes (FLOPs) ×",
    "wall ×",
    "peak ×",
    "MiB·s ×",
]


def ordered(groups: dict[tuple[str, str], Group]) -> list[Group]:
    return sorted(groups.values(), key=lambda g: (framework_order(g.framework), mode_order(g.rows[0]), g.label))


def bracket_cell(bracket: tuple[float, float] | None) -> str:
    """Where the median steps lie: "52–61", or "8" where every seed's count is exact (evaluated at each step)."""
    if bracket is None or math.isinf(bracket[1]):
        return "-"
    lo, hi = bracket
    return f"{hi:.0f}" if lo == hi else f"{lo:.0f}–{hi:.0f}"


def cost_table(groups: dict[tuple[str, str], Group]) -> str:
    """One row per group; joules to the target and their ratio at the end where a row read a device's counter."""
    joules = any(num(r, "energy_to_target_j") is not None for g in groups.values() for r in g.rows)
    body = []
    for g in ordered(groups):
        w, ref = g.winner, reference(groups, g)
        reached = sum(reached_row(r) for r in g.search)
        bracket = g.steps_bracket()
        row = [
            FRAMEWORK_NAMES.get(g.framework, g.framework),
            g.label,
            f"{num(w or g.rows[0], 'n_trainable') or 0:,.0f}",
            point_label(w) if w else "-",
            search_cell(g, reached) if g.search else "no search",
            seeds_cell(g),
            fmt_spread(g.cost("steps_to_target"), fmt=count),
            bracket_cell(bracket),
            fmt_spread(g.cost("forwards_to_target"), fmt=count),
            fmt_spread(g.cost("passes_to_target"), fmt=count),
            fmt_spread(g.cost("flops_to_target"), 1e-9),
            fmt_spread(g.cost("seconds_to_target")),
            fmt_spread(g.cost("wall_to_target_s")),
            fmt_value(measured(g, "peak_mem_mb")),
            fmt_value(measured(g, "excess_mem_mb")),
            fmt_spread(g.cost("mib_s_to_target")),
            ratio_cell(g, ref, "steps_to_target"),
            ratio_cell(g, ref, "forwards_to_target"),
            ratio_cell(g, ref, "wall_to_target_s"),
            peak_cell(g, ref),
            ratio_cell(g, ref, "mib_s_to_target"),
        ]
        if joules:
            row += [fmt_spread(g.cost("energy_to_target_j")), ratio_cell(g, ref, "energy_to_target_j")]
        body.append(row)
    head = [*HEAD, "joules", "joules ×"] if joules else HEAD
    return md_table(head, body, "ll" + "r" * (len(head) - 2))


def peak_ratio(g: Group, ref: Group | None) -> float | None:
    if ref is None or g.winner is None or ref.winner is None:
        return None
    a, b = measured(g, "peak_mem_mb"), measured(ref, "peak_mem_mb")
    return None if a is None or not b else a / b


def peaks(g: Group) -> list[list[float]]:
    """The winner's seeds' peak memory, one arm (a seed's peak is measured whether or not it reached)."""
    values = [v for v in (num(r, "peak_mem_mb") for r in g.seeds()) if v is not None]
    return [values] if values else []


def peak_cell(g: Group, ref: Group | None) -> str:
    mid = peak_ratio(g, ref)
    return fmt_ratio(mid) + (
        fmt_interval(ratio_interval(peaks(g), peaks(ref))) if mid is not None and g is not ref else ""
    )


def dropout_note(groups: dict[tuple[str, str], Group]) -> str:
    """The dropout the table's trials trained with, in one line: equal for every mode, or which ran with which
    (MeZO and its kin run the model in eval mode whatever model.dropout says)."""
    by: dict = defaultdict(list)
    for g in ordered(groups):
        for p in sorted({ran_dropout(r) for r in g.rows}):
            if g.mode not in by[p]:
                by[p].append(g.mode)
    if len(by) == 1:
        return f"Dropout {next(iter(by)):g} in every mode's trials."
    parts = "; ".join(f"{p:g} for {', '.join(modes)}" for p, modes in sorted(by.items(), reverse=True))
    return (
        f"Dropout differs between the modes: {parts} (the zeroth-order estimators run the model in eval mode, as "
        "MeZO's recipe does; `model.dropout=0.0` trains every mode without it)."
    )


def search_cell(g: Group, reached: int) -> str:
    """reached/searched, then how many of the rest were capped and how many diverged."""
    rest = [f"{n} {what}" for n, what in ((g.capped, "capped"), (g.diverged, "diverged")) if n]
    return f"{reached}/{len(g.search)}" + (f" ({', '.join(rest)})" if rest else "")


KIND_ORDER = {"search": 0, "confirm": 1, "repeat": 2, "": 3, "rerun": 4}


def trials_table(groups: dict[tuple[str, str], Group]) -> str:
    body = []
    for g in ordered(groups):
        kind = lambda r: KIND_ORDER.get(r.get("tuning") or "", len(KIND_ORDER))  # noqa: E731
        for r in sorted(g.rows, key=lambda r: (kind(r), point(r), str(r.get("seed")))):
            ok = r.get("status") == "ok"
            outcome = (r.get("target_status") or "ok") if ok else f"**{r.get('status')}**"
            final = num(r, r.get("target_metric") or "eval_accuracy")
            body.append(
                [
                    FRAMEWORK_NAMES.get(g.framework, g.framework),
                    g.label,
                    r.get("tuning") or "-",
                    point_label(r),
                    r.get("seed", ""),
                    outcome,
                    r.get("steps_to_target") or "-",
                    fmt_value(num(r, "wall_to_target_s")),
                    fmt_value(final),
                    r.get("run_id", ""),
                ]
            )
    head = ["framework", "mode", "trial", "point", "seed", "target", "steps", "wall s", "final metric", "run_id"]
    return md_table(head, body, "llllllrrrl")


def matched_memory(groups: dict[tuple[str, str], Group]) -> list[list[str]]:
    """Per framework and trained scope, for each memory budget a tuned mode needs (its peak), the fastest mode
    (median wall time to the target) that fits in it: the answer to "which method reaches my accuracy fastest
    within my memory?", for the parameters a user trains. Budgets within the framework's noise band of each other
    (memory_band: peak memory's run-to-run spread) are one row, a tie: the modes there cannot be told apart by
    memory, so the fastest of them is the answer at each."""
    cells: dict = defaultdict(list)
    for g in groups.values():
        cells[(g.framework, g.scope)].append(g)
    bands = {fw: memory_band([g for g in groups.values() if g.framework == fw]) for fw, _ in cells}
    # scopes in the order of their trained parameters, as the steps-against-parameters plot reads
    size = lambda c: min(num(g.rows[0], "n_trainable") or 0 for g in cells[c])  # noqa: E731
    order = lambda c: (framework_order(c[0]), size(c), min(mode_order(g.rows[0])[1] for g in cells[c]))  # noqa: E731
    rows = []
    for fw, scope in sorted(cells, key=order):
        wall = {g: g.cost("wall_to_target_s") for g in cells[(fw, scope)]}
        tuned = {g: c for g, c in wall.items() if c.finite and measured(g, "peak_mem_mb") is not None}
        band = bands[fw]
        for tie in ties([measured(g, "peak_mem_mb") for g in tuned], band):
            best = min((g for g in tuned if measured(g, "peak_mem_mb") <= tie[-1]), key=lambda g: tuned[g].median)
            tied = sorted({g.label for g in tuned if measured(g, "peak_mem_mb") in tie}) if len(tie) > 1 else []
            rows.append(
                [
                    FRAMEWORK_NAMES.get(fw, fw),
                    scope,
                    budget_cell(tie),
                    best.label,
                    fmt_spread(tuned[best]),
                    str(tuned[best].seeds),
                    ", ".join(tied) or "-",
                    "-" if band is None else f"±{fmt_value(band)}",
                ]
            )
    return rows


def budget_cell(tie: list[float]) -> str:
    """500, or 500–505 (tie) where budgets within the noise band are one row"""
    if len(tie) == 1:
        return fmt_value(tie[0])
    span = fmt_value(tie[0]) if fmt_value(tie[0]) == fmt_value(tie[-1]) else f"{fmt_value(tie[0])}–{fmt_value(tie[-1])}"
    return f"{span} (tie)"


MEMORY_HEAD = [
    "framework",
    "trained scope",
    "memory budget MiB",
    "fastest within it",
    "wall s",
    "seeds",
    "tied in memory",
    "noise band MiB",
]


def framework_table(groups: dict[tuple[str, str], Group]) -> str:
    """Per mode run in both frameworks, the other framework's median costs over the first's (JAX's over PyTorch's)
    with their 95% bootstrap intervals."""
    base, *others = FRAMEWORKS
    body = []
    refs = {g.label: g for g in groups.values() if g.framework == base}
    for g in ordered(groups):
        ref = refs.get(g.label)
        if g.framework not in others or ref is None:
            continue
        cells = [ratio_cell(g, ref, column) for column in ("steps_to_target", "wall_to_target_s")]
        body.append([FRAMEWORK_NAMES[g.framework], g.label, f"{len(g.seeds())} / {len(ref.seeds())}", *cells])
        body[-1].append(peak_cell(g, ref))
    head = ["framework", "mode", f"seeds (its / {FRAMEWORK_NAMES[base]}'s)", "steps ×", "wall ×", "peak ×"]
    return md_table(head, body, "lllrrr") if body else ""


def seeds_note(groups: dict[tuple[str, str], Group]) -> str:
    """Which winners were priced over fewer fresh seeds than the report asks for, in one line ("" where none)."""
    few = few_seeds(ordered(groups))
    if not few:
        return ""
    studies = {g: len(g.studies()) for g in few}
    names = ", ".join(
        f"{FRAMEWORK_NAMES.get(g.framework, g.framework)} {g.label} "
        + (f"({n})" if studies[g] == 1 else f"({n} in the fewest of its {studies[g]} studies)")
        for g, n in few.items()
    )
    return (
        f"Fewer than {MIN_SEEDS} fresh seeds: {names}; their medians and intervals move a whole seed's worth on one "
        f"more (`hydra.sweeper.repeats` with {MIN_SEEDS} seeds apart from the search's)."
    )


PROFILED = (
    ("wall_to_target_s", "wall s"),
    ("steps_to_target", "steps"),
    ("forwards_to_target", "forward passes (FLOPs)"),
)


def mode_rank(label: str) -> int:
    """A mode label's estimator in the registry's order (backprop, jvp, jacfwd, mezo, ...)."""
    names = estimators.names()
    base = label.split("+")[0].split("(")[0].split("[")[0]
    return names.index(base) if base in names else len(names)


PROFILE_PROBLEMS = 8  # under this, one problem moves a fraction by more than 12%: too coarse to rank modes by


def profile_table(found: dict[Context, dict]) -> str:
    """The performance profile at a few tau, per cost: a row per mode, over the problems (table, scope, framework,
    level of the target) some mode solved; a cost with fewer than PROFILE_PROBLEMS says so."""
    body = []
    for column, name in PROFILED:
        costs = problems(found, column)
        solved = sum(any(math.isfinite(v) for v in c.values()) for c in costs.values())
        if not solved:
            continue
        few = (
            f", under {PROFILE_PROBLEMS}: a fraction moves {1 / solved:.0%} a problem"
            if solved < PROFILE_PROBLEMS
            else ""
        )
        for mode in sorted(profile := performance_profile(costs), key=lambda m: (mode_rank(m), m)):
            body.append([mode, f"{name} (of {solved}{few})", *(f"{f:.0%}" for f in profile[mode])])
    head = ["mode", "cost (problems)", *(f"τ = {t}" for t in TAUS)]
    return md_table(head, body, "ll" + "r" * len(TAUS)) if body else ""


# ---------------------------------------------------------------------------------------------------- plots


def curve_charts(key: Context, groups: dict[tuple[str, str], Group]) -> list[Chart]:
    """Held-out accuracy (or loss) against wall time and against steps, a line per mode: its winner's first fresh
    seed (the winning search trial where it has none; the first trial where nothing won)."""
    metric = dict(dict(key)["target"])["target_metric"]
    by_time, by_step = [], []
    for g in groups.values():
        w = next(iter(g.seeds()), None) or g.winner or (g.rows[0] if g.rows else None)
        history = read_history(w) if w else None
        if not history or not history.get(metric):
            continue
        steps = [i for i, v in enumerate(history[metric]) if v is not None]
        clock, total = [], num(w, "compile_time_s") or 0.0
        for t in history.get("step_time_s", []):
            total += t
            clock.append(total)
        warm = num(w, "warmup_steps") or 0
        ys = [history[metric][i] for i in steps]
        by_step.append(Series(g.framework, g.label, [warm + i + 1 for i in steps], ys))
        if len(clock) == len(history[metric]):
            by_time.append(Series(g.framework, g.label, [clock[i] for i in steps], ys))
    title = context_label(key[:-1])
    label = "held-out accuracy" if metric == "eval_accuracy" else "held-out loss"
    charts = [Chart(title, "compile + training seconds", label, by_time, legend=False)] if by_time else []
    return charts + ([Chart(title, "training steps (warm-up included)", label, by_step, logx=10)] if by_step else [])


def cost_plots(found: dict[Context, dict]) -> list[Plot]:
    keys = sorted(found, key=context_order)[:4]
    curves = [row for row in (curve_charts(k, found[k]) for k in keys) if row]
    scopes = [[c] for c in (params_chart(k, found[k]) for k in keys) if c is not None]
    return [
        Plot(
            "cost_curves",
            "Held-out accuracy against time and steps, tuned winners",
            "Left: against seconds of compilation and training steps (evaluation excluded), so a line that rises "
            "sooner reaches the target sooner on this host; right: against steps, so it shows what each way of "
            "differentiating gets per step (a forward gradient's or MeZO's estimate is noisier than backprop's "
            "gradient, so it needs more). One line per framework and mode, each its tuned winner.",
            "target trials with a history (evaluate=true eval_every=N)",
            curves,
        ),
        Plot(
            "steps_vs_params",
            "Steps to the target against the trained parameters",
            "Log-log, a line per mode over the trainable scopes it reached the target at: a forward gradient's and "
            "MeZO's variance grows with the number of trained parameters, so their steps to the target should "
            "climb with it (theory: as d, the dotted slope-1 line from the smallest scope one reached) while "
            "backprop's stay flat; where the lines meet, the cheaper step pays. The horizontal dotted line is the "
            "step cap, drawn where some mode missed a scope: a line that skips a scope, or stops short of the "
            "largest, did not reach the target there within the cap. The fitted exponents are in the section's "
            "curve table.",
            "target trials of one mode at >= 2 trainable scopes that reached the target",
            scopes,
        ),
    ]


class CostSection(Section):
    """Cost to target: per mode its tuned cost, relative to backprop; every trial of the search; the plots."""

    def render(self, results: Results, plot_dir: Path) -> list[str]:
        rows = [r for r in results.rows(RUNS_CSV, required=REQUIRED_COLUMNS) if r.get("target_metric")]
        if not rows:
            return []
        found = cost_groups(rows)
        out = [
            "## Cost to target",
            "",
            "What each way of differentiating costs to reach the same held-out target, each tuned "
            "with the same budget of trials (a grid per mode: `+experiment=cost_to_target`, docs/cost-to-target.md). "
            "Each table's heading names its target and the held-out examples it is met on, with an accuracy's "
            "standard error on them at the target: a model short of the target by about that much meets it by the "
            "sample alone at some evaluations, so a mode whose accuracy climbs slowly past it can count early. "
            "A tuned mode brings its own optimizer, as a submission does: where it is not plain SGD its label names "
            "it (backprop · sgd (momentum 0.9)), and the modes' ratios are still over that backprop. "
            "**tuned point**: the search trial that reached the target with the lowest value of the sweep's objective "
            "(its rows' `tune_objective`; wall time before rows named it); **reached (search)** counts its search "
            "trials that reached the target, those capped (stopped at the steps the group's best took: "
            "`hydra.sweeper.capping`, they could no longer win) and those that diverged (where all did, its grid "
            "never went low enough); with `hydra.sweeper.stop_at_miss` the points below a capped one are not run, "
            "so a group can count fewer trials than its grid has points. "
            "Its costs come only from fresh seeds: the median [lowest–highest] over its repeats at seeds the search "
            "did not use (**seeds**: how many; a seed that missed counts as infinite), never the search trial that "
            "chose it; a target trial run without a sweep is its own point, every trial of it a seed. **steps** "
            "include the warm-up steps (they train too); the target is checked only at evaluations (every `eval_every` "
            "steps, and in between with `eval_resolution`: within that fraction of the count), so each "
            "seed's count is the evaluation that met it: **steps known within** is where the median lies if each "
            "seed's first step at the target came after the evaluation before (so where the metric, once met, stays "
            "met; a held-out metric near its target can cross it and fall back, and evaluating more often then counts "
            "an earlier crossing: docs/cost-to-target.md), and **steps ×** gives in brackets the range of the ratio "
            "that allows. **forward passes (FLOPs)** are FLOP equivalents: the step's counted FLOPs over one forward "
            "pass of the model, times the steps (a MeZO step is about two, backprop's about three); **forward passes "
            "(declared)** are the steps times the passes a step runs as its method counts them (MeZO 2, 2q with q; "
            "HiZOO 3; a jvp 1 forward-mode pass per tangent; backprop 1, its backward not a forward pass); **GFLOP** "
            "the counted FLOPs to the target; **timed s** is the steps' own time; **wall s** counts from the "
            "compilation to the evaluation that met the target (the first of the run that held), compilation included "
            "and the evaluations' own time left out, as AlgoPerf's clock leaves it out (rows without `eval_time_s`, "
            "written before, count it); **MiB·s** is the excess memory held for the timed seconds; **joules** "
            "(where a trial read its device's energy counter: docs/energy.md) the power timed through the target "
            "times its timed seconds. The × columns divide medians by backprop's in the same "
            "framework and scope, with a 95% bootstrap interval in square brackets (each arm's fresh seeds "
            "resampled, a fixed generator seed; ∞ where resampled medians land on a missed seed). **†**: a median "
            "over seeds some of which missed the target; a missed seed is censored at the cap (its cost is more), "
            "so it ranks above every seed that reached. Reruns (`python -m bench rerun`) are listed with the "
            "trials, never counted.",
            "",
        ]
        for key in sorted(found, key=context_order):
            heading = f"### {context_label(key[:-1])} · target {target_label(key)}"
            out += [heading, "", dropout_note(found[key]), "", cost_table(found[key]), ""]
            note = seeds_note(found[key])
            out += [note, ""] if note else []
            versus = framework_table(found[key])
            if versus:
                out += [
                    f"Over {FRAMEWORK_NAMES[FRAMEWORKS[0]]}, per mode: the ratio of medians, with its 95% bootstrap "
                    "interval over the seeds.",
                    "",
                    versus,
                    "",
                ]
            fits = matched_memory(found[key])
            if fits:
                out += [
                    "At matched memory, per trained scope: the fastest tuned mode within each mode's peak memory "
                    "(wall s: median [lowest–highest] over its seeds). Budgets within the noise band of each other "
                    "are one row, a tie (**tied in memory**: the modes whose peaks it holds); the band is the widest "
                    "spread of one winner's peak across its seeds in that framework.",
                    "",
                    md_table(MEMORY_HEAD, fits, "llrllrlr"),
                    "",
                ]
            curve = curve_table(found[key])
            if curve:
                out += ["#### Steps to the target against the trained parameters", "", CURVE_TEXT, "", curve, ""]
            out += [
                "<details><summary>Every trial of the search, its repeats and reruns</summary>",
                "",
                trials_table(found[key]),
                "",
                "</details>",
                "",
            ]
        profile = profile_table(found)
        if profile:
            fewest, most = seed_counts(found)
            seeds = f"{fewest}" if fewest == most else f"{fewest} to {most}"
            out += [
                "### Performance profile",
                "",
                "As AlgoPerf scores submissions: a problem is a (context, target, trained scope, framework, level "
                "of the target: each level the rows' `levels_to_target` recorded, or for rows that recorded none, "
                "0.75 and 0.875 of an accuracy target replayed from their kept evaluations by the same hold rule; "
                "priced in steps and what follows from them, and in time from each trial's kept step times: its "
                "time to the target less the steps after the level's count); per cost, the share "
                "of the problems some mode reached "
                "on which each mode reached that level within τ times the best mode's cost there (medians over "
                f"{seeds} fresh seeds per winner). τ = 1: how often it was the cheapest.",
                "",
                profile,
                "",
            ]
        for plot in cost_plots(found):
            if save(plot, plot_dir):
                out += [f"![{plot.title}]({PLOT_DIR}/{plot.name}.png)", "", f"*How to read it:* {plot.how_to_read}", ""]
        return out
