"""The report's section on scenario=ops results (ops.csv, one row per framework x op x shape): its tables, and
its plots drawn into the report's plots/ as ops_*.png. The CSV is only ever read.

Which rows count: a measurement (framework, execution, dtype, threads, device, op, shape) taken several times is
shown by its latest row; rows whose status is not ok are listed at the end and never enter a number or a plot.
A context is what stays fixed in a comparison: device, dtype and threads. Plots, per context:
  time vs size   per op, log-log, primal / jvp / vjp of each framework at the square sizes
  cost ratios    jvp / primal and vjp / primal per op at the largest square size
and per device and dtype measured with threads=1 and threads=all:
  thread speedup time(threads=1) / time(threads=all) per op at the largest square size
"""

from __future__ import annotations

from collections import defaultdict
from pathlib import Path

from bench.report.section import PLOT_DIR, Results, Section
from bench.report.tables import fixed_width, fmt_ratio, md_table, num
from bench.store.read import latest as latest_rows

RESULTS_FILE = "ops.csv"  # bench/scenarios/ops/scenario.py writes it beside runs.csv
MODES = (("primal_s", "primal"), ("jvp_s", "jvp"), ("vjp_s", "vjp"))
MODE_LINES = {"primal": "-", "jvp": "--", "vjp": ":"}
SERIES_COLORS = {"torch eager": "#ee4c2c", "torch compile": "#8c1d0f", "jax jit": "#4285f4"}
GRID_COLS = 5  # op panels per row of the time-vs-size figure

# What the ratios mean, for the report (docs/ops.md says the same at more length).
HOW_TO_READ_RATIOS = (
    "jvp and vjp are timed from scratch (both return f(x) too), so each ratio is the cost of one Jacobian-vector "
    "product (jvp) or vector-Jacobian product (vjp) in units of f itself; theory bounds both by small constants "
    "that do not grow with the size of f (Griewank & Walther, Evaluating Derivatives, ch. 4). matmul is "
    "compute-bound: its jvp adds dA·B + A·dB and its vjp ct·Bᵀ and Aᵀ·ct, two products of the primal's size "
    "each, so both ratios are about 3 and the backward half alone (backward/primal) about 2. Elementwise ops are "
    "memory-bound, and their ratios count arrays moved: exp's jvp reads x and t and writes y and its tangent, "
    "4 arrays against the primal's 2, about 2x. Ratios well above that are unfused kernels: PyTorch eager runs "
    "one kernel, one pass over memory, per operation of the derivative formula (max's backward compares, "
    "selects and fills for each input), where XLA fuses the formula into one loop. Ratios below 1 (add's, "
    "copy's or sum's vjp in PyTorch): the backward hands the cotangent on as it is, or as a view. At small "
    "sizes the fixed cost of a call dominates: torch.func.jvp and vjp cost hundreds of microseconds per call in "
    "eager mode against a few for the primal, so there the ratios measure the transform's overhead."
)
HOW_TO_READ_SPEEDUP = (
    "Above 1: the op runs faster on every core than on one. Elementwise ops are memory-bound and gain little; "
    "matmul is compute-bound and scales with the cores. `cpu_util` in the CSV (process CPU seconds per wall "
    "second) shows how many cores a measurement kept busy."
)


# ------------------------------------------------------------------------------------------------- selection


def series_label(row: dict) -> str:
    """torch eager | torch compile | jax jit."""
    return f"{row.get('framework', '')} {row.get('execution', '')}".strip()


def context_label(ctx: tuple) -> str:
    device, dtype, threads = ctx
    return f"{device} {dtype} threads={threads}"


def _key(row: dict) -> tuple:
    return (
        row.get("framework"),
        row.get("execution"),
        row.get("dtype"),
        row.get("threads"),
        row.get("device"),
        row.get("op"),
        row.get("shape"),
    )


