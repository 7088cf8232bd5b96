"""The model scenario's report sections built from its tables: the framework x mode tables and their ratios,
the UMass forward-AD study's table and jvp pathology, memory growth with depth, and the trials that did not
finish. Which rows count and which are compared is bench/scenarios/model/select.py's business."""

from __future__ import annotations

from pathlib import Path

from bench import estimators
from bench.measure.trackers import MiB
from bench.report.section import RUNS_CSV, Results, Section
from bench.report.tables import FP32_BYTES, fmt_ratio, fmt_value, md_table, num
from bench.scenarios.model.report.targets import slope
from bench.scenarios.model.select import (
    STUDY_EXPERIMENT,
    STUDY_MODES,
    Cells,
    Context,
    Selection,
    best_groups,
    cell_order,
    config_key,
    context_heading,
    context_key,
    context_label,
    context_order,
    experiment_of,
    framework_order,
    mode_order,
    richest_first,
    series_groups,
    trends,
    variant,
    view,
)
from bench.spec import FRAMEWORK_NAMES, TRAINABLE_SCOPES
from bench.store.read import DAMAGED, started

# ------------------------------------------------------------------------------------------------ formatting


def _fmt_mem(v: float | None) -> str:
    return "-" if v is None else f"{v:.0f}"


def _fmt_pct(v: float | None) -> str:
    return "-" if v is None else f"{100 * v:.1f}%"


def _error_line(row: dict, limit: int = 160) -> str:
    lines = [s for s in str(row.get("error", "")).splitlines() if s.strip()]
    text = lines[0].strip() if lines else ""
    more = len(lines) > 1 or len(text) > limit
    return text[:limit] + (" …" if more else "")


# ---------------------------------------------------------------------------------------------------- tables

# (column title, CSV column, formatter)
TABLE_METRICS = (
    ("peak MiB", "peak_mem_mb", _fmt_mem),
    ("excess MiB", "excess_mem_mb", _fmt_mem),
    ("compile s", "compile_time_s", fmt_value),
    ("step ms (median)", "step_time_median_s", lambda v: fmt_value(v, 1e3)),
    ("samples/s", "samples_per_s", fmt_value),
)
# shown only in contexts where some row has them (experiments that ask for them)
OPTIONAL_METRICS = (
    ("grad cosine", "grad_cosine", lambda v: "-" if v is None else f"{v:.3f}"),
    ("eval accuracy", "eval_accuracy", _fmt_pct),
)
RATIO_METRICS = (
    ("peak memory", "peak_mem_mb"),
    ("excess memory", "excess_mem_mb"),
    ("median step time", "step_time_median_s"),
    ("compile time", "compile_time_s"),
)
# mode ratios within one framework and trainable scope: (numerator, denominator), plain variants of each: every
# estimator against the mode it declares it is compared with (jvp / backprop, mezo / inference, ...)
MODE_RATIOS = tuple(
    (name, estimators.get(name).compared_with) for name in estimators.names() if estimators.get(name).compared_with
)


def context_table(cells: Cells) -> str:
    optional = [m for m in OPTIONAL_METRICS if any(num(r, m[1]) is not None for r in cells.values())]
    metrics = [*TABLE_METRICS, *optional]
    body = []
    for (fw, label), r in sorted(cells.items(), key=cell_order):
        if r.get("status") == "ok":
            values = [fmt(num(r, col)) for _, col, fmt in metrics]
            body.append([fw, label, *values, r.get("mem_method", "")])
        else:  # listed where it would have been, with no numbers
            body.append([fw, label, f"**{r.get('status') or 'no status'}**", *[""] * (len(metrics) - 1), ""])
    return md_table(["framework", "mode", *[m[0] for m in metrics], "memory by"], body, "ll" + "r" * len(metrics) + "l")


def _ratio(a: dict, b: dict, col: str) -> float | None:
    x, y = num(a, col), num(b, col)
    if x is None or y is None or x < 0 or y <= 0:  # a negative excess (memory freed) has no meaningful ratio
        return None
    return x / y


