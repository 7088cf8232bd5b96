"""Plots from chosen results rows: planning (what each plot shows) and drawing (PNG files).

Computing and drawing are apart: `plan_plots` returns what each plot shows (tests check it), `draw` only draws.
A plot is a grid of panels, one context per row of panels (bench.results: contexts and labels); a plot with an
empty grid has no data and is skipped, with what it needs said in the report.
"""

from __future__ import annotations

import math
import zlib
from collections import Counter, defaultdict
from dataclasses import dataclass, field
from pathlib import Path

from bench.results import (
    FRAMEWORK_NAMES,
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
    fmt_bytes,
    framework_order,
    knob,
    mode_label,
    read_history,
    richest_first,
    row_order,
    series_groups,
    strategy_order,
    trends,
    variant,
    world_size,
)
from bench.tables import FP32_BYTES, fmt_value, num
from bench.trackers import MiB

PLOT_DIR = "plots"  # under --out; report.md links plots/<name>.png, so the folder moves as one
MAX_PANELS = 4  # contexts per figure: more panels no longer read at report size (the tables have every context)
MAX_CURVES = 8  # training runs per curve plot, for the same reason


# ----------------------------------------------------------------------------------------------------- plans


@dataclass
class Series:
    framework: str
    mode: str  # mode label; the colour of a line (bars are coloured by framework)
    xs: list[float]
    ys: list[float]
    lo: list[float] | None = None  # bars: whisker ends (p10, p90)
    hi: list[float] | None = None
    guide: str = ""  # non-empty: a reference line, not a measurement; the text is its legend entry

    @property
    def label(self) -> str:
        return self.guide or f"{self.framework} {self.mode}"


@dataclass
class Panel:
    title: str
    xlabel: str
    ylabel: str
    series: list[Series]
    categories: list[str] = field(default_factory=list)  # grouped bars: xs index these
    logx: int = 0  # log base of the x axis (0: linear)
    logy: bool = False
    legend: bool = True
    units: str = ""  # "bytes": the y axis and the bars' labels in B, KiB, MiB


@dataclass
class Plot:
    name: str  # file stem: plots/<name>.png
    title: str
    how_to_read: str
    needs: str  # the data the plot needs: said when it is skipped
    grid: list[list[Panel]]  # rows of panels; empty: skipped
    path: Path | None = None  # set once drawn

    @property
    def drawn(self) -> bool:
        return bool(self.grid)


def _wide_range(values: list[float], factor: float = 30.0) -> bool:
    """Whether a log axis reads better: the values span more than `factor` (jacfwd vs inference step times)."""
    pos = [v for v in values if v > 0]
    return len(pos) == len(values) and bool(pos) and max(pos) / min(pos) > factor


def bar_panels(contexts: dict[Context, Cells], col: str, ylabel: str, scale: float = 1.0,
               spread: tuple[str, str] | None = None, log_ok: bool = False) -> list[Panel]:  # fmt: skip
    """Grouped bars per context: modes along x, one bar per framework. The contexts that compare the most ways
    of differentiating come first, as in the tables (richest_first)."""
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
        panels.append(Panel(context_label(key), "", ylabel, series, categories, logy=log_ok and _wide_range(values)))
    return panels[:MAX_PANELS]



def _line_series(series: dict, y_col: str, scale: float = 1.0) -> list[Series]:
    """One line per trend (_trends): y_col at each x where the row has it."""
    lines = []
    for fw, label, xs, pts in trends(series):
        xs = [x for x in xs if num(pts[x], y_col) is not None]
        lines.append(Series(fw, label, xs, [num(pts[x], y_col) * scale for x in xs]))
    return lines


def scaling_grid(rows: list[dict], x_col: str, xlabel: str, guide_params: bool = False,
                 logx: int = 0) -> list[list[Panel]]:  # fmt: skip
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
        grid.append([
            Panel(title, xlabel, "excess memory (MiB)", memory, logx=logx, legend=False),
            Panel(title, xlabel, "median step time (ms)", time_series, logx=logx, logy=_wide_range(times)),
        ])  # fmt: skip
    return grid


