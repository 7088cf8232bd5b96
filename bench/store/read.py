"""Reading results back: whole rows of a results CSV, the rows a report reads (with the damaged ones marked), a
trial's per-step history, and the one rule for repeated measurements: the latest row wins.

Nothing here writes: resume, the sweep's summary, the report and the targets only ever read a CSV (CsvSink,
bench/store/csv.py, is the one writer).
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable, Hashable, Iterable, Sequence
from pathlib import Path

from bench.errors import ConfigError
from bench.store.csv import CsvScan, escaped, scan_csv, text_cell

DAMAGED = "damaged"  # the status a reader gives a CSV row that is not whole (cut off, wrong cell count)


class ReadError(ConfigError):
    """A results file a reader cannot take; the message is one line naming it and what is accepted."""


def read_rows(path: str | os.PathLike[str]) -> list[dict[str, str]]:
    """Every whole row of a results CSV as {column: string} ("" for empty cells); [] if the file does not exist.
    Rows that are not whole (scan_csv) are left out: resume and the sweep's summary never read a cut-off row."""
    path = Path(path)
    try:
        scan = scan_csv(path.read_bytes())
    except FileNotFoundError:
        return []
    except UnicodeDecodeError as e:
        raise ReadError(f"{path}: not UTF-8 text (byte {e.start}); accepted: a results CSV written by bench") from None
    check_header(str(path), scan)
    return [as_written(scan.header, record) for record in scan.records]


def as_written(header: list[str], record: list[str]) -> dict[str, str]:
    """A record as the row the writer was given: a formula-like text cell without the quote put before it
    (bench.store.csv's OWASP rule)."""
    return {column: text_cell(cell) for column, cell in zip(header, record)}


def as_shown(header: list[str], record: list[str]) -> dict[str, str]:
    """A record as the report shows it: a formula-like text cell with one quote before it (bench.store.csv's OWASP
    rule), whether the file had it or not (a CSV edited by hand), so no heading, table cell or plot label the report
    writes starts with a formula."""
    return {column: escaped(text_cell(cell)) for column, cell in zip(header, record)}


def check_header(where: str, scan: CsvScan) -> None:
    """ReadError (one line) for a header that names a column twice: each row would be read with the later cell
    in place of the earlier one (a torch row shown as jax), so the file is refused rather than read either way."""
    twice = [c for i, c in enumerate(scan.header) if c in scan.header[:i]]
    if twice:
        shown = ", ".join(dict.fromkeys(twice))
        raise ReadError(
            f"{where}: its header repeats the column(s) {shown}; accepted: a results CSV written by bench, each "
            "column once"
        )


def started(row: dict) -> str:
    return row.get("started_at") or ""  # ISO 8601 in UTC: sorts as text


def latest(rows: Iterable[dict], key: Callable[[dict], Hashable]) -> list[dict]:
    """The latest row of each `key(row)`, oldest first. Rows are ordered by started_at, file order among equal
    timestamps (a stable sort: the later line wins). A re-run after a fix replaces the old numbers; it is never
    averaged with them."""
    last: dict = {}
    for r in sorted(rows, key=started):
        last[key(r)] = r
    return sorted(last.values(), key=started)


def load_rows(paths: Sequence[str | Path], required: Sequence[str] = ()) -> list[dict[str, str]]:
    """Every row of the given results CSVs, in file order, each with "_source" (its CSV's path) added; a row that
    is not whole is one row marked status "damaged" with its line and what is wrong (listed as such, never read
    as numbers); a formula-like text cell is read with a quote before it (as_shown). A run_id an earlier file had
    (the same file given twice) is read once; within one file every row is kept (an ops trial writes one row per
    op and shape under its run_id). ReadError (one line) for a file that is missing, unreadable, or whose header
    lacks a `required` column or repeats one."""
    rows: list[dict[str, str]] = []
    seen: set[str] = set()
    for p in paths:
        path = Path(p)
        mine: set[str] = set()
        for r in _read_csv(path, required):
            if r.get("run_id"):
                if r["run_id"] in seen:
                    continue
                mine.add(r["run_id"])
            rows.append({**r, "_source": str(path)})
        seen |= mine
    return rows


def _read_csv(path: Path, required: Sequence[str]) -> list[dict[str, str]]:
    accepted = f"accepted: a results CSV written by `python -m bench`, e.g. results/{path.name or 'runs.csv'}"
    if path.is_dir():
        raise ReadError(f"csv={path}: is a folder ({accepted})")
    try:
        scan = scan_csv(path.read_bytes())  # read-only: a reader never changes a CSV
    except FileNotFoundError:
        raise ReadError(f"csv={path}: no such file ({accepted}; `make bench` writes one)") from None
    except UnicodeDecodeError:
        raise ReadError(f"csv={path}: not UTF-8 text ({accepted})") from None
    except OSError as e:
        raise ReadError(f"csv={path}: cannot read it: {e.strerror} ({accepted})") from None
    if not scan.header:
        raise ReadError(f"csv={path}: empty file ({accepted})")
    missing = [c for c in required if c not in scan.header]
    if missing:
        shown = ", ".join(missing[:5]) + (f" and {len(missing) - 5} more" if len(missing) > 5 else "")
        raise ReadError(f"csv={path}: not a bench results CSV, its header lacks {shown} ({accepted})")
    check_header(f"csv={path}", scan)
    rows = [as_shown(scan.header, record) for record in scan.records]
    rows = [_counted(path, r) for r in rows]
    for first, _, why in scan.damaged:
        rows.append({"status": DAMAGED, "error": f"{path.name} line {first}: row not whole ({why})"})
    return rows


# The shape columns the report sections group and sort by as whole numbers; a row with another value in one
# (edited, or written by something else) is damaged, listed as such, never a traceback in one section
COUNTS = ("batch_size", "seq_len", "num_layers", "hidden_size", "grad_accum")


def _counted(path: Path, row: dict[str, str]) -> dict[str, str]:
    bad = [c for c in COUNTS if row.get(c) and not (row[c].isascii() and row[c].isdigit())]
    if not bad:
        return row
    cells = ", ".join(f"{c}={row[c][:40]!r}" for c in bad)
    return {"status": DAMAGED, "error": f"{path.name} run {row.get('run_id', '')[:80]!r}: {cells} not a whole number"}


def is_run_id(run_id: str) -> bool:
    """Whether it can name a trial: a run_id names its files (history/<run_id>.json, configs/), so it is a file
    name, never a path."""
    return bool(run_id) and run_id not in (".", "..") and Path(run_id).name == run_id and "\\" not in run_id


def read_history(row: dict) -> dict | None:
    """The trial's per-step series (the model scenario's history/<run_id>.json beside its CSV), or None when
    absent or unreadable (a report from a CSV copied without its folder still builds, without training curves)."""
    run_id, source = row.get("run_id", ""), row.get("_source")
    if not source or not is_run_id(run_id):
        return None
    try:
        history = json.loads((Path(source).parent / "history" / f"{run_id}.json").read_text())
    except (OSError, ValueError):
        return None
    return history if isinstance(history, dict) else None
