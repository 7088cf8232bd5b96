"""Signals and failures, as a process that runs trials sees them: SIGINT/SIGTERM (and SIGHUP) raised as
Interrupted so that clean-up runs, an exception turned into a trial's status, and the fault injection the
failure tests use."""

from __future__ import annotations

import contextlib
import ctypes
import os
import signal
import threading

STOPS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)  # a closed terminal or a dropped ssh session is a SIGHUP


class Interrupted(BaseException):
    """SIGINT, SIGTERM or SIGHUP reached a process that runs trials: raised in its main thread, so that the
    running trial is stopped and its temporary files removed on the way out (their default would end the process
    at once and leave the trial running). A BaseException, like KeyboardInterrupt: no `except Exception` (Hydra's
    own included) swallows it."""

    def __init__(self, signum: int):
        super().__init__(signal.Signals(signum).name)
        self.signum = signum

    @property
    def exit_code(self) -> int:
        return 128 + self.signum  # the shell's convention: 130 for SIGINT, 143 for SIGTERM, 129 for SIGHUP


class Abort(BaseException):
    """A command must stop now with one line and an exit code (a full disk while recording): a BaseException, so
    that no `except Exception` on the way up (Hydra's job runner prints a traceback for those) turns it into a
    traceback; bench.harness.command prints it."""

    def __init__(self, line: str, code: int = 1):
        super().__init__(line)
        self.line, self.code = line, code


_held: list[int] | None = None  # the stop signals that arrived within hold_interrupts, else None


@contextlib.contextmanager
def hold_interrupts():
    """Within: a stop signal is held, not raised, and delivered again on the way out, so the handler raises it
    there. For starting a child: Interrupted raised inside subprocess.Popen, between its fork and its return,
    leaves a child its parent has no handle on, which runs on after the parent has stopped what it knew of."""
    global _held
    if _held is not None or threading.current_thread() is not threading.main_thread():
        yield
        return
    _held = []
    try:
        yield
    finally:
        held, _held = _held, None
        if held:
            os.kill(os.getpid(), held[0])  # the handler runs at the next bytecode: right after this block


@contextlib.contextmanager
def interrupts_raise(first=None):
    """Within: SIGINT, SIGTERM and SIGHUP raise Interrupted (main thread only; elsewhere a no-op), after calling
    `first()` if given, with all three ignored meanwhile (a second Ctrl-C must not cut the clean-up short).
    Handlers restored after."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def handler(signum, frame):
        if _held is not None:
            _held.append(signum)
            return
        if first is not None:
            for s in STOPS:
                signal.signal(s, signal.SIG_IGN)
            first()
        raise Interrupted(signum)

    previous = {s: signal.signal(s, handler) for s in STOPS}
    try:
        yield
    finally:
        for s, h in previous.items():
            signal.signal(s, h)


def classify(e: BaseException) -> str:
    """A trial's exception as its status: its own (an exception that knows it: `status`, e.g. diverged), oom
    (CUDA OOM, XLA RESOURCE_EXHAUSTED, MemoryError) or error."""
    if isinstance(getattr(e, "status", None), str):
        return e.status
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