def latest(rows: list[dict]) -> tuple[list[dict], list[dict]]:
    """(ok rows, not-ok rows): each measurement by its latest row."""
    chosen = latest_rows(rows, key=_key)
    return [r for r in chosen if r.get("status") == "ok"], [r for r in chosen if r.get("status") != "ok"]


def _square(row: dict) -> int | None:
    n, m = num(row, "rows"), num(row, "cols")
    return int(n) if n is not None and n == m else None


def contexts(ok: list[dict]) -> dict[tuple, list[dict]]:
    out = defaultdict(list)
    for r in ok:
        out[(r.get("device"), r.get("dtype"), r.get("threads"))].append(r)
    return dict(sorted(out.items(), key=lambda kv: (str(kv[0][0]), str(kv[0][1]), kv[0][2] != "all")))


def op_order(rows: list[dict]) -> list[str]:
    seen: dict[str, None] = {}
    for r in rows:
        seen.setdefault(r.get("op", ""), None)
    return list(seen)


def largest_square(rows: list[dict], op: str) -> int | None:
    """The largest square size every series measured for this op (so that bars compare like with like)."""
    by_series = defaultdict(set)
    for r in rows:
        if r.get("op") == op and _square(r) is not None:
            by_series[series_label(r)].add(_square(r))
    common = set.intersection(*by_series.values()) if by_series else set()
    return max(common) if common else None


def at(rows: list[dict], op: str, n: int) -> dict[str, dict]:
    """series label -> row of this op at size n x n."""
    return {series_label(r): r for r in rows if r.get("op") == op and _square(r) == n}


def thread_pairs(ok: list[dict]) -> dict[tuple, tuple[list[dict], list[dict]]]:
    """(device, dtype) -> (threads=1 rows, threads=all rows), where both were measured."""
    by = defaultdict(lambda: ([], []))
    for r in ok:
        if r.get("threads") in ("1", "all"):
            by[(r.get("device"), r.get("dtype"))][r["threads"] == "all"].append(r)
    return {k: v for k, v in sorted(by.items()) if v[0] and v[1]}


def speedups(one: list[dict], all_: list[dict]) -> dict[str, dict[str, dict[str, float]]]:
    """series -> mode -> op -> time(threads=1) / time(threads=all) at the op's largest square size in both."""
    out: dict = defaultdict(lambda: defaultdict(dict))
    for op in op_order(one + all_):
        n = largest_square(one + all_, op)
        if n is None:
            continue
        a, b = at(one, op, n), at(all_, op, n)
        for label in sorted(set(a) & set(b)):
            for col, mode in MODES:
                t1, tn = num(a[label], col), num(b[label], col)
                if t1 and tn:
                    out[label][mode][f"{op} {n}"] = t1 / tn
    return out


# ---------------------------------------------------------------------------------------------------- tables


def _fmt_s(v: float | None) -> str:
    if v is None:
        return "-"
    for scale, unit in ((1, "s"), (1e-3, "ms"), (1e-6, "µs")):
        if v >= scale:
            return f"{v / scale:.3g} {unit}"
    return f"{v / 1e-9:.3g} ns"


def ratio_table(rows: list[dict]) -> str:
    """Per op at its largest square size: primal time and the three ratios of each series."""
    labels = sorted({series_label(r) for r in rows})
    head = ["op", "n"] + [
        f"{lb} {what}" for lb in labels for what in ("primal", "jvp/primal", "vjp/primal", "backward/primal")
    ]
    body = []
    for op in op_order(rows):
        n = largest_square(rows, op)
        if n is None:
            continue
        cells = at(rows, op, n)
        line = [op, str(n)]
        for lb in labels:
            r = cells.get(lb, {})
            p, b = num(r, "primal_s"), num(r, "vjp_backward_s")
            line += [
                _fmt_s(p),
                fmt_ratio(num(r, "jvp_over_primal")),
                fmt_ratio(num(r, "vjp_over_primal")),
                fmt_ratio(b / p if b is not None and p else None),
            ]
        body.append(line)
    return md_table(head, body, "l" + "r" * (len(head) - 1))


