"""The report's section beyond one device: per-device memory, step time and the bytes each device exchanged per
step, for every strategy (bench/parallel.py: ddp, fsdp and its settings) and device count measured, beside the
single-device rows of the same per-device work; and the HPML lecture's table of DDP against FSDP's sharding
strategies, with the ways of differentiating as its columns.

Rows come as select.py groups them (group_contexts): the parallel settings are part of a context, so a trial on
two devices never shares a cell with one on a single device. Here contexts that differ only in those settings
are gathered into one comparison (select.comparison) and shown in one table.
"""

from __future__ import annotations

from collections import defaultdict
from pathlib import Path

from bench.report.section import Results, Section
from bench.report.tables import fmt_bytes, fmt_ratio, fmt_value, md_table, num
from bench.scenarios.model.select import (
    Cells,
    Context,
    comparison,
    context_label,
    context_order,
    framework_order,
    knob,
    mode_order,
    provenance,
    strategy,
    strategy_order,
    variant,
    view,
    world_size,
)
from bench.spec import FRAMEWORK_NAMES
from bench.store.read import read_history

# Counted and expected bytes agree within 10%: the formula leaves out what a step may add around its collectives
# (a broadcast of a seed, padding of a bucket); a larger gap is a collective the formula does not describe, or a
# formula that misses one.
COMM_TOLERANCE = 0.10
FLAG = "⚠"
# Per-device memory: the smallest device is shown beside the largest where it holds 10% less (rank 0 keeping
# more than the others, say); below that the difference is allocator noise.
SPREAD = 0.10
EXPERIMENTS = (
    "`python -m bench -m +experiment=scale_out` (ddp and fsdp on 1 and 2 devices) or "
    "`+experiment=strategy_table` (DDP against FSDP's sharding strategies)"
)


def comm_mismatch(row: dict) -> bool | None:
    """Whether the bytes counted differ from the expectation by more than COMM_TOLERANCE; None when either is
    missing (a single-device row, a trial that failed)."""
    counted, expected = num(row, "comm_bytes_per_step"), num(row, "comm_bytes_expected")
    if counted is None or expected is None:
        return None
    if expected == 0:
        return counted != 0
    return abs(counted / expected - 1) > COMM_TOLERANCE


def _comm_check(row: dict) -> str:
    mismatch = comm_mismatch(row)
    if mismatch is None or (not mismatch and not num(row, "comm_bytes_expected")):
        return "-"  # nothing to compare, or nothing expected and nothing exchanged (a world of one)
    counted, expected = num(row, "comm_bytes_per_step"), num(row, "comm_bytes_expected")
    text = fmt_ratio(counted / expected) if expected else "expected none"
    return f"**{text} {FLAG}**" if mismatch else text


def devices_of(row: dict) -> list[dict]:
    """Each device's memory and step time, from the trial's history JSON ("devices"); [] where there is none."""
    devices = (read_history(row) or {}).get("devices")
    return [d for d in devices if isinstance(d, dict)] if isinstance(devices, list) else []


def per_device(row: dict, col: str, devices: list[dict]) -> str:
    """The row's value (the largest device's) in MiB, with the smallest device's beside it where they differ by
    more than SPREAD."""
    v = num(row, col)
    if v is None:
        return "-"
    values = [x for x in (num(d, col) for d in devices) if x is not None]
    if len(values) >= 2 and max(values) > 0 and min(values) < (1 - SPREAD) * max(values):
        return f"{v:.0f} (min {min(values):.0f})"
    return f"{v:.0f}"


def _devices(row: dict) -> str:
    nodes = knob(row, "nodes")
    return str(world_size(row)) if nodes == "1" else f"{nodes} × {knob(row, 'devices')}"


def _parallel(row: dict) -> bool:
    return knob(row, "parallel") != "none"


