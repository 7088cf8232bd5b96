"""The runner: every trial in its own freshly spawned process, whatever its scenario.

Parent (`run_job`, one Hydra job): validate, skip the trial if resume finds it finished (ok or diverged), spawn the
trial's processes (`python -m bench.scenarios PAYLOAD RESULT`, bench/harness/trial.py), watch them (timeout,
host-memory limit, a rank that dies), classify the outcome, append its rows to the scenario's CSV, save its side
files, log its W&B run, print progress, and return the outcome. The parent never imports torch or jax, and knows
nothing of BERT or of ops: the scenario turns the outcome into rows.

Statuses: ok | oom (CUDA OOM, XLA RESOURCE_EXHAUSTED, MemoryError, host limit) | crashed (the child died: signal,
abort, "Fatal Python error") | timeout | error (an exception: the message is in the row) | skipped (resume).
A trial that died keeps what it reported before dying (on_progress): the ops scenario's finished rows.

What a launch's exit code is made of travels as files, not module globals: each job leaves its outcome in the
folder BENCH_OUTCOMES names (shared storage under SLURM, as the results are), and `python -m bench` reads them
when Hydra returns (`outcomes`).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import tempfile
import time
import uuid
from contextlib import ExitStack
from datetime import datetime, timezone
from pathlib import Path

from hydra.core.hydra_config import HydraConfig
from hydra.types import RunMode

from bench.config import BenchConfig, launch_id, resolve, to_dict
from bench.harness.command import DISK_FULL, disk_full
from bench.harness.launch import (
    LAUNCHER_PID,
    TRIAL_MODULE,
    Task,
    child_env,
    die_with_parent,
    kill_session,
    rank_env,
    temp_prefix,
    this_task,
)
from bench.harness.plan import read_plan
from bench.harness.scenario import (
    CONFIGS,
    LOGS,
    RUN_ID_ENV,
    Registry,
    Scenario,
    config_hash,
    finished_runs,
    scenario_of,
    validate,
)
from bench.harness.signals import Abort, hold_interrupts, interrupts_raise
from bench.harness.sweep import worst
from bench.measure.system import REPO
from bench.measure.trackers import HostMemWatchdog
from bench.store.csv import CsvSink, ResultsFileError, check_free_space
from bench.store.read import read_rows

LOG_TAIL_LINES = 12  # stderr lines kept in the row of a crashed trial
WATCH_INTERVAL_S = 0.05  # how often the parent looks at its trial processes (a poll is a waitpid)
OUTCOMES = "BENCH_OUTCOMES"  # the folder where each job of a launch leaves its outcome (read by outcomes())


# ---------------------------------------------------------------------------------------------------------------
# parent: one Hydra job


def run_job(cfg, scenarios: Registry) -> dict:
    """One Hydra job: skip it if resume finds it finished (ok or diverged), else spawn the trial and record its rows;
    returns {"run_id", "status", "row"} (a sweeper reads the row) and leaves run_id and status for the launch's exit
    code (BENCH_OUTCOMES). SIGINT, SIGTERM or SIGHUP stops the trial's processes, records nothing for it and raises
    Interrupted; a full disk raises Abort (one line)."""
    cfg = resolve(cfg)
    scenario = scenario_of(scenarios, cfg.scenario)
    launcher = int(os.environ.get(LAUNCHER_PID, os.getpid()))
    if launcher not in (os.getpid(), 1) and os.getppid() == launcher:
        # a launcher's worker (joblib, submitit_local) dies with the launcher, and its trial with it (the trial's
        # own PR_SET_PDEATHSIG); the next command removes the temp folder it leaves
        die_with_parent(launcher, signal.SIGKILL)
    with interrupts_raise():
        try:
            outcome = record_job(cfg, scenario)
        except OSError as e:
            if e.errno not in DISK_FULL:
                raise
            raise Abort(disk_full(e)) from None  # one line, no traceback (Hydra prints one for an Exception)
    if os.environ.get(OUTCOMES):
        folder = Path(os.environ[OUTCOMES])
        folder.mkdir(parents=True, exist_ok=True)
        (folder / f"{outcome['run_id']}.json").write_text(json.dumps({k: outcome[k] for k in ("run_id", "status")}))
    return outcome


def outcomes(folder: Path) -> list[str]:
    """The statuses the jobs of one launch left in `folder` (run_job)."""
    return [json.loads(p.read_text())["status"] for p in sorted(folder.glob("*.json"))] if folder.is_dir() else []


def record_job(cfg: BenchConfig, scenario: Scenario, run_trial=None) -> dict:
    """Validate, skip (resume) or run one trial and record its rows. `run_trial` runs it (spawn_trial's
    signature): spawn_trial, its own processes, unless a test measures in its own process (tests/support.py)."""
    validate(scenario, cfg)
    results_dir = Path(cfg.results_dir)
    csv_path = results_dir / scenario.results_file
    index, total, sweep_id, experiment = progress_info(cfg)
    progress = f"[{index}/{total}] {scenario.label(cfg)}"
    h = config_hash(scenario, cfg)
    try:
        check_free_space(results_dir)  # space runs out mid-sweep too: checked before each trial starts
    except ResultsFileError as e:
        raise Abort(str(e)) from None
    if cfg.resume:
        earlier = recorded_finished(csv_path, h, cfg.tuning)
        if earlier:
            run_id = earlier[0]["run_id"]
            print(f"{progress}: skipped (recorded {earlier[0]['status']} as {run_id})", flush=True)
            return {"run_id": run_id, "status": "skipped", "row": earlier[0] if len(earlier) == 1 else {}}
    run_id = f"{datetime.now():%Y%m%d-%H%M%S}-{cfg.framework}-{scenario.kind(cfg)}-{uuid.uuid4().hex[:6]}"
    task = this_task(cfg)
    if task.main:
        print(f"{progress}: running ({run_id})", flush=True)
    started = datetime.now(timezone.utc).isoformat(timespec="seconds")
    t0 = time.perf_counter()
    outcome = (run_trial or spawn_trial)(cfg, scenario, run_id, results_dir, task)
    if not task.main:  # another task of a multi-task job: the main one records the trial
        return {"run_id": run_id, "status": outcome["status"]}
    ids = {
        "run_id": run_id,
        "started_at": started,
        "wall_time_s": time.perf_counter() - t0,
        "sweep_id": sweep_id,
        "config_hash": h,
        "experiment": experiment,
        "tune_objective": tuning_objective() if cfg.tuning else None,
    }
    rows = scenario.rows(cfg, outcome, ids)
    sink = CsvSink(csv_path, scenario.columns)
    for row in rows:
        sink.write(row)
    scenario.save(results_dir, rows, outcome)
    save_config(results_dir, run_id, cfg)
    if cfg.logger.name == "wandb":
        scenario.log_wandb(cfg, rows, outcome, results_dir)
    print(f"{progress}: {scenario.describe(outcome, rows)}", flush=True)
    return {"run_id": run_id, "status": worst(r.get("status") for r in rows), "row": rows[0] if len(rows) == 1 else {}}


def config_path(results_dir: Path, run_id: str) -> Path:
    """Where a trial's resolved config is kept: what `python -m bench rerun RUN_ID` runs again."""
    return Path(results_dir) / CONFIGS / f"{run_id}.json"


