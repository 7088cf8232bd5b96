"""The report's "Time, explained" section: where each way of differentiating's step time goes, from the trials'
profiler traces (profile=true), and how far each is from the host's matmul peak, from the step's FLOPs.

Rows carry, per step of the traced steps (bench/measure/timeline.py; docs/time.md):

    time_matmul_ms       matrix multiplies of the linear layers (and their tangents and gradients)
    time_attention_ms    attention's batched matmuls (scores, context) and its softmax
    time_elementwise_ms  everything else the framework computes: layer norms, activations, dropout, copies
    time_random_ms       random draws: tangents, MeZO's perturbations (and their regeneration), dropout masks
    time_optimizer_ms    the optimizer's update
    time_collectives_ms  all-reduces, all-gathers, reduce-scatters
    time_overhead_ms     no operation ran: Python, dispatch, the runtime

summing to profile_step_ms; kernels_per_step (what one step launches: torch's operators that do work, the
compiled JAX programs' kernels) and host_share (the share of a step in which none of them ran), in every row; and
flops_per_step (counted by the framework), flops_predicted (the analytical model),
flops_forward (the model's one forward pass) and flops_per_s (at the timed median step). Against one peak per host
(a GPU's published peak, else the highest of the host's trials' matmul probes: a slower probe met a busy host), the
table gives HFU, the counted FLOPs' rate, and MFU, the model's useful FLOPs' rate: 3x a forward pass per training
step whatever the mode (PaLM's and torchtitan's definition), 1x for inference. Rows without a trace are left out;
the section appears only when some ok row has one.
"""

from __future__ import annotations

from collections import defaultdict
from functools import partial
from pathlib import Path

from bench import estimators
from bench.measure import flop_model
from bench.measure.timeline import CATEGORIES
from bench.report.plots import Chart, Plot, Series, save
from bench.report.section import PLOT_DIR, Results, Section
from bench.report.tables import md_table, num
from bench.scenarios.model.report.memory import bar_label, draw_breakdown
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

COLORS = {
    "matmul": "#1f77b4",
    "attention": "#17becf",
    "elementwise": "#2ca02c",
    "random": "#ff7f0e",
    "optimizer": "#9467bd",
    "collectives": "#d62728",
    "overhead": "#7f7f7f",
}
# A ratio of step times worth explaining across frameworks (the same mode): below it the two are close enough
# that the categories' differences are within the run-to-run spread of a few profiled steps.
EXPLAIN_RATIO = 1.5
NAMED = 3  # categories named in a sentence that explains a difference, the largest first


def has_trace(row: dict) -> bool:
    return num(row, "time_overhead_ms") is not None


def time_contexts(sel: Selection) -> dict[Context, Cells]:
    """{context: {(framework, variant): row}} over the ok rows with a trace: the latest of each cell."""
    return dict(ok_cells(r for r in sel.ok if has_trace(r)))


def ms(row: dict, category: str) -> float:
    return num(row, f"time_{category}_ms") or 0.0


def _g(v: float | None, scale: float = 1e9) -> str:
    return "-" if v is None else f"{v / scale:.3g}"


def _share(v: float | None) -> str:
    return "-" if v is None else f"{v:.1%}"


HEAD = [
    "framework",
    "mode",
    "timed ms",
    "traced ms",
    *[f"{c} ms" for c in CATEGORIES],
    "kernels / step",
    "host share",
    "GFLOP / step (counted / model)",
    "GFLOP/s",
    "HFU (counted FLOPs)",
    "MFU (model FLOPs, 3× forward)",
]


def host(row: dict) -> str:
    return row.get("hostname") or row.get("device_name") or row.get("device") or "?"


def host_peaks(rows) -> dict[str, float]:
    """One matmul peak per host: the highest of its trials' probes (each probe keeps its fastest matmul; one slower
    than another on the same host met a busy host)."""
    peaks: dict[str, float] = {}
    for r in rows:
        probe = num(r, "matmul_peak_flops_per_s")
        if probe:
            peaks[host(r)] = max(probe, peaks.get(host(r), 0.0))
    return peaks


def peak_of(row: dict, peaks: dict[str, float]) -> float | None:
    """What a row's utilisation divides by: its GPU's published peak, else its host's measured one."""
    return num(row, "peak_flops_per_s") or peaks.get(host(row))


def useful_flops(row: dict) -> float | None:
    """The model's FLOPs a row's step is credited with (bench.measure.flop_model.useful_flops)."""
    return flop_model.useful_flops(num(row, "flops_forward"), row.get("mode", ""))


