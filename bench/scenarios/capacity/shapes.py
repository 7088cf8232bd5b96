"""Shapes users train at: the ladders of `python -m bench capacity --ladder F` (conf/experiment/shapes.yaml, and
shapes_gpu.yaml on a GPU) as the rate each rung reached, TFLOP/s, HFU and MFU, against batch x sequence, per
framework, way of differentiating and dtype; beside them any other row of the same context (the GPU table's
B8 T128 in a lease's report). Every rung is a model trial, a row of runs.csv named by its ladder's probe_run_ids.

HFU and MFU are the time-explained section's (bench/scenarios/model/report/time_explained.py): the counted FLOPs'
rate and the model's useful FLOPs' rate (3 forward passes a training step, 1 for inference) over one peak, a GPU's
published one, else the highest matmul probe of the host's trials in that dtype.
"""

from __future__ import annotations

from collections import defaultdict
from pathlib import Path

from bench.report.plots import Chart, Plot, Series, save
from bench.report.section import PLOT_DIR, Results, Section
from bench.report.tables import fmt_value, md_table, num
from bench.scenarios.capacity.columns import RESULTS_FILE
from bench.scenarios.capacity.report import latest_searches
from bench.scenarios.model.report.time_explained import host_peaks, utilisations
from bench.scenarios.model.select import context_key, context_label, framework_order, mode_order, variant, view
from bench.spec import FRAMEWORK_NAMES

SHAPE = ("batch_size", "seq_len", "dtype")  # what varies within one of the section's contexts
Cell = tuple  # (framework, variant, dtype)


def dtype_order(dtype: str) -> tuple:
    return (dtype != "fp32", dtype)  # fp32 first, then the narrower ones


def ladders(results: Results) -> list[dict]:
    """The latest search of each kind that was a ladder (capacity.csv's `ladder` set)."""
    return [r for r in latest_searches(results.rows(RESULTS_FILE)) if r.get("ladder") and r.get("status") != "damaged"]


def cell(row: dict) -> Cell:
    return row["framework"], variant(row), row.get("dtype", "")


def shape_rows(model_rows: list[dict], chosen: list[dict], searches: list[dict]) -> list[dict]:
    """Every ok rung of the ladders, then the chosen rows of their contexts and cells at shapes no rung has (the
    B8 T128 the GPU table measured), each (cell, batch, sequence) once."""
    ids = {i for s in searches for i in (s.get("probe_run_ids") or "").split()}
    rungs = [r for r in model_rows if r.get("run_id") in ids and r.get("status") == "ok"]
    keys = {context_key(r, drop=SHAPE) for r in rungs}
    cells = {cell(r) for r in rungs}
    out, seen = [], set()
    for r in [*rungs, *chosen]:
        where = (cell(r), r.get("batch_size"), r.get("seq_len"))
        if where not in seen and cell(r) in cells and context_key(r, drop=SHAPE) in keys:
            seen.add(where)
            out.append(r)
    return out


def peaks_by_dtype(rows: list[dict]) -> dict[str, dict[str, float]]:
    """One matmul peak per host and dtype: a bf16 probe is not fp32's peak."""
    return {d: host_peaks([r for r in rows if r.get("dtype") == d]) for d in {r.get("dtype") for r in rows}}


def rate_unit(rows: list[dict]) -> tuple[str, float]:
    """TFLOP/s where some rung reached one, else GFLOP/s (a CPU's)."""
    top = max((num(r, "flops_per_s") or 0.0 for r in rows), default=0.0)
    return ("TFLOP/s", 1e-12) if top >= 1e12 else ("GFLOP/s", 1e-9)


def _share(x: float | None) -> str:
    return "-" if x is None else f"{fmt_value(x * 100)} %"


def stopped(search: dict) -> str:
    """Where the ladder ended: the limit, the rung out of memory, or not yet (probes spent)."""
    probes = (search.get("probe_values") or "").split()
    last = probes[-1] if probes else ""
    if search.get("verdict") == "fits at the limit":
        return "the limit"
    if last.endswith((":oom", ":over")):
        return f"B{last.split(':')[0]} out of memory"
    return f"{search.get('verdict')} after {len(probes)} rung(s)"


def of_context(searches: list[dict], key: tuple, rows: list[dict]) -> list[dict]:
    """The ladders of a context's cells: its model, layers and device, one of its (framework, mode, dtype)."""
    c, cells = dict(key), {cell(r) for r in rows}
    return [
        s
        for s in searches
        if cell(s) in cells and all(str(s.get(k) or "") == c.get(k, "") for k in ("model", "num_layers", "device"))
    ]


