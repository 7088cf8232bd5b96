"""The rows every lease measured, kept by step in benchmarks/gpu_rows/ (tracked): a lease starts on a bare machine,
and without them it would measure the first steps' cells again each time (issue 42). `--summarize` adds a lease's
new rows (keep), `--lease` seeds each step's runs.csv with them (seed), and README's "measured on a GPU" table is
made from them (readme_table, `python -m bench gpu-check --table`; a test holds README to it).
"""

from __future__ import annotations

import shutil
from pathlib import Path

from bench.harness.scenario import FINISHED
from bench.measure.system import REPO
from bench.report.tables import fmt_value, md_table, num
from bench.scenarios.capacity.search import OUT_OF_MEMORY
from bench.scenarios.gpu.steps import STEPS
from bench.scenarios.model.select import framework_order, mode_order, variant
from bench.spec import FRAMEWORK_NAMES
from bench.store.csv import CsvSink
from bench.store.read import read_rows

KEPT = REPO / "benchmarks" / "gpu_rows"
EARLIER = "earlier.csv"  # in a step's folder: the rows it was seeded with, so its record can say which are new
RESUMES = {s.name for s in STEPS if s.resumes}  # the steps whose rows are kept, and seed the next lease
# What is kept: the rows resume skips (ok, diverged), and a ladder's rung out of memory, which a ladder in the same
# budget reads instead of running it again (bench/scenarios/capacity/run.py); a multirun's oom runs again anyway
KEPT_STATUSES = (*FINISHED, *OUT_OF_MEMORY)


def seed(out: Path, names: list[str], kept: Path = KEPT) -> None:
    """Each chosen step's kept rows as its runs.csv where it has none yet (a bare machine's first call): every
    trial runs with resume=true, so only the cells no lease has recorded ok are measured. A cell measured on
    another card counts as measured; --fresh measures every cell again (to compare cards)."""
    for name in RESUMES.intersection(names):
        rows, runs = kept / f"{name}.csv", out / name / "runs.csv"
        if rows.exists() and not runs.exists():
            runs.parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(rows, runs)
            shutil.copyfile(rows, runs.with_name(EARLIER))
            n = len(read_rows(rows))
            print(f"gpu-check: [{name}] {n} row(s) of earlier leases from {rows}: not measured again", flush=True)


def keep(out: Path, kept: Path = KEPT, device: str = "cuda") -> list[str]:
    """Add every resuming step's new rows measured on `device` to kept/<step>.csv (each run_id once), those of
    KEPT_STATUSES; returns what it added, a line a step. A dry run's rows (the CPU's) are never kept."""
    said = []
    for name in sorted(RESUMES):
        rows = read_rows(out / name / "runs.csv")
        known = {r["run_id"] for r in read_rows(kept / f"{name}.csv")}
        new = [
            r
            for r in rows
            if r.get("status") in KEPT_STATUSES and r.get("device") == device and r["run_id"] not in known
        ]
        if not new:
            continue
        sink = CsvSink(kept / f"{name}.csv", columns=list(rows[0]))
        for row in new:
            sink.write(row)
        said.append(f"gpu-check: [{name}] {len(new)} new row(s) kept in {kept / name}.csv: the next lease skips them")
    return said


# ------------------------------------------------------------------------------------------ README's GPU table

# The kept steps whose cells are the GPU table's (B8 T128, one learning rate): every mode, the newer estimators, OPT
TABLE_STEPS = ("modes_fp32", "modes_bf16", "zo_family", "opt")
TABLE_COLUMNS = (("torch", "fp32"), ("jax", "fp32"), ("torch", "bf16"), ("jax", "bf16"))


def _these(rows: list[dict], column: str, fmt=str) -> str:
    return ", ".join(dict.fromkeys(fmt(r[column]) for r in rows if r.get(column)))


def readme_table(kept: Path = KEPT) -> str:
    """README's "measured on a GPU" table: each kept ok row of TABLE_STEPS as its median step and TFLOP/s (counted
    FLOPs over that step), a line per model and mode, a column per framework and dtype, under one line that says
    the shape, the optimizer, the device, the commits and the dates, all read from the rows."""
    rows = [r for name in TABLE_STEPS for r in read_rows(kept / f"{name}.csv") if r.get("status") == "ok"]
    if not rows:
        return f"(no rows kept in {kept})"
    cells = {(r["model"], variant(r), r["framework"], r["dtype"]): r for r in rows}
    lines = sorted({(r["model"], variant(r)): r for r in rows}.items(), key=lambda kv: (kv[0][0], mode_order(kv[1])))
    body = []
    for (model, mode), _ in lines:
        line = [model, mode]
        for fw, dtype in TABLE_COLUMNS:
            r = cells.get((model, mode, fw, dtype))
            step, rate = (num(r, "step_time_median_s"), num(r, "flops_per_s")) if r else (None, None)
            line.append("" if step is None else f"{fmt_value(step, 1e3)} · {fmt_value(rate, 1e-12)}")
        body.append(line)
    fixed = sorted(rows, key=lambda r: framework_order(r["framework"]))
    head = ["model", "mode", *(f"{FRAMEWORK_NAMES.get(fw, fw)} {dtype}" for fw, dtype in TABLE_COLUMNS)]
    caption = (
        f"Median step ms · TFLOP/s (counted FLOPs), B{_these(fixed, 'batch_size')} "
        f"T{_these(fixed, 'seq_len')}, {_these(fixed, 'optimizer')} lr {_these(fixed, 'lr')}, "
        f"{_these(fixed, 'device_name')}, git {_these(fixed, 'git_sha', lambda s: s[:7])}, "
        f"{_these(fixed, 'started_at', lambda s: s[:10])}:"
    )
    return "\n".join([caption, "", md_table(head, body, "ll" + "r" * len(TABLE_COLUMNS))])
