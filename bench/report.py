"""Tables and plots from results CSVs.

    python -m bench.report [csv ...] [--out DIR]      (`make report`: results/runs.csv -> results/report.md)

Reads results CSVs (the bench.sinks schema) and the per-trial history JSONs the runner writes next to them
(<csv folder>/history/<run_id>.json), and writes DIR/report.md with PNG plots in DIR/plots/ (matplotlib, Agg).
The CSVs are only ever read.

Which rows count. A configuration (config_hash) measured several times is shown by its latest ok row: a re-run
after a fix should replace the old numbers, not be averaged with them. Rows whose status is not ok are listed, in
their own table and in the cell they would have filled, and never enter a number or a plot. Rows are grouped by
context, what stays fixed in a comparison (model and its size, data, optimizer, batch, sequence length, dtype,
device); within a context there is one row per framework x mode, the mode as variant() names it. The trainable
scope is part of that name (jacfwd[head], backprop[bias]) rather than of the context, so that `make bench`'s
jacfwd[head] sits in the same table as the modes that train every parameter.

Computing and drawing are apart: `plan_plots` returns what each plot shows (tests check it), `draw` only draws,
and nothing but `main` prints.
"""

from __future__ import annotations

import csv
import json
import math
import sys
import zlib
from collections import Counter, defaultdict
from dataclasses import dataclass, field
from pathlib import Path

from bench import targets
from bench.sinks import REQUIRED_COLUMNS
from bench.spec import FRAMEWORKS, JVP_IMPLS, MODES, TRAINABLE_SCOPES
from bench.tables import FP32_BYTES, OneLineParser, fixed_width, fmt_ratio, md_table, num
from bench.trackers import MiB

DEFAULT_CSV = Path("results") / "runs.csv"
DEFAULT_OUT = Path("results")
PLOT_DIR = "plots"  # under --out; report.md links plots/<name>.png, so the folder moves as one
MAX_PANELS = 4  # contexts per figure: more panels no longer read at report size (the tables have every context)
MAX_CURVES = 8  # training runs per curve plot, for the same reason
SEED_SWEEP = "seed_agnews"  # conf/experiment/seed_agnews.yaml: the seed study's AG-News experiment
FRAMEWORK_NAMES = {"torch": "PyTorch", "jax": "JAX"}


def variant(row: dict) -> str:
    """The mode as a reader names it: backprop+remat, jvp(K=4), jvp[naive], jacfwd[head]..."""
    mode = row.get("mode", "")
    name = mode
    if str(row.get("remat")).lower() == "true":
        name += "+remat"
    if mode == "jvp":
        k = row.get("num_tangents")
        if k not in (None, "", "1", 1):
            name += f"(K={k})"
        if row.get("framework") == "torch" and row.get("jvp_impl") not in (None, "", "func"):
            name += f"[{row['jvp_impl']}]"
    if row.get("trainable") not in (None, "", "all"):
        name += f"[{row['trainable']}]"
    return name


def summary_table(rows: list[dict]) -> str:
    """A fixed-width table of trials: what `make bench` and every sweep print at the end."""
    if not rows:
        return "(no trials recorded)"
    head = ["framework", "mode", "model", "status", "excess MiB", "peak MiB", "step ms", "compile s",
            "samples/s", "loss first->last"]
    body = []
    for r in rows:
        def f(key, fmt, scale=1.0, r=r):
            v = num(r, key)
            return "-" if v is None else format(v * scale, fmt)

        loss = "-" if num(r, "loss_first") is None else f"{f('loss_first', '.4f')}->{f('loss_last', '.4f')}"
        body.append([r.get("framework", ""), variant(r), r.get("model", ""), r.get("status", ""),
                     f("excess_mem_mb", ".0f"), f("peak_mem_mb", ".0f"), f("step_time_median_s", ".1f", 1e3),
                     f("compile_time_s", ".1f"), f("samples_per_s", ".1f"), loss])
    lines = [fixed_width(head, body)]
    failed = [r for r in rows if r.get("status") not in ("ok", "skipped")]
    for r in failed:
        lines.append(f"  {r.get('run_id', '')}: {r.get('status')}: {r.get('error', '')}")
    return "\n".join(lines)


# --------------------------------------------------------------------------------------------------- reading


class ReportError(Exception):
    """Bad input for the report; the message is one line naming the option, the value and what is accepted."""


_ACCEPTED_CSV = "accepted: a results CSV written by `python -m bench`, e.g. results/runs.csv"


def load_rows(paths: list[str | Path]) -> list[dict[str, str]]:
    """Every row of the given results CSVs, in file order, each with "_source" (its CSV's path) added. A run_id
    seen before (the same file given twice) is read once."""
    rows: list[dict[str, str]] = []
    seen: set[str] = set()
    for p in paths:
        path = Path(p)
        for r in _read_csv(path):
            if r.get("run_id"):
                if r["run_id"] in seen:
                    continue
                seen.add(r["run_id"])
            rows.append({**r, "_source": str(path)})
    return rows