def context_ratios(cells: Cells) -> list[tuple[str, dict[str, float | None]]]:
    """[(what is divided by what, {CSV column: ratio})]: jvp/backprop and mezo/inference within each framework,
    jax/torch for each mode both frameworks ran."""
    ok = {cell: r for cell, r in cells.items() if r.get("status") == "ok"}
    out = []
    for fw in sorted({fw for fw, _ in ok}, key=framework_order):
        for scope in TRAINABLE_SCOPES:
            suffix = "" if scope == "all" else f"[{scope}]"
            for top, den in MODE_RATIOS:
                a, b = ok.get((fw, top + suffix)), ok.get((fw, den + suffix))
                if b is None and not estimators.get(den).updates:
                    b = ok.get((fw, den))  # what is trainable does not change a step that trains nothing
                if a is not None and b is not None:
                    name = f"{fw}: {top + suffix} / {variant(b)}"
                    out.append((name, {c: _ratio(a, b, c) for _, c in RATIO_METRICS}))
    both = [(label, r) for (fw, label), r in ok.items() if fw == "torch" and ("jax", label) in ok]
    for label, torch_row in sorted(both, key=lambda item: mode_order(item[1])):
        jax_row = ok["jax", label]
        out.append((f"{label}: jax / torch", {c: _ratio(jax_row, torch_row, c) for _, c in RATIO_METRICS}))
    return out


def ratio_table(ratios: list[tuple[str, dict]]) -> str:
    body = [[name, *[fmt_ratio(v[c]) for _, c in RATIO_METRICS]] for name, v in ratios]
    return md_table(["ratio", *[t for t, _ in RATIO_METRICS]], body, "l" + "r" * len(RATIO_METRICS))


def study_rows(contexts: dict[Context, Cells]) -> list[tuple[Context, list[list]]]:
    """The UMass forward-AD study's table, one per context of sweep seed_agnews: PyTorch backprop / PyTorch JVP /
    JAX backprop / JAX JVP with peak and excess memory, total training time and held-out accuracy."""
    out = []
    for key in sorted(contexts, key=context_order):
        cells = [
            (cell, r)
            for cell, r in contexts[key].items()
            if experiment_of(r) == STUDY_EXPERIMENT and r.get("mode") in STUDY_MODES
        ]
        if not cells:
            continue
        body = []
        for (fw, label), r in sorted(cells, key=lambda item: (framework_order(item[0][0]), mode_order(item[1]))):
            mode = r["mode"]
            name = f"{FRAMEWORK_NAMES.get(fw, fw)} {'JVP' if mode == 'jvp' else mode}{label[len(mode) :]}"
            if r.get("status") != "ok":
                body.append([name, f"**{r.get('status')}**", "", "", "", "", ""])
                continue
            body.append(
                [
                    name,
                    _fmt_mem(num(r, "peak_mem_mb")),
                    _fmt_mem(num(r, "excess_mem_mb")),
                    fmt_value(num(r, "total_train_time_s")),
                    _fmt_pct(num(r, "eval_accuracy")),
                    r.get("steps_timed") or r.get("steps", ""),
                    r.get("epochs", ""),
                ]
            )
        out.append((key, body))
    return out


STUDY_HEAD = [
    "",
    "Peak memory (MiB)",
    "Excess memory (MiB)",
    "Total training time (s)",
    "Eval accuracy",
    "steps timed",
    "epochs",
]


def naive_jvp_contexts(contexts: dict[Context, Cells]) -> list[tuple[Context, list[list]]]:
    """Contexts with a torch jvp.impl=naive row: torch's inference, backprop and jvp rows there, with each row's
    excess memory as a multiple of backprop's."""
    out = []
    for key in sorted(contexts, key=context_order):
        cells = contexts[key]
        if not any(
            fw == "torch" and r.get("mode") == estimators.FORWARD_GRADIENT and r.get("jvp_impl") == "naive"
            for (fw, _), r in cells.items()
        ):
            continue
        backprop = cells.get(("torch", estimators.EXACT))
        body = []
        for (fw, label), r in sorted(cells.items(), key=cell_order):
            if fw != "torch" or r.get("mode") not in (estimators.BASELINE, *STUDY_MODES):
                continue
            if r.get("status") != "ok":
                body.append([label, f"**{r.get('status')}**", "", "", ""])
                continue
            vs = _ratio(r, backprop, "excess_mem_mb") if backprop and backprop.get("status") == "ok" else None
            body.append(
                [label, "ok", _fmt_mem(num(r, "peak_mem_mb")), _fmt_mem(num(r, "excess_mem_mb")), fmt_ratio(vs)]
            )
        out.append((key, body))
    return out


GROWTH_HEAD = [
    "framework",
    "mode",
    "layers",
    "excess MiB",
    "growth MiB/layer",
    "a layer's params MiB",
    "growth / layer's params",
]