def save_config(results_dir: Path, run_id: str, cfg: BenchConfig) -> None:
    path = config_path(results_dir, run_id)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(to_dict(cfg), indent=1))
    tmp.replace(path)  # whole or absent: a rerun never reads half a config


def recorded_finished(csv_path: Path, config_hash: str, tuning: str | None = None) -> list[dict]:
    """The rows of the latest run of this configuration and kind whose every row is finished, or none. The kind
    (`tuning`: search, confirm, repeat, rerun, or none) is not in the hash, which a rerun keeps, yet a trial of one
    kind never stands for another: a rerun of a search point is not that point's search trial."""
    kind = tuning or ""
    rows = (r for r in read_rows(csv_path) if r.get("config_hash") == config_hash and (r.get("tuning") or "") == kind)
    return finished_runs(rows).get(config_hash, [])


def progress_info(cfg: BenchConfig) -> tuple[int, int | str, str, str]:
    """(trial number, total, sweep id, experiment) from Hydra's runtime config. The sweep id is the launch's own
    (bench.config.launch_id) unless sweep_id names one; the experiment is +experiment=NAME's NAME, or ""."""
    sweep_id = cfg.sweep_id or launch_id()
    try:
        hc = HydraConfig.get()
    except ValueError:  # called outside a Hydra app (tests, tools)
        return 1, 1, sweep_id, ""
    experiment = hc.runtime.choices.get("experiment") or ""
    if hc.mode == RunMode.MULTIRUN:
        return hc.job.num + 1, read_plan(hc.sweep.dir).get("total") or "?", sweep_id, experiment
    return 1, 1, sweep_id, experiment