def shapes_table(rows: list[dict]) -> str | None:
    """The chosen (non-square) shapes: times of every series."""
    thin = sorted((r for r in rows if _square(r) is None), key=lambda r: (r["op"], r["shape"], series_label(r)))
    if not thin:
        return None
    head = ["op", "shape", "series", "primal", "jvp", "vjp", "jvp/primal", "vjp/primal"]
    body = [
        [
            r["op"],
            r["shape"],
            series_label(r),
            _fmt_s(num(r, "primal_s")),
            _fmt_s(num(r, "jvp_s")),
            _fmt_s(num(r, "vjp_s")),
            fmt_ratio(num(r, "jvp_over_primal")),
            fmt_ratio(num(r, "vjp_over_primal")),
        ]
        for r in thin
    ]
    return md_table(head, body, "lll" + "r" * (len(head) - 3))


def failed_table(bad: list[dict]) -> str:
    body = [
        [
            r.get("framework", ""),
            r.get("execution", ""),
            r.get("op", ""),
            r.get("shape", ""),
            r.get("dtype", ""),
            r.get("threads", ""),
            r.get("status", ""),
            " ".join(str(r.get("error", "")).split())[:160],
        ]
        for r in bad
    ]
    return md_table(["framework", "execution", "op", "shape", "dtype", "threads", "status", "error"], body, "l" * 8)


def summary_table(rows: list[dict]) -> str:
    """Fixed-width text for the end of a sweep: each series' ops at their largest square size."""
    ok, bad = latest(rows)
    if not rows:
        return "(no ops rows recorded)"
    head = ["series", "dtype", "threads", "op", "n", "primal", "jvp/primal", "vjp/primal"]
    body = []
    for ctx, ctx_rows in contexts(ok).items():
        for op in op_order(ctx_rows):
            n = largest_square(ctx_rows, op)
            for label, r in sorted(at(ctx_rows, op, n).items()) if n else ():
                body.append(
                    [
                        label,
                        ctx[1],
                        ctx[2],
                        op,
                        str(n),
                        _fmt_s(num(r, "primal_s")),
                        fmt_ratio(num(r, "jvp_over_primal")),
                        fmt_ratio(num(r, "vjp_over_primal")),
                    ]
                )
    lines = [fixed_width(head, body)]
    lines += [
        f"  {r.get('framework')} {r.get('op')} {r.get('shape')}: {r.get('status')}: {r.get('error', '')}" for r in bad
    ]
    return "\n".join(lines)


# ----------------------------------------------------------------------------------------------------- plots


def _figure(width: float, height: float):
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=(width, height))
    FigureCanvasAgg(fig)
    return fig