def depth_growth(rows: list[dict]) -> list[tuple[Context, list[list]]]:
    """Per context measured at >= 2 depths: each framework x mode's excess memory at its shallowest and deepest
    model, its growth per layer (least squares over every depth measured) and that growth against one layer's
    trainable parameters in fp32, the size of one layer's gradient or tangent. Near 0: flat in depth; near 1:
    one parameter-sized buffer per layer (jvp's tangent); above: activations kept per layer (backprop)."""
    out = []
    groups = series_groups(rows, "num_layers", "excess_mem_mb", variant)
    for key, series in best_groups(groups, lambda s, pts: len(pts) >= 2, limit=None):
        body = []
        for fw, label, xs, pts in trends(series):
            ys = [num(pts[x], "excess_mem_mb") for x in xs]
            growth = slope(xs, ys)
            n_lo, n_hi = num(pts[xs[0]], "n_trainable"), num(pts[xs[-1]], "n_trainable")
            layer = None if n_lo is None or n_hi is None else (n_hi - n_lo) / (xs[-1] - xs[0]) * FP32_BYTES / MiB
            vs = growth / layer if layer else None
            body.append(
                [
                    fw,
                    label,
                    f"{xs[0]:g} → {xs[-1]:g}",
                    f"{ys[0]:.0f} → {ys[-1]:.0f}",
                    f"{round(growth, 1) or 0.0:.1f}",
                    "-" if not layer else f"{layer:.1f}",
                    fmt_ratio(None if vs is None else round(vs, 2) or 0.0),
                ]
            )
        out.append((key, body))
    return out


def failed_table(sel: Selection) -> str:
    latest_ok = {config_key(r): r for r in sel.ok}
    body = []
    for r in sel.failed:
        if r.get("status") == DAMAGED:  # a CSV row that is not whole: nothing in it can be trusted but its place
            body.append(["", "", "", "-", "", DAMAGED, "-", _error_line(r)])
            continue
        later = latest_ok.get(config_key(r))
        rerun = "yes" if later is not None and started(later) >= started(r) else "no"
        body.append(
            [
                r.get("run_id", ""),
                r.get("framework", ""),
                variant(r),
                context_label(context_key(r)),
                r.get("sweep_id", ""),
                r.get("status") or "no status",
                rerun,
                _error_line(r),
            ]
        )
    return md_table(["run_id", "framework", "mode", "context", "sweep", "status", "re-run ok", "error"], body, "l" * 8)


# -------------------------------------------------------------------------------------------------- sections

HOW_ROWS_ARE_CHOSEN = (
    "How rows are chosen: each configuration (`config_hash`) is shown by its **latest ok row**, not a median of "
    "repeats: a re-run replaces older numbers{repeats}. Rows are grouped by context, what stays fixed in a "
    "comparison (the heading: model, data, batch, optimizer and its hyperparameters, dtype, dropout, device and, "
    "beyond one device, the strategy and the number of devices); within it each framework × mode has a cell, the "
    "mode named with its own settings (`jvp(K=4)`, `jvp[naive]`, `mezo(eps=0.0001)`, `backprop(attn=sdpa)`, "
    "`jacfwd[head]`). A setting that changes the numbers is always in one or the other, shown only where it is "
    "not the default, so rows that differ in it never share a cell. Where several configurations still fill one "
    "cell (another random seed, step count...) the latest is shown. Rows whose status is not ok appear in bold in "
    "their cell and in [Trials that did not finish](#trials-that-did-not-finish), never as numbers or in a plot."
)
COLUMNS_READ = (
    "Columns: **peak** is the highest memory during the timed steps; **excess** is peak minus what was resident "
    "before them (weights, batches, the compiled step), the cost of the way of differentiating itself; **memory "
    "by** is how it was measured (`rss_hwm`: the process's resident set, on CPU; `torch_max_memory_allocated` / "
    "`jax_peak_bytes_in_use`: the framework's GPU allocator, so compare excess between frameworks on CPU and with "
    "care on GPU). **compile** is the first step, compilation included; **step** is the median of the timed "
    "steps. MiB = 2²⁰ bytes."
)


class ModesSection(Section):
    """Framework × mode: one table per context, with the ratios of its rows."""

    def render(self, results: Results, plot_dir: Path) -> list[str]:
        v = view(results)
        if not v.rows and results.rows(RUNS_CSV):  # a tuning sweep's rows alone: the Cost to target section's
            return []
        if not results.runs or not any(p.exists() for p in results.runs):
            return []
        status = {}
        for r in v.sel.failed:
            status[r.get("status") or "no status"] = status.get(r.get("status") or "no status", 0) + 1
        counted = f"{len(v.rows)} row{'' if len(v.rows) == 1 else 's'}, {len(v.rows) - len(v.sel.failed)} ok"
        if v.sel.failed:
            counted += f", {len(v.sel.failed)} not ok ({', '.join(f'{s} {n}' for s, n in sorted(status.items()))})"
        repeats = f" ({v.sel.repeats} older ok rows of repeated configurations are set aside)" if v.sel.repeats else ""
        out = [
            f"From {', '.join(f'`{p}`' for p in results.runs if p.exists())}: {counted}.",
            "",
            HOW_ROWS_ARE_CHOSEN.format(repeats=repeats),
            "",
            COLUMNS_READ,
            "",
            "## Framework × mode",
            "",
        ]
        if not v.contexts:
            out += ["(no trials recorded)", ""]
        for key in richest_first(v.contexts):
            cells = v.contexts[key]
            out += [*context_heading(key, cells.values()), context_table(cells), ""]
            ratios = context_ratios(cells)
            if ratios:
                out += ["Ratios of the rows above (below 1: the first needs less):", "", ratio_table(ratios), ""]
        return out


