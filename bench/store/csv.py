"""Where results go: the results CSVs, the record of truth (the report reads them; W&B runs, bench/store/wandb.py,
are a view on the same numbers). A row is a flat dict whose keys are a schema's columns; each scenario declares
its own (bench/scenarios/<name>/columns.py). Reading them back is bench/store/read.py.
"""

from __future__ import annotations

import csv
import io
import os
import re
import shutil
import warnings
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any

import filelock

from bench.errors import ConfigError


class SchemaError(ValueError):
    """A row or a results file does not match its schema; the message is one line naming what differs."""


# ------------------------------------------------------------------------------------------------------ CSV


class CsvSink:
    """Appends one row per trial to a CSV file, safely from several processes at once. `columns`: the file's
    schema (its scenario's columns.py).

    Each append holds an inter-process lock (`path + ".lock"`, flock-based, so the kernel releases it if the
    holder dies) and is one os.write of the whole encoded row on an O_APPEND descriptor, then fsync: a crash
    leaves the row either absent or whole. The header is written only into a new or empty file; existing rows
    are never rewritten.

    Rows that are not whole (a last row cut off mid-write by another tool or a full disk, a line with the wrong
    number of cells) are set aside into a side file before the append (set_aside_damaged): a new row never
    becomes part of a damaged one.

    An existing file written under another schema: when its header is an earlier version of this one (our
    columns less some added since, in our order: earlier_schema), it is widened to the current header before the
    row is appended (the rows already there keep their values, moved by column name, and get empty cells for the
    new columns; the file is replaced atomically). Otherwise rows are appended under the file's own header as long as
    it has a column for every value the row sets (values the file has no column for and that are empty are
    dropped, its extra columns stay empty); if not, SchemaError names the file and the missing columns: start a
    new results file rather than mix schemas in one.
    """

    def __init__(self, path: str | os.PathLike[str], columns: Sequence[str]):
        self.path = Path(path)
        self.columns = tuple(columns)
        self._lock = filelock.FileLock(str(self.path) + ".lock")

    def write(self, row: Mapping[str, Any]) -> None:
        unknown = [k for k in row if k not in self.columns]
        if unknown:
            raise SchemaError(
                f"result row has columns not in {self.path.name}'s schema: {', '.join(map(str, unknown))} "
                "(add them to its scenario's columns.py)"
            )
        self.path.parent.mkdir(parents=True, exist_ok=True)
        with self._lock:
            note = set_aside_damaged(self.path)
            if note:
                warnings.warn(note, RuntimeWarning, stacklevel=2)
            self._widen_header(row)
            fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
            size = os.fstat(fd).st_size
            try:
                data = self._encode(row, fd)
                while data:  # a regular-file write is whole in practice; if not, we still hold the lock
                    data = data[os.write(fd, data) :]
                os.fsync(fd)
            except OSError as e:
                os.ftruncate(fd, size)  # a full disk (or a file-size limit) mid-row: the row is absent, not half
                raise OSError(e.errno, e.strerror, str(self.path)) from None
            finally:
                os.close(fd)

    def _widen_header(self, row: Mapping[str, Any]) -> None:
        """An earlier version of this schema (earlier_schema) gets our header, if the row needs it."""
        if not self.path.exists() or self.path.stat().st_size == 0:
            return
        header, _ = _read_header(self.path)
        if header == list(self.columns) or not earlier_schema(header, self.columns):
            return
        if all(_cell(row.get(c)) == "" for c in self.columns if c not in header):
            return
        # every row's cells moved to their column's place, empty cells for the new columns (a row with fewer cells
        # than its header is one that was cut off: scan_csv sets those aside first)
        records = scan_csv(self.path.read_bytes()).records
        where = {c: i for i, c in enumerate(header)}
        cells = lambda rec: [rec[where[c]] if where.get(c, len(rec)) < len(rec) else "" for c in self.columns]
        body = b"".join(_csv_line(cells(record)) for record in records)
        tmp = self.path.with_name(f".{self.path.name}.widen-{os.getpid()}")
        try:
            with open(tmp, "wb") as f:
                f.write(_csv_line(self.columns) + body)
                f.flush()
                os.fsync(f.fileno())
            os.chmod(tmp, self.path.stat().st_mode & 0o777)
            os.replace(tmp, self.path)  # atomic: a reader sees the old file or the widened one
        finally:
            tmp.unlink(missing_ok=True)

    def _encode(self, row: Mapping[str, Any], fd: int) -> bytes:
        if os.fstat(fd).st_size == 0:
            return _csv_line(self.columns) + _csv_line(_cell(row.get(c)) for c in self.columns)
        header, ends_with_newline = _read_header(self.path)
        if header != list(self.columns):
            missing = [k for k, v in row.items() if k not in header and _cell(v) != ""]
            if missing:
                raise SchemaError(
                    f"{self.path}: existing header is another schema and lacks {', '.join(missing)}; "
                    "move the file aside or write to a new results file"
                )
        # A file whose last line was cut off (edited by hand, copied mid-write) must not swallow our row.
        lead = b"" if ends_with_newline else b"\n"
        return lead + _csv_line(_cell(row.get(c)) for c in header)


