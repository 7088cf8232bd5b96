"""The runner: every trial in its own freshly spawned process, whatever its scenario (bench/scenarios/).

Parent (`run_job`, one Hydra job): validate, skip the trial if resume finds it recorded ok, spawn
`python -m bench.runner payload result`, watch it (timeout, host-memory limit), classify the outcome, append its
rows to the scenario's CSV, save its side files, log its W&B run, print progress. The parent never imports torch
or jax, and knows nothing of BERT or of ops: the scenario turns the outcome into rows.

Child (`child_main`): the scenario's `measure`, every exception turned into a status.

Statuses: ok | oom (CUDA OOM, XLA RESOURCE_EXHAUSTED, MemoryError, host limit) | crashed (the child died: signal,
abort, "Fatal Python error") | timeout | error (an exception: the message is in the row) | skipped (resume).
A trial that died keeps what it reported before dying (on_progress): the ops scenario's finished rows.
"""

from __future__ import annotations

import contextlib
import faulthandler
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import traceback
import uuid
from contextlib import ExitStack
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path

import psutil
from hydra.core.hydra_config import HydraConfig
from hydra.types import RunMode
from submitit.helpers import TorchDistributedEnvironment

from bench.config import launch_id, to_container
from bench.parallel import processes_per_node
from bench.scenarios import config_hash, scenario_of, validate
from bench.sinks import CsvSink, read_rows
from bench.sweep import sweep_info
from bench.system import REPO, classify, error_line, free_port, interrupts_raise
from bench.trackers import HostMemWatchdog

LOG_TAIL_LINES = 12  # stderr lines kept in the row of a crashed trial
OUTCOMES: list[str] = []  # the status of every job this process ran: `python -m bench`'s exit code reads it
WATCH_INTERVAL_S = 0.05  # how often the parent looks at its trial processes (a poll is a waitpid)
STOP_GRACE_S = 5.0  # what an interrupted launch gives its jobs to stop their trials and clean up (they take < 1 s)
LAUNCHER_PID = "BENCH_LAUNCHER_PID"


# ---------------------------------------------------------------------------------------------------------------
# parent: one Hydra job


def run_job(cfg) -> dict:
    """One Hydra job: skip it if resume finds it recorded ok, else spawn the trial and record its rows. SIGINT or
    SIGTERM stops the trial's processes, records nothing for it and raises Interrupted."""
    with interrupts_raise():
        outcome = record_job(cfg)
    OUTCOMES.append(outcome["status"])
    return outcome


def record_job(cfg) -> dict:
    validate(cfg)
    c = to_container(cfg)
    scenario = scenario_of(c)
    results_dir = Path(c["results_dir"])
    csv_path = results_dir / scenario.results_file
    index, total, sweep_id, experiment = progress_info(c)
    progress = f"[{index}/{total}] {scenario.label(c)}"
    h = config_hash(cfg)
    if c["resume"]:
        run_id = recorded_ok(csv_path, h)
        if run_id:
            print(f"{progress}: skipped (recorded ok as {run_id})", flush=True)
            return {"run_id": run_id, "status": "skipped"}
    run_id = f"{datetime.now():%Y%m%d-%H%M%S}-{c['framework']}-{scenario.kind(c)}-{uuid.uuid4().hex[:6]}"
    task = this_task(c)
    if task.main:
        print(f"{progress}: running ({run_id})", flush=True)
    started = datetime.now(timezone.utc).isoformat(timespec="seconds")
    t0 = time.perf_counter()
    outcome = spawn_trial(c, run_id, results_dir, task)
    if not task.main:  # another task of a multi-task job: the main one records the trial
        return {"run_id": run_id, "status": outcome["status"]}
    ids = {"run_id": run_id, "started_at": started, "wall_time_s": time.perf_counter() - t0,
           "sweep_id": sweep_id, "config_hash": h, "experiment": experiment}  # fmt: skip
    rows = scenario.rows(c, outcome, ids)
    sink = CsvSink(csv_path, scenario.columns)
    for row in rows:
        sink.write(row)
    scenario.save(results_dir, rows, outcome)
    if c["logger"]["name"] == "wandb":
        scenario.log_wandb(c, rows, outcome, results_dir)
    print(f"{progress}: {scenario.describe(outcome, rows)}", flush=True)
    return {"run_id": run_id, "status": outcome["status"]}


