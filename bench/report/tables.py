"""What the readers of results CSVs share (the report's sections, plots and targets): fp32's size, a cell as a
number, a number as short text, markdown and fixed-width tables."""

from __future__ import annotations

import math
import re
import warnings

FP32_BYTES = 4  # one fp32 number: the report's guide lines are one fp32 copy of the trainable parameters


class SkippedCell(UserWarning):
    """A results cell that should hold a number and does not: shown as "-", said once per row and column."""


# What a measured cell can hold. A size or a duration below zero, a step that took no time, a memory past any
# device's: the cell was damaged (edited, or written by a broken tracker) and is shown as "-", never used in a ratio.
MAX_MIB = 2.0**30  # a pebibyte: a thousand times the largest host or accelerator memory
DIFFERENCES = ("excess_mem_mb", "time_overhead_ms")  # measured as one reading less another: below zero is possible
# the time of one step or call: every ratio of times and every rate divides by one, and a timer never reads 0 for it
PER_STEP = re.compile(r"step_time_(median|mean|p10|p90)_s|\w+_step_s|profile_step_ms|(primal|jvp|vjp|vjp_backward)_s")


def impossible(key: str, x: float) -> str | None:
    """Why `x` cannot be column `key`'s measurement, or None when it can."""
    if key.endswith("_mb") and abs(x) > MAX_MIB:
        return f"more than {MAX_MIB:.0f} MiB"
    if key in DIFFERENCES:
        return None
    if PER_STEP.fullmatch(key) and x <= 0:
        return "a step's time, not above 0 s"
    if key.endswith(("_s", "_ms", "_mb", "_bytes", "_per_step", "_expected")) and x < 0:
        return "a size, duration or rate below 0"
    return None


def num(row: dict, key: str) -> float | None:
    """row[key] as a float; None for an empty, unparsable, non-finite (a "nan" carries no measurement) or impossible
    cell. An unparsable or impossible cell is said once, naming its row and column (a SkippedCell warning: Python
    shows each once)."""
    v = row.get(key)
    if v in (None, ""):
        return None
    try:
        x = float(v)
    except (TypeError, ValueError):
        x, why = None, "is not a number"
    else:
        if not math.isfinite(x):
            return None
        why = impossible(key, x)
        if why is not None:
            why = f"cannot be a measurement ({why})"
    if why is None:
        return x
    where = f"{row.get('_source') or 'a results CSV'}, run_id {row.get('run_id') or '?'}"
    warnings.warn(f"{where}: column {key}={v!r} {why}; shown as -", SkippedCell, stacklevel=2)
    return None


def fmt_value(v: float | None, scale: float = 1.0) -> str:
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


def fmt_ratio(v: float | None) -> str:
    return "-" if v is None else f"{v:.2f}×"


def _md_cell(x) -> str:
    return str(x).replace("|", "\\|").replace("\n", " ").strip()


def md_table(head: list[str], body: list[list], align: str = "") -> str:
    """A markdown table. align: "l" (text) or "r" (numbers) per column; by default two text columns, then
    numbers."""
    align = align or "ll" + "r" * (len(head) - 2)
    lines = [
        "| " + " | ".join(_md_cell(h) for h in head) + " |",
        "|" + "|".join(":---" if a == "l" else "---:" for a in align) + "|",
    ]
    lines += ["| " + " | ".join(_md_cell(c) for c in row) + " |" for row in body]
    return "\n".join(lines)


def fixed_width(head: list[str], body: list[list]) -> str:
    """Columns padded to their widest cell, a dashed rule under the head: for a terminal."""
    table = [[str(c) for c in row] for row in [head, *body]]
    widths = [max(len(row[i]) for row in table) for i in range(len(head))]
    lines = ["  ".join(c.ljust(w) for c, w in zip(row, widths)).rstrip() for row in table]
    lines.insert(1, "  ".join("-" * w for w in widths))
    return "\n".join(lines)


def fmt_bytes(v: float | None) -> str:
    """Bytes in binary units, about three significant figures: 8 B, 1.50 KiB, 86.6 MiB, 1.25 GiB."""
    if v is None:
        return "-"
    for unit, size in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if abs(v) >= size:
            return f"{fmt_value(v / size)} {unit}"
    return f"{v:.0f} B"