def _read_csv(path: Path) -> list[dict[str, str]]:
    if path.is_dir():
        raise ReportError(f"csv={path}: is a folder ({_ACCEPTED_CSV})")
    try:
        with open(path, newline="", encoding="utf-8") as f:  # read-only: the report never changes a CSV
            reader = csv.DictReader(f, restval="")
            header = reader.fieldnames
            if not header:
                raise ReportError(f"csv={path}: empty file ({_ACCEPTED_CSV})")
            missing = [c for c in REQUIRED_COLUMNS if c not in header]
            if missing:
                shown = ", ".join(missing[:5]) + (f" and {len(missing) - 5} more" if len(missing) > 5 else "")
                raise ReportError(
                    f"csv={path}: not a bench results CSV, its header lacks {shown} "
                    f"({_ACCEPTED_CSV}, with the columns of bench.sinks.REQUIRED_COLUMNS)"
                )
            # cells beyond the header (a hand-edited line) land under the key None: not ours to read
            return [{k: v for k, v in r.items() if k is not None} for r in reader]
    except FileNotFoundError:
        raise ReportError(f"csv={path}: no such file ({_ACCEPTED_CSV}; `make bench` writes one)") from None
    except UnicodeDecodeError:
        raise ReportError(f"csv={path}: not UTF-8 text ({_ACCEPTED_CSV})") from None
    except csv.Error as e:
        raise ReportError(f"csv={path}: malformed CSV: {e} ({_ACCEPTED_CSV})") from None
    except OSError as e:
        raise ReportError(f"csv={path}: cannot read it: {e.strerror} ({_ACCEPTED_CSV})") from None


def read_history(row: dict) -> dict | None:
    """The trial's per-step series (runner.save_history): <csv folder>/history/<run_id>.json, or None when absent
    or unreadable (a report from a CSV copied without its folder still builds, without training curves)."""
    run_id, source = row.get("run_id", ""), row.get("_source")
    if not run_id or not source or Path(run_id).name != run_id:  # a run_id is a file name, never a path
        return None
    try:
        history = json.loads((Path(source).parent / "history" / f"{run_id}.json").read_text())
    except (OSError, ValueError):
        return None
    return history if isinstance(history, dict) else None


# ---------------------------------------------------------------------------------------------- choosing rows

# What identifies a configuration when a row has no config_hash (written before the column existed).
_IDENTITY_COLUMNS = ("framework", "mode", "model", "num_layers", "hidden_size", "data", "trainable", "last_k",
                     "optimizer", "batch_size", "grad_accum", "seq_len", "steps", "epochs", "seed", "remat",
                     "num_tangents", "jvp_impl", "dtype", "device")  # fmt: skip


def _started(row: dict) -> str:
    return row.get("started_at") or ""  # ISO 8601 in UTC: sorts as text


def config_key(row: dict) -> str | tuple:
    return row.get("config_hash") or tuple(row.get(c, "") for c in _IDENTITY_COLUMNS)


@dataclass
class Selection:
    ok: list[dict]  # the latest ok row of each configuration, oldest first
    failed: list[dict]  # every row whose status is not ok, oldest first
    repeats: int  # older ok rows of repeated configurations, set aside


def select(rows: list[dict]) -> Selection:
    latest: dict = {}
    ok = [r for r in rows if r.get("status") == "ok"]
    for r in sorted(ok, key=_started):  # a stable sort: among equal timestamps the later line wins
        latest[config_key(r)] = r
    return Selection(
        ok=sorted(latest.values(), key=_started),
        failed=sorted((r for r in rows if r.get("status") != "ok"), key=_started),
        repeats=len(ok) - len(latest),
    )


# --------------------------------------------------------------------------------------------------- contexts

# What stays fixed within one comparison table; the framework and the mode (variant(), trainable scope included)
# vary within it.
CONTEXT_COLUMNS = ("model", "num_layers", "hidden_size", "data", "optimizer", "batch_size", "grad_accum",
                   "seq_len", "dtype", "device", "device_name")  # fmt: skip

Context = tuple  # ((column, value), ...)
Cells = dict  # (framework, variant) -> row


def context_key(row: dict, drop: tuple[str, ...] = (), keep: tuple[str, ...] = ()) -> Context:
    """The row's context: CONTEXT_COLUMNS less `drop`, plus `keep` (e.g. trainable, for a plot per scope)."""
    return tuple((c, row.get(c, "") or "") for c in (*CONTEXT_COLUMNS, *keep) if c not in drop)


def context_label(key: Context) -> str:
    c = dict(key)
    model = c.get("model", "") or "?"
    layers = c.get("num_layers")
    size = [f"{layers} layer{'' if layers == '1' else 's'}" if layers else "",
            f"hidden {c['hidden_size']}" if c.get("hidden_size") else ""]  # fmt: skip
    if any(size):
        model += f" ({', '.join(s for s in size if s)})"
    shape = " ".join(
        s for s in (
            f"B{c['batch_size']}" if c.get("batch_size") else "",
            f"x{c['grad_accum']} accumulated" if c.get("grad_accum") not in (None, "", "1") else "",
            f"T{c['seq_len']}" if c.get("seq_len") else "",
        ) if s
    )  # fmt: skip
    trainable = c.get("trainable", "")
    if trainable == "last_k":
        trainable = f"last {c.get('last_k') or 'k'} layers"
    device = c.get("device", "")
    if c.get("device_name"):
        device += f" ({c['device_name']})"
    parts = [model, c.get("data", ""), shape, f"trainable {trainable}" if trainable else "", c.get("optimizer", ""),
             c.get("dtype", ""), device]  # fmt: skip
    return " · ".join(p for p in parts if p)