def recorded_ok(csv_path: Path, config_hash: str) -> str | None:
    """The run_id of the latest run of this configuration whose every row is ok (a model trial writes one row,
    an ops trial one per op and shape), or None."""
    runs: dict[str, bool] = {}
    for r in read_rows(csv_path):
        if r.get("config_hash") == config_hash:
            runs[r["run_id"]] = runs.get(r["run_id"], True) and r.get("status") == "ok"
    ok = [run_id for run_id, all_ok in runs.items() if all_ok]
    return ok[-1] if ok else None


def progress_info(c: dict) -> tuple[int, int | str, str, str]:
    """(trial number, total, sweep id, experiment) from Hydra's runtime config. The sweep id is the launch's own
    (bench.config.launch_id) unless sweep_id names one; the experiment is +experiment=NAME's NAME, or ""."""
    sweep_id = c["sweep_id"] or launch_id()
    try:
        hc = HydraConfig.get()
    except ValueError:  # called outside a Hydra app (tests, tools)
        return 1, 1, sweep_id, ""
    experiment = hc.runtime.choices.get("experiment") or ""
    if hc.mode == RunMode.MULTIRUN:
        return hc.job.num + 1, sweep_info(hc.sweep.dir).get("total") or "?", sweep_id, experiment
    return 1, 1, sweep_id, experiment


@dataclass(frozen=True)
class Task:
    """This job's share of a trial's processes. Locally the runner starts every process of the trial; under a
    multi-task submitit job (hydra/launcher=submitit_* with tasks_per_node and nodes) every task runs this job
    and starts one process: its own rank, with the rendezvous submitit gives."""

    ranks: tuple[int, ...]  # the ranks this job starts
    processes: int  # every process of the trial, on every node
    master_addr: str
    master_port: int

    @property
    def main(self) -> bool:
        return 0 in self.ranks  # the job that records the trial


def this_task(c: dict) -> Task:
    try:
        env = TorchDistributedEnvironment()  # submitit's: rank, world size, rendezvous (host of rank 0)
    except RuntimeError:  # not inside a submitit job
        env = None
    if env is not None and env.world_size > 1:
        return Task((env.rank,), env.world_size, env.master_addr, env.master_port)
    n = processes_per_node(c)  # nodes=1 here: preflight refuses more nodes without a multi-node launcher
    return Task(tuple(range(n)), n, "127.0.0.1", free_port() if n > 1 else 0)