def plot_time_vs_size(rows: list[dict], title: str, path: Path) -> Path | None:
    """One log-log panel per op: time per call against n (square n x n), primal / jvp / vjp per series."""
    ops = [op for op in op_order(rows) if any(r.get("op") == op and _square(r) for r in rows)]
    if not ops:
        return None
    n_rows = -(-len(ops) // GRID_COLS)
    fig = _figure(3.0 * GRID_COLS, 2.5 * n_rows + 0.9)
    axes = fig.subplots(n_rows, GRID_COLS, squeeze=False)
    for ax, op in zip(axes.flat, ops):
        by_series = defaultdict(list)
        for r in rows:
            if r.get("op") == op and _square(r):
                by_series[series_label(r)].append(r)
        for label, rs in sorted(by_series.items()):
            rs.sort(key=_square)
            for col, mode in MODES:
                pts = [(_square(r), num(r, col)) for r in rs if num(r, col)]
                if pts:
                    ax.plot(
                        *zip(*pts),
                        color=SERIES_COLORS.get(label, "0.4"),
                        linestyle=MODE_LINES[mode],
                        marker="o",
                        markersize=3,
                        label=f"{label} {mode}",
                    )
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.set_title(op, fontsize=9)
        ax.tick_params(labelsize=7)
        ax.grid(True, alpha=0.3)
    for ax in axes.flat[len(ops) :]:
        ax.set_visible(False)
    for ax in axes[:, 0]:
        ax.set_ylabel("seconds per call", fontsize=8)
    for ax in axes[-1, :]:
        ax.set_xlabel("n (n × n)", fontsize=8)
    handles, labels = axes.flat[0].get_legend_handles_labels()
    fig.legend(
        handles,
        labels,
        loc="upper center",
        ncol=min(6, len(labels)),
        fontsize=8,
        frameon=False,
        bbox_to_anchor=(0.5, 1 - 0.35 / fig.get_figheight()),
    )
    fig.suptitle(title, fontsize=11, y=1 - 0.05 / fig.get_figheight())
    fig.tight_layout(rect=(0, 0, 1, 1 - 0.75 / fig.get_figheight()))
    return _save(fig, path)


def _bars(
    ax, categories: list[str], series: dict[str, list[float | None]], colors: dict[str, str], ylabel: str
) -> None:
    """Grouped bars of ratios, one group per category, with the 1x reference line."""
    n = max(1, len(series))
    width = 0.8 / n
    for i, (label, ys) in enumerate(series.items()):
        xs = [k + (i - (n - 1) / 2) * width for k in range(len(categories))]
        ax.bar(xs, [y if y is not None else 0.0 for y in ys], width, label=label, color=colors.get(label, None))
    ax.set_xticks(range(len(categories)), categories, rotation=35, ha="right", fontsize=7)
    ax.tick_params(axis="y", labelsize=7)
    ax.grid(True, axis="y", alpha=0.3)
    ax.axhline(1.0, color="0.3", linewidth=0.8)
    ax.set_ylabel(ylabel, fontsize=9)
    ax.legend(fontsize=7, loc="upper left")


def _save(fig, path: Path, title: str | None = None) -> Path:
    if title is not None:
        fig.suptitle(title, fontsize=11)
        fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=90)
    return path


def plot_ratios(rows: list[dict], title: str, path: Path) -> Path | None:
    """Two bar panels, jvp / primal and vjp / primal, per op at its largest square size, one bar per series."""
    cats, per_series = [], defaultdict(lambda: ([], []))
    labels = sorted({series_label(r) for r in rows})
    for op in op_order(rows):
        n = largest_square(rows, op)
        if n is None:
            continue
        cats.append(f"{op} {n}")
        cells = at(rows, op, n)
        for lb in labels:
            per_series[lb][0].append(num(cells.get(lb, {}), "jvp_over_primal"))
            per_series[lb][1].append(num(cells.get(lb, {}), "vjp_over_primal"))
    if not cats:
        return None
    fig = _figure(max(8.0, 0.45 * len(cats) * len(labels) + 2), 6.5)
    for i, (ax, what) in enumerate(zip(fig.subplots(2, 1), ("jvp / primal", "vjp / primal"))):
        _bars(ax, cats, {lb: per_series[lb][i] for lb in labels}, SERIES_COLORS, what)
    return _save(fig, path, title)


def plot_speedups(sp: dict, title: str, path: Path) -> Path | None:
    """One bar panel per series: time(threads=1) / time(threads=all) per op, bars for primal / jvp / vjp."""
    if not sp:
        return None
    labels = sorted(sp)
    cats = list(dict.fromkeys(c for lb in labels for mode in sp[lb].values() for c in mode))
    fig = _figure(max(8.0, 0.35 * len(cats) * 3 + 2), 3.2 * len(labels))
    axes = fig.subplots(len(labels), 1, squeeze=False)[:, 0]
    mode_colors = {"primal": "0.35", "jvp": "#e69f00", "vjp": "#009e73"}
    for ax, lb in zip(axes, labels):
        _bars(
            ax, cats, {m: [sp[lb].get(m, {}).get(c) for c in cats] for _, m in MODES}, mode_colors, "speedup (× faster)"
        )
        ax.set_title(lb, fontsize=9)
    return _save(fig, path, title)


