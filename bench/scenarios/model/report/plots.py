"""The model scenario's plots: what each shows, planned from the rows that count (a grid of charts, one context per
row), and the report section that draws them. Drawing is bench/report/plots.py's."""

from __future__ import annotations

import math
from collections import Counter, defaultdict
from pathlib import Path

from bench import estimators
from bench.measure.trackers import MiB
from bench.report.panels import EXCESS_MEMORY, STEP_TIME, Panel
from bench.report.plots import Chart, Plot, Series, save
from bench.report.section import PLOT_DIR, Results, Section
from bench.report.tables import FP32_BYTES, num
from bench.scenarios.model.select import (
    SCOPE_COLUMNS,
    STUDY_EXPERIMENT,
    Cells,
    Context,
    Selection,
    best_groups,
    cell_order,
    context_key,
    context_label,
    context_order,
    experiment_of,
    framework_order,
    knob,
    knob_default,
    mode_label,
    richest_first,
    row_order,
    series_groups,
    strategy_order,
    trends,
    variant,
    view,
    world_size,
)
from bench.store.read import read_history

MAX_PANELS = 4  # contexts per figure: more panels no longer read at report size (the tables have every context)
MAX_CURVES = 8  # training runs per curve plot, for the same reason


def _wide_range(values: list[float], factor: float = 30.0) -> bool:
    """Whether a log axis reads better: the values span more than `factor` (jacfwd vs inference step times)."""
    pos = [v for v in values if v > 0]
    return len(pos) == len(values) and bool(pos) and max(pos) / min(pos) > factor


def bar_panels(
    contexts: dict[Context, Cells], panel: Panel, spread: tuple[str, str] | None = None, log_ok: bool = False
) -> list[Chart]:
    """Grouped bars per context of a panel's column: modes along x, one bar per framework. The contexts that
    compare the most ways of differentiating come first, as in the tables (richest_first)."""
    (col,), scale, ylabel = panel.keys, panel.scale, panel.title
    panels = []
    for key in richest_first(contexts):
        ok = {cell: r for cell, r in contexts[key].items() if r.get("status") == "ok" and num(r, col) is not None}
        if not ok:
            continue
        rows = sorted(ok.items(), key=cell_order)
        categories = list(dict.fromkeys(label for (_, label), _ in rows))
        series = []
        for fw in sorted({fw for fw, _ in ok}, key=framework_order):
            mine = [(categories.index(label), r) for (f, label), r in rows if f == fw]
            s = Series(fw, "", [float(i) for i, _ in mine], [num(r, col) * scale for _, r in mine])
            if spread and all(num(r, spread[0]) is not None and num(r, spread[1]) is not None for _, r in mine):
                s.lo = [num(r, spread[0]) * scale for _, r in mine]
                s.hi = [num(r, spread[1]) * scale for _, r in mine]
            series.append(s)
        values = [y for s in series for y in s.ys]
        panels.append(Chart(context_label(key), "", ylabel, series, categories, logy=log_ok and _wide_range(values)))
    return panels[:MAX_PANELS]


def _line_series(series: dict, y_col: str, scale: float = 1.0) -> list[Series]:
    """One line per trend (_trends): y_col at each x where the row has it."""
    lines = []
    for fw, label, xs, pts in trends(series):
        xs = [x for x in xs if num(pts[x], y_col) is not None]
        lines.append(Series(fw, label, xs, [num(pts[x], y_col) * scale for x in xs]))
    return lines