def rank_env(c: dict, task: Task, rank: int) -> dict[str, str]:
    """The env:// rendezvous of one trial process (torch.distributed reads it; so does jax_impl/parallel.py)."""
    if task.processes == 1:
        return {}
    per_node = max(1, task.processes // c["nodes"])
    return {"MASTER_ADDR": task.master_addr, "MASTER_PORT": str(task.master_port), "RANK": str(rank),
            "WORLD_SIZE": str(task.processes), "LOCAL_RANK": str(rank % per_node),
            "LOCAL_WORLD_SIZE": str(per_node)}  # fmt: skip


def spawn_trial(c: dict, run_id: str, results_dir: Path, task: Task) -> dict:
    """Run this job's processes of one trial, each in a fresh session; never raises for anything they do.
    Returns the main process's result, or a status of the parent's making: crashed (a process died; the others
    are killed, since they would wait for it in a collective forever), timeout, oom (the host-memory watchdog,
    per process)."""
    logs = results_dir / "logs"
    logs.mkdir(parents=True, exist_ok=True)
    log_path = lambda r: logs / (f"{run_id}.log" if r == 0 else f"{run_id}.rank{r}.log")
    with tempfile.TemporaryDirectory(prefix=temp_prefix()) as tmp:
        payload = Path(tmp) / "payload.json"
        payload.write_text(json.dumps(c))
        result = lambda r: Path(tmp) / f"result.{r}.json"
        procs: dict[int, subprocess.Popen] = {}
        with ExitStack() as stack:
            for r in task.ranks:
                log = stack.enter_context(open(log_path(r), "wb"))
                procs[r] = subprocess.Popen(
                    [sys.executable, "-m", "bench.runner", str(payload), str(result(r))],
                    stdout=log,
                    stderr=subprocess.STDOUT,
                    env={**os.environ, **trial_env(c), **rank_env(c, task, r)},
                    cwd=REPO,
                    start_new_session=True,
                )
            kill_all = lambda *_: [kill_session(p) for p in procs.values()]
            limit = c["max_host_mem_mb"]
            dogs = {r: stack.enter_context(HostMemWatchdog(p.pid, limit, on_exceed=kill_all)) for r, p in procs.items()}
            try:
                timed_out, first_down = watch(procs, c["timeout_s"], kill_all)
            except BaseException:  # Interrupted, KeyboardInterrupt: stop the trial first (then its temp folder goes)
                kill_all()
                for p in procs.values():
                    p.wait()
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
        return {**out, "status": "timeout", "error": f"no result within timeout_s={c['timeout_s']}"}
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


def temp_prefix() -> str:
    """Trial temp folders are named after the launching process (`python -m bench` sets BENCH_LAUNCHER_PID for
    its jobs, wherever a launcher runs them), so that an interrupted launch can remove what a killed job left."""
    return f"bench-{os.environ.get(LAUNCHER_PID, os.getpid())}-"


def stop_descendants(grace_s: float = STOP_GRACE_S) -> None:
    """On SIGINT/SIGTERM to the launching process: ask every descendant (a launcher's workers, submitit's local
    jobs) to stop with SIGTERM, which makes a job stop its trial, remove its temp folder and record nothing
    (run_job), give them `grace_s`, then SIGKILL what is left, trial sessions included, and remove the temp folders
    of this launch that a killed job could not."""
    me = psutil.Process()
    trials = [p for p in me.children(recursive=True) if is_trial(p)]
    jobs = []  # the processes that started the trials: a launcher's workers, submitit's jobs (not the launcher's
    for p in trials:  # own helpers, such as loky's resource tracker: the launcher stops those itself)
        with contextlib.suppress(psutil.Error):
            parent = p.parent()
            if parent is not None and parent.pid != me.pid and parent not in jobs:
                jobs.append(parent)
    for p in jobs:
        with contextlib.suppress(psutil.Error):
            p.terminate()
    _, alive = psutil.wait_procs(jobs, timeout=grace_s)
    for p in alive:
        with contextlib.suppress(psutil.Error):
            p.kill()
    for p in trials:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(p.pid, signal.SIGKILL)  # a trial leads its own session: it and whatever it started
    psutil.wait_procs(trials, timeout=grace_s)
    for leftover in Path(tempfile.gettempdir()).glob(f"bench-{os.getpid()}-*"):
        shutil.rmtree(leftover, ignore_errors=True)


def is_trial(p: psutil.Process) -> bool:
    try:
        return "bench.runner" in p.cmdline()
    except psutil.Error:
        return False


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


def trial_env(c: dict) -> dict[str, str]:
    """The trial process's environment beyond the parent's: the runner's own settings, then its scenario's."""
    env = {
        "PYTHONUNBUFFERED": "1",
        "XLA_PYTHON_CLIENT_PREALLOCATE": "false",  # JAX would grab 75% of GPU memory up front: no peak to see
        "TF_CPP_MIN_LOG_LEVEL": "1",
        "TOKENIZERS_PARALLELISM": "false",
        "HF_HUB_OFFLINE": "1",  # never touch the network from a trial
        "HF_DATASETS_OFFLINE": "1",
    }
    if c["device"] == "cpu":
        env.update(CUDA_VISIBLE_DEVICES="", JAX_PLATFORMS="cpu")
    return {**env, **scenario_of(c).env(c)}


def kill_session(proc) -> None:
    try:
        os.killpg(proc.pid, signal.SIGKILL)  # the whole session: the child and anything it started
    except ProcessLookupError:
        pass


def log_tail(path: Path, n: int = LOG_TAIL_LINES) -> str:
    lines = [ln.strip() for ln in path.read_text(errors="replace").splitlines() if ln.strip()]
    return " | ".join(lines[-n:]) or "(no output)"


# ---------------------------------------------------------------------------------------------------------------
# child: the trial itself


def child_main(payload: str, result: str) -> None:
    faulthandler.enable()  # a segfault leaves a Python traceback in the log
    c = json.loads(Path(payload).read_text())
    progress: dict = {}

    def on_progress(partial: dict) -> None:
        # what is done so far, without a status; the parent completes it if this process dies
        progress.clear()
        progress.update(partial)
        write_result(result, partial)

    try:
        out = scenario_of(c).measure(c, on_progress)
    except BaseException as e:  # noqa: BLE001 (every failure becomes a row)
        traceback.print_exc()
        out = {**progress, "status": classify(e), "error": error_line(e)}
    write_result(result, out)
    if out["status"] != "ok":
        sys.exit(1)  # the parent stops the trial's other processes: they would wait for this one in a collective


def write_result(path: str, out: dict) -> None:
    tmp = Path(path).with_suffix(".tmp")
    tmp.write_text(json.dumps(out))
    tmp.replace(path)  # atomic: the parent sees a whole result or none


if __name__ == "__main__":
    child_main(sys.argv[1], sys.argv[2])