def jacfwd_grid(rows: list[dict]) -> list[list[Panel]]:
    """Median step time against the number of trainable parameters (the trainable scope varies), per context where
    jacfwd was measured at >= 2 sizes; the other modes of the same context for comparison."""
    plain = [r for r in rows if mode_label(r) in ("backprop", "jvp", "jacfwd")]  # K, remat: other plots
    groups = series_groups(plain, "n_trainable", "step_time_median_s", mode_label)
    grid = []
    for key, series in best_groups(groups, lambda s, pts: s[1] == "jacfwd" and len(pts) >= 2, MAX_PANELS):
        lines = _line_series(series, "step_time_median_s", 1e3)
        grid.append([Panel(context_label(key), "trainable parameters", "median step time (ms)", lines, logx=10,
                           logy=True)])  # fmt: skip
    return grid


def grad_quality_grid(rows: list[dict]) -> list[list[Panel]]:
    """Cosine to the exact gradient against the number of tangents K for jvp, MeZO as a flat line, and the
    expected cosine of K Gaussian tangents, sqrt(K / (K + n - 1)) (conf/experiment/grad_quality.yaml)."""
    jvp = [r for r in rows if r.get("mode") == "jvp"]
    # one panel per trainable scope: n, and with it the expected cosine, depends on it
    groups = series_groups(jvp, "num_tangents", "grad_cosine", lambda r: mode_label({**r, "num_tangents": 1}),
                           keep=("trainable", "last_k"))  # fmt: skip
    mezo: dict = defaultdict(dict)  # {context: {(framework, mode label): row}}: one line per mezo_eps
    for r in rows:
        if r.get("mode") == "mezo" and num(r, "grad_cosine") is not None:
            mezo[context_key(r, keep=("trainable", "last_k"))][r.get("framework", ""), mode_label(r)] = r  # latest
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
            lines.append(Series("", "", grid_k, [math.sqrt(k / (k + n - 1)) for k in grid_k],
                                guide=f"expected, n = {n:,.0f}"))  # fmt: skip
        grid.append([Panel(context_label(key), "tangents K", "cosine to the exact gradient", lines, logx=2)])
    return grid


def _finite_points(values) -> tuple[list[float], list[float]]:
    xs, ys = [], []
    for i, v in enumerate(values or []):
        if isinstance(v, (int, float)) and math.isfinite(v):
            xs.append(float(i + 1))
            ys.append(float(v))
    return xs, ys


def curves_grid(rows: list[dict]) -> list[list[Panel]]:
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
    row = [Panel(title, "timed step", "training loss", loss, legend=True)]
    accuracy = [Series(r.get("framework", ""), mode_label(r), *_finite_points(h.get("eval_accuracy"))) for r, h in runs]
    accuracy = [s for s in accuracy if s.xs]
    if accuracy:
        row[0].legend = False
        row.append(Panel(title, "timed step", "held-out accuracy", accuracy))
    return [row]


def devices_grid(rows: list[dict]) -> list[list[Panel]]:
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
    return variant({**row, "jvp_impl": "func"})


def comm_panels(contexts: dict[Context, Cells]) -> list[Panel]:
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
        rows = sorted((r for r in contexts[key].values() if r.get("status") == "ok"
                       and (num(r, "comm_bytes_per_step") or 0) > 0), key=row_order)  # fmt: skip
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
        panels.append(Panel(context_label(key), "", "bytes exchanged per step per device", series + guides,
                            categories, logy=True, units="bytes"))  # fmt: skip
    return panels[:MAX_PANELS]


