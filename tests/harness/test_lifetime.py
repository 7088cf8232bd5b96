"""A trial never outlives its launcher, a diverged run is never ok, and the results survive a full disk.

Killed outright (SIGKILL) or hung up on (SIGHUP, a closed terminal), the launching process leaves no trial process
behind within seconds, for a single trial, a 2-rank DDP trial and a capacity probe; the temp folder a killed
launch could not remove is gone after the next command. A huge learning rate ends `diverged` in both frameworks,
a NaN one is refused. `bench overhead` (make perf) interrupted ends in one line and 130. A results file that
cannot grow (a file-size limit) gets no partial row and the command one line, no traceback."""

from __future__ import annotations

import os
import resource
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

from bench.store.read import read_rows
from tests.support import bench_here, cmdline, run_here, trials_anywhere, trials_under

REPO = Path(__file__).resolve().parents[2]
TINY = [
    "model=tiny",
    "batch_size=4",
    "seq_len=32",
    "warmup_steps=1",
    "data.num_train=64",
    "data.num_eval=16",
    "logger=none",
]
FOREVER = "steps=1000000"
GONE_WITHIN_S = 10  # the kernel signals the children at once; a loaded CI host takes a moment to reap them


def wait_for(predicate, timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(0.2)
    return predicate()


def start(args: list[str]) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, "-m", "bench", *args],
        cwd=REPO,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )


SURFACES = {
    "trial": [*TINY, FOREVER],
    "ddp": [*TINY, FOREVER, "parallel=ddp", "devices=2", "model.dropout=0"],
    "capacity": [
        "capacity",
        *[a for a in TINY if not a.startswith("batch_size")],
        FOREVER,
        "budget_mb=100000",
        "--max-probes",
        "3",
    ],
}


@pytest.mark.slow
@pytest.mark.parametrize("sig", [signal.SIGKILL, signal.SIGHUP], ids=["SIGKILL", "SIGHUP"])
@pytest.mark.parametrize("surface", SURFACES)
def test_no_trial_outlives_its_launcher(surface, sig, tmp_path):
    proc = start([*SURFACES[surface], f"results_dir={tmp_path}"])
    ranks = 2 if surface == "ddp" else 1
    try:
        assert wait_for(lambda: len(trials_anywhere(proc.pid)) == ranks, 120), proc.stderr.read() if proc.poll() else ""
        os.kill(proc.pid, sig)
        assert wait_for(lambda: not trials_anywhere(proc.pid), GONE_WITHIN_S), [
            cmdline(p) for p in trials_anywhere(proc.pid)
        ]
        proc.wait(timeout=30)
        if sig == signal.SIGHUP:  # handled: the trial stopped, one line, 128 + SIGHUP
            assert proc.returncode == 129 and "interrupted (SIGHUP)" in proc.stderr.read()
        bench_here("targets", str(tmp_path))  # any command of the suite first removes what killed launches left
        assert not list(Path(tempfile.gettempdir()).glob(f"bench-{proc.pid}-*"))  # the next command removed it
    finally:
        for p in trials_anywhere(proc.pid):
            p.kill()
        proc.kill()


