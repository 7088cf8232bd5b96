"""The report's "Cost to target" section: what each way of differentiating costs to reach the same held-out
accuracy (or loss), tuned with the same budget, relative to backprop; and its plots.

Rows are the trials run with a target (`target.metric`). A tuning sweep (bench/harness/tuning.py) marks each
trial `search` (a point of its mode's search space) or `repeat` (the winner at another seed) and names what was
tuned together (`tune_group`); a target trial run on its own is a group of its own kind (framework, mode, scope).
Per group, as AlgoPerf scores a submission: the fastest search trial that reached the target is the mode's tuned
point; its cost is the median over the seeds it ran with (the search trial and its repeats), a seed that missed
the target counting as infinitely slow; every trial of the search is listed too.
"""

from __future__ import annotations

import math
import statistics
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path

from bench import estimators
from bench.report.plots import Chart, Plot, Series, save
from bench.report.section import PLOT_DIR, RUNS_CSV, Results, Section
from bench.report.tables import fmt_ratio, fmt_value, md_table, num
from bench.scenarios.model.columns import REQUIRED_COLUMNS
from bench.scenarios.model.select import (
    OPTIMIZER_KNOBS,
    Context,
    context_key,
    context_label,
    context_order,
    framework_order,
    knob,
    mode_order,
    non_default,
    scope_label,
)
from bench.spec import FRAMEWORK_NAMES
from bench.store.read import read_history

# What a tuning search varies: left out of the context a cost is compared in, and shown as the tuned point.
TUNED = (*OPTIMIZER_KNOBS, *estimators.setting_columns(), "num_tangents")
REFERENCE = "backprop"  # costs are given relative to backprop's, in the same framework, scope and context


@dataclass(eq=False)  # compared (and hashed) by identity: one group per framework and mode
class Group:
    """The trials of one way of differentiating tuned together: its search, and its winner's seeds."""

    framework: str
    label: str
    search: list[dict] = field(default_factory=list)
    repeats: list[dict] = field(default_factory=list)

    @property
    def winner(self) -> dict | None:
        reached = [r for r in self.search if reached_row(r)]
        return min(reached, key=lambda r: num(r, "wall_to_target_s")) if reached else None

    def seeds(self) -> list[dict]:
        """The winner's trials over seeds: its search trial and the repeats of its point."""
        w = self.winner
        if w is None:
            return []
        return [w, *(r for r in self.repeats if point(r) == point(w))]

    def cost(self, column: str) -> tuple[float | None, float | None, float | None]:
        """(median, lowest, highest) of `column` over the winner's seeds; a seed that missed is infinite."""
        values = [num(r, column) if reached_row(r) else math.inf for r in self.seeds()]
        values = [v for v in values if v is not None]
        if not values:
            return None, None, None
        return statistics.median(values), min(values), max(values)


def reached_row(row: dict) -> bool:
    return row.get("status") == "ok" and row.get("target_status") == "reached"


def point(row: dict) -> tuple:
    """The tuned point of a trial: its learning rate and the mode's own tuned knobs."""
    numeric = (*OPTIMIZER_KNOBS, *estimators.setting_columns())  # compared by value: 1e-3 and 0.001 are one point
    return tuple(knob(row, c) if c in numeric else str(row.get(c, "")) for c in TUNED)


def point_label(row: dict) -> str:
    parts = [f"lr {knob(row, 'lr')}"]
    for column, option in estimators.setting_columns().items():  # the row's own estimator's settings
        name, key = option.split(".")
        if name == row.get("mode") and (column in estimators.moved() or non_default(row, column)):
            parts.append(f"{key} {knob(row, column)}")
    if row.get("mode") == "jvp" and str(row.get("num_tangents")) not in ("", "1"):
        parts.append(f"K={row.get('num_tangents')}")
    return ", ".join(parts)


def cost_label(row: dict) -> str:
    """The way of differentiating, without what its tuning varies: backprop+remat, jvp[lazy], mezo; its scope."""
    name = row.get("mode", "") + ("+remat" if str(row.get("remat")).lower() == "true" else "")
    if row.get("mode") == "jvp" and row.get("framework") == "torch" and row.get("jvp_impl") not in ("", "func", None):
        name += f"[{row['jvp_impl']}]"
    if (row.get("trainable") or "all") != "all":
        name += f"[{scope_label(row)}]"
    return name