def scaling_grid(
    rows: list[dict], x_col: str, xlabel: str, guide_params: bool = False, logx: int = 0
) -> list[list[Chart]]:
    """Excess memory and median step time against one column, everything else fixed: one row of two panels per
    context where some framework x mode was measured at >= 2 values. A linear x axis (logx=0) keeps a linear
    cost a straight line, its slope the cost per layer or per sample."""
    groups = series_groups(rows, x_col, "excess_mem_mb", variant)
    grid = []
    for key, series in best_groups(groups, lambda s, pts: len(pts) >= 2, MAX_PANELS):
        memory = _line_series(series, "excess_mem_mb")
        if guide_params:
            # jvp's tangent and estimate are parameter-sized: what forward mode may add as depth grows
            sizes: dict[float, float] = {}
            for pts in series.values():
                for x, r in pts.items():
                    n = num(r, "n_trainable")
                    if n is not None:
                        sizes[x] = max(sizes.get(x, 0.0), n * FP32_BYTES / MiB)
            if len(sizes) >= 2:
                xs = sorted(sizes)
                memory.append(Series("", "", xs, [sizes[x] for x in xs], guide="one fp32 copy of the trainable params"))
        time_series = _line_series(series, "step_time_median_s", 1e3)
        title = context_label(key)
        times = [y for s in time_series for y in s.ys]
        grid.append(
            [
                Chart(title, xlabel, "excess memory (MiB)", memory, logx=logx, legend=False),
                Chart(title, xlabel, "median step time (ms)", time_series, logx=logx, logy=_wide_range(times)),
            ]
        )
    return grid


def jacfwd_grid(rows: list[dict]) -> list[list[Chart]]:
    """Median step time against the number of trainable parameters (the trainable scope varies), per context where
    jacfwd was measured at >= 2 sizes; the other modes of the same context for comparison."""
    # the exact gradients and the forward gradient at their defaults (K, remat: other plots)
    plain = [
        r for r in rows if mode_label(r) in (estimators.EXACT, estimators.FORWARD_GRADIENT, estimators.EXACT_FORWARD)
    ]
    groups = series_groups(plain, "n_trainable", "step_time_median_s", mode_label)
    grid = []
    for key, series in best_groups(
        groups, lambda s, pts: s[1] == estimators.EXACT_FORWARD and len(pts) >= 2, MAX_PANELS
    ):
        lines = _line_series(series, "step_time_median_s", 1e3)
        grid.append(
            [Chart(context_label(key), "trainable parameters", "median step time (ms)", lines, logx=10, logy=True)]
        )
    return grid