def _cell(v: Any) -> str:
    if v is None:
        return ""
    if isinstance(v, float):
        return repr(v)  # shortest string that round-trips the float exactly
    return escaped(str(v)) if isinstance(v, str) else str(v)


# OWASP's CSV-injection advice: a spreadsheet evaluates a cell that starts with one of these (=1+2, @SUM(...),
# -2+3 or a tab then =...), so a text cell starting with one is written after a single quote, which the
# spreadsheet shows as text. Numbers (-1.5, +3, 1e-5) are cells of their own kind and written as they are.
FORMULA_START = ("=", "+", "-", "@", "\t", "\r")


def _formula_like(text: str) -> bool:
    """Text that starts, after any quotes, like a formula and is not a number."""
    bare = text.lstrip("'")
    if not bare.startswith(FORMULA_START):
        return False
    try:
        float(bare)
    except ValueError:
        return True
    return False


def escaped(text: str) -> str:
    """A text cell as written: a quote before one that reads as a formula. Text already starting with quotes
    before a formula gets one more, so that reading back (text_cell) removes exactly the one written."""
    return "'" + text if _formula_like(text) else text


def text_cell(cell: str) -> str:
    """A cell as it was given to the writer: the quote `escaped` put before a formula-like text taken off."""
    return cell[1:] if cell.startswith("'") and _formula_like(cell) else cell


def _csv_line(cells: Iterable[str]) -> bytes:
    cells = list(cells)
    # csv quotes a cell holding "\n" (the line terminator) but not a bare "\r", which a strict reader then refuses
    # as a damaged row: a line with one is written with every cell quoted
    quoting = csv.QUOTE_ALL if any("\r" in c for c in cells) else csv.QUOTE_MINIMAL
    buf = io.StringIO()
    csv.writer(buf, lineterminator="\n", quoting=quoting).writerow(cells)
    return buf.getvalue().encode("utf-8")


def _read_header(path: Path) -> tuple[list[str], bool]:
    """(the file's header, whether the file ends with a newline)."""
    with open(path, "rb") as f:
        first = f.readline()
        f.seek(-1, os.SEEK_END)
        last = f.read(1)
    header = next(csv.reader([first.decode("utf-8").rstrip("\r\n")]), [])
    return header, last == b"\n"


# ----------------------------------------------------------------------------------------- integrity, up front


class ResultsFileError(ConfigError):
    """A results file or folder that cannot take this suite's rows; the message is one line: the file, what is
    wrong with it, what would be accepted."""


@dataclass
class CsvScan:
    """What a results CSV holds: its header, how many whole rows, and the rows that are not whole."""

    header: list[str]
    records: list[list[str]]  # the whole rows under the header, in file order
    damaged: list[tuple[int, int, str]]  # (first line, end line, why) of each row that is not whole, 1-based lines
    lines: list[str]  # the file's physical lines (newline kept), to cut the damaged ones out by number

    @property
    def rows(self) -> int:
        return len(self.records)

    @property
    def damaged_lines(self) -> set[int]:
        return {n for first, end, _ in self.damaged for n in range(first, end)}


def scan_csv(data: bytes) -> CsvScan:
    """Parse a results CSV strictly, record by record, noting each that is not whole: a cell count other than the
    header's, a quote left open (a row cut off inside a quoted cell, which then swallows the lines after it), a
    last record cut off before its cells. A record that is not whole costs only its first line: parsing resumes on
    the next, so whole rows written after a cut-off one are found again. UnicodeDecodeError for non-UTF-8 bytes."""
    text = data.decode("utf-8")
    lines = re.findall(r"[^\n]*\n|[^\n]+$", text)
    header = next(csv.reader(lines[:1]), []) if lines else []
    records, damaged, i = [], [], 1
    while i < len(lines):
        reader = csv.reader(iter(lines[i:]), strict=True)
        try:
            record, why = next(reader), ""
        except StopIteration:
            break
        except csv.Error as e:
            record, why = None, f"not valid CSV ({e})"
        if record is not None and record and len(record) != len(header):
            why = f"{len(record)} cells where the header has {len(header)}"
        if why:
            damaged.append((i + 1, i + 2, why))  # its first line only: the cut is there
            i += 1
            continue
        if record:  # a blank line is no row
            records.append(record)
        i += reader.line_num
    return CsvScan(header, records, damaged, lines)