def _sortable(v: str) -> tuple:
    try:
        return (0, float(v), "")
    except (TypeError, ValueError):
        return (1, 0.0, str(v))


def _context_order(key: Context) -> tuple:
    return tuple(_sortable(v) for _, v in key)


def mode_label(row: dict) -> str:
    """variant() without the trainable scope: for plots whose x axis is the scope's size."""
    return variant({**row, "trainable": "all"})


def _mode_order(row: dict) -> tuple:
    mode = row.get("mode", "")
    impl = row.get("jvp_impl") if row.get("framework") == "torch" else "func"
    scope = row.get("trainable") or "all"
    return (
        MODES.index(mode) if mode in MODES else len(MODES),
        TRAINABLE_SCOPES.index(scope) if scope in TRAINABLE_SCOPES else len(TRAINABLE_SCOPES),
        str(row.get("remat")).lower() == "true",
        JVP_IMPLS.index(impl) if impl in JVP_IMPLS else len(JVP_IMPLS),
        num(row, "num_tangents") or 1,
        mode_label(row),
    )


def _framework_order(fw: str) -> tuple:
    return (FRAMEWORKS.index(fw) if fw in FRAMEWORKS else len(FRAMEWORKS), fw)


def group_contexts(sel: Selection) -> dict[Context, Cells]:
    """{context: {(framework, variant): row}}: the ok row of each cell (the latest, where several
    configurations share a cell, e.g. different seeds), else its latest failed row."""
    out: dict[Context, Cells] = defaultdict(dict)
    for r in sel.ok:  # oldest first: a later configuration of the same cell replaces an earlier one
        out[context_key(r)][(r.get("framework", ""), variant(r))] = r
    for r in sel.failed:
        key = context_key(r)
        if key not in out and r.get("device") not in ("cpu", "cuda"):
            # a trial that died before reporting its device carries the configured one ("auto"): it belongs with
            # the ok rows that agree on everything else
            loose = _without_device(key)
            key = next((k for k in sorted(out, key=_context_order) if _without_device(k) == loose), key)
        cell = (r.get("framework", ""), variant(r))
        if out[key].get(cell, {}).get("status") != "ok":
            out[key][cell] = r
    return dict(out)


def richest_first(contexts: dict[Context, Cells]) -> list[Context]:
    """Contexts that compare the most ways of differentiating first (`make bench`'s before a sweep's slices),
    then by their values."""

    def order(key):
        cells = contexts[key]
        modes = {r.get("mode") for r in cells.values()}
        frameworks = {fw for fw, _ in cells}
        return (-len(modes), -len(frameworks), -len(cells), _context_order(key))

    return sorted(contexts, key=order)


def _without_device(key: Context) -> Context:
    return tuple((c, v) for c, v in key if c not in ("device", "device_name"))


def _row_order(row: dict) -> tuple:
    """Mode, then framework: the order of every table's rows and every plot's lines."""
    return (_mode_order(row), _framework_order(row.get("framework", "")))


def _cell_order(item) -> tuple:
    return _row_order(item[1])


# ------------------------------------------------------------------------------------------------ formatting


def _fmt(v: float | None, scale: float = 1.0) -> str:
    """About three significant figures, never scientific notation for the sizes a benchmark produces."""
    if v is None:
        return "-"
    v *= scale
    a = abs(v)
    if a >= 100 or a == 0:
        return f"{v:.0f}"
    if a >= 10:
        return f"{v:.1f}"
    if a >= 0.1:
        return f"{v:.2f}"
    return f"{v:.2g}"


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
    ("compile s", "compile_time_s", _fmt),
    ("step ms (median)", "step_time_median_s", lambda v: _fmt(v, 1e3)),
    ("samples/s", "samples_per_s", _fmt),
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
# mode ratios within one framework and trainable scope: (numerator, denominator), plain variants of each
MODE_RATIOS = (("jvp", "backprop"), ("mezo", "inference"))


def context_table(cells: Cells) -> str:
    optional = [m for m in OPTIONAL_METRICS if any(num(r, m[1]) is not None for r in cells.values())]
    metrics = [*TABLE_METRICS, *optional]
    body = []
    for (fw, label), r in sorted(cells.items(), key=_cell_order):
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
    for fw in sorted({fw for fw, _ in ok}, key=_framework_order):
        for scope in TRAINABLE_SCOPES:
            suffix = "" if scope == "all" else f"[{scope}]"
            for top, den in MODE_RATIOS:
                a, b = ok.get((fw, top + suffix)), ok.get((fw, den + suffix))
                if b is None and den == "inference":
                    b = ok.get((fw, den))  # what is trainable does not change an inference step
                if a is not None and b is not None:
                    name = f"{fw}: {top + suffix} / {variant(b)}"
                    out.append((name, {c: _ratio(a, b, c) for _, c in RATIO_METRICS}))
    both = [(label, r) for (fw, label), r in ok.items() if fw == "torch" and ("jax", label) in ok]
    for label, torch_row in sorted(both, key=lambda item: _mode_order(item[1])):
        jax_row = ok["jax", label]
        out.append((f"{label}: jax / torch", {c: _ratio(jax_row, torch_row, c) for _, c in RATIO_METRICS}))
    return out


