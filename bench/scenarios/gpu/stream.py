"""A gpu-check streamed into the device tool's $OUT as it goes, so that a call killed at any second brings back what
was measured until then: the device tool returns only what lies in $OUT when the command ends, killed or not.

    console.log        the check's own output, line by line (the steps' output is in each <step>/step.log)
    gpu_check.tar.gz   the results folder, rewritten whenever a row or a step's record lands (looked for every
                       POLL_S), at least every ARCHIVE_EVERY_S (the logs of a trial still running), and at the end;
                       replaced atomically, so a kill while packing leaves the last whole one
    summary.md         the summary as it stood after the last step that ended

The device tool brings back at most 8 files, each under ARCHIVE_LIMIT_MB, no deeper than two folders: three files,
at the top.
"""

from __future__ import annotations

import io
import os
import sys
import tarfile
import threading
import time
from pathlib import Path

ARCHIVE_NAME = "gpu_check.tar.gz"
CONSOLE_NAME = "console.log"
SUMMARY_NAME = "summary.md"
ARCHIVE_LIMIT_MB = 16  # the largest file the device tool brings back (/work/.library/device/README.md: Limits)
POLL_S = 2  # a row that lands is in the archive within this (plus a pack: well under a second for a few MiB)
ARCHIVE_EVERY_S = 60  # the archive is rewritten at least this often, rows or not: the running step's logs
# What a pack over the limit keeps: the rows, the records, the summary and the report's text, each step's log;
# it leaves out each trial's own log and history and the plots (traces are never written: profile=false).
ESSENTIAL = (".csv", ".json", ".md", ".xml", "step.log")


def files_of(out: Path, slim: bool) -> list[Path]:
    return sorted(p for p in out.rglob("*") if p.is_file() and (not slim or p.name.endswith(ESSENTIAL)))


def pack(out: Path, path: Path, slim: bool = False) -> float:
    """`out` into the .tar.gz `path`, as folder out.name; returns its MiB. Written beside `path` and renamed over
    it, so a reader (or a kill) sees the last whole archive. Each file is read whole before it is added: a CSV being
    appended to goes in up to its last whole line, and a file that vanishes meanwhile is left out."""
    part = path.with_name(path.name + ".part")
    with tarfile.open(part, "w:gz") as tar:
        for file in files_of(out, slim):
            try:
                data, mtime = file.read_bytes(), file.stat().st_mtime
            except OSError:  # replaced or removed since it was listed: the next pack has it
                continue
            if file.suffix == ".csv":
                data = data[: data.rfind(b"\n") + 1]
            info = tarfile.TarInfo(f"{out.name}/{file.relative_to(out).as_posix()}")
            info.size, info.mtime = len(data), mtime
            tar.addfile(info, io.BytesIO(data))
    os.replace(part, path)
    return path.stat().st_size / 2**20


def archive(out: Path, path: Path) -> str:
    """pack(), and again without each trial's log, history and plots when that is over ARCHIVE_LIMIT_MB (the device
    tool would not bring it back); one line that says what was packed."""
    path.parent.mkdir(parents=True, exist_ok=True)
    size = pack(out, path)
    if size <= ARCHIVE_LIMIT_MB:
        return f"{out} packed into {path}, {size:.1f} MiB"
    whole, size = size, pack(out, path, slim=True)
    over = (
        f"; still over {ARCHIVE_LIMIT_MB} MiB: the device tool will not bring it back"
        if size > ARCHIVE_LIMIT_MB
        else ""
    )
    return (
        f"{out} packed into {path}, {size:.1f} MiB without the trials' logs, histories and plots (with them "
        f"{whole:.1f} MiB, over the {ARCHIVE_LIMIT_MB} MiB the device tool brings back){over}"
    )


class Tee(io.TextIOBase):
    """A text stream that writes to `stream` and to the file `log`, each write flushed: what a kill leaves."""

    def __init__(self, stream, log):
        super().__init__()
        self.stream, self.log = stream, log

    def write(self, s: str) -> int:
        self.stream.write(s)
        self.log.write(s)
        self.log.flush()
        return len(s)

    def flush(self) -> None:
        self.stream.flush()
        self.log.flush()

    def fileno(self) -> int:  # what writes to the descriptor itself reaches the console, not the log
        return self.stream.fileno()


class Stream:
    """Streams the results folder `out` into `folder` (the device tool's $OUT) from start() to close()."""

    def __init__(self, out: Path, folder: Path, poll_s: float = POLL_S, every_s: float = ARCHIVE_EVERY_S):
        self.out, self.folder, self.poll_s, self.every_s = out, folder, poll_s, every_s
        self.path = folder / ARCHIVE_NAME
        self.lock, self.stopped = threading.Lock(), threading.Event()
        self.seen: tuple = ()
        self.packed_at = -float("inf")
        self.thread = threading.Thread(target=self.loop, name="gpu-check stream", daemon=True)
        self.streams = (sys.stdout, sys.stderr)
        self.log = None

    def start(self) -> Stream:
        self.folder.mkdir(parents=True, exist_ok=True)
        self.log = open(self.folder / CONSOLE_NAME, "a", encoding="utf-8")  # noqa: SIM115 (closed by close())
        sys.stdout, sys.stderr = Tee(self.streams[0], self.log), Tee(self.streams[1], self.log)
        self.thread.start()
        return self

    def rows(self) -> tuple:
        """What a new pack is due for: each step's rows and records, by size and time."""
        found = [*self.out.glob("*/*.csv"), *self.out.glob("*/step.json")]
        return tuple(sorted((str(p), s.st_size, s.st_mtime_ns) for p in found if (s := p.stat())))

    def loop(self) -> None:
        while not self.stopped.wait(self.poll_s):
            try:
                seen = self.rows()
                if seen != self.seen or time.monotonic() - self.packed_at >= self.every_s:
                    self.refresh(seen)
            except OSError as e:  # a file replaced while listed, a full disk: the next round tries again
                print(f"gpu-check: the streamed archive was not rewritten this time: {e}", file=sys.stderr)

    def refresh(self, seen: tuple | None = None) -> str:
        with self.lock:
            if not self.out.is_dir():
                return ""
            said = archive(self.out, self.path)
            self.seen, self.packed_at = seen if seen is not None else self.rows(), time.monotonic()
            return said

    def step_ended(self) -> None:
        """A step's record and the summary have been written: both go out now, not at the next poll."""
        self.copy_summary()
        self.refresh()

    def copy_summary(self) -> None:
        summary = self.out / SUMMARY_NAME
        if summary.exists():
            (self.folder / SUMMARY_NAME).write_bytes(summary.read_bytes())

    def close(self) -> None:
        """The last pack, with everything; the console back as it was."""
        self.stopped.set()
        if self.thread.is_alive():
            self.thread.join()
        try:
            self.copy_summary()
            print(f"gpu-check: {self.refresh()} (streamed into {self.folder})", flush=True)
        finally:
            sys.stdout, sys.stderr = self.streams
            if self.log is not None:
                self.log.close()