def plan_plots(sel: Selection, contexts: dict[Context, Cells]) -> list[Plot]:
    """Every plot the report knows, with what it would show (an empty grid: no data for it)."""
    rows = sel.ok
    return [
        Plot("excess_memory", "Excess memory by mode and framework",
             "Each group of bars is one way of differentiating and each bar one framework; the height is the memory "
             "the timed steps needed above what was resident before them (weights, batches, compiled step), so "
             "lower is better and inference is the floor.",
             "an ok row with excess_mem_mb",
             [[p] for p in bar_panels(contexts, "excess_mem_mb", "excess memory (MiB)")]),
        Plot("step_time", "Median step time by mode and framework",
             "Bar height is the median time of one training step, whiskers span the 10th to 90th percentile of the "
             "timed steps; the axis is logarithmic when modes differ by more than 30x; lower is better.",
             "an ok row with step_time_median_s",
             [[p] for p in bar_panels(contexts, "step_time_median_s", "median step time (ms)", 1e3,
                                      ("step_time_p10_s", "step_time_p90_s"), log_ok=True)]),
        Plot("memory_vs_depth", "Memory and step time vs depth",
             "One line per framework (solid torch, dashed jax) and mode (colour), on a linear depth axis: a line "
             "that climbs with the number of layers stores something per layer (backprop's activations and "
             "gradient). The dotted grey line is one fp32 copy of the trainable parameters: a forward gradient "
             "that holds its tangent whole (torch's default jvp) climbs parallel to it, one that never does "
             "(JAX's jvp, torch's jvp[lazy]) and MeZO stay flat. The growth table above gives the slopes.",
             "one framework x mode at >= 2 values of num_layers with everything else equal",
             scaling_grid(rows, "num_layers", "encoder layers", guide_params=True)),
        Plot("memory_vs_seq_len", "Memory and step time vs sequence length",
             "Activations grow with T (attention scores with T²) in every mode, but backprop keeps every layer's at "
             "once, so its line should climb steepest.",
             "one framework x mode at >= 2 values of seq_len with everything else equal",
             scaling_grid(rows, "seq_len", "sequence length T", logx=2)),
        Plot("memory_vs_batch", "Memory and step time vs batch size",
             "The slope is the memory per sample (activations); where a line meets the axis is the parameter-sized "
             "part (gradients, tangents, optimizer state), which does not grow with B.",
             "one framework x mode at >= 2 values of batch_size with everything else equal",
             scaling_grid(rows, "batch_size", "batch size B")),
        Plot("jacfwd_vs_trainable", "jacfwd step time vs trainable parameters",
             "Log-log axes: jacfwd runs one forward-mode pass per trainable parameter, so its line should have slope "
             "about 1, while backprop and one-tangent jvp stay nearly flat.",
             "jacfwd rows at >= 2 values of n_trainable (different trainable scopes) with everything else equal",
             jacfwd_grid(rows)),
        Plot("grad_quality", "Gradient quality vs number of tangents",
             "Cosine between the estimate and the exact gradient of the same batch (1 is exact): jvp's should follow "
             "the dotted grey expectation sqrt(K/(K+n-1)), rising with K; MeZO's one direction is a flat line.",
             "jvp rows with grad_cosine at >= 2 values of num_tangents with everything else equal "
             "(measure_grad_cosine=true)",
             grad_quality_grid(rows)),
        Plot("training_curves", "Training curves",
             "Loss at each timed step (thin: raw, thick: moving average) and held-out accuracy where it was "
             "evaluated; compare how fast modes learn per step here and per second with the step-time plot.",
             "a history JSON with >= 2 loss values next to the CSV (<csv folder>/history/<run_id>.json)",
             curves_grid(rows)),
        Plot("memory_vs_devices", "Memory and step time vs devices",
             "One row of panels per strategy, one line per framework (solid torch, dashed jax) and mode (colour), "
             "against the devices a trial ran on. batch_size is per device, so every device does the same work and "
             "a flat line scales perfectly. Left: the largest device's excess memory; what FSDP saves (1/N of the "
             "parameters and optimizer state) is held before the step begins, so it shows in the table's peak, "
             "params and optimizer columns, while the excess shows what a step adds (activations, the gradient, "
             "gathered parameters). Right: the slowest device's step time, which grows with what is exchanged: "
             "most for backprop's all-reduce of the gradient, hardly for jvp's and MeZO's few scalars.",
             "one framework x mode with parallel=ddp|fsdp at >= 2 values of devices with everything else equal "
             "(+experiment=scale_out)",
             devices_grid(rows)),
        Plot("comm_bytes", "Bytes exchanged per step per device",
             "A log axis in bytes, a panel per strategy: each group of bars is one way of differentiating and each "
             "bar one framework, what one device exchanged in one step as counted from the program; the black tick "
             "on a bar is the expectation (bench/parallel.py). Backprop's bar is parameter-sized (it all-reduces its "
             "gradient, 4n bytes); under DDP jvp's and MeZO's are a few bytes, because every device draws the same "
             "seeded direction and only scalars travel; under FSDP every mode also gathers the parameters for each "
             "forward pass. A bar well away from its tick exchanged something the formula does not describe.",
             "an ok row with parallel=ddp|fsdp on >= 2 devices and comm_bytes_per_step "
             "(+experiment=scale_out or strategy_table)",
             [[p] for p in comm_panels(contexts)]),
    ]  # fmt: skip


# ---------------------------------------------------------------------------------------------------- drawing

