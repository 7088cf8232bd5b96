"""The report's "Memory, explained" section: what holds each way of differentiating's memory, measured, against
what the memory model (bench/measure/memory_model.py) predicts.

Rows carry the breakdown (bench/<framework>_impl/memory.py, per device, the largest device's) in MiB:

    params      mem_params_mb       every parameter, resident before the step
    optimizer   mem_optimizer_mb    optimizer state
    grads       mem_grads_mb        gradient buffers
    directions  mem_directions_mb   random directions / tangents resident at once
    saved       mem_saved_mb        activations kept for a backward pass
    temp        mem_temp_mb         the step's working memory (torch on the CPU: what the measured excess leaves
                                    after the others; mem_breakdown_method says so)

and the model's predicted excess (mem_predicted_mb) with its categories (mem_predicted_<category>_mb). Rows written
before the breakdown existed have none of it and are left out; the section appears only when some ok row has it.
Rows are chosen as everywhere in the report (select.py): the latest ok row of each configuration, one cell per
framework x mode (variant()) within a context, the latest configuration where several share a cell.
"""

from __future__ import annotations

from collections import defaultdict
from pathlib import Path

from bench import estimators
from bench.estimators.jvp import AUTO_IMPL
from bench.report.plots import Chart, Plot, Series, fit_title, save
from bench.report.section import PLOT_DIR, Results, Section
from bench.report.tables import fmt_ratio, md_table, num
from bench.scenarios.model.report.plots import MAX_PANELS
from bench.scenarios.model.select import (
    Cells,
    Context,
    Selection,
    cell_order,
    context_heading,
    context_label,
    ok_cells,
    richest_first,
    variant,
    view,
)

# (category, CSV column), in the order a bar stacks them: what is resident before the step first
CATEGORIES = (
    ("params", "mem_params_mb"),
    ("optimizer", "mem_optimizer_mb"),
    ("grads", "mem_grads_mb"),
    ("directions", "mem_directions_mb"),
    ("saved", "mem_saved_mb"),
    ("temp", "mem_temp_mb"),
)
# the categories the step itself adds, measured by the breakdown and predicted by the model one by one
STEP_CATEGORIES = ("saved", "grads", "directions", "temp")
# A row has the breakdown when any of these is filled: params and optimizer state were measured before it existed.
BREAKDOWN_COLUMNS = tuple(f"mem_{c}_mb" for c in STEP_CATEGORIES)
# Measured and predicted excess agree within a quarter of the prediction: the model counts the buffers a way of
# differentiating needs and leaves out the allocator's rounding and caching, the framework's own workspaces and
# fragmentation, which stay well below that on BERT-sized steps; a larger gap is a buffer the model does not
# describe (or one it describes that the framework does not keep).
DISAGREE = 0.25
FLAG = "**disagrees**"
# Two amounts of memory read as the same within 1 MiB or 5%, whichever is larger: what the allocator rounds a
# buffer to, and the noise of a remainder measured from the process's resident set.
SAME_MB, SAME_REL = 1.0, 0.05
COLORS = {
    "params": "#7f7f7f",
    "optimizer": "#9467bd",
    "grads": "#1f77b4",
    "directions": "#ff7f0e",
    "saved": "#d62728",
    "temp": "#2ca02c",
}
MEASURED, PREDICTED = "params + measured excess", "params + predicted excess"
# why each of torch's jvp implementations holds what it holds (bench/torch_impl/steps.py)
JVP_WHY = {
    "naive": "its parameters still require grad, so autograd records the whole dual computation for a backward "
    "pass that never comes",
    "lazy": "each module's tangent is drawn as the pass reaches it and dropped after",
}
JVP_REFERENCE = AUTO_IMPL["torch"]  # bench's default torch jvp (jvp.impl=auto): the others are compared with it


def has_breakdown(row: dict) -> bool:
    return any(num(row, c) is not None for c in BREAKDOWN_COLUMNS)


def breakdown_contexts(sel: Selection) -> dict[Context, Cells]:
    """{context: {(framework, variant): row}} over the ok rows with the breakdown: the latest of each cell."""
    return dict(ok_cells(r for r in sel.ok if has_breakdown(r)))


def bar_label(cell: tuple[str, str]) -> str:
    """ "torch jvp[naive]", "jax backprop+remat": the framework and the mode as the report's tables name it."""
    return " ".join(cell)


def _mb(row: dict, category: str) -> float:
    return num(row, f"mem_{category}_mb") or 0.0