def tuning_objective() -> str | None:
    """The tuning sweeper's objective (hydra.sweeper.objective), so the report picks the winner the sweep picked;
    None outside a Hydra multirun or under another sweeper."""
    try:
        hc = HydraConfig.get()
    except ValueError:  # outside a Hydra app: a rerun, tests
        return None
    return hc.sweeper.get("objective") if hc.mode == RunMode.MULTIRUN else None


def spawn_trial(cfg: BenchConfig, scenario: Scenario, run_id: str, results_dir: Path, task: Task) -> dict:
    """Run this job's processes of one trial, each in a fresh session; never raises for anything they do.
    Returns the main process's result, or a status of the parent's making: crashed (a process died; the others
    are killed, since they would wait for it in a collective forever), timeout, oom (the host-memory watchdog,
    per process)."""
    logs = results_dir / LOGS
    logs.mkdir(parents=True, exist_ok=True)
    log_path = lambda r: logs / (f"{run_id}.log" if r == 0 else f"{run_id}.rank{r}.log")
    with tempfile.TemporaryDirectory(prefix=temp_prefix()) as tmp:
        payload = Path(tmp) / "payload.json"
        payload.write_text(json.dumps(to_dict(cfg)))
        result = lambda r: Path(tmp) / f"result.{r}.json"
        procs: dict[int, subprocess.Popen] = {}
        kill_all = lambda *_: [kill_session(p) for p in procs.values()]
        limit = cfg.max_host_mem_mb
        with ExitStack() as stack:
            # An interrupt from the first process started on (Ctrl-C as a rank starts, or while the watchdogs
            # start) stops what has started, and waits for it: no trial outlives the command
            try:
                for r in task.ranks:
                    log = stack.enter_context(open(log_path(r), "wb"))
                    with hold_interrupts():  # a Ctrl-C within Popen is raised once procs holds the child
                        procs[r] = subprocess.Popen(
                            [sys.executable, "-m", TRIAL_MODULE, str(payload), str(result(r))],
                            stdout=log,
                            stderr=subprocess.STDOUT,
                            env={
                                **os.environ,
                                **trial_env(cfg, scenario),
                                **rank_env(cfg, task, r),
                                **child_env(),
                                RUN_ID_ENV: run_id,
                            },
                            cwd=REPO,
                            start_new_session=True,
                        )
                dogs = {
                    r: stack.enter_context(HostMemWatchdog(p.pid, limit, on_exceed=kill_all)) for r, p in procs.items()
                }
                timed_out, first_down = watch(procs, cfg.timeout_s, kill_all)
            except BaseException:  # Interrupted, KeyboardInterrupt: stop the trial first (then its temp folder goes)
                kill_all()
                for p in procs.values():
                    p.wait()
                # what the trial reported so far, if its main process started: its curve is kept, no row written
                if task.main and procs and (partial := result(min(procs))).exists():
                    scenario.save(results_dir, [{"run_id": run_id}], json.loads(partial.read_text()))
                raise
        outs = {r: json.loads(result(r).read_text()) if result(r).exists() else {} for r in procs}
    main_rank = min(procs)
    out = outs[main_rank]
    out.setdefault("host_peak_rss_mb", round(max(d.max_seen_mb for d in dogs.values()), 1))
    at = lambda r: f"rank {r}: " if len(procs) > 1 else ""
    over = [r for r, d in dogs.items() if d.exceeded.is_set()]
    if over:
        r = over[0]
        return {
            **out,
            "status": "oom",
            "peak_mem_mb": dogs[r].exceeded_mb,
            "mem_method": "host_rss_watchdog",
            "error": f"{at(r)}host memory limit max_host_mem_mb={limit} exceeded: rss {dogs[r].exceeded_mb:.0f} MiB",
        }
    if timed_out:
        return {**out, "status": "timeout", "error": f"no result within timeout_s={cfg.timeout_s}"}
    failed = [r for r in first_down if procs[r].returncode != 0 or outs[r].get("status", "ok") != "ok"]
    if failed:
        r = failed[0]  # the first process down is the cause; the others were killed waiting for it
        if outs[r].get("status") not in (None, "ok"):
            return {**out, "status": outs[r]["status"], "error": at(r) + outs[r].get("error", "")}
        rc = procs[r].returncode
        how = f"killed by {signal.Signals(-rc).name}" if rc < 0 else f"exit code {rc}"
        return {**out, "status": "crashed", "error": f"{at(r)}trial process died ({how}): {log_tail(log_path(r))}"}
    if "status" in out:
        return out
    return {**out, "status": "crashed", "error": f"trial process left no result: {log_tail(log_path(main_rank))}"}