FRAMEWORK_COLORS = {"torch": "#ee4c2c", "jax": "#4285f4"}  # PyTorch's orange-red, a Google blue
FRAMEWORK_LINES = {"torch": ("-", "o"), "jax": ("--", "s")}
MODE_COLORS = {"inference": "#7f7f7f", "backprop": "#1f77b4", "backprop+remat": "#17becf", "jvp": "#ff7f0e",
               "jvp[naive]": "#d62728", "jvp[dual]": "#bcbd22",
               "jvp[lazy]": "#8c564b", "jacfwd": "#2ca02c", "mezo": "#9467bd"}  # fmt: skip
_MORE_COLORS = ("#e377c2", "#aec7e8", "#ffbb78", "#98df8a", "#c5b0d5", "#c49c94", "#f7b6d2")


def _byte_axis(ax, values: list[float]) -> None:
    """Ticks at powers of 32 bytes (1 B, 32 B, 1 KiB, 32 KiB, 1 MiB...), named in binary units."""
    pos = [v for v in values if v > 0]
    if not pos:
        return
    hi = max(pos) * 8  # room for the bars' labels above the tallest bar
    ax.set_ylim(1, hi)  # from 1 B, in every panel: a scalar's 8 B and a gradient's MiB on one scale
    ticks = [2.0**k for k in range(0, 51, 5) if 2.0**k <= hi]
    names = []
    for t in ticks:
        unit = next(((u, size) for u, size in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)) if t >= size),
                    ("B", 1))  # fmt: skip
        names.append(f"{t / unit[1]:g} {unit[0]}")
    ax.set_yticks(ticks, names)
    ax.minorticks_off()


def _mode_color(label: str) -> str:
    # crc32, not hash(): the same label keeps its colour from one report to the next
    return MODE_COLORS.get(label) or _MORE_COLORS[zlib.crc32(label.encode()) % len(_MORE_COLORS)]


def moving_average(ys: list[float], window: int) -> list[float]:
    out, total = [], 0.0
    for i, y in enumerate(ys):
        total += y
        if i >= window:
            total -= ys[i - window]
        out.append(total / min(i + 1, window))
    return out


# Figure geometry in inches. Axes are placed by hand: a layout engine measures every text twice per figure, and
# that doubled the time of a report.
PANEL_HEIGHT = 3.0
PAD_LEFT, PAD_BOTTOM, PAD_TOP = 0.9, 0.95, 0.4  # tick labels + axis label; rotated mode names; panel title
LEGEND_WIDTH = {True: 1.2, False: 2.6}  # beside a panel: bars (framework names), lines (framework + mode)
SUPTITLE_HEIGHT = 0.45


def draw(plot: Plot, path: Path) -> Path:
    """Draw a planned plot into a PNG with matplotlib's Agg canvas (no display, no pyplot state)."""
    # imported here only: the sweep process and `python -m bench.targets` read rows but never draw
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    def legend_w(p: Panel) -> float:
        return LEGEND_WIDTH[bool(p.categories)] if p.legend else 0.25

    row_h = PAD_TOP + PANEL_HEIGHT + PAD_BOTTOM
    fig_w = max(sum(PAD_LEFT + _panel_width(p) + legend_w(p) for p in row) for row in plot.grid)
    fig_h = SUPTITLE_HEIGHT + row_h * len(plot.grid)
    fig = Figure(figsize=(fig_w, fig_h))
    FigureCanvasAgg(fig)
    for i, row in enumerate(plot.grid):
        bottom = fig_h - SUPTITLE_HEIGHT - row_h * (i + 1) + PAD_BOTTOM
        left = 0.0
        for panel in row:
            left += PAD_LEFT
            ax = fig.add_axes((left / fig_w, bottom / fig_h, _panel_width(panel) / fig_w, PANEL_HEIGHT / fig_h))
            _draw_panel(ax, panel)
            left += _panel_width(panel) + legend_w(panel)
    fig.suptitle(plot.title, fontsize=11, y=1 - 0.1 / fig_h, va="top")
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=100)
    return path


def _panel_width(p: Panel) -> float:
    if p.categories:
        return max(5.0, 0.4 * len(p.categories) * max(1, sum(not s.guide for s in p.series)) + 1.0)
    return 5.0


TITLE_CHAR_WIDTH = 0.062  # inches per character of an 8-point title (DejaVu Sans, on average)


def fit_title(title: str, width: float) -> str:
    """A context label broken at its " · " into lines as wide as the panel and a little of the padding beside it
    (at most two lines: PAD_TOP's room)."""
    most = int((width + 0.5) / TITLE_CHAR_WIDTH)
    lines = [""]
    for part in title.split(" · "):
        if lines[-1] and len(lines[-1]) + 3 + len(part) > most and len(lines) < 2:
            lines.append(part)
        else:
            lines[-1] = f"{lines[-1]} · {part}" if lines[-1] else part
    return "\n".join(lines)