# ------------------------------------------------------------------------------------------------------ chart


def breakdown_panels(contexts: dict[Context, Cells]) -> list[Chart]:
    """One panel per context (the richest first, at most MAX_PANELS): one bar per cell (categories), one Series per
    memory category (its `mode`, the colour) with a value per bar, and two guides: params + the measured excess,
    params + the predicted excess."""
    panels = []
    for key in richest_first(contexts)[:MAX_PANELS]:
        cells = sorted(contexts[key].items(), key=cell_order)
        xs = [float(i) for i in range(len(cells))]
        series = [Series("", name, xs, [_mb(r, name) for _, r in cells]) for name, _ in CATEGORIES]
        for guide, col in ((MEASURED, "excess_mem_mb"), (PREDICTED, "mem_predicted_mb")):
            points = [(x, _mb(r, "params") + num(r, col)) for x, (_, r) in zip(xs, cells) if num(r, col) is not None]
            if points:
                series.append(Series("", "", [x for x, _ in points], [y for _, y in points], guide=guide))
        panels.append(
            Chart(
                context_label(key),
                "MiB per device (the largest device's)",
                "",
                series,
                [bar_label(cell) for cell, _ in cells],
                legend=True,
            )
        )
    return panels


def breakdown_plot(contexts: dict[Context, Cells]) -> Plot:
    return Plot(
        "memory_breakdown",
        "Memory, explained: what holds each way of differentiating's memory",
        "One bar per framework × mode, stacked by what holds the memory on the device that holds the most: "
        "**params** (resident before the step), **optimizer** state, **grads**, the random **directions** or "
        "tangents held at once, activations **saved** for a backward pass, and **temp**, the step's working "
        "memory (torch on the CPU: what the measured excess leaves after the others). Each segment is the most "
        "that category held at once, so categories never resident together (backprop frees a layer's saved "
        "activations as its gradients arrive) stack past the step's real peak. The black tick is params + the "
        "measured excess, where the peak was; the hollow diamond is params + the memory model's predicted excess "
        "(bench/memory_model.py). A diamond far from its tick is where the model misses; the table above says "
        "by how much and in which category.",
        "an ok row with the memory breakdown (mem_saved_mb, mem_grads_mb, ...)",
        [[p] for p in breakdown_panels(contexts)],
    )


# Figure geometry in inches, as bench.plots places axes: by hand, no layout engine.
BAR_HEIGHT = 0.32
MIN_PANEL_HEIGHT = 1.5  # the legend's eight entries beside a panel of one or two bars
PANEL_WIDTH, LEGEND_WIDTH = 6.0, 2.2
PAD_TOP, PAD_BOTTOM, PAD_RIGHT = 0.5, 0.6, 0.1  # a two-line title; tick labels + axis label
SUPTITLE_HEIGHT = 0.35
LABEL_CHAR_WIDTH = 0.065  # inches per character of an 8-point tick label (DejaVu Sans, on average)


def draw_breakdown(plot: Plot, path: Path, colors: dict[str, str] = COLORS) -> Path:
    """Draw the planned stacked bars (one Series per category, its `mode` the key of `colors`) into a PNG with
    matplotlib's Agg canvas (no display, no pyplot state). The "Time, explained" chart is drawn by it too."""
    # imported here only, as bench.plots does: reading rows never needs matplotlib
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    panels = [row[0] for row in plot.grid]
    pad_left = 0.3 + LABEL_CHAR_WIDTH * max(len(c) for p in panels for c in p.categories)
    heights = [max(MIN_PANEL_HEIGHT, BAR_HEIGHT * len(p.categories) + 0.3) for p in panels]
    fig_w = pad_left + PANEL_WIDTH + LEGEND_WIDTH + PAD_RIGHT
    fig_h = SUPTITLE_HEIGHT + sum(PAD_TOP + h + PAD_BOTTOM for h in heights)
    fig = Figure(figsize=(fig_w, fig_h))
    FigureCanvasAgg(fig)
    top = fig_h - SUPTITLE_HEIGHT
    for panel, h in zip(panels, heights):
        top -= PAD_TOP + h
        ax = fig.add_axes((pad_left / fig_w, top / fig_h, PANEL_WIDTH / fig_w, h / fig_h))
        top -= PAD_BOTTOM
        _draw_stack(ax, panel, colors)
    fig.suptitle(plot.title, fontsize=11, y=1 - 0.1 / fig_h, va="top")
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=100)
    return path


