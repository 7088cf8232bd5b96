"""Ctrl-C and SIGTERM to a sweep, under each launcher: the running trial's processes end within seconds, its temp
folder goes, nothing partial is recorded, one line is printed, the exit code is 130 / 143, and resume=true
afterwards runs exactly the trials not recorded yet."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

from bench.harness.launch import QUIET_TRACKER, quiet_helpers
from bench.store.read import read_rows
from tests.support import FAST, REPO, trials_anywhere, trials_under

LAUNCHERS = {
    "basic": [],
    "joblib": ["hydra/launcher=joblib", "hydra.launcher.n_jobs=2"],
    "submitit_local": ["hydra/launcher=submitit_local", "hydra.launcher.timeout_min=10"],
}
# Steps of a trial that outlasts any test (~10 min here), yet starts them within seconds: a trial makes all its
# batches before its first step (a million steps' took it past a minute).
ENDLESS = 10_000
STOP_WITHIN_S = 20  # the parent gives its jobs 5 s to stop their trials, then kills; loaded CI hosts are slow


def reported_in_timed_steps(launcher_pid: int) -> bool:
    """Whether a running trial of this launch has reported a curve: an evaluation inside its timed steps (its
    partial result in the temp folder named after the launch; a finished trial's folder is gone)."""
    return any(Path(tempfile.gettempdir()).glob(f"bench-{launcher_pid}-*/result.0.json"))


@pytest.mark.slow
@pytest.mark.parametrize(
    "launcher, sig, group",
    # `kill` to the basic launcher, Ctrl-C to a joblib launch's whole group, Ctrl-C to submitit's parent: the
    # signal handling is one handler for both signals, so each launcher is tried once (SIGINT alone to a launch
    # is test_an_interrupt_to_a_single_trial_stops_it's)
    [("basic", signal.SIGTERM, False), ("joblib", signal.SIGINT, True), ("submitit_local", signal.SIGINT, False)],
)
def test_an_interrupt_stops_the_trial_records_nothing_and_resume_finishes(tmp_path, launcher, sig, group):
    """`group`: the signal goes to the launch's whole process group, as a terminal's Ctrl-C does (the launcher's
    workers get it too); otherwise to the launching process alone, as `kill <pid>` does."""
    # the second trial outlasts the test (ENDLESS): only the interrupt can stop it. An evaluation after every timed
    # step says when it is inside them (its curve, reported to the runner).
    args = [
        "-m",
        "framework=torch",
        "mode=inference",
        *FAST,
        "evaluate=true",
        "eval_every=1",
        "logger=none",
        *LAUNCHERS[launcher],
    ]
    cmd = [sys.executable, "-m", "bench", *args, f"steps=3,{ENDLESS}", f"results_dir={tmp_path}"]
    # with `group`, its own process group: killpg reaches it and not pytest
    proc = subprocess.Popen(
        cmd, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=group
    )
    try:
        deadline = time.monotonic() + 240
        while time.monotonic() < deadline and not read_rows(tmp_path / "runs.csv"):
            time.sleep(0.2)  # the short trial is recorded
        while time.monotonic() < deadline and not reported_in_timed_steps(proc.pid):
            time.sleep(0.2)  # the endless one is inside its timed steps
        assert trials_under(proc.pid) and reported_in_timed_steps(proc.pid), "no trial in its timed steps"
        recorded = (tmp_path / "runs.csv").read_bytes()
        if group:
            os.killpg(proc.pid, sig)
        else:
            proc.send_signal(sig)
        out, err = proc.communicate(timeout=STOP_WITHIN_S)
    except subprocess.TimeoutExpired:
        pytest.fail("the launch did not end within its grace period")
    finally:
        proc.kill()  # a no-op for one that ended; its trials die with it
    assert proc.returncode == 128 + sig, err
    assert err.strip().splitlines()[-1].startswith(f"bench: interrupted ({signal.Signals(sig).name})"), err
    assert not trials_anywhere(proc.pid)
    assert not list(Path(tempfile.gettempdir()).glob(f"bench-{proc.pid}-*"))
    assert (tmp_path / "runs.csv").read_bytes() == recorded  # nothing partial
    earlier = [r["run_id"] for r in read_rows(tmp_path / "runs.csv")]
    assert len(earlier) == 1
    if launcher != "basic":
        return  # resuming is the runner's, whichever launcher started the trials: once is enough

    resumed = subprocess.run(
        [*cmd[:-2], "steps=3,5", "resume=true", f"results_dir={tmp_path}"],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert resumed.returncode == 0, resumed.stderr
    after = [r["run_id"] for r in read_rows(tmp_path / "runs.csv")]
    # the trial recorded before the interrupt was skipped, the other ran: one row per trial, the earlier untouched
    assert len(after) == 2 and after[: len(earlier)] == earlier


@pytest.mark.slow
def test_an_interrupt_to_a_single_trial_stops_it(tmp_path):
    """`python -m bench ...` without -m: Hydra runs the one job in this process; Ctrl-C stops its trial too."""
    env = {**os.environ, "BENCH_INJECT_FAULT": ""}
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "bench",
            "framework=torch",
            *FAST,
            "logger=none",
            "steps=1000000",
            f"results_dir={tmp_path}",
        ],
        cwd=REPO,
        stderr=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
        env=env,
    )
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline and not trials_under(proc.pid):
        time.sleep(0.1)
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=STOP_WITHIN_S)
    assert proc.returncode == 130 and err.strip().splitlines()[-1].startswith("bench: interrupted (SIGINT)"), err
    assert not trials_anywhere(proc.pid) and not (tmp_path / "runs.csv").exists()


