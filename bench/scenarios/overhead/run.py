"""What the harness costs: the suite's backprop trial against a plain training loop, per framework, interleaved.

    python -m bench overhead                          # MiniLM-L6, B8 T128, SGD, both frameworks, 3 rounds
    python -m bench overhead --framework jax --rounds 5 --steps 10 --model tiny
    -> a table on stdout, one row per framework appended to results/overhead.csv (read by `bench targets`)

The plain loop is what a user would write without the suite, in a fresh process with the user's own environment,
around the very model the suite trains (its builders, weights and batches, on the device the suite's
device=auto takes): bench/<framework>_impl/plain.py, run by bench/scenarios/overhead/plain.py. Both warm up as
many steps, time each step the same way (perf_counter around the step, until the device is done) and report the
median. The suite's side is a whole trial through `python -m bench`
(runner, spawned child, memory trackers, parent's watchdog), its per-step times read back from its history.

Rounds alternate which side goes first, so a drift of the host (turbo, another job) falls on both; the ratio is
the median of the suite's medians over the median of the plain loop's. Target: <= 1.02 (OVERHEAD_LIMIT, in
bench/scenarios/model/report/targets.py).
"""

from __future__ import annotations

import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from bench.config import available
from bench.data import MAX_SEQ_LEN
from bench.errors import ConfigError
from bench.harness.command import OneLineParser, run
from bench.harness.launch import child_env, stop_descendants
from bench.harness.signals import Interrupted
from bench.report.tables import fixed_width
from bench.scenarios.model.report.targets import OVERHEAD_LIMIT
from bench.scenarios.overhead.columns import COLUMNS
from bench.spec import FRAMEWORKS
from bench.store.csv import CsvSink, check_results_file
from bench.store.read import read_history, read_rows

PLAIN = "bench.scenarios.overhead.plain"  # the plain loop's process (python -m PLAIN ...)


# ---------------------------------------------------------------------------------------------------------------
# the two sides, each in a fresh process


def side(cmd: list[str], what: str) -> subprocess.CompletedProcess:
    """Run one side in its own process; an interrupt that reached it first (it exits 130 or 143) is this
    command's interrupt, any other failure a MeasurementError naming the side and the end of its output."""
    out = subprocess.run(cmd, capture_output=True, text=True, env={**os.environ, **child_env()})
    if out.returncode in (128 + signal.SIGINT, 128 + signal.SIGTERM):
        raise Interrupted(out.returncode - 128)
    if out.returncode != 0:
        tail = " | ".join((out.stdout + out.stderr).strip().splitlines()[-3:])
        raise MeasurementError(f"{what} failed (exit code {out.returncode}): {tail}")
    return out


class MeasurementError(ConfigError):
    """A side that could not be measured: one line, exit 2 (bench/harness/command.py)."""


def run_plain(framework: str, a) -> list[float]:
    cmd = [
        sys.executable,
        "-m",
        PLAIN,
        framework,
        a.model,
        str(a.batch_size),
        str(a.seq_len),
        str(a.steps),
        str(a.warmup),
        str(a.lr),
        str(a.seed),
    ]
    out = side(cmd, f"the plain {framework} loop")
    return json.loads(out.stdout.strip().splitlines()[-1])


def run_suite(framework: str, a, scratch: Path) -> tuple[list[float], dict]:
    """One backprop trial through the suite's own command line: its per-step times (the trial's history) and its
    row. Plain SGD, as the plain loop's."""
    results = scratch / f"{framework}_{time.monotonic_ns()}"
    cmd = [
        sys.executable,
        "-m",
        "bench",
        f"framework={framework}",
        "case=backprop",
        f"model={a.model}",
        f"batch_size={a.batch_size}",
        f"seq_len={a.seq_len}",
        f"steps={a.steps}",
        f"warmup_steps={a.warmup}",
        "optimizer=sgd",
        f"optimizer.lr={a.lr}",
        "optimizer.momentum=0",
        "optimizer.weight_decay=0",
        f"seed={a.seed}",
        f"results_dir={results}",
        "logger.mode=disabled",
    ]
    side(cmd, f"the suite's {framework} trial")
    rows = read_rows(results / "runs.csv")
    history = read_history({**rows[-1], "_source": str(results / "runs.csv")}) if rows else None
    if not history or rows[-1]["status"] != "ok":
        raise MeasurementError(f"the suite's {framework} trial recorded no ok row with a history in {results}")
    return history["step_time_s"], rows[-1]