def _draw_panel(ax, p: Panel) -> None:
    if p.categories:
        _draw_bars(ax, p)
    else:
        for s in p.series:
            if s.guide:
                ax.plot(s.xs, s.ys, color="0.55", linestyle=":", linewidth=1.5, label=s.label)
                continue
            style, marker = FRAMEWORK_LINES.get(s.framework, ("-.", "^"))
            color = _mode_color(s.mode)
            if len(s.xs) > 50:  # long training runs: the raw loss is noise around the trend
                ax.plot(s.xs, s.ys, color=color, linestyle=style, linewidth=0.6, alpha=0.35)
                ax.plot(s.xs, moving_average(s.ys, max(2, len(s.xs) // 25)), color=color, linestyle=style,
                        linewidth=1.8, label=s.label)  # fmt: skip
            else:
                ax.plot(s.xs, s.ys, color=color, linestyle=style, marker=marker, markersize=4, label=s.label)
        xs = sorted({x for s in p.series if not s.guide for x in s.xs})
        if p.logx:
            ax.set_xscale("log", base=p.logx)
            if p.logx == 2 and 0 < len(xs) <= 12:  # the measured values as ticks: 1, 2, 4, 8 layers...
                ax.set_xticks(xs, [f"{x:g}" for x in xs])
                ax.minorticks_off()
        elif all(float(x).is_integer() for s in p.series for x in s.xs):  # steps, layers: no 2.5th step
            if len(xs) <= 12:  # a sweep's few values (1, 2, 4, 8 layers) as the ticks
                ax.set_xticks(xs, [f"{x:g}" for x in xs])
            else:
                ax.locator_params(axis="x", integer=True)  # the default locator, whole numbers only
        if p.legend:
            ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1.0), borderaxespad=0)
        elif any(s.guide for s in p.series):  # the lines are explained beside the next panel, the guide here
            guides = [line for line in ax.get_lines() if line.get_linestyle() == ":"]
            ax.legend(handles=guides, fontsize=7, loc="upper left")
    if p.logy:
        ax.set_yscale("log")
    if p.units == "bytes":
        _byte_axis(ax, [y for s in p.series for y in s.ys])
    ax.set_title(fit_title(p.title, _panel_width(p)), fontsize=8)
    ax.set_xlabel(p.xlabel, fontsize=9)
    ax.set_ylabel(p.ylabel, fontsize=9)
    ax.tick_params(labelsize=8)
    ax.grid(True, axis="y", alpha=0.3)


def _draw_bars(ax, p: Panel) -> None:
    bars = [s for s in p.series if not s.guide]
    n = len(bars)
    width = 0.8 / n
    offset = {}
    label = fmt_bytes if p.units == "bytes" else fmt_value
    for i, s in enumerate(bars):
        offset[s.framework] = (i - (n - 1) / 2) * width
        xs = [x + offset[s.framework] for x in s.xs]
        err = None
        if s.lo is not None and s.hi is not None:
            err = [[max(0.0, y - lo) for y, lo in zip(s.ys, s.lo)], [max(0.0, hi - y) for y, hi in zip(s.ys, s.hi)]]
        drawn = ax.bar(xs, s.ys, width, yerr=err, capsize=2, label=FRAMEWORK_NAMES.get(s.framework, s.framework),
                       color=FRAMEWORK_COLORS.get(s.framework, "0.5"), error_kw={"linewidth": 0.8})  # fmt: skip
        ax.bar_label(drawn, labels=[label(y) for y in s.ys], fontsize=7, padding=2)
    for i, g in enumerate(s for s in p.series if s.guide):  # a tick across its framework's bar
        xs = [x + offset.get(g.framework, 0.0) for x in g.xs]
        ax.hlines(g.ys, [x - 0.45 * width for x in xs], [x + 0.45 * width for x in xs], colors="black",
                  linewidth=2, zorder=3, label=g.label if i == 0 else None)  # fmt: skip
    long = max((len(c) for c in p.categories), default=0) > 8
    ax.set_xticks(range(len(p.categories)), p.categories, rotation=25 if long else 0, ha="right" if long else "center")
    ax.margins(y=0.15)  # room for the value labels above the tallest bar
    if p.legend:
        ax.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.01, 1.0), borderaxespad=0)