def utilisations(row: dict, peaks: dict[str, float]) -> tuple[float | None, float | None]:
    """(HFU, MFU) of a row: the counted FLOPs' rate, and the model's useful FLOPs' rate, over its peak."""
    peak, step = peak_of(row, peaks), num(row, "step_time_median_s")
    if not peak or not step:
        return None, None
    counted, useful = num(row, "flops_per_step"), useful_flops(row)
    return (None if counted is None else counted / step / peak), (None if useful is None else useful / step / peak)


def peaks_line(cells: Cells, peaks: dict[str, float]) -> str:
    """Which peak each host's rows divide by."""
    parts = []
    for name in dict.fromkeys(host(r) for r in cells.values()):
        published = {num(r, "peak_flops_per_s") for r in cells.values() if host(r) == name} - {None}
        if published:
            parts.append(f"{name}: {_g(max(published))} GFLOP/s, published")
        elif name in peaks:
            parts.append(f"{name}: {_g(peaks[name])} GFLOP/s, the highest of its trials' matmul probes")
    return f"Peak: {'; '.join(parts)}." if parts else ""


def kernels(row: dict) -> str:
    """Kernels per step, and in torch the dispatches beside them that launch nothing ("272 (+4,200 none)")."""
    n, empty = num(row, "kernels_per_step"), num(row, "no_kernel_dispatches_per_step")
    if n is None:
        return "-"
    return f"{n:,.0f}" + (f" (+{empty:,.0f} none)" if empty else "")


def time_table(cells: Cells, peaks: dict[str, float] | None = None) -> str:
    peaks = host_peaks(cells.values()) if peaks is None else peaks
    body = []
    for (fw, label), r in sorted(cells.items(), key=cell_order):
        hfu, mfu = utilisations(r, peaks)
        step = num(r, "profile_step_ms") or 0.0
        parts = [f"{ms(r, c):.1f} ({ms(r, c) / step:.0%})" if step else "-" for c in CATEGORIES]
        flops = f"{_g(num(r, 'flops_per_step'))} / {_g(num(r, 'flops_predicted'))}"
        timed = "-" if num(r, "step_time_median_s") is None else f"{num(r, 'step_time_median_s') * 1e3:.1f}"
        body.append(
            [
                fw,
                label,
                timed,
                f"{step:.1f}",
                *parts,
                kernels(r),
                _share(num(r, "host_share")),
                flops,
                _g(num(r, "flops_per_s")),
                _share(hfu),
                _share(mfu),
            ]
        )
    return md_table(HEAD, body)


def biggest(more: dict, less: dict) -> str:
    """The categories that make up most of what `more` spends beyond `less`, the largest first."""
    diffs = sorted(((ms(more, c) - ms(less, c), c) for c in CATEGORIES), reverse=True)
    named = [f"{c} (+{d:.1f} ms)" for d, c in diffs[:NAMED] if d > 0]
    return ", ".join(named) or "no one category"


def jvp_against_backprop(cells: Cells) -> list[str]:
    """Per framework, where a jvp step's time beyond backprop's goes."""
    out = []
    for fw in dict.fromkeys(f for f, _ in sorted(cells, key=lambda c: c[0])):
        bp, fg = cells.get((fw, estimators.EXACT)), cells.get((fw, estimators.FORWARD_GRADIENT))
        if bp is None or fg is None or not num(bp, "profile_step_ms"):
            continue
        a, b = num(fg, "profile_step_ms"), num(bp, "profile_step_ms")
        ta, tb = num(fg, "step_time_median_s"), num(bp, "step_time_median_s")
        timed = f"; timed, {ta / tb:.2f}×" if ta and tb else ""
        out.append(
            f"{fw}: a traced jvp step took {a:.1f} ms against backprop's {b:.1f} ({a / b:.2f}×{timed}); "
            f"{'its extra time is mostly ' + biggest(fg, bp) if a > b else 'no extra time'}."
        )
    return out


def across_frameworks(cells: Cells) -> list[str]:
    """For each mode both frameworks ran where one took EXPLAIN_RATIO x the other's time or more: where."""
    out = []
    by_mode: dict[str, dict] = defaultdict(dict)
    for (fw, label), r in sorted(cells.items(), key=cell_order):  # in the table's order
        by_mode[label][fw] = r
    for label, rows in by_mode.items():
        if len(rows) < 2:
            continue
        (f1, r1), (f2, r2) = sorted(rows.items(), key=lambda kv: -(num(kv[1], "profile_step_ms") or 0.0))[:2]
        slow, fast = num(r1, "profile_step_ms"), num(r2, "profile_step_ms")
        if fast and slow / fast >= EXPLAIN_RATIO:
            out.append(
                f"{label}: {f1}'s step took {slow / fast:.1f}× {f2}'s ({slow:.1f} against {fast:.1f} ms), "
                f"mostly in {biggest(r1, r2)}."
            )
    return out