def measure(framework: str, a, scratch: Path) -> dict:
    suite, plain, row = [], [], {}
    for r in range(a.rounds):
        sides = [("suite", suite), ("plain", plain)]
        for name, acc in sides if r % 2 == 0 else sides[::-1]:
            if name == "suite":
                times, row = run_suite(framework, a, scratch)
            else:
                times = run_plain(framework, a)
            acc.append(statistics.median(times))
            print(f"  {framework} round {r + 1}/{a.rounds} {name:5s} step {acc[-1] * 1e3:7.1f} ms", flush=True)
    s, p = statistics.median(suite), statistics.median(plain)
    return {
        "framework": framework,
        "model": a.model,
        "batch_size": a.batch_size,
        "seq_len": a.seq_len,
        "optimizer": "sgd",
        "lr": a.lr,
        "steps": a.steps,
        "warmup_steps": a.warmup,
        "rounds": a.rounds,
        "suite_step_s": s,
        "plain_step_s": p,
        "ratio": s / p,
        "suite_steps_s": " ".join(f"{x:.4f}" for x in suite),
        "plain_steps_s": " ".join(f"{x:.4f}" for x in plain),
        "device": row["device"],
        "device_name": row["device_name"],
        "timestamp": time.strftime("%Y-%m-%dT%H:%M:%S"),
    }


def table(rows: list[dict]) -> str:
    head = ["framework", "model", "shape", "suite step", "plain step", "ratio", "target"]
    ms = lambda x: f"{float(x) * 1e3:.1f} ms"  # noqa: E731
    cells = [
        [
            r["framework"],
            r["model"],
            f"B{r['batch_size']} T{r['seq_len']}",
            ms(r["suite_step_s"]),
            ms(r["plain_step_s"]),
            f"{float(r['ratio']):.3f}x",
            "met" if float(r["ratio"]) <= OVERHEAD_LIMIT else "MISSED",
        ]
        for r in rows
    ]
    return fixed_width(head, cells)


# Each count's upper bound: far past what a comparison of step times needs (the defaults are 8, 128, 10, 2, 3), and
# short of a typo (1e9) that would run until killed. seq_len: the data's own cap (a model's is checked in its trial).
LIMITS = {"batch_size": 4096, "seq_len": MAX_SEQ_LEN, "steps": 10_000, "warmup": 1_000, "rounds": 100}


def _count(name: str, default: int, what: str = "") -> dict:
    """add_argument's keywords for a count in [1, LIMITS[name]], the bound shown in --help."""
    text = f"{what}; " if what else ""
    return dict(type=int, default=default, help=f"{text}an integer in [1, {LIMITS[name]:,}] (default {default})")


def parse(argv: list[str] | None):
    p = OneLineParser("overhead", "python -m bench overhead [options]", description=__doc__.splitlines()[0])
    p.add_argument("--framework", default="torch,jax", help="torch, jax or torch,jax (default both)")
    p.add_argument("--model", default="minilm_l6", help="a conf/model preset (default minilm_l6)")
    p.add_argument("--batch-size", **_count("batch_size", 8))
    p.add_argument("--seq-len", **_count("seq_len", 128))
    p.add_argument("--steps", **_count("steps", 10, "timed steps per run"))
    p.add_argument("--warmup", **_count("warmup", 2, "untimed steps first (the first compiles)"))
    p.add_argument("--rounds", **_count("rounds", 3, "suite/plain pairs per framework"))
    p.add_argument("--lr", type=float, default=1e-4)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", default="results/overhead.csv", help="CSV the rows are appended to")
    return p.parse_args(argv)


def validate(a) -> list[str]:
    """The frameworks to measure; ConfigError (one line) for a bad option or an --out that cannot take the rows,
    before any process starts."""
    frameworks = [f for f in a.framework.split(",") if f]
    if not frameworks or any(f not in FRAMEWORKS for f in frameworks):
        raise ConfigError(f"--framework={a.framework}: accepted torch, jax or torch,jax")
    for name, high in LIMITS.items():
        if not 1 <= getattr(a, name) <= high:
            raise ConfigError(f"--{name.replace('_', '-')}={getattr(a, name)}: accepted an integer in [1, {high:,}]")
    if a.model not in available("model"):
        raise ConfigError(f"--model={a.model}: accepted {', '.join(available('model'))}")
    check_results_file(Path(a.out), COLUMNS)
    return frameworks


def main(argv: list[str] | None = None) -> int:
    """`python -m bench overhead` (make perf)."""
    a = parse(argv)
    rows: list[dict] = []

    def body() -> int:
        frameworks = validate(a)
        with tempfile.TemporaryDirectory(prefix="bench_overhead_") as scratch:
            for fw in frameworks:
                rows.append(measure(fw, a, Path(scratch)))
                CsvSink(a.out, COLUMNS).write(rows[-1])
        print(table(rows))
        print(f"(suite / plain loop, medians of {a.rounds} interleaved runs of {a.steps} steps; appended to {a.out})")
        return 0

    return run(
        "overhead",
        body,
        first=stop_descendants,
        interrupted=f"the rounds of the framework being measured are discarded; finished frameworks are in {a.out}",
    )
