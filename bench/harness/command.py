"""The one way every command of the suite runs (`python -m bench [COMMAND]`, bench/cli.py): its arguments parsed
with usage errors in one line, bad input in one line with exit 2, an interrupt (SIGINT, SIGTERM, SIGHUP) in one
line with the shell's code (130, 143, 129), a full disk in one line naming the folder and its free space. The
command returns its exit code; nothing is kept in module globals.
"""

from __future__ import annotations

import argparse
import errno
import shutil
import signal
import sys
from collections.abc import Callable
from pathlib import Path

from bench.errors import ConfigError
from bench.harness.launch import remove_orphans
from bench.harness.signals import Abort, Interrupted, interrupts_raise


class OneLineParser(argparse.ArgumentParser):
    """argparse whose usage errors are one line and exit 2, naming the usage (not argparse's usage block)."""

    def __init__(self, name: str, usage_line: str, **kw):
        super().__init__(prog=f"python -m bench {name}", **kw)
        self.name, self.usage_line = name, usage_line

    def error(self, message: str):
        self.exit(2, f"bench {self.name}: error: {message} (usage: {self.usage_line})\n")


def run(
    name: str,
    body: Callable[[], int],
    interrupted: str = "nothing was recorded",
    first: Callable[[], None] | None = None,
) -> int:
    """Run `body` as command `name` and return its exit code. An interrupt prints one line: what the command keeps
    or discards (`interrupted`), and returns 128 + the signal; `first` runs before the interrupt is raised (it
    stops the command's child processes)."""
    prefix = f"bench {name}" if name else "bench"
    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # a file past RLIMIT_FSIZE fails its write (EFBIG), one line
    remove_orphans()  # what launches that died (kill -9) left behind
    try:
        with interrupts_raise(first=first):
            return body()
    except ConfigError as e:
        print(f"{prefix}: error: {e}", file=sys.stderr)
        return 2
    except Abort as e:
        print(f"{prefix}: error: {e.line}", file=sys.stderr)
        return e.code
    except (Interrupted, KeyboardInterrupt) as e:
        signum = e.signum if isinstance(e, Interrupted) else 2
        print(f"{prefix}: interrupted ({Interrupted(signum)}): {interrupted}", file=sys.stderr)
        return 128 + signum
    except OSError as e:
        if e.errno not in DISK_FULL:
            raise
        print(f"{prefix}: error: {disk_full(e)}", file=sys.stderr)
        return 1


DISK_FULL = (errno.ENOSPC, errno.EDQUOT, errno.EFBIG)


def disk_full(e: OSError) -> str:
    """A write that failed for lack of space (or past a file-size limit), as one line: the file, why, its folder's
    free space."""
    where = Path(e.filename).parent if e.filename else Path.cwd()
    while not where.exists() and where != where.parent:
        where = where.parent
    free = shutil.disk_usage(where).free / 2**20
    return (
        f"cannot write {e.filename or 'the results'}: {e.strerror} ({where}: {free:.1f} MiB free); nothing "
        "partial was kept"
    )