# ---------------------------------------------------------------------------------------------------- report


def _slug(*parts) -> str:
    return "_".join(str(p).replace("=", "-").replace(" ", "-") for p in parts if p not in (None, ""))


class OpsSection(Section):
    """Op-level AD micro-benchmarks: where the results have an ops.csv."""

    def render(self, results: Results, plot_dir: Path) -> list[str]:
        sources = results.beside(RESULTS_FILE)
        if not sources:
            return []
        return ops_section(results.rows(RESULTS_FILE), ", ".join(map(str, sources)), plot_dir)


def ops_section(rows: list[dict], csv_path: str, plot_dir: Path) -> list[str]:
    """The section's markdown, its plots drawn into plot_dir (linked as plots/ops_*.png)."""
    ok, bad = latest(rows)
    out = ["## Op-level AD micro-benchmarks (scenario=ops)", ""]
    if not rows:
        return out + [f"No rows in `{csv_path}`: `python -m bench scenario=ops` writes them.", ""]
    out += [
        f"From `{csv_path}`: {len(rows)} rows; {len(ok)} measurements ok, {len(bad)} not ok (latest row of each "
        "framework × execution × dtype × threads × device × op × shape).",
        "",
        "Times are the median over the repeats of the time per call, synced (`block_until_ready`, "
        "`torch.cuda.synchronize`). **primal** is f(x); **jvp** is f(x) and its tangent (forward mode); "
        "**vjp** is f(x) and the cotangents of its inputs (reverse mode, forward pass included); "
        "**backward** is the pullback alone, its residuals precomputed. JAX runs under `jax.jit`, PyTorch "
        "eager (`torch compile` rows: `ops.compile=true`).",
        "",
        f"*How to read the ratios:* {HOW_TO_READ_RATIOS}",
        "",
    ]
    for ctx, ctx_rows in contexts(ok).items():
        label = context_label(ctx)
        out += [f"### {label}", "", ratio_table(ctx_rows), ""]
        for kind, fn, what in (
            ("time", plot_time_vs_size, "time per call vs size"),
            ("ratios", plot_ratios, "cost ratios at the largest size"),
        ):
            name = f"ops_{kind}_{_slug(ctx[0], ctx[1], f'threads={ctx[2]}')}"
            if fn(ctx_rows, f"{what}: {label}", plot_dir / f"{name}.png"):
                out += [f"![{what}, {label}]({PLOT_DIR}/{name}.png)", ""]
        thin = shapes_table(ctx_rows)
        if thin:
            out += ["Chosen shapes:", "", thin, ""]
    pairs = thread_pairs(ok)
    out += ["### Thread speedup", ""]
    if not pairs:
        out += [
            "No device × dtype measured with both threads=1 and threads=all: "
            "`python -m bench -m scenario=ops framework=torch,jax threads=1,all`.",
            "",
        ]
    for (device, dtype), (one, all_) in pairs.items():
        sp = speedups(one, all_)
        name = f"ops_threads_{_slug(device, dtype)}"
        cpus = sorted({r.get("num_threads") for r in all_ if r.get("num_threads")})
        title = f"time(threads=1) / time(threads=all, {'/'.join(cpus) or '?'} threads): {device} {dtype}"
        if plot_speedups(sp, title, plot_dir / f"{name}.png"):
            out += [f"![thread speedup, {device} {dtype}]({PLOT_DIR}/{name}.png)", "", HOW_TO_READ_SPEEDUP, ""]
    if bad:
        out += ["### Ops that did not finish", "", failed_table(bad), ""]
    return out
