"""What fits: the capacity search's results (capacity.csv) as the table its command prints, the report's "What
fits" section, and its bar chart (largest batch or sequence length per way of differentiating and framework)."""

from __future__ import annotations

from collections import defaultdict
from pathlib import Path

from bench.report.plots import Chart, Plot, Series, save
from bench.report.section import PLOT_DIR, Results, Section
from bench.report.tables import fixed_width, md_table, num
from bench.scenarios.capacity.columns import COLUMNS, OUTCOME_COLUMNS, RESULTS_FILE
from bench.scenarios.capacity.search import LARGEST_RUNG
from bench.scenarios.model.select import framework_order, variant
from bench.spec import FRAMEWORK_NAMES
from bench.store.read import latest

VERDICTS = {
    "fits": "the largest value that fits (the next one ran out of memory)",
    "fits at the limit": "fits up to the search's limit (seq_len: the model's positions; batch: data.num_train)",
    "does not fit": "even the first value ran out of memory",
    "undecided": "the probes ran out before the bracket closed: the largest value that fitted so far",
    LARGEST_RUNG: "a ladder's (--ladder F) largest rung that fits: the next rung, F times it, ran out of memory",
    "failed": "a probe ended in error or crashed (its row in runs.csv says why)",
}


def label(row: dict) -> str:
    """The way of differentiating, as the other tables name it (backprop+remat, jvp[lazy], jacfwd[head])."""
    return variant(row)


def search_label(row: dict) -> str:
    """What the search varied, and how: "batch_size", or "batch_size x4" for a ladder of factor 4."""
    return f"{row.get('search')} x{row['ladder']}" if row.get("ladder") else str(row.get("search"))


def _fixed(row: dict) -> str:
    return f"T{row.get('seq_len')}" if row.get("search") == "batch_size" else f"B{row.get('batch_size')}"


def capacity_table(rows: list[dict]) -> str:
    """The fixed-width table `python -m bench capacity` prints at its end."""
    if not rows:
        return "(no searches)"
    head = [
        "framework",
        "mode",
        "dtype",
        "search",
        "budget MiB",
        "largest",
        "verdict",
        "peak MiB",
        "step ms",
        "tokens/s",
        "probes",
    ]
    body = []
    for r in rows:

        def f(key, fmt, scale=1.0, r=r):
            v = num(r, key)
            return "-" if v is None else format(v * scale, fmt)

        body.append(
            [
                r.get("framework", ""),
                label(r),
                r.get("dtype", ""),
                f"{search_label(r)} ({_fixed(r)})",
                f("budget_mb", ".0f"),
                "-" if r.get("max_value") in (None, "") else str(r["max_value"]),
                r.get("verdict", ""),
                f("peak_mem_mb", ".0f"),
                f("step_time_median_s", ".1f", 1e3),
                f("tokens_per_s", ".0f"),
                str(r.get("probes", "")),
            ]
        )
    return fixed_width(head, body)


def latest_searches(rows: list[dict]) -> list[dict]:
    """The latest search of each (framework, mode, search, budget, context): a re-run replaces it."""
    return latest(rows, key=lambda r: tuple(r.get(c, "") for c in COLUMNS if c not in OUTCOME_COLUMNS))


def contexts(rows: list[dict]) -> dict[tuple, list[dict]]:
    """Searches compared together: the same model, search, budget, fixed dimension, device and strategy."""
    out: dict[tuple, list[dict]] = defaultdict(list)
    for r in rows:
        key = (
            r.get("model"),
            r.get("num_layers"),
            r.get("search"),
            _fixed(r),
            r.get("budget_mb"),
            r.get("device"),
            r.get("device_name"),
            r.get("dtype"),
            r.get("optimizer"),
            r.get("parallel"),
            r.get("devices"),
        )
        out[key].append(r)
    return out