def ratio_table(ratios: list[tuple[str, dict]]) -> str:
    body = [[name, *[fmt_ratio(v[c]) for _, c in RATIO_METRICS]] for name, v in ratios]
    return md_table(["ratio", *[t for t, _ in RATIO_METRICS]], body, "l" + "r" * len(RATIO_METRICS))


def seed_rows(contexts: dict[Context, Cells]) -> list[tuple[Context, list[list]]]:
    """The seed study's table, one per context of sweep seed_agnews: PyTorch backprop / PyTorch JVP / JAX backprop
    / JAX JVP with peak and excess memory, total training time and held-out accuracy."""
    out = []
    for key in sorted(contexts, key=_context_order):
        cells = [(cell, r) for cell, r in contexts[key].items()
                 if r.get("sweep_id") == SEED_SWEEP and r.get("mode") in ("backprop", "jvp")]  # fmt: skip
        if not cells:
            continue
        body = []
        for (fw, label), r in sorted(cells, key=lambda item: (_framework_order(item[0][0]), _mode_order(item[1]))):
            mode = r["mode"]
            name = f"{FRAMEWORK_NAMES.get(fw, fw)} {'JVP' if mode == 'jvp' else mode}{label[len(mode):]}"
            if r.get("status") != "ok":
                body.append([name, f"**{r.get('status')}**", "", "", "", "", ""])
                continue
            body.append([name, _fmt_mem(num(r, "peak_mem_mb")), _fmt_mem(num(r, "excess_mem_mb")),
                         _fmt(num(r, "total_train_time_s")), _fmt_pct(num(r, "eval_accuracy")),
                         r.get("steps_timed") or r.get("steps", ""), r.get("epochs", "")])  # fmt: skip
        out.append((key, body))
    return out


SEED_HEAD = ["", "Peak memory (MiB)", "Excess memory (MiB)", "Total training time (s)", "Eval accuracy",
             "steps timed", "epochs"]  # fmt: skip


def naive_jvp_contexts(contexts: dict[Context, Cells]) -> list[tuple[Context, list[list]]]:
    """Contexts with a torch jvp_impl=naive row: torch's inference, backprop and jvp rows there, with each row's
    excess memory as a multiple of backprop's."""
    out = []
    for key in sorted(contexts, key=_context_order):
        cells = contexts[key]
        if not any(fw == "torch" and r.get("mode") == "jvp" and r.get("jvp_impl") == "naive"
                   for (fw, _), r in cells.items()):  # fmt: skip
            continue
        backprop = cells.get(("torch", "backprop"))
        body = []
        for (fw, label), r in sorted(cells.items(), key=_cell_order):
            if fw != "torch" or r.get("mode") not in ("inference", "backprop", "jvp"):
                continue
            if r.get("status") != "ok":
                body.append([label, f"**{r.get('status')}**", "", "", ""])
                continue
            vs = _ratio(r, backprop, "excess_mem_mb") if backprop and backprop.get("status") == "ok" else None
            body.append([label, "ok", _fmt_mem(num(r, "peak_mem_mb")), _fmt_mem(num(r, "excess_mem_mb")),
                         fmt_ratio(vs)])  # fmt: skip
        out.append((key, body))
    return out


GROWTH_HEAD = ["framework", "mode", "layers", "excess MiB", "growth MiB/layer", "a layer's params MiB",
               "growth / layer's params"]  # fmt: skip


def depth_growth(rows: list[dict]) -> list[tuple[Context, list[list]]]:
    """Per context measured at >= 2 depths: each framework x mode's excess memory at its shallowest and deepest
    model, its growth per layer (least squares over every depth measured) and that growth against one layer's
    trainable parameters in fp32, the size of one layer's gradient or tangent. Near 0: flat in depth; near 1:
    one parameter-sized buffer per layer (jvp's tangent); above: activations kept per layer (backprop)."""
    out = []
    groups = _series_groups(rows, "num_layers", "excess_mem_mb", variant)
    for key, series in _best_groups(groups, lambda s, pts: len(pts) >= 2, limit=None):
        body = []
        for fw, label, xs, pts in _trends(series):
            ys = [num(pts[x], "excess_mem_mb") for x in xs]
            growth = targets.slope(xs, ys)
            n_lo, n_hi = num(pts[xs[0]], "n_trainable"), num(pts[xs[-1]], "n_trainable")
            layer = None if n_lo is None or n_hi is None else (n_hi - n_lo) / (xs[-1] - xs[0]) * FP32_BYTES / MiB
            vs = growth / layer if layer else None
            body.append([fw, label, f"{xs[0]:g} → {xs[-1]:g}", f"{ys[0]:.0f} → {ys[-1]:.0f}",
                         f"{round(growth, 1) or 0.0:.1f}", "-" if not layer else f"{layer:.1f}",
                         fmt_ratio(None if vs is None else round(vs, 2) or 0.0)])  # fmt: skip
        out.append((key, body))
    return out