def comparisons(contexts: dict[Context, Cells]) -> list[tuple[Context, list[dict]]]:
    """[(comparison, rows)] for every comparison with a trial beyond one device: its rows with parallel settings
    (ok or not) and, as the baseline, its single-device rows of the same framework x mode; strategy, then device
    count, mode and framework order."""
    groups: dict[Context, list[dict]] = defaultdict(list)
    for key, cells in contexts.items():
        groups[comparison(key)] += list(cells.values())
    out = []
    for key in sorted(groups, key=context_order):
        rows = groups[key]
        spread = {(r.get("framework", ""), variant(r)) for r in rows if _parallel(r)}
        if not spread:
            continue
        shown = [r for r in rows if _parallel(r) or (r.get("framework", ""), variant(r)) in spread]
        shown.sort(key=lambda r: (strategy_order(r), mode_order(r), framework_order(r.get("framework", ""))))
        out.append((key, shown))
    return out


HEAD = [
    "framework",
    "mode",
    "strategy",
    "devices",
    "peak MiB",
    "excess MiB",
    "params MiB",
    "optimizer MiB",
    "step ms (slowest)",
    "samples/s (global)",
    "exchanged / step",
    "expected",
    "counted / expected",
    "memory by",
]


def scale_table(rows: list[dict]) -> str:
    body = []
    for r in rows:
        head = [r.get("framework", ""), variant(r), strategy(r), _devices(r)]
        if r.get("status") != "ok":  # listed where it would have been, with no numbers
            body.append([*head, f"**{r.get('status') or 'no status'}**", *[""] * (len(HEAD) - 5)])
            continue
        devices = devices_of(r)
        memory = [
            per_device(r, col, devices) for col in ("peak_mem_mb", "excess_mem_mb", "mem_params_mb", "mem_optimizer_mb")
        ]
        body.append(
            [
                *head,
                *memory,
                fmt_value(num(r, "step_time_median_s"), 1e3),
                fmt_value(num(r, "samples_per_s")),
                fmt_bytes(num(r, "comm_bytes_per_step")),
                fmt_bytes(num(r, "comm_bytes_expected")),
                _comm_check(r),
                r.get("mem_method", ""),
            ]
        )
    return md_table(HEAD, body, "llll" + "r" * 9 + "l")


def lecture_name(row: dict) -> str:
    """DDP, FSDP SHARD_GRAD_OP, FSDP FULL_SHARD, FSDP FULL_SHARD + CPU offload: as the lecture names them."""
    return strategy(row).replace("fsdp", "FSDP").replace("ddp", "DDP")


def strategy_tables(found: list[tuple[Context, list[dict]]]) -> list[tuple[str, str]]:
    """[(what the table compares, markdown)]: per comparison, framework and device count (> 1) where >= 2
    strategies were measured, one row per strategy and, per way of differentiating, the per-device peak memory
    and the slowest device's median step time."""
    out = []
    for key, rows in found:
        by: dict[tuple, dict[str, dict]] = defaultdict(lambda: defaultdict(dict))
        for r in rows:
            if _parallel(r) and world_size(r) > 1:
                by[r.get("framework", ""), world_size(r), _devices(r)][lecture_name(r)][variant(r)] = r
        for (fw, _, devices), strategies in sorted(by.items(), key=lambda kv: (framework_order(kv[0][0]), kv[0][1:])):
            if len(strategies) < 2:
                continue
            mode_rows = {label: r for cells in strategies.values() for label, r in cells.items()}
            modes = sorted(mode_rows, key=lambda label: mode_order(mode_rows[label]))
            body = []
            for name, cells in sorted(strategies.items(), key=lambda kv: strategy_order(next(iter(kv[1].values())))):
                line = [name]
                for label in modes:
                    r = cells.get(label)
                    if r is None:
                        line += ["-", "-"]
                    elif r.get("status") != "ok":
                        line += [f"**{r.get('status') or 'no status'}**", ""]
                    else:
                        line += [
                            f"{num(r, 'peak_mem_mb'):.0f}" if num(r, "peak_mem_mb") is not None else "-",
                            fmt_value(num(r, "step_time_median_s"), 1e3),
                        ]
                body.append(line)
            head = ["strategy", *[f"{label} {unit}" for label in modes for unit in ("peak MiB", "ms")]]
            title = f"{FRAMEWORK_NAMES.get(fw, fw)} on {devices} devices · {context_label(key)}"
            out.append((title, md_table(head, body, "l" + "r" * (len(head) - 1))))
    return out