def _draw_stack(ax, p: Chart, colors: dict[str, str]) -> None:
    n = len(p.categories)
    left = [0.0] * n
    for s in (s for s in p.series if not s.guide):
        if not any(s.ys):
            continue  # a category no bar holds stays out of the legend
        ax.barh(s.xs, s.ys, 0.7, left=left, color=colors.get(s.mode, "0.5"), label=s.mode)
        left = [a + b for a, b in zip(left, s.ys)]
    for g in (s for s in p.series if s.guide):
        if g.guide == MEASURED:
            ax.plot(
                g.ys,
                g.xs,
                linestyle="none",
                marker="|",
                markersize=16,
                markeredgewidth=2.5,
                color="black",
                label=g.guide,
                zorder=3,
            )
        else:
            ax.plot(
                g.ys,
                g.xs,
                linestyle="none",
                marker="D",
                markersize=6,
                markerfacecolor="none",
                markeredgecolor="black",
                markeredgewidth=1.2,
                label=g.guide,
                zorder=4,
            )
    ax.set_yticks(range(n), p.categories, fontsize=8)
    ax.set_ylim(n - 0.5, -0.5)  # the first cell on top, as the table lists it
    ax.set_xlim(left=0)
    ax.set_title(fit_title(p.title, PANEL_WIDTH), fontsize=8)
    ax.set_xlabel(p.xlabel, fontsize=9)
    ax.tick_params(labelsize=8)
    ax.grid(True, axis="x", alpha=0.3)
    if p.legend:  # the categories in stacking order, then the two guides (matplotlib puts lines first)
        handles, labels = ax.get_legend_handles_labels()
        order = sorted(range(len(labels)), key=lambda i: labels[i] in (MEASURED, PREDICTED))
        ax.legend(
            [handles[i] for i in order],
            [labels[i] for i in order],
            fontsize=7,
            loc="upper left",
            bbox_to_anchor=(1.01, 1.0),
            borderaxespad=0,
        )


# ------------------------------------------------------------------------------------------------------ table


def disagrees(row: dict) -> bool | None:
    """Whether the measured excess is more than DISAGREE of the prediction away from it; None when either is
    missing."""
    measured, predicted = num(row, "excess_mem_mb"), num(row, "mem_predicted_mb")
    if measured is None or predicted is None:
        return None
    return abs(measured - predicted) > DISAGREE * abs(predicted)


def _pair(row: dict, category: str) -> str:
    m, p = num(row, f"mem_{category}_mb"), num(row, f"mem_predicted_{category}_mb")
    return f"{'-' if m is None else f'{m:.0f}'} / {'-' if p is None else f'{p:.0f}'}"


HEAD = [
    "framework",
    "mode",
    "excess MiB",
    "predicted MiB",
    "measured / predicted",
    *[f"{c} (meas. / pred.)" for c in STEP_CATEGORIES],
    "vs model",
    "measured by",
]


def predicted_table(cells: Cells) -> str:
    """Per cell: the measured excess, the predicted, their ratio, each step category measured / predicted, and
    FLAG where the two excesses disagree by more than DISAGREE."""
    body = []
    for (fw, label), r in sorted(cells.items(), key=cell_order):
        measured, predicted = num(r, "excess_mem_mb"), num(r, "mem_predicted_mb")
        ratio = measured / predicted if measured is not None and predicted else None
        body.append(
            [
                fw,
                label,
                "-" if measured is None else f"{measured:.0f}",
                "-" if predicted is None else f"{predicted:.0f}",
                fmt_ratio(ratio),
                *[_pair(r, c) for c in STEP_CATEGORIES],
                FLAG if disagrees(r) else "",
                r.get("mem_breakdown_method", ""),
            ]
        )
    return md_table(HEAD, body, "ll" + "r" * (len(HEAD) - 4) + "ll")


# -------------------------------------------------------------------------------------- torch's jvp variants


def _same(a: float, b: float) -> bool:
    return abs(a - b) <= max(SAME_MB, SAME_REL * max(abs(a), abs(b)))


def jvp_impl_rows(cells: Cells) -> list[list[dict]]:
    """Torch jvp rows that differ only in jvp_impl, grouped (the same K and trainable scope), where a group has
    >= 2 implementations; each group in table order."""
    groups: dict[str, list[dict]] = defaultdict(list)
    for (fw, _), r in sorted(cells.items(), key=cell_order):
        if fw == "torch" and r.get("mode") == estimators.FORWARD_GRADIENT:
            groups[variant({**r, "jvp_impl": JVP_REFERENCE})].append(r)
    return [rows for rows in groups.values() if len({r.get("jvp_impl") or JVP_REFERENCE for r in rows}) >= 2]