def heading(key: tuple) -> str:
    model, layers, search, fixed, budget, device, device_name, dtype, optimizer, parallel, devices = key
    where = f"{device} ({device_name})" if device_name else device
    strategy = "" if parallel in (None, "", "none") else f" · {parallel} × {devices} devices"
    budget = f"{float(budget):.0f}" if budget not in (None, "") else "?"
    return (
        f"{model} ({layers} layers) · largest {search} at {fixed} in {budget} MiB · {optimizer} · {dtype} · "
        f"{where}{strategy}"
    )


def capacity_plot(found: dict[tuple, list[dict]]) -> Plot:
    panels = []
    for key, rows in list(found.items())[:4]:
        modes = list(dict.fromkeys(label(r) for r in rows))
        series = []
        for fw in sorted({r["framework"] for r in rows}, key=framework_order):
            mine = [(modes.index(label(r)), num(r, "max_value") or 0.0) for r in rows if r["framework"] == fw]
            series.append(Series(fw, "", [float(i) for i, _ in mine], [v for _, v in mine]))
        panels.append(Chart(heading(key), "", f"largest {rows[0].get('search')}", series, modes))
    return Plot(
        name="what_fits",
        title="What fits: the largest batch (or sequence length) per way of differentiating",
        how_to_read="One group of bars per way of differentiating, one bar per framework: the largest value whose "
        "training step ran within the budget (0: not even the first). Higher is better; backprop pays for the "
        "activations it keeps, jvp and MeZO do not.",
        needs="python -m bench capacity (capacity.csv)",
        grid=[[p] for p in panels],
    )


class CapacitySection(Section):
    """What fits: the latest search of each kind in capacity.csv, with its bar chart."""

    def render(self, results: Results, plot_dir: Path) -> list[str]:
        rows = latest_searches([r for r in results.rows(RESULTS_FILE) if r.get("status") != "damaged"])
        if not results.beside(RESULTS_FILE):
            return []
        return capacity_section(rows, results.beside(RESULTS_FILE), plot_dir)


def capacity_section(rows: list[dict], sources: list[Path], plot_dir: Path) -> list[str]:
    """The report's "What fits" section from the latest searches, with its bar chart drawn into plot_dir."""
    csv_path = ", ".join(map(str, sources))
    out = ["## What fits", ""]
    if not rows:
        return [*out, f"No searches in `{csv_path}`.", ""]
    out += [
        f"From `{csv_path}`: the largest value of each search whose step ran within the memory budget "
        "(`python -m bench capacity`), the latest search of each kind. Each probe is a trial of its own in "
        "runs.csv (status ok, or oom where it did not fit). On CUDA the budget is the framework's allocator "
        "limit; on the CPU it is the trial process's whole RSS (interpreter, framework and weights included), "
        "so compare within a table, not with a GPU's memory.",
        "",
    ]
    found = contexts(rows)
    head = ["framework", "mode", "largest", "verdict", "peak MiB", "step ms", "tokens/s", "probes (value:status)"]
    for key, group in found.items():
        group.sort(key=lambda r: (label(r), framework_order(r["framework"])))
        body = [
            [
                FRAMEWORK_NAMES.get(r["framework"], r["framework"]),
                label(r),
                "-" if r.get("max_value") in (None, "") else r["max_value"],
                r.get("verdict", ""),
                "-" if num(r, "peak_mem_mb") is None else f"{num(r, 'peak_mem_mb'):.0f}",
                "-" if num(r, "step_time_median_s") is None else f"{num(r, 'step_time_median_s') * 1e3:.0f}",
                "-" if num(r, "tokens_per_s") is None else f"{num(r, 'tokens_per_s'):.0f}",
                r.get("probe_values", ""),
            ]
            for r in group
        ]
        out += [f"### {heading(key)}", "", md_table(head, body, "llrlrrrl"), ""]
    out += ["Verdicts: " + "; ".join(f"*{v}*: {what}" for v, what in VERDICTS.items()) + ".", ""]
    plot = capacity_plot(found)
    if save(plot, plot_dir):
        out += [f"![{plot.title}]({PLOT_DIR}/{plot.name}.png)", "", plot.how_to_read, ""]
    return out