def section(contexts: dict[Context, Cells]) -> list[str]:
    """The report's "Beyond one device" section, as lines of markdown; one line naming the experiments that
    produce it where no trial ran beyond one device."""
    out = ["## Beyond one device", ""]
    found = comparisons(contexts)
    if not found:
        return out + [f"No rows with `parallel=ddp|fsdp`: {EXPERIMENTS}.", ""]
    out += [
        "Trials that spread a step over devices (bench/parallel.py), beside the single-device trials of the same "
        "per-device work: `batch_size` is the per-device micro-batch, so N devices step over a global batch N "
        "times as large. Memory is per device, the largest device's (the smallest's in parentheses where "
        "they differ by more than 10%); **params** and **optimizer** are the parameters and optimizer state "
        "one device holds; step time is the slowest device's median; samples/s counts the global batch. "
        "**exchanged / step** is what one device exchanged in collectives in one step, counted from what the "
        "program did (torch: the collectives it issued; JAX: those in the compiled step's HLO), beside the "
        "**expected** bytes of bench/parallel.py's formula. KiB, MiB = 2¹⁰, 2²⁰ bytes.",
        "",
    ]
    for key, rows in found:
        out += [context_label(key), ""]
        if provenance(rows):
            out += [provenance(rows), ""]
        out += [scale_table(rows), ""]
    out += [
        "*How to read it:* backprop all-reduces its gradient every step, 4n bytes for n trainable parameters "
        "in fp32 (87 MiB for MiniLM's 22.7 M) on any number of devices. The forward gradient (jvp) and MeZO "
        "exchange only scalars, jvp its K directional derivatives and the loss, MeZO its two losses: every "
        "device draws the same seeded direction, so those scalars rebuild the whole update on each. FSDP "
        "holds 1/N of the parameters and of the optimizer state per device (the params and optimizer "
        "columns) and pays with an all-gather of the parameters for every forward pass (FULL_SHARD gathers "
        "again for backprop's backward pass, MeZO's two forward passes gather twice), so under FSDP every "
        f"mode exchanges parameter-sized amounts. **{FLAG}** marks a count more than 10% away from its "
        "expectation: the expectation is a formula, the count is what happened, so a flag is a collective "
        "the formula does not describe (or one it describes that never ran), worth a look before the numbers "
        "are trusted. `xla_memory_analysis` under *memory by*: JAX on CPU runs every device in one process, "
        "whose resident set cannot be split by device, so each device's memory is the compiled step's "
        "memory analysis (arguments, outputs, temporaries): an account, not a measurement.",
        "",
    ]
    out += ["### DDP vs FSDP strategies (the HPML lecture's table)", ""]
    tables = strategy_tables(found)
    if not tables:
        return out + ["No two strategies at one device count yet: `python -m bench -m +experiment=strategy_table`.", ""]
    out += [
        "Per-device peak memory (MiB) and the slowest device's median step time (ms) at one per-device batch, "
        "for each way of differentiating. DDP replicates parameters, gradients and optimizer state; "
        "SHARD_GRAD_OP shards gradients and optimizer state and keeps the gathered parameters from the "
        "forward to the backward pass; FULL_SHARD frees them after the forward pass and gathers them again "
        "(less memory, one more all-gather); CPU offload keeps parameters, gradients and optimizer state in "
        "host memory. Peak rather than excess: what a strategy saves is state held before the step begins.",
        "",
    ]
    for title, table in tables:
        out += [title, "", table, ""]
    return out


class ParallelSection(Section):
    """Beyond one device: where the results have a model row."""

    def render(self, results: Results, plot_dir: Path) -> list[str]:
        v = view(results)
        return section(v.contexts) if v.rows else []