def test_an_interrupt_while_a_trial_starts_stops_that_trial_too(tmp_path, monkeypatch):
    """Ctrl-C inside subprocess.Popen, after the fork and before it returns (CI met it once, on a loaded host):
    the runner holds it until the child is in its hands, then stops the child and waits for it."""
    from bench.harness import runner
    from bench.harness.launch import Task
    from bench.harness.signals import Interrupted, interrupts_raise
    from bench.scenarios import SCENARIOS
    from tests.support import composed

    started, real_popen = [], subprocess.Popen

    def popen_then_interrupt(*args, **kwargs):
        proc = real_popen(*args, **kwargs)
        started.append(proc)
        os.kill(os.getpid(), signal.SIGINT)  # arrives before Popen's caller has the child
        return proc

    monkeypatch.setattr(runner.subprocess, "Popen", popen_then_interrupt)
    cfg = composed("framework=torch", *FAST, "logger=none", "steps=1000000", f"results_dir={tmp_path}")
    try:
        with pytest.raises(Interrupted), interrupts_raise():
            runner.spawn_trial(cfg, SCENARIOS["model"], "interrupted", tmp_path, Task((0,), 1, "127.0.0.1", 0))
        assert len(started) == 1 and started[0].poll() is not None  # stopped and reaped, not left running
    finally:
        for proc in started:  # a failure here must not leave the trial running
            proc.kill()
            proc.wait()


LEAK = "from joblib.externals.loky.backend import resource_tracker; resource_tracker.register({path!r}, 'file')"


def test_lokys_resource_tracker_says_nothing_after_a_launchs_last_line(tmp_path, monkeypatch):
    """joblib's loky tracker cleans up after a process that registered a resource and ended without unregistering
    it (a worker stopped by Ctrl-C), and warns at its own exit, after the launch's one line: a launch's environment
    keeps the clean-up and leaves the warning out, a user's own warning filters kept."""
    leak = [sys.executable, "-c", LEAK.format(path=str(tmp_path / "registered-never-made"))]
    # the tracker holds the stderr it inherited until it exits: capture_output waits for its warning
    assert "leaked file objects" in subprocess.run(leak, capture_output=True, text=True, timeout=60).stderr
    monkeypatch.setenv("PYTHONWARNINGS", "error::ResourceWarning")
    quiet_helpers()
    quiet_helpers()  # a second launch in the same process adds nothing
    assert os.environ["PYTHONWARNINGS"] == f"error::ResourceWarning,{QUIET_TRACKER}"
    assert subprocess.run(leak, capture_output=True, text=True, timeout=60).stderr == ""
