"""What the readers of results CSVs share (the report's sections, plots and targets): fp32's size, a cell as a
number, a number as short text, markdown and fixed-width tables."""

from __future__ import annotations

import math
import warnings

FP32_BYTES = 4  # one fp32 number: the report's guide lines are one fp32 copy of the trainable parameters


class SkippedCell(UserWarning):
    """A results cell that should hold a number and does not: shown as "-", said once per row and column."""


def num(row: dict, key: str) -> float | None:
    """row[key] as a float; None for an empty, unparsable or non-finite cell (a "nan" carries no measurement). An
    unparsable cell is said once, naming its row and column (a SkippedCell warning: Python shows each once)."""
    v = row.get(key)
    if v in (None, ""):
        return None
    try:
        x = float(v)
    except (TypeError, ValueError):
        where = f"{row.get('_source') or 'a results CSV'}, run_id {row.get('run_id') or '?'}"
        warnings.warn(f"{where}: column {key}={v!r} is not a number; shown as -", SkippedCell, stacklevel=2)
        return None
    return x if math.isfinite(x) else None


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