def peak_sentence(cells: Cells, peaks: dict[str, float]) -> list[str]:
    rows = [(variant(r), r.get("framework", ""), utilisations(r, peaks)[0]) for r in cells.values()]
    rows = [x for x in rows if x[2] is not None]
    if not rows:
        return []
    lo, hi = min(rows, key=lambda x: x[2]), max(rows, key=lambda x: x[2])
    return [
        f"Of the peak, the steps' counted FLOPs reach (HFU) from {lo[2]:.1%} ({lo[1]} {lo[0]}) to {hi[2]:.1%} "
        f"({hi[1]} {hi[0]})."
    ]


def time_plot(contexts: dict[Context, Cells]) -> Plot:
    panels = []
    for key in richest_first(contexts)[:MAX_PANELS]:
        cells = sorted(contexts[key].items(), key=cell_order)
        xs = [float(i) for i in range(len(cells))]
        series = [Series("", c, xs, [ms(r, c) for _, r in cells]) for c in CATEGORIES]
        panels.append(
            Chart(
                context_label(key),
                "ms per step (the traced steps' mean)",
                "",
                series,
                [bar_label(cell) for cell, _ in cells],
                legend=True,
            )
        )
    return Plot(
        "time_breakdown",
        "Time, explained: where each way of differentiating's step time goes",
        "One bar per framework × mode, stacked by what the step's time went to, from its profiler trace: "
        "**matmul** (linear layers), **attention** (batched matmuls and softmax), **elementwise** (norms, "
        "activations, dropout, copies), **random** draws, the **optimizer**'s update, **collectives**, and "
        "**overhead**, where no operation of the framework ran (Python, dispatch, the runtime). The bar's length "
        "is the traced step's time.",
        "an ok row with a profiler trace (profile=true)",
        [[p] for p in panels],
    )


def section(contexts: dict[Context, Cells], plot: Plot) -> list[str]:
    if not contexts:
        return []
    out = [
        "## Time, explained",
        "",
        "Where each way of differentiating's step time goes, from a profiler trace of a few steps after the "
        "timed ones (profile=true: torch.profiler, jax.profiler; docs/time.md says how to open them). Each "
        "category is its operations' share of the time some operation ran, and **overhead** the rest of the "
        "step, so the categories add up to the traced step (*traced ms*: with the profiler on, above the "
        "*timed* median by the profiler's cost per operation, most where a step runs many small ones). "
        "*Kernels / step* is what one step launches (torch: the operators it dispatches that do work, a "
        "foreach operator one; JAX: the compiled programs' kernels, loops at their trip counts), with torch's "
        "dispatches that launch nothing (views, metadata) in parentheses; *host share* is the part of a step in "
        "which none of its kernels ran (torch on a CPU: its operators' own time against the timed median; "
        "otherwise one traced step), docs/time.md. "
        "FLOPs per step are the matmuls', counted by the framework (torch's FlopCounterMode; the compiled JAX "
        "programs' dots) beside the analytical model's (bench/measure/flop_model.py). Both utilisations divide "
        "by one peak per host (a GPU's published peak, else the highest of the host's trials' matmul probes), "
        "at the timed median step: *HFU* the FLOPs the framework counted (torch's forward mode includes its zero "
        "tangents' products), *MFU* the model's useful FLOPs, 3 forward passes per training step whatever the "
        "mode (PaLM's and torchtitan's definition: every mode is credited backprop's useful work, so MeZO's 2 "
        "forwards count as 3 and torch's zero-tangent products not at all).",
        "",
    ]
    peaks = host_peaks(r for cells in contexts.values() for r in cells.values())
    for key in richest_first(contexts):
        cells = contexts[key]
        line = peaks_line(cells, peaks)
        out += [*context_heading(key, cells.values()), time_table(cells, peaks), "", *([line, ""] if line else [])]
        said = jvp_against_backprop(cells) + across_frameworks(cells) + peak_sentence(cells, peaks)
        out += [*(f"- {s}" for s in said), ""] if said else []
    if plot.drawn:
        out += [f"![{plot.title}]({PLOT_DIR}/{plot.name}.png)", "", f"*How to read it:* {plot.how_to_read}", ""]
    return out


class TimeSection(Section):
    """Time, explained: where some ok row has a profiler trace."""

    def render(self, results: Results, plot_dir: Path) -> list[str]:
        contexts = time_contexts(view(results).sel)
        plot = time_plot(contexts)
        save(plot, plot_dir, drawer=partial(draw_breakdown, colors=COLORS))
        return section(contexts, plot)