def context_tables(rows: list[dict], searches: list[dict], peaks: dict[str, dict[str, float]]) -> list[str]:
    """One table per sequence length: a line per (framework, mode, dtype), a column per batch, each cell the rate
    with HFU and MFU, and where the ladder stopped."""
    unit, scale = rate_unit(rows)
    out = []
    for seq in sorted({int(r["seq_len"]) for r in rows}):
        mine = [r for r in rows if int(r["seq_len"]) == seq]
        batches = sorted({int(r["batch_size"]) for r in mine})
        by = {(cell(r), int(r["batch_size"])): r for r in mine}
        ends = {
            (s["framework"], variant(s), s.get("dtype", "")): s for s in searches if str(s.get("seq_len")) == str(seq)
        }
        lines = sorted(
            {cell(r): r for r in mine}.items(),
            key=lambda kv: (mode_order(kv[1]), dtype_order(kv[0][2]), framework_order(kv[0][0])),
        )
        body = []
        for c, _ in lines:
            cells = []
            for b in batches:
                r = by.get((c, b))
                if r is None:
                    cells.append("")
                    continue
                hfu, mfu = utilisations(r, peaks.get(r.get("dtype"), {}))
                cells.append(f"{fmt_value(num(r, 'flops_per_s'), scale)} · {_share(hfu)} · {_share(mfu)}")
            end = ends.get(c)
            body.append([FRAMEWORK_NAMES.get(c[0], c[0]), c[1], c[2], *cells, stopped(end) if end else "-"])
        head = ["framework", "mode", "dtype", *(f"B{b} ({b * seq} tokens)" for b in batches), "ladder ended at"]
        out += [f"T{seq}: {unit} · HFU · MFU", "", md_table(head, body, "lll" + "r" * len(batches) + "l"), ""]
    return out


def shapes_plot(contexts: dict[tuple, list[dict]]) -> Plot:
    """A panel per (context, dtype, sequence length): the rate against the batch, a line per framework and mode."""
    grid = []
    for key, rows in contexts.items():
        unit, scale = rate_unit(rows)
        for dtype in sorted({r.get("dtype", "") for r in rows}, key=dtype_order):
            panels = []
            for seq in sorted({int(r["seq_len"]) for r in rows}):
                mine = [r for r in rows if r.get("dtype") == dtype and int(r["seq_len"]) == seq]
                series = []
                for c in sorted({cell(r) for r in mine}, key=lambda c: (c[1], framework_order(c[0]))):
                    points = sorted((int(r["batch_size"]), num(r, "flops_per_s")) for r in mine if cell(r) == c)
                    points = [(b, y * scale) for b, y in points if y is not None]
                    if points:
                        series.append(Series(c[0], c[1], [float(b) for b, _ in points], [y for _, y in points]))
                if series:
                    title = f"{context_label(key)} · {dtype} · T{seq}"
                    panels.append(Chart(title, "batch", unit, series, logx=2, logy=True))
            if panels:
                grid.append(panels)
    return Plot(
        name="shapes",
        title="Shapes: the rate each way of differentiating reaches as the batch grows",
        how_to_read="One panel per dtype and sequence length, one line per framework and mode: the counted FLOPs "
        "per second of the median step against the batch (both axes logarithmic). A line that keeps rising was "
        "still paying a cost per step that a larger batch shares out (launching kernels, the host's Python); a flat "
        "one has reached what the device gives that mode.",
        needs="python -m bench capacity --ladder F +experiment=shapes (capacity.csv and its probes in runs.csv)",
        grid=grid,
    )


class ShapesSection(Section):
    """Shapes users train at: the ladders' rungs, as rates against batch x sequence, with HFU and MFU."""

    def render(self, results: Results, plot_dir: Path) -> list[str]:
        searches = ladders(results)
        if not searches:
            return []
        v = view(results)
        rows = shape_rows(v.rows, v.sel.ok, searches)
        if not rows:
            return []
        peaks = peaks_by_dtype(v.sel.ok)
        contexts: dict[tuple, list[dict]] = defaultdict(list)
        for r in rows:
            contexts[context_key(r, drop=SHAPE)].append(r)
        out = [
            "## Shapes",
            "",
            "Each way of differentiating at growing batches, every batch a measured trial up to what fits "
            "(`python -m bench capacity --ladder F`: each rung F times the last, until one runs out of memory or the "
            "ladder's limit, data.num_train), beside the other rows of its context. A cell: the counted FLOPs per "
            "second of the median step, HFU (that rate over the peak) and MFU (the model's useful FLOPs: 3 forward "
            "passes a training step, 1 for inference, over the peak; MeZO's 2 passes are credited 3, as any "
            "training step's). The peak: a GPU's published one for the dtype, else the host's highest matmul probe "
            "in it. docs/shapes.md says how to read it.",
            "",
        ]
        for key, mine in sorted(contexts.items(), key=lambda kv: str(kv[0])):
            out += [f"### {context_label(key)}", "", *context_tables(mine, of_context(searches, key, mine), peaks)]
        plot = shapes_plot(contexts)
        if save(plot, plot_dir):
            out += [f"![{plot.title}]({PLOT_DIR}/{plot.name}.png)", "", plot.how_to_read, ""]
        return out