def failed_table(sel: Selection) -> str:
    latest_ok = {config_key(r): r for r in sel.ok}
    body = []
    for r in sel.failed:
        later = latest_ok.get(config_key(r))
        rerun = "yes" if later is not None and _started(later) >= _started(r) else "no"
        body.append([r.get("run_id", ""), r.get("framework", ""), variant(r), context_label(context_key(r)),
                     r.get("sweep_id", ""), r.get("status") or "no status", rerun, _error_line(r)])  # fmt: skip
    return md_table(["run_id", "framework", "mode", "context", "sweep", "status", "re-run ok", "error"], body, "l" * 8)


# ----------------------------------------------------------------------------------------------------- plots


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
        rows = sorted(ok.items(), key=_cell_order)
        categories = list(dict.fromkeys(label for (_, label), _ in rows))
        series = []
        for fw in sorted({fw for fw, _ in ok}, key=_framework_order):
            mine = [(categories.index(label), r) for (f, label), r in rows if f == fw]
            s = Series(fw, "", [float(i) for i, _ in mine], [num(r, col) * scale for _, r in mine])
            if spread and all(num(r, spread[0]) is not None and num(r, spread[1]) is not None for _, r in mine):
                s.lo = [num(r, spread[0]) * scale for _, r in mine]
                s.hi = [num(r, spread[1]) * scale for _, r in mine]
            series.append(s)
        values = [y for s in series for y in s.ys]
        panels.append(Panel(context_label(key), "", ylabel, series, categories, logy=log_ok and _wide_range(values)))
    return panels[:MAX_PANELS]


def _series_groups(rows: list[dict], x_col: str, y_col: str, label_of, keep: tuple[str, ...] = ()) -> dict:
    """{context without x_col, plus keep: {(framework, label): {x: row}}}; a later row at the same x replaces an
    earlier one (rows come oldest first)."""
    groups: dict = defaultdict(lambda: defaultdict(dict))
    for r in rows:
        x, y = num(r, x_col), num(r, y_col)
        if x is None or y is None:
            continue
        groups[context_key(r, drop=(x_col,), keep=keep)][(r.get("framework", ""), label_of(r))][x] = r
    return groups


def _best_groups(groups: dict, qualifies, limit: int | None = MAX_PANELS) -> list[tuple[Context, dict]]:
    """The groups where some series qualifies (e.g. has >= 2 points), the most points first; at most `limit`
    (a figure's panels; a table takes them all)."""
    found = [(key, series) for key, series in groups.items() if any(qualifies(s, pts) for s, pts in series.items())]
    found.sort(key=lambda g: (-sum(len(p) for p in g[1].values()), _context_order(g[0])))
    return found[:limit]


def _trends(series: dict) -> list[tuple[str, str, list[float], dict]]:
    """(framework, label, its xs sorted, {x: row}) per series measured at >= 2 values, in table order: a lone point
    (another sweep's row that shares the context) shows no trend."""
    trends = [(fw, label, sorted(pts), pts) for (fw, label), pts in series.items() if len(pts) >= 2]
    return sorted(trends, key=lambda t: _row_order(next(iter(t[3].values()))))


def _line_series(series: dict, y_col: str, scale: float = 1.0) -> list[Series]:
    """One line per trend (_trends): y_col at each x where the row has it."""
    lines = []
    for fw, label, xs, pts in _trends(series):
        xs = [x for x in xs if num(pts[x], y_col) is not None]
        lines.append(Series(fw, label, xs, [num(pts[x], y_col) * scale for x in xs]))
    return lines


def scaling_grid(rows: list[dict], x_col: str, xlabel: str, guide_params: bool = False,
                 logx: int = 0) -> list[list[Panel]]:  # fmt: skip
    """Excess memory and median step time against one column, everything else fixed: one row of two panels per
    context where some framework x mode was measured at >= 2 values. A linear x axis (logx=0) keeps a linear
    cost a straight line, its slope the cost per layer or per sample."""
    groups = _series_groups(rows, x_col, "excess_mem_mb", variant)
    grid = []
    for key, series in _best_groups(groups, lambda s, pts: len(pts) >= 2):
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
    groups = _series_groups(plain, "n_trainable", "step_time_median_s", mode_label)
    grid = []
    for key, series in _best_groups(groups, lambda s, pts: s[1] == "jacfwd" and len(pts) >= 2):
        lines = _line_series(series, "step_time_median_s", 1e3)
        grid.append([Panel(context_label(key), "trainable parameters", "median step time (ms)", lines, logx=10,
                           logy=True)])  # fmt: skip
    return grid