@pytest.mark.slow
@pytest.mark.parametrize("framework", ["torch", "jax"])
def test_a_huge_learning_rate_is_diverged_not_ok(framework, tmp_path):
    out = subprocess.run(
        [
            sys.executable,
            "-m",
            "bench",
            *TINY,
            f"framework={framework}",
            "mode=mezo",
            "steps=20",
            "optimizer.lr=1e6",
            f"results_dir={tmp_path}",
        ],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert out.returncode == 0, out.stderr  # a measured outcome, as oom is
    (row,) = read_rows(tmp_path / "runs.csv")
    assert row["status"] == "diverged" and row["diverged_at"] and "loss" in row["error"]
    assert "DIVERGED" in out.stdout and "Traceback" not in out.stderr


def test_a_nan_learning_rate_is_refused(tmp_path):
    out = bench_here(*TINY, "optimizer.lr=nan", results=tmp_path)  # refused before any trial starts
    assert out.returncode == 2 and out.stderr.strip() == "bench: error: optimizer.lr=nan: accepted a finite number > 0"
    assert not (tmp_path / "runs.csv").exists()


@pytest.mark.slow
def test_perf_interrupted_is_one_line_and_130(tmp_path):
    args = [
        "overhead",
        "--model",
        "tiny",
        "--framework",
        "torch",
        "--steps",
        "10000",
        "--rounds",
        "1",
        "--out",
        str(tmp_path / "overhead.csv"),
    ]
    proc = subprocess.Popen(
        [sys.executable, "-m", "bench", *args],
        cwd=REPO,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    try:
        suite_trial = lambda: bool(trials_under(proc.pid))
        assert wait_for(suite_trial, 120)  # the first round's suite side is timing its steps
        os.killpg(proc.pid, signal.SIGINT)  # a terminal's Ctrl-C reaches the whole group
        _, err = proc.communicate(timeout=60)
    finally:
        proc.kill()
    assert proc.returncode == 130, err
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("bench overhead: interrupted (SIGINT)") and "resume" not in err
    assert not (tmp_path / "overhead.csv").exists() or not read_rows(tmp_path / "overhead.csv")


@pytest.mark.slow
def test_a_results_file_that_cannot_grow_gets_no_partial_row(tmp_path):
    # the row the file starts with, recorded as the runner records it (its trial measured in this process); the
    # file-size limit is the second command's process's own
    (first,) = run_here(*TINY, "steps=2", results=tmp_path)
    assert first["status"] == "ok", first["row"].get("error")
    csv = tmp_path / "runs.csv"
    row = csv.read_text().splitlines(keepends=True)[1]
    with open(csv, "a") as f:  # larger than any other file the next trial writes (its log, history, Hydra's files)
        f.write(row * 40)
    before = csv.read_bytes()
    limit = len(before) + 100  # every other file fits; another row (~1 KiB) does not
    out = subprocess.run(
        [sys.executable, "-m", "bench", *TINY, "steps=2", f"results_dir={tmp_path}"],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=300,
        preexec_fn=lambda: resource.setrlimit(resource.RLIMIT_FSIZE, (limit, limit)),
    )
    assert out.returncode == 1 and "Traceback" not in out.stderr
    assert out.stderr.strip().splitlines() == [
        f"bench: error: cannot write {csv}: File too large ({tmp_path}: "
        + out.stderr.split(f"({tmp_path}: ")[1].split(" MiB")[0]
        + " MiB free); nothing partial was kept"
    ]
    assert csv.read_bytes() == before and len(read_rows(csv)) == 41


ADOPT = (
    "import os, time; from bench.harness.launch import PARENT_PID, adopt; adopt(); "
    "print(os.environ.get(PARENT_PID)); time.sleep(0.5); print('alive', flush=True)"
)


def test_a_process_adopted_through_one_in_between_lives_and_passes_nothing_on():
    """`bench gpu-check` marks its steps to die with it; its pytest step runs `python -m bench` with that mark in
    its environment. That grandchild must neither take the alive grandparent for a dead parent (on an H100 it
    killed itself with SIGTERM) nor pass the mark on; a direct child whose parent is gone still dies."""
    env = {**os.environ, "BENCH_PARENT_PID": str(os.getpid()), "PYTHONPATH": str(REPO)}
    call = f"import subprocess, sys; sys.exit(subprocess.call([sys.executable, '-c', {ADOPT!r}]))"
    between = [sys.executable, "-c", call]
    out = subprocess.run(between, cwd=REPO, env=env, capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["None", "alive"]
    dead = str(2**22 + 7)  # above Linux's largest pid: a parent that is gone
    direct = subprocess.run(
        [sys.executable, "-c", ADOPT],
        cwd=REPO,
        env={**env, "BENCH_PARENT_PID": dead},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert direct.returncode == -signal.SIGTERM and "alive" not in direct.stdout