def set_aside_damaged(path: Path) -> str | None:
    """Move the rows of `path` that are not whole into `<name>.damaged-<time>` beside it, byte for byte, and rewrite
    the file without them (atomically); the caller holds the file's lock. Returns a one-line note of what was set
    aside, or None when every row is whole."""
    if not path.exists():
        return None
    scan = scan_csv(path.read_bytes())
    if not scan.damaged:
        return None
    cut = scan.damaged_lines
    kept = "".join(line for n, line in enumerate(scan.lines, start=1) if n not in cut)
    if kept and not kept.endswith("\n"):
        kept += "\n"
    side = path.with_name(f"{path.name}.damaged-{datetime.now():%Y%m%d-%H%M%S}-{os.getpid()}")
    side.write_text("".join(line for n, line in enumerate(scan.lines, start=1) if n in cut), encoding="utf-8")
    tmp = path.with_name(f".{path.name}.repair-{os.getpid()}")
    try:
        tmp.write_text(kept, encoding="utf-8")
        os.chmod(tmp, path.stat().st_mode & 0o777)
        os.replace(tmp, path)  # a reader sees the damaged file or the repaired one, never half of each
    finally:
        tmp.unlink(missing_ok=True)
    where = ", ".join(f"line {a}" if b == a + 1 else f"lines {a}-{b - 1}" for a, b, _ in scan.damaged[:3])
    more = f" and {len(scan.damaged) - 3} more" if len(scan.damaged) > 3 else ""
    return (
        f"{path}: {len(scan.damaged)} row(s) not whole ({where}{more}: {scan.damaged[0][2]}) set aside in "
        f"{side.name}; the {scan.rows} whole row(s) are kept"
    )


MIN_FREE_MB = 1.0  # what a trial writes beside its results: its row (~4 KiB), its log, its history and config


def check_free_space(folder: Path) -> None:
    """ResultsFileError (one line) when the filesystem of `folder` (or of its nearest existing parent) has less
    room than a trial's row, log, history and config need."""
    existing = next(p for p in (folder, *folder.parents) if p.exists())
    free = shutil.disk_usage(existing).free / 2**20
    if free < MIN_FREE_MB:
        raise ResultsFileError(
            f"results_dir={folder}: {free:.2f} MiB free on its filesystem; a trial needs "
            f"{MIN_FREE_MB:g} MiB for its row, log and history; accepted: a folder with room"
        )


def earlier_schema(header: Sequence[str], columns: Sequence[str]) -> bool:
    """Whether `header` is an earlier version of the schema `columns`: our columns less some added since, in our
    order. Columns are added at the end, except "compile" (e59713b), added among the others: a file written before
    it lacks it in the middle."""
    ours = iter(columns)
    return all(c in ours for c in header)  # `in` advances the iterator: a subsequence test


def unwritable(folder: Path) -> Path | None:
    """What stops `folder` being written or created (itself, or its nearest parent that exists), or None."""
    existing = next(p for p in (folder, *folder.parents) if p.exists())
    return None if existing.is_dir() and os.access(existing, os.W_OK | os.X_OK) else existing


def check_folders(results_dir: Path, names: Sequence[str]) -> None:
    """Before any trial runs: can the folders a trial writes under `results_dir` (its history, saved config, log)
    be written? Raises ResultsFileError (one line) for the first that is a file or cannot be written; a folder not
    there yet is created by the trial where its parent can be written."""
    for name in names:
        folder = results_dir / name
        if folder.exists() and not folder.is_dir():
            raise ResultsFileError(f"results_dir={results_dir}: its {name}/ is a file; accepted: a folder (or none)")
        if (existing := unwritable(folder)) is not None:
            raise ResultsFileError(
                f"results_dir={results_dir}: its {name}/ folder cannot be written ({existing}: "
                "permission denied); accepted: a results folder you can write"
            )


def check_results_file(path: Path, columns: Sequence[str]) -> str | None:
    """Before any trial runs: can `path` (a results CSV) take rows of `columns`? Raises ResultsFileError (one line)
    when it cannot: its folder is a file or cannot be written, the file cannot be read or written, is not UTF-8,
    or has another header than this schema (or an earlier version of it). Rows that are not whole are set aside
    (set_aside_damaged, under the file's lock); returns that note, or None."""
    folder = path.parent
    if folder.exists() and not folder.is_dir():
        raise ResultsFileError(f"results_dir={folder}: is a file; accepted: a folder (created if missing)")
    if (existing := unwritable(folder)) is not None:
        raise ResultsFileError(
            f"results_dir={folder}: cannot be written ({existing}: permission denied); accepted: a folder you can write"
        )
    check_free_space(folder)
    if not path.exists():
        return None
    accepted = f"accepted: a {path.name} written by bench, or another results_dir (move this file aside)"
    if not path.is_file():
        raise ResultsFileError(f"{path}: not a regular file; {accepted}")
    if not os.access(path, os.R_OK | os.W_OK):
        raise ResultsFileError(f"{path}: cannot be {'written' if os.access(path, os.R_OK) else 'read'}; {accepted}")
    data = path.read_bytes()
    try:
        header = scan_csv(data).header
    except UnicodeDecodeError as e:
        raise ResultsFileError(f"{path}: not UTF-8 text (byte {e.start}); {accepted}") from None
    if header and not earlier_schema(header, columns):
        other = [c for c in header if c not in columns] or [c for c in columns[: len(header)] if c not in header]
        shown = ", ".join(other[:3]) + (f" and {len(other) - 3} more" if len(other) > 3 else "")
        raise ResultsFileError(f"{path}: its header is not bench's {path.name} schema (differs at {shown}); {accepted}")
    with filelock.FileLock(str(path) + ".lock"):
        return set_aside_damaged(path)