def reference_label(row: dict) -> str:
    """The backprop a mode is compared with: plain backprop (no remat) over the same trainable scope."""
    return cost_label({**row, "mode": REFERENCE, "remat": "False", "jvp_impl": ""})


def target_key(row: dict) -> Context:
    """What a cost is compared in: the context less what tuning varies, plus the target itself."""
    return (*context_key(row, drop=TUNED), ("target", f"{row.get('target_metric')} {row.get('target_value')}"))


def cost_groups(rows: list[dict]) -> dict[Context, dict[tuple[str, str], Group]]:
    out: dict = defaultdict(dict)
    for r in rows:
        if not r.get("target_metric") or r.get("status") == "damaged":
            continue
        key, cell = target_key(r), (r.get("framework", ""), cost_label(r))
        group = out[key].setdefault(cell, Group(*cell))
        (group.repeats if r.get("tuning") == "repeat" else group.search).append(r)
    return out


def fmt_spread(cost: tuple, scale: float = 1.0) -> str:
    mid, lo, hi = cost
    if mid is None:
        return "-"
    if math.isinf(mid):
        return "not reached"
    text = fmt_value(mid, scale)
    return text if lo == hi else f"{text} [{fmt_value(lo, scale)}–{'∞' if math.isinf(hi) else fmt_value(hi, scale)}]"


HEAD = [
    "framework",
    "mode",
    "trained params",
    "tuned point",
    "reached (search)",
    "seeds",
    "steps",
    "timed s",
    "wall s",
    "peak MiB",
    "excess MiB",
    "MiB·s",
    "steps ×",
    "wall ×",
    "peak ×",
    "MiB·s ×",
]


def ordered(groups: dict[tuple[str, str], Group]) -> list[Group]:
    first = lambda g: (g.search or g.repeats)[0]  # noqa: E731
    return sorted(groups.values(), key=lambda g: (framework_order(g.framework), mode_order(first(g)), g.label))


COSTS = ("steps_to_target", "seconds_to_target", "wall_to_target_s")


def cost_table(groups: dict[tuple[str, str], Group]) -> str:
    body = []
    for g in ordered(groups):
        w, any_row = g.winner, (g.search or g.repeats)[0]
        ref = groups.get((g.framework, reference_label(any_row)))
        reached = sum(reached_row(r) for r in g.search)
        row = [
            FRAMEWORK_NAMES.get(g.framework, g.framework),
            g.label,
            f"{num(w or any_row, 'n_trainable') or 0:,.0f}",
            point_label(w) if w else "-",
            f"{reached}/{len(g.search)}",
            str(len(g.seeds())),
        ]
        row += [fmt_spread(g.cost(c)) for c in COSTS]
        row += ["-" if w is None else fmt_value(num(w, c)) for c in ("peak_mem_mb", "excess_mem_mb")]
        row.append(fmt_spread(g.cost("mib_s_to_target")))
        for column in ("steps_to_target", "wall_to_target_s", "peak_mem_mb", "mib_s_to_target"):
            row.append(fmt_ratio(relative(g, ref, column)))
        body.append(row)
    return md_table(HEAD, body, "ll" + "r" * (len(HEAD) - 2))


def relative(g: Group, ref: Group | None, column: str) -> float | None:
    """The group's median cost over the reference's (backprop's, same framework and scope); peak memory is the
    winner's own."""
    if ref is None or g.winner is None or ref.winner is None:
        return None
    if column == "peak_mem_mb":
        a, b = num(g.winner, column), num(ref.winner, column)
    else:
        a, b = g.cost(column)[0], ref.cost(column)[0]
    return None if a is None or b is None or b <= 0 or math.isinf(a) or math.isinf(b) else a / b