def watch(procs: dict[int, subprocess.Popen], timeout_s: float, kill_all) -> tuple[bool, list[int]]:
    """Wait for every process; once one ends badly (non-zero exit), kill the rest: a collective would wait for
    it forever. Returns (timed out, ranks in the order they went down)."""
    deadline = time.monotonic() + timeout_s
    down: list[int] = []
    while len(down) < len(procs):
        for r, p in procs.items():
            if r not in down and p.poll() is not None:
                down.append(r)
                if p.returncode != 0:
                    kill_all()
        if len(down) == len(procs):
            break
        if time.monotonic() > deadline:
            kill_all()
            for p in procs.values():
                p.wait()
            return True, down
        time.sleep(WATCH_INTERVAL_S)
    return False, down


def trial_env(cfg: BenchConfig, scenario: Scenario) -> dict[str, str]:
    """The trial process's environment beyond the parent's: the runner's own settings, then its scenario's."""
    env = {
        "PYTHONUNBUFFERED": "1",
        "XLA_PYTHON_CLIENT_PREALLOCATE": "false",  # JAX would grab 75% of GPU memory up front: no peak to see
        "TF_CPP_MIN_LOG_LEVEL": "1",
        "TOKENIZERS_PARALLELISM": "false",
        "HF_HUB_OFFLINE": "1",  # never touch the network from a trial
        "HF_DATASETS_OFFLINE": "1",
    }
    if cfg.device == "cpu":
        env.update(CUDA_VISIBLE_DEVICES="", JAX_PLATFORMS="cpu")
    return {**env, **scenario.env(cfg)}


def log_tail(path: Path, n: int = LOG_TAIL_LINES) -> str:
    """The log's last n lines, after the interpreter's "Fatal Python error" line where the tail leaves it out
    (faulthandler's dump of every thread and extension module can outrun the tail)."""
    lines = [ln.strip() for ln in path.read_text(errors="replace").splitlines() if ln.strip()]
    fatal = [ln for ln in lines[:-n] if ln.startswith("Fatal Python error")][:1]
    return " | ".join(fatal + lines[-n:]) or "(no output)"