def grad_quality_grid(rows: list[dict]) -> list[list[Panel]]:
    """Cosine to the exact gradient against the number of tangents K for jvp, MeZO as a flat line, and the
    expected cosine of K Gaussian tangents, sqrt(K / (K + n - 1)) (conf/experiment/grad_quality.yaml)."""
    jvp = [r for r in rows if r.get("mode") == "jvp"]
    # one panel per trainable scope: n, and with it the expected cosine, depends on it
    groups = _series_groups(jvp, "num_tangents", "grad_cosine", lambda r: mode_label({**r, "num_tangents": 1}),
                            keep=("trainable", "last_k"))  # fmt: skip
    mezo: dict = defaultdict(dict)
    for r in rows:
        if r.get("mode") == "mezo" and num(r, "grad_cosine") is not None:
            mezo[context_key(r, keep=("trainable", "last_k"))][r.get("framework", "")] = r  # latest wins
    grid = []
    for key, series in _best_groups(groups, lambda s, pts: len(pts) >= 2):
        lines = _line_series(series, "grad_cosine")
        ks = sorted({x for s in lines for x in s.xs})
        for fw, r in sorted(mezo.get(key, {}).items(), key=lambda kv: _framework_order(kv[0])):
            lines.append(Series(fw, "mezo", [ks[0], ks[-1]], [num(r, "grad_cosine")] * 2))
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
    """Training loss per timed step, and held-out accuracy where evaluated, from the history JSONs: the seed
    experiment's runs when present, else the context with the most runs that have a history."""
    runs = []
    for r in rows:
        h = read_history(r)
        if h is not None and len(_finite_points(h.get("loss"))[0]) >= 2:
            runs.append((r, h))
    if not runs:
        return []
    seed = [(r, h) for r, h in runs if r.get("sweep_id") == SEED_SWEEP]
    if seed:
        runs = seed
    else:
        count = Counter(context_key(r) for r, _ in runs)
        best = min(count, key=lambda k: (-count[k], _context_order(k)))
        runs = [(r, h) for r, h in runs if context_key(r) == best]
    runs.sort(key=lambda rh: _row_order(rh[0]))
    runs = runs[:MAX_CURVES]
    title = context_label(context_key(runs[0][0])) if len({context_key(r) for r, _ in runs}) == 1 else SEED_SWEEP
    loss = [Series(r.get("framework", ""), mode_label(r), *_finite_points(h["loss"])) for r, h in runs]
    row = [Panel(title, "timed step", "training loss", loss, legend=True)]
    accuracy = [Series(r.get("framework", ""), mode_label(r), *_finite_points(h.get("eval_accuracy"))) for r, h in runs]
    accuracy = [s for s in accuracy if s.xs]
    if accuracy:
        row[0].legend = False
        row.append(Panel(title, "timed step", "held-out accuracy", accuracy))
    return [row]


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
    ]  # fmt: skip


# ---------------------------------------------------------------------------------------------------- drawing

FRAMEWORK_COLORS = {"torch": "#ee4c2c", "jax": "#4285f4"}  # PyTorch's orange-red, a Google blue
FRAMEWORK_LINES = {"torch": ("-", "o"), "jax": ("--", "s")}
MODE_COLORS = {"inference": "#7f7f7f", "backprop": "#1f77b4", "backprop+remat": "#17becf", "jvp": "#ff7f0e",
               "jvp[naive]": "#d62728", "jvp[dual]": "#bcbd22",
               "jvp[lazy]": "#8c564b", "jacfwd": "#2ca02c", "mezo": "#9467bd"}  # fmt: skip
_MORE_COLORS = ("#e377c2", "#aec7e8", "#ffbb78", "#98df8a", "#c5b0d5", "#c49c94", "#f7b6d2")


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
        return max(5.0, 0.4 * len(p.categories) * max(1, len(p.series)) + 1.0)
    return 5.0


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
            from matplotlib.ticker import MaxNLocator

            if len(xs) <= 12:  # a sweep's few values (1, 2, 4, 8 layers) as the ticks
                ax.set_xticks(xs, [f"{x:g}" for x in xs])
            else:
                ax.xaxis.set_major_locator(MaxNLocator(integer=True))
        if p.legend:
            ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1.0), borderaxespad=0)
        elif any(s.guide for s in p.series):  # the lines are explained beside the next panel, the guide here
            guides = [line for line in ax.get_lines() if line.get_linestyle() == ":"]
            ax.legend(handles=guides, fontsize=7, loc="upper left")
    if p.logy:
        ax.set_yscale("log")
    ax.set_title(p.title, fontsize=8)
    ax.set_xlabel(p.xlabel, fontsize=9)
    ax.set_ylabel(p.ylabel, fontsize=9)
    ax.tick_params(labelsize=8)
    ax.grid(True, axis="y", alpha=0.3)