class StudySection(Section):
    """The UMass forward-AD study's AG-News table, measured in both frameworks."""

    def render(self, results: Results, plot_dir: Path) -> list[str]:
        v = view(results)
        if not v.rows:
            return []
        study = study_rows(v.contexts)
        out = ["## The UMass forward-AD study's table: AG-News fine-tuning", ""]
        if not study:
            return [
                *out,
                f"No rows of experiment `{STUDY_EXPERIMENT}`: `python -m bench -m +experiment=seed_agnews` "
                "(a GPU job).",
                "",
            ]
        out += [
            f"Rows of experiment `{STUDY_EXPERIMENT}` (conf/experiment/seed_agnews.yaml): the table of the "
            "UMass student study *Understanding Forward-Mode Auto Differentiation*, whose JAX column was empty, "
            "measured in both frameworks. Total training time is the sum of the timed steps "
            "(`total_train_time_s`): compilation, warm-up and evaluation excluded. Eval accuracy is on the "
            "held-out samples after the last step.",
            "",
        ]
        for key, body in study:
            out += [f"{context_label(key)}", "", md_table(STUDY_HEAD, body, "l" + "r" * (len(STUDY_HEAD) - 1)), ""]
        return out


class PathologySection(Section):
    """The study's jvp pathology: torch jvp.impl=naive against backprop."""

    def render(self, results: Results, plot_dir: Path) -> list[str]:
        naive = naive_jvp_contexts(view(results).contexts)
        if not naive:
            return []
        out = [
            "## The UMass study's jvp pathology (torch `jvp.impl=naive`)",
            "",
            "In the UMass forward-AD study, PyTorch's forward-gradient step used more memory than backprop and "
            "ran out of memory on a GPU. Its `torch.func.jvp` ran "
            "with parameters that still required grad, so autograd also recorded the whole dual computation "
            "for a backward pass that never comes, keeping every layer's primal and tangent activations alive. "
            "bench's torch jvp (`jvp.impl=func`) and the dual-number version (`jvp.impl=dual`, the study's "
            "approach 2) detach the parameters first and hold about one layer's activations at a time, plus "
            "the whole tangent; `jvp.impl=lazy` draws each module's tangent as the pass reaches it. "
            "The last column is each row's excess memory as a multiple of backprop's.",
            "",
        ]
        for key, body in naive:
            out += [
                f"{context_label(key)}",
                "",
                md_table(["mode", "status", "peak MiB", "excess MiB", "excess / backprop"], body, "llrrr"),
                "",
            ]
        return out


class DepthSection(Section):
    """Memory growth with depth, per layer, against one layer's parameters."""

    def render(self, results: Results, plot_dir: Path) -> list[str]:
        growth = depth_growth(view(results).sel.ok)
        if not growth:
            return []
        out = [
            "## Memory growth with depth",
            "",
            "Excess memory from the shallowest to the deepest model of a sweep over `model.num_layers`, its "
            "growth per layer (least squares over every depth) and that growth as a multiple of one layer's "
            "trainable parameters in fp32, the size of one layer's gradient or tangent. About 0×: flat in "
            "depth. About 1×: one parameter-sized buffer per layer (a tangent held whole, as torch's "
            "`torch.func.jvp` needs). Above 1×: activations kept for every layer (backprop, which also "
            "holds a gradient). Differences under ~30 MiB are allocator noise on CPU.",
            "",
        ]
        for key, body in growth:
            out += [f"{context_label(key)}", "", md_table(GROWTH_HEAD, body), ""]
        return out


class FailedSection(Section):
    """Every row whose status is not ok."""

    def render(self, results: Results, plot_dir: Path) -> list[str]:
        v = view(results)
        if not v.rows:
            return []
        out = ["## Trials that did not finish", ""]
        if not v.sel.failed:
            return [*out, "None.", ""]
        return [
            *out,
            "Every row whose status is not ok, oldest first; *re-run ok* says whether the same "
            "configuration has a later ok row.",
            "",
            failed_table(v.sel),
            "",
        ]
