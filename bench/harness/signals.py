"""Signals and failures, as a process that runs trials sees them: SIGINT/SIGTERM (and SIGHUP) raised as
Interrupted so that clean-up runs, an exception turned into a trial's status, and the fault injection the
failure tests use."""

from __future__ import annotations

import contextlib
import ctypes
import os
import signal
import threading


class Interrupted(BaseException):
    """SIGINT or SIGTERM reached a process that runs trials: raised in its main thread, so that the running trial
    is stopped and its temporary files removed on the way out (SIGTERM's default would end the process at once and
    leave the trial running). A BaseException, like KeyboardInterrupt: no `except Exception` swallows it."""

    def __init__(self, signum: int):
        super().__init__(signal.Signals(signum).name)
        self.signum = signum

    @property
    def exit_code(self) -> int:
        return 128 + self.signum  # the shell's convention: 130 for SIGINT, 143 for SIGTERM


@contextlib.contextmanager
def interrupts_raise(first=None):
    """Within: SIGINT and SIGTERM raise Interrupted (main thread only; elsewhere a no-op), after calling
    `first()` if given, with both signals ignored meanwhile (a second Ctrl-C must not cut the clean-up short).
    Handlers restored after."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def handler(signum, frame):
        if first is not None:
            signal.signal(signal.SIGINT, signal.SIG_IGN)
            signal.signal(signal.SIGTERM, signal.SIG_IGN)
            first()
        raise Interrupted(signum)

    previous = {s: signal.signal(s, handler) for s in (signal.SIGINT, signal.SIGTERM)}
    try:
        yield
    finally:
        for s, h in previous.items():
            signal.signal(s, h)


def classify(e: BaseException) -> str:
    """A trial's exception as its status: oom (CUDA OOM, XLA RESOURCE_EXHAUSTED, MemoryError) or error."""
    text = f"{type(e).__name__}: {e}"
    if isinstance(e, MemoryError) or "OutOfMemoryError" in type(e).__name__:
        return "oom"
    if "RESOURCE_EXHAUSTED" in text or "out of memory" in text.lower():
        return "oom"
    return "error"


def error_line(e: BaseException, limit: int = 500) -> str:
    """An exception as one line for a CSV cell: its type and its message, whitespace folded, cut at `limit`."""
    return f"{type(e).__name__}: {' '.join(str(e).split())[:limit]}"


def maybe_inject_fault(where: str) -> None:
    """BENCH_INJECT_FAULT=<where>:<segv|abort|exit|oom> makes the trial fail for real at `where`; the tests use
    it to check that every failure is recorded with the right status and the sweep goes on."""
    spec = os.environ.get("BENCH_INJECT_FAULT", "")
    if not spec.startswith(where + ":"):
        return
    kind = spec.split(":", 1)[1]
    if kind == "segv":
        ctypes.string_at(0)  # a real segmentation fault
    elif kind == "abort":
        os.abort()
    elif kind == "exit":
        os._exit(3)
    elif kind == "oom":
        raise MemoryError("injected")