def grad_quality_grid(rows: list[dict]) -> list[list[Chart]]:
    """Cosine to the exact gradient against the number of tangents K for jvp, MeZO as a flat line, and the
    expected cosine of K Gaussian tangents, sqrt(K / (K + n - 1)) (conf/experiment/grad_quality.yaml)."""
    jvp = [r for r in rows if r.get("mode") == estimators.FORWARD_GRADIENT]
    # one panel per trainable scope: n, and with it the expected cosine, depends on it
    groups = series_groups(
        jvp, "num_tangents", "grad_cosine", lambda r: mode_label({**r, "num_tangents": 1}), keep=SCOPE_COLUMNS
    )
    mezo: dict = defaultdict(dict)  # {context: {(framework, mode label): row}}: one line per mezo_eps
    for r in rows:
        if r.get("mode") == estimators.ZEROTH_ORDER and num(r, "grad_cosine") is not None:
            mezo[context_key(r, keep=SCOPE_COLUMNS)][r.get("framework", ""), mode_label(r)] = r  # latest
    grid = []
    for key, series in best_groups(groups, lambda s, pts: len(pts) >= 2, MAX_PANELS):
        lines = _line_series(series, "grad_cosine")
        ks = sorted({x for s in lines for x in s.xs})
        for (fw, label), r in sorted(mezo.get(key, {}).items(), key=lambda kv: row_order(kv[1])):
            lines.append(Series(fw, label, [ks[0], ks[-1]], [num(r, "grad_cosine")] * 2))
        ns = [num(r, "n_trainable") for pts in series.values() for r in pts.values() if num(r, "n_trainable")]
        if ns:
            n = sorted(ns)[len(ns) // 2]
            grid_k = [ks[0] * (ks[-1] / ks[0]) ** (i / 40) for i in range(41)]
            lines.append(
                Series("", "", grid_k, [math.sqrt(k / (k + n - 1)) for k in grid_k], guide=f"expected, n = {n:,.0f}")
            )
        grid.append([Chart(context_label(key), "tangents K", "cosine to the exact gradient", lines, logx=2)])
    return grid


def _finite_points(values) -> tuple[list[float], list[float]]:
    xs, ys = [], []
    for i, v in enumerate(values or []):
        if isinstance(v, (int, float)) and math.isfinite(v):
            xs.append(float(i + 1))
            ys.append(float(v))
    return xs, ys


def curves_grid(rows: list[dict]) -> list[list[Chart]]:
    """Training loss per timed step, and held-out accuracy where evaluated, from the history JSONs: the UMass
    forward-AD study's runs (sweep seed_agnews) when present, else the context with the most runs that have one."""
    runs = []
    for r in rows:
        h = read_history(r)
        if h is not None and len(_finite_points(h.get("loss"))[0]) >= 2:
            runs.append((r, h))
    if not runs:
        return []
    study = [(r, h) for r, h in runs if experiment_of(r) == STUDY_EXPERIMENT]
    if study:
        runs = study
    else:
        count = Counter(context_key(r) for r, _ in runs)
        best = min(count, key=lambda k: (-count[k], context_order(k)))
        runs = [(r, h) for r, h in runs if context_key(r) == best]
    runs.sort(key=lambda rh: row_order(rh[0]))
    runs = runs[:MAX_CURVES]
    title = context_label(context_key(runs[0][0])) if len({context_key(r) for r, _ in runs}) == 1 else STUDY_EXPERIMENT
    loss = [Series(r.get("framework", ""), mode_label(r), *_finite_points(h["loss"])) for r, h in runs]
    row = [Chart(title, "timed step", "training loss", loss, legend=True)]
    accuracy = [Series(r.get("framework", ""), mode_label(r), *_finite_points(h.get("eval_accuracy"))) for r, h in runs]
    accuracy = [s for s in accuracy if s.xs]
    if accuracy:
        row[0].legend = False
        row.append(Chart(title, "timed step", "held-out accuracy", accuracy))
    return [row]


def devices_grid(rows: list[dict]) -> list[list[Chart]]:
    """Per-device excess memory and the slowest device's step time against the number of devices (per node):
    scaling_grid over the trials with a parallel strategy, so one row of panels per strategy (a context less
    its device count) and one line per framework x mode."""
    grid = scaling_grid([r for r in rows if knob(r, "parallel") != "none"], "devices", "devices")
    for memory, time in grid:
        memory.ylabel, time.ylabel = "excess memory per device (MiB)", "median step time, slowest device (ms)"
    return grid


def comm_category(row: dict) -> str:
    """The way of differentiating as the bytes plot groups it: variant() less torch's jvp_impl, which changes what
    a jvp holds, not what it exchanges (torch's jvp[lazy] and JAX's jvp stand side by side)."""
    return variant({**row, "jvp_impl": knob_default("jvp_impl", row=row)})


def comm_panels(contexts: dict[Context, Cells]) -> list[Chart]:
    """Bytes one device exchanged per step, grouped bars on a log axis: the ways of differentiating along x, one
    bar per framework, the expectation (comm_bytes_expected) as a guide per framework. One panel per strategy, at
    the largest device count it was measured on (> 1): what a device exchanges hardly depends on how many there
    are (an all-reduce's buffer is the gradient on 2 devices as on 8); strategy order, as the tables."""
    largest: dict[Context, Context] = {}  # a context less its device counts -> the context with the most devices
    for key in sorted(contexts, key=context_order):
        ok = [r for r in contexts[key].values() if r.get("status") == "ok" and num(r, "comm_bytes_per_step")]
        if not ok or world_size(dict(key)) < 2:
            continue
        loose = tuple((c, v) for c, v in key if c not in ("devices", "nodes"))
        if loose not in largest or world_size(dict(key)) > world_size(dict(largest[loose])):
            largest[loose] = key
    panels = []
    for key in sorted(largest.values(), key=lambda k: (strategy_order(dict(k)), context_order(k))):
        rows = sorted(
            (r for r in contexts[key].values() if r.get("status") == "ok" and (num(r, "comm_bytes_per_step") or 0) > 0),
            key=row_order,
        )
        categories = list(dict.fromkeys(comm_category(r) for r in rows))
        series, guides = [], []
        for fw in sorted({r.get("framework", "") for r in rows}, key=framework_order):
            mine = {comm_category(r): r for r in rows if r.get("framework", "") == fw}  # the latest of a category
            xs = [float(categories.index(c)) for c in mine]
            series.append(Series(fw, "", xs, [num(r, "comm_bytes_per_step") for r in mine.values()]))
            expected = [(x, num(r, "comm_bytes_expected")) for x, r in zip(xs, mine.values())]
            expected = [(x, y) for x, y in expected if y]
            if expected:
                guides.append(Series(fw, "", [x for x, _ in expected], [y for _, y in expected], guide="expected"))
        panels.append(
            Chart(
                context_label(key),
                "",
                "bytes exchanged per step per device",
                series + guides,
                categories,
                logy=True,
                units="bytes",
            )
        )
    return panels[:MAX_PANELS]


def plan_plots(sel: Selection, contexts: dict[Context, Cells]) -> list[Plot]:
    """Every plot the report knows, with what it would show (an empty grid: no data for it)."""
    rows = sel.ok
    return [
        Plot(
            "excess_memory",
            "Excess memory by mode and framework",
            "Each group of bars is one way of differentiating and each bar one framework; the height is the memory "
            "the timed steps needed above what was resident before them (weights, batches, compiled step), so "
            "lower is better and inference is the floor.",
            "an ok row with excess_mem_mb",
            [[p] for p in bar_panels(contexts, EXCESS_MEMORY)],
        ),
        Plot(
            "step_time",
            "Median step time by mode and framework",
            "Bar height is the median time of one training step, whiskers span the 10th to 90th percentile of the "
            "timed steps; the axis is logarithmic when modes differ by more than 30x; lower is better.",
            "an ok row with step_time_median_s",
            [[p] for p in bar_panels(contexts, STEP_TIME, ("step_time_p10_s", "step_time_p90_s"), log_ok=True)],
        ),
        Plot(
            "memory_vs_depth",
            "Memory and step time vs depth",
            "One line per framework (solid torch, dashed jax) and mode (colour), on a linear depth axis: a line "
            "that climbs with the number of layers stores something per layer (backprop's activations and "
            "gradient). The dotted grey line is one fp32 copy of the trainable parameters: a forward gradient "
            "that holds its tangent whole (torch's default jvp) climbs parallel to it, one that never does "
            "(JAX's jvp, torch's jvp[lazy]) and MeZO stay flat. The growth table above gives the slopes.",
            "one framework x mode at >= 2 values of num_layers with everything else equal",
            scaling_grid(rows, "num_layers", "encoder layers", guide_params=True),
        ),
        Plot(
            "memory_vs_seq_len",
            "Memory and step time vs sequence length",
            "Activations grow with T (attention scores with T²) in every mode, but backprop keeps every layer's at "
            "once, so its line should climb steepest.",
            "one framework x mode at >= 2 values of seq_len with everything else equal",
            scaling_grid(rows, "seq_len", "sequence length T", logx=2),
        ),
        Plot(
            "memory_vs_batch",
            "Memory and step time vs batch size",
            "The slope is the memory per sample (activations); where a line meets the axis is the parameter-sized "
            "part (gradients, tangents, optimizer state), which does not grow with B.",
            "one framework x mode at >= 2 values of batch_size with everything else equal",
            scaling_grid(rows, "batch_size", "batch size B"),
        ),
        Plot(
            "jacfwd_vs_trainable",
            "jacfwd step time vs trainable parameters",
            "Log-log axes: jacfwd runs one forward-mode pass per trainable parameter, so its line should have slope "
            "about 1, while backprop and one-tangent jvp stay nearly flat.",
            "jacfwd rows at >= 2 values of n_trainable (different trainable scopes) with everything else equal",
            jacfwd_grid(rows),
        ),
        Plot(
            "grad_quality",
            "Gradient quality vs number of tangents",
            "Cosine between the estimate and the exact gradient of the same batch (1 is exact): jvp's should follow "
            "the dotted grey expectation sqrt(K/(K+n-1)), rising with K; MeZO's one direction is a flat line.",
            "jvp rows with grad_cosine at >= 2 values of num_tangents with everything else equal "
            "(measure_grad_cosine=true)",
            grad_quality_grid(rows),
        ),
        Plot(
            "training_curves",
            "Training curves",
            "Loss at each timed step (thin: raw, thick: moving average) and held-out accuracy where it was "
            "evaluated; compare how fast modes learn per step here and per second with the step-time plot.",
            "a history JSON with >= 2 loss values next to the CSV (<csv folder>/history/<run_id>.json)",
            curves_grid(rows),
        ),
        Plot(
            "memory_vs_devices",
            "Memory and step time vs devices",
            "One row of panels per strategy, one line per framework (solid torch, dashed jax) and mode (colour), "
            "against the devices a trial ran on. batch_size is per device, so every device does the same work and "
            "a flat line scales perfectly. Left: the largest device's excess memory; what FSDP saves (1/N of the "
            "parameters and optimizer state) is held before the step begins, so it shows in the table's peak, "
            "params and optimizer columns, while the excess shows what a step adds (activations, the gradient, "
            "gathered parameters). Right: the slowest device's step time, which grows with what is exchanged: "
            "most for backprop's all-reduce of the gradient, hardly for jvp's and MeZO's few scalars.",
            "one framework x mode with parallel=ddp|fsdp at >= 2 values of devices with everything else equal "
            "(+experiment=scale_out)",
            devices_grid(rows),
        ),
        Plot(
            "comm_bytes",
            "Bytes exchanged per step per device",
            "A log axis in bytes, a panel per strategy: each group of bars is one way of differentiating and each "
            "bar one framework, what one device exchanged in one step as counted from the program; the black tick "
            "on a bar is the expectation (bench/parallel.py). Backprop's bar is parameter-sized (it all-reduces its "
            "gradient, 4n bytes); under DDP jvp's and MeZO's are a few bytes, because every device draws the same "
            "seeded direction and only scalars travel; under FSDP every mode also gathers the parameters for each "
            "forward pass. A bar well away from its tick exchanged something the formula does not describe.",
            "an ok row with parallel=ddp|fsdp on >= 2 devices and comm_bytes_per_step "
            "(+experiment=scale_out or strategy_table)",
            [[p] for p in comm_panels(contexts)],
        ),
    ]


class PlotsSection(Section):
    """Every plot the model's rows can fill; the ones they cannot, with what each needs."""

    def render(self, results: Results, plot_dir: Path) -> list[str]:
        v = view(results)
        if not v.rows:
            return []
        plots = plan_plots(v.sel, v.contexts)
        drawn = [p for p in plots if save(p, plot_dir)]
        out = ["## Plots", ""]
        if not drawn:
            out += ["(no plot: no ok rows with the data any plot needs)", ""]
        for p in drawn:
            out += [
                f"### {p.title}",
                "",
                f"![{p.title}]({PLOT_DIR}/{p.name}.png)",
                "",
                f"*How to read it:* {p.how_to_read}",
                "",
            ]
        if any(len(p.grid) == MAX_PANELS for p in drawn):
            out += [f"A plot shows at most {MAX_PANELS} contexts, those with the most data; the tables have all.", ""]
        skipped = [p for p in plots if not p.drawn]
        if skipped:
            out += ["Skipped for lack of data:", "", *[f"- **{p.title}**: needs {p.needs}." for p in skipped], ""]
        return out
