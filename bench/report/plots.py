"""Plots, drawn: what a plot holds (Series on Charts, a grid of Charts), and drawing it into a PNG.

Computing and drawing are apart: a section plans what each plot shows (tests check the plan), `draw` only draws.
A plot is a grid of charts, one context per row of charts; a plot with an empty grid has no data and is skipped,
with what it needs said in the report. What a chart shows is described once (bench/report/panels.py), for the
report and the W&B dashboard alike.
"""

from __future__ import annotations

import math
import zlib
from dataclasses import dataclass, field
from pathlib import Path

from bench import estimators
from bench.report.tables import fmt_bytes, fmt_value
from bench.spec import FRAMEWORK_NAMES

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
    note: str = ""  # said after the label in the legend (a line drawn over another one: which)

    @property
    def label(self) -> str:
        return self.guide or f"{self.framework} {self.mode}{self.note}"


@dataclass
class Chart:
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
    grid: list[list[Chart]]  # rows of panels; empty: skipped
    path: Path | None = None  # set once drawn

    @property
    def drawn(self) -> bool:
        return bool(self.grid)


# ---------------------------------------------------------------------------------------------------- drawing

FRAMEWORK_COLORS = {"torch": "#ee4c2c", "jax": "#4285f4"}  # PyTorch's orange-red, a Google blue
FRAMEWORK_LINES = {"torch": ("-", "o"), "jax": ("--", "s")}
# each estimator's own colour (bench/estimators/), and the variants the plots set beside their mode's
MODE_COLORS = {name: estimators.get(name).color for name in estimators.names() if estimators.get(name).color} | {
    f"{estimators.EXACT}+remat": "#17becf",
    f"{estimators.FORWARD_GRADIENT}[naive]": "#d62728",
    f"{estimators.FORWARD_GRADIENT}[dual]": "#bcbd22",
    f"{estimators.FORWARD_GRADIENT}[lazy]": "#8c564b",
}
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
        unit = next(((u, size) for u, size in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)) if t >= size), ("B", 1))
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


def save(plot: Plot, plot_dir: Path, drawer=None) -> bool:
    """Draw a planned plot into plot_dir/<name>.png (with `drawer` where the plot draws its own way), or, when it
    has no data, remove a file of that name left by an earlier report: the folder never shows a stale plot."""
    target = plot_dir / f"{plot.name}.png"
    if not plot.drawn:
        target.unlink(missing_ok=True)
        return False
    plot.path = (drawer or draw)(plot, target)
    return True


def draw(plot: Plot, path: Path) -> Path:
    """Draw a planned plot into a PNG with matplotlib's Agg canvas (no display, no pyplot state)."""
    # imported here only: the sweep process and `python -m bench targets` read rows but never draw
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    def legend_w(p: Chart) -> float:
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
            draw_panel(ax, panel)
            left += _panel_width(panel) + legend_w(panel)
    fig.suptitle(plot.title, fontsize=11, y=1 - 0.1 / fig_h, va="top")
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=100)
    return path


def _panel_width(p: Chart) -> float:
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


def measured_ticks(xs: list[float]) -> bool:
    """Whether a log axis's ticks are its measured values: a few whole numbers (layers, trained parameters), no two
    closer than a twentieth of the axis's span in log (their labels would overlap)."""
    if not 1 < len(xs) <= 12 or not all(x > 0 and float(x).is_integer() for x in xs):
        return False
    logs = [math.log10(x) for x in xs]
    return min(b - a for a, b in zip(logs, logs[1:])) >= (logs[-1] - logs[0]) / 20


def draw_panel(ax, p: Chart) -> None:
    """Draw one chart on a matplotlib Axes: its lines or bars, axes, ticks and legend."""
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
                ax.plot(
                    s.xs,
                    moving_average(s.ys, max(2, len(s.xs) // 25)),
                    color=color,
                    linestyle=style,
                    linewidth=1.8,
                    label=s.label,
                )
            else:
                ax.plot(s.xs, s.ys, color=color, linestyle=style, marker=marker, markersize=4, label=s.label)
        xs = sorted({x for s in p.series if not s.guide for x in s.xs})
        if p.logx:
            ax.set_xscale("log", base=p.logx)
            if measured_ticks(xs):  # the measured values as ticks: 1, 2, 4, 8 layers; a model's trained scopes
                ax.set_xticks(xs, [f"{x:,.0f}" for x in xs])
                ax.minorticks_off()
            else:  # a log axis spanning a decade or two labels its minor ticks too, over each other
                from matplotlib.ticker import NullFormatter

                ax.xaxis.set_minor_formatter(NullFormatter())
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


def _draw_bars(ax, p: Chart) -> None:
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
        drawn = ax.bar(
            xs,
            s.ys,
            width,
            yerr=err,
            capsize=2,
            label=FRAMEWORK_NAMES.get(s.framework, s.framework),
            color=FRAMEWORK_COLORS.get(s.framework, "0.5"),
            error_kw={"linewidth": 0.8},
        )
        ax.bar_label(drawn, labels=[label(y) for y in s.ys], fontsize=7, padding=2)
    for i, g in enumerate(s for s in p.series if s.guide):  # a tick across its framework's bar
        xs = [x + offset.get(g.framework, 0.0) for x in g.xs]
        ax.hlines(
            g.ys,
            [x - 0.45 * width for x in xs],
            [x + 0.45 * width for x in xs],
            colors="black",
            linewidth=2,
            zorder=3,
            label=g.label if i == 0 else None,
        )
    long = max((len(c) for c in p.categories), default=0) > 8
    ax.set_xticks(range(len(p.categories)), p.categories, rotation=25 if long else 0, ha="right" if long else "center")
    ax.margins(y=0.15)  # room for the value labels above the tallest bar
    if p.legend:
        ax.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.01, 1.0), borderaxespad=0)