def _draw_bars(ax, p: Panel) -> None:
    n = len(p.series)
    width = 0.8 / n
    for i, s in enumerate(p.series):
        xs = [x + (i - (n - 1) / 2) * width for x in s.xs]
        err = None
        if s.lo is not None and s.hi is not None:
            err = [[max(0.0, y - lo) for y, lo in zip(s.ys, s.lo)], [max(0.0, hi - y) for y, hi in zip(s.ys, s.hi)]]
        bars = ax.bar(xs, s.ys, width, yerr=err, capsize=2, label=FRAMEWORK_NAMES.get(s.framework, s.framework),
                      color=FRAMEWORK_COLORS.get(s.framework, "0.5"), error_kw={"linewidth": 0.8})  # fmt: skip
        ax.bar_label(bars, labels=[_fmt(y) for y in s.ys], fontsize=7, padding=2)
    long = max((len(c) for c in p.categories), default=0) > 8
    ax.set_xticks(range(len(p.categories)), p.categories, rotation=25 if long else 0, ha="right" if long else "center")
    ax.margins(y=0.15)  # room for the value labels above the tallest bar
    if p.legend:
        ax.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.01, 1.0), borderaxespad=0)


# ---------------------------------------------------------------------------------------------------- report


@dataclass
class Report:
    path: Path  # report.md
    plots: list[Plot]  # drawn and skipped
    rows: int
    failed: int


def render(sel: Selection, contexts: dict[Context, Cells], plots: list[Plot], sources: list[str], n_rows: int) -> str:
    """report.md's text; plots are linked as plots/<name>.png."""
    status = Counter(r.get("status") or "no status" for r in sel.failed)
    not_ok = ", ".join(f"{s} {n}" for s, n in sorted(status.items()))
    out = ["# bench report", ""]
    counted = f"{n_rows} row{'' if n_rows == 1 else 's'}, {n_rows - len(sel.failed)} ok"
    if sel.failed:
        counted += f", {len(sel.failed)} not ok ({not_ok})"
    out.append(f"From {', '.join(f'`{s}`' for s in sources)}: {counted}.")
    out += ["",
            "How rows are chosen: each configuration (`config_hash`) is shown by its **latest ok row**, not a median "
            "of repeats: a re-run replaces older numbers"
            + (f" ({sel.repeats} older ok rows of repeated configurations are set aside)" if sel.repeats else "")
            + ". Rows are grouped by context, what stays fixed in a comparison; where several configurations fill "
            "the same framework × mode cell of a context (another seed, step count...) the latest is shown. Rows "
            "whose status is not ok appear in bold in their cell and in [Trials that did not finish]"
            "(#trials-that-did-not-finish), never as numbers or in a plot.",
            "",
            "Columns: **peak** is the highest memory during the timed steps; **excess** is peak minus what was "
            "resident before them (weights, batches, the compiled step), the cost of the way of differentiating "
            "itself; **memory by** is how it was measured (`rss_hwm`: the process's resident set, on CPU; "
            "`torch_max_memory_allocated` / `jax_peak_bytes_in_use`: the framework's GPU allocator, so compare "
            "excess between frameworks on CPU and with care on GPU). **compile** is the first step, compilation "
            "included; **step** is the median of the timed steps. MiB = 2²⁰ bytes.",
            ""]  # fmt: skip

    out += ["## Framework × mode", ""]
    if not contexts:
        out += ["(no trials recorded)", ""]
    for key in richest_first(contexts):
        cells = contexts[key]
        sweeps = sorted({r.get("sweep_id") for r in cells.values() if r.get("sweep_id")})
        out += [f"### {context_label(key)}", ""]
        if sweeps:
            out += [f"From sweep{'s' if len(sweeps) > 1 else ''} {', '.join(f'`{s}`' for s in sweeps)}.", ""]
        out += [context_table(cells), ""]
        ratios = context_ratios(cells)
        if ratios:
            out += ["Ratios of the rows above (below 1: the first needs less):", "", ratio_table(ratios), ""]

    seed = seed_rows(contexts)
    out += ["## The seed study's table: AG-News fine-tuning", ""]
    if seed:
        out += [f"Rows of sweep `{SEED_SWEEP}` (conf/experiment/seed_agnews.yaml). Total training time is the sum "
                "of the timed steps (`total_train_time_s`): compilation, warm-up and evaluation excluded. Eval "
                "accuracy is on the held-out samples after the last step.", ""]  # fmt: skip
        for key, body in seed:
            out += [f"{context_label(key)}", "", md_table(SEED_HEAD, body, "l" + "r" * (len(SEED_HEAD) - 1)), ""]
    else:
        out += [f"No rows of sweep `{SEED_SWEEP}`: `python -m bench -m +experiment=seed_agnews` (a GPU job).", ""]

    naive = naive_jvp_contexts(contexts)
    if naive:
        out += ["## Seed 000's jvp pathology (torch `jvp_impl=naive`)", "",
                "Seed 000's PyTorch forward-gradient step used more memory than backprop. Its `torch.func.jvp` ran "
                "with parameters that still required grad, so autograd also recorded the whole dual computation "
                "for a backward pass that never comes, keeping every layer's primal and tangent activations alive. "
                "bench's torch jvp (`jvp_impl=func`) and the dual-number version (`jvp_impl=dual`, the seed's "
                "approach 2) detach the parameters first and hold about one layer's activations at a time, plus "
                "the whole tangent; `jvp_impl=lazy` draws each module's tangent as the pass reaches it. "
                "The last column is each row's excess memory as a multiple of backprop's.", ""]  # fmt: skip
        for key, body in naive:
            out += [f"{context_label(key)}", "",
                    md_table(["mode", "status", "peak MiB", "excess MiB", "excess / backprop"], body, "llrrr"), ""]

    checks = targets.check(sel.ok)
    if checks:
        out += ["## The training modes' targets", "",
                "Per framework at the deepest model recorded (`+experiment=mode_targets` records BERT-base shapes at "
                "8 and 12 layers); *MISSED* rows are explained in README's section on the modes.", "",
                md_table(targets.HEAD, targets.cells(checks), "lllrrl"), ""]

    growth = depth_growth(sel.ok)
    if growth:
        out += ["## Memory growth with depth", "",
                "Excess memory from the shallowest to the deepest model of a sweep over `model.num_layers`, its "
                "growth per layer (least squares over every depth) and that growth as a multiple of one layer's "
                "trainable parameters in fp32, the size of one layer's gradient or tangent. About 0×: flat in "
                "depth. About 1×: one parameter-sized buffer per layer (a tangent held whole, as torch's "
                "`torch.func.jvp` needs). Above 1×: activations kept for every layer (backprop, which also "
                "holds a gradient). Differences under ~30 MiB are allocator noise on CPU.", ""]  # fmt: skip
        for key, body in growth:
            out += [f"{context_label(key)}", "", md_table(GROWTH_HEAD, body), ""]

    drawn = [p for p in plots if p.drawn]
    skipped = [p for p in plots if not p.drawn]
    out += ["## Plots", ""]
    if not drawn:
        out += ["(no plot: no ok rows with the data any plot needs)", ""]
    for p in drawn:
        out += [f"### {p.title}", "", f"![{p.title}]({PLOT_DIR}/{p.name}.png)", "",
                f"*How to read it:* {p.how_to_read}", ""]  # fmt: skip
    if any(len(p.grid) == MAX_PANELS for p in drawn):
        out += [f"A plot shows at most {MAX_PANELS} contexts, those with the most data; the tables have all.", ""]
    if skipped:
        out += ["Skipped for lack of data:", ""]
        out += [f"- **{p.title}**: needs {p.needs}." for p in skipped]
        out.append("")

    out += ["## Trials that did not finish", ""]
    if sel.failed:
        out += ["Every row whose status is not ok, oldest first; *re-run ok* says whether the same configuration "
                "has a later ok row.", "", failed_table(sel), ""]  # fmt: skip
    else:
        out += ["None.", ""]
    return "\n".join(out)