def jvp_impl_paragraph(rows: list[dict]) -> str:
    """What torch's jvp implementations save and hold, each against the default, dual (or the first measured): the
    extra activations naive's autograd records, the tangent lazy holds instead of the whole."""
    impl = {r.get("jvp_impl") or JVP_REFERENCE: r for r in rows}
    ref_name = JVP_REFERENCE if JVP_REFERENCE in impl else next(iter(impl))
    ref = impl[ref_name]
    s0, d0 = _mb(ref, "saved"), _mb(ref, "directions")
    parts = [f"`{ref_name}` saves {s0:.0f} MiB of activations and holds {d0:.0f} MiB of tangent at once"]
    for name, r in impl.items():
        if name == ref_name:
            continue
        s, d = _mb(r, "saved"), _mb(r, "directions")
        facts = []
        if _same(s, s0):
            facts.append(f"saves as much as `{ref_name}` ({s:.0f} MiB)")
        elif s > s0:
            why = f": {JVP_WHY[name]}" if name == "naive" else ""  # the reason, beside the number it explains
            facts.append(
                f"saves {s - s0:.0f} MiB of activations that `{ref_name}` does not ({s:.0f} against {s0:.0f} MiB{why})"
            )
        else:
            facts.append(f"saves {s0 - s:.0f} MiB less than `{ref_name}` ({s:.0f} against {s0:.0f} MiB)")
        if _same(d, d0):
            facts.append(f"holds the same {d:.0f} MiB of tangent")
        else:
            why = f" ({JVP_WHY[name]})" if name == "lazy" and d < d0 else ""
            facts.append(f"holds {d:.0f} MiB of tangent at once instead of {d0:.0f} MiB{why}")
        parts.append(f"`{name}` " + " and ".join(facts))
    group = variant({**ref, "jvp_impl": JVP_REFERENCE})
    return f"Torch's `{group}` by `jvp_impl`: " + "; ".join(parts) + "."


# ---------------------------------------------------------------------------------------------------- section


def section(contexts: dict[Context, Cells], plot: Plot) -> list[str]:
    """The "Memory, explained" section as lines of markdown, the chart linked where it was drawn; [] where no row
    has the breakdown."""
    if not contexts:
        return []
    out = [
        "## Memory, explained",
        "",
        "What holds each way of differentiating's memory, measured in one instrumented step after the timed "
        "ones (torch: autograd's saved tensors, the gradients and directions as they are made; JAX: the "
        "compiled step's residuals, pytrees and XLA's temporaries), per device, the largest device's, against "
        "what the memory model predicts from the shapes (bench/measure/memory_model.py; docs/memory.md "
        "has the formulas). Each row is the latest ok row of its cell that has the breakdown; rows "
        "from runs before it existed are left out. **excess** is the measured excess (optimizer state "
        "included), **predicted** the model's; each category reads *measured / predicted* MiB. "
        f"{FLAG} marks a measured excess more than {DISAGREE:.0%} away from the prediction: where the model "
        "misses a buffer, or counts one the framework does not keep. *measured by* ending in `_remainder`: no "
        "allocator statistics (torch on the CPU), so temp is what the measured excess leaves after the other "
        "categories.",
        "",
    ]
    for key in richest_first(contexts):
        cells = contexts[key]
        out += [*context_heading(key, cells.values()), predicted_table(cells), ""]
        for rows in jvp_impl_rows(cells):
            out += [jvp_impl_paragraph(rows), ""]
    if plot.drawn:
        out += [f"![{plot.title}]({PLOT_DIR}/{plot.name}.png)", "", f"*How to read it:* {plot.how_to_read}", ""]
        if len(contexts) > MAX_PANELS:
            out += [
                f"The chart shows the {MAX_PANELS} contexts that compare the most ways of differentiating; the "
                "tables have all.",
                "",
            ]
    return out


class MemorySection(Section):
    """Memory, explained: where some ok row has the breakdown."""

    def render(self, results: Results, plot_dir: Path) -> list[str]:
        contexts = breakdown_contexts(view(results).sel)
        plot = breakdown_plot(contexts)
        save(plot, plot_dir, drawer=draw_breakdown)
        return section(contexts, plot)