def trials_table(groups: dict[tuple[str, str], Group]) -> str:
    body = []
    for g in ordered(groups):
        for r in sorted(g.search + g.repeats, key=lambda r: (r.get("tuning") == "repeat", point(r), r.get("seed"))):
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
    """For each memory budget a tuned mode needs (its winner's peak), the fastest mode (median wall time to the
    target) that fits in it, per framework: the answer to "which method reaches my accuracy fastest within my
    memory?"."""
    rows = []
    for fw in sorted({g.framework for g in groups.values()}, key=framework_order):
        wall = {g: g.cost("wall_to_target_s")[0] for g in groups.values() if g.framework == fw and g.winner}
        tuned = {g: w for g, w in wall.items() if w is not None and math.isfinite(w)}
        for budget in sorted({num(g.winner, "peak_mem_mb") for g in tuned} - {None}):
            fits = [g for g in tuned if (num(g.winner, "peak_mem_mb") or math.inf) <= budget]
            best = min(fits, key=tuned.get)
            rows.append(
                [FRAMEWORK_NAMES.get(fw, fw), fmt_value(budget), best.label, fmt_spread(best.cost("wall_to_target_s"))]
            )
    return rows


# ---------------------------------------------------------------------------------------------------- plots


def curve_charts(key: Context, groups: dict[tuple[str, str], Group]) -> list[Chart]:
    """Held-out accuracy (or loss) against wall time and against steps, a line per mode: each winner's first seed."""
    metric = dict(key)["target"].split()[0]
    by_time, by_step = [], []
    for g in groups.values():
        w = g.winner or (g.search[0] if g.search else None)
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


def params_chart(key: Context, groups: dict[tuple[str, str], Group]) -> Chart | None:
    """Steps to the target against the trained parameters, a line per mode over its scopes (head, bias, last_k,
    all): where forward-mode or zeroth-order training pays."""
    lines: dict = defaultdict(dict)
    missed: dict = {}  # trained parameters -> the cap a mode did not reach the target within
    for g in groups.values():
        steps = g.cost("steps_to_target")[0]
        if g.winner is None or steps is None or math.isinf(steps):
            row = (g.search or g.repeats)[0]
            if num(row, "n_trainable") and num(row, "target_max_steps"):
                missed[num(row, "n_trainable")] = num(row, "target_max_steps")
            continue
        mode = g.label.split("[")[0] if g.label.endswith("]") else g.label
        lines[(g.framework, mode)][num(g.winner, "n_trainable")] = steps
    series = [
        Series(fw, mode, sorted(pts), [pts[x] for x in sorted(pts)])
        for (fw, mode), pts in lines.items()
        if len(pts) >= 2
    ]
    if not series:
        return None
    if missed:  # a mode that never reached the target: at least the cap, drawn at it
        series.append(Series("", "", sorted(missed), [missed[x] for x in sorted(missed)], guide="not reached: the cap"))
    return Chart(context_label(key[:-1]), "trained parameters", "steps to the target", series, logx=10, logy=True)


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
            "Log-log, a line per mode over its trainable scopes: a forward gradient's and MeZO's variance grows "
            "with the number of trained parameters, so their steps to the target should climb with it while "
            "backprop's stay flat; where the lines meet, the cheaper step pays. The dotted grey line marks the "
            "step cap at the scopes where some mode did not reach the target within it.",
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
            "What each way of differentiating costs to reach the same held-out target, each tuned with the same "
            "budget of trials (a grid per mode: `+experiment=cost_to_target`, docs/cost-to-target.md). **tuned "
            "point**: the search trial that reached the target fastest (wall time); its costs are the median "
            "[lowest–highest] over the seeds it ran with, a seed that missed counting as infinite. **steps** "
            "include the warm-up steps (they train too); **timed s** is the steps' own time; **wall s** counts "
            "from the compilation to the evaluation that met the target, compilation and evaluations included "
            "(AlgoPerf's clock); **MiB·s** is the excess memory held for the timed seconds. The × columns divide "
            "by backprop's in the same framework and scope.",
            "",
        ]
        for key in sorted(found, key=context_order):
            out += [f"### {context_label(key[:-1])} · target {dict(key)['target']}", "", cost_table(found[key]), ""]
            fits = matched_memory(found[key])
            if fits:
                out += [
                    "At matched memory: the fastest tuned mode within each mode's peak memory.",
                    "",
                    md_table(["framework", "memory budget MiB", "fastest within it", "wall s"], fits, "lrll"),
                    "",
                ]
            out += [
                "<details><summary>Every trial of the search and its repeats</summary>",
                "",
                trials_table(found[key]),
                "",
                "</details>",
                "",
            ]
        for plot in cost_plots(found):
            if save(plot, plot_dir):
                out += [f"![{plot.title}]({PLOT_DIR}/{plot.name}.png)", "", f"*How to read it:* {plot.how_to_read}", ""]
        return out