def build_report(csv_paths: list[str | Path], out_dir: str | Path) -> Report:
    """Read the CSVs, write out_dir/report.md and out_dir/plots/*.png. Plot files of ours that this report does
    not draw are removed, so the folder never shows a stale plot next to the report."""
    out_dir = Path(out_dir)
    if out_dir.exists() and not out_dir.is_dir():
        raise ReportError(f"--out={out_dir}: is a file (accepted: a folder, created if missing)")
    report_path = out_dir / "report.md"
    for p in csv_paths:
        if Path(p).resolve() == report_path.resolve():
            raise ReportError(f"--out={out_dir}: report.md would overwrite csv={p} (accepted: another folder)")
    rows = load_rows(csv_paths)
    sel = select(rows)
    contexts = group_contexts(sel)
    plots = plan_plots(sel, contexts)
    plot_dir = out_dir / PLOT_DIR
    for p in plots:
        target = plot_dir / f"{p.name}.png"
        if p.drawn:
            p.path = draw(p, target)
        else:
            target.unlink(missing_ok=True)
    out_dir.mkdir(parents=True, exist_ok=True)
    text = render(sel, contexts, plots, [str(p) for p in csv_paths], len(rows))
    # scenario=ops writes ops.csv beside runs.csv: its section (tables, plots/ops_*.png) follows the model's
    from bench.ops_report import ops_report

    for ops_csv in dict.fromkeys(Path(p).parent / "ops.csv" for p in csv_paths):
        if ops_csv.is_file():
            text += "\n" + ops_report(ops_csv, out_dir)
    report_path.write_text(text, encoding="utf-8")
    return Report(report_path, plots, len(rows), len(sel.failed))


# -------------------------------------------------------------------------------------------------------- CLI


def main(argv: list[str] | None = None) -> int:
    parser = OneLineParser(
        "bench.report",
        "python -m bench.report [csv ...] [--out DIR]",
        description="Tables and plots from bench results CSVs -> DIR/report.md and DIR/plots/*.png.",
    )
    parser.add_argument("csv", nargs="*", help=f"results CSVs (default: {DEFAULT_CSV})")
    parser.add_argument("--out", default=str(DEFAULT_OUT), metavar="DIR",
                        help=f"folder for report.md and plots/ (default: {DEFAULT_OUT})")  # fmt: skip
    args = parser.parse_args(argv)
    try:
        report = build_report(args.csv or [DEFAULT_CSV], args.out)
    except ReportError as e:
        print(f"bench.report: error: {e}", file=sys.stderr)
        return 2
    drawn = sum(p.drawn for p in report.plots)
    print(f"bench.report: {report.path} ({report.rows} rows, {report.failed} not ok; {drawn} plots, "
          f"{len(report.plots) - drawn} skipped for lack of data)")  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
