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

import faulthandler
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
import traceback
import uuid
from datetime import datetime, timezone
from pathlib import Path

from hydra.core.hydra_config import HydraConfig
from hydra.types import RunMode

from bench.config import to_container
from bench.scenarios import config_hash, scenario_of, validate
from bench.sinks import CsvSink, read_rows
from bench.sweep import sweep_info
from bench.system import REPO, classify, error_line
from bench.trackers import HostMemWatchdog

LOG_TAIL_LINES = 12  # stderr lines kept in the row of a crashed trial


# ---------------------------------------------------------------------------------------------------------------
# parent: one Hydra job


def run_job(cfg) -> dict:
    """One Hydra job: skip it if resume finds it recorded ok, else spawn the trial and record its rows."""
    validate(cfg)
    c = to_container(cfg)
    scenario = scenario_of(c)
    results_dir = Path(c["results_dir"])
    csv_path = results_dir / scenario.results_file
    index, total, sweep_id = progress_info(c)
    progress = f"[{index}/{total}] {scenario.label(c)}"
    h = config_hash(cfg)
    if c["resume"]:
        run_id = recorded_ok(csv_path, h)
        if run_id:
            print(f"{progress}: skipped (recorded ok as {run_id})", flush=True)
            return {"run_id": run_id, "status": "skipped"}
    run_id = f"{datetime.now():%Y%m%d-%H%M%S}-{c['framework']}-{scenario.kind(c)}-{uuid.uuid4().hex[:6]}"
    print(f"{progress}: running ({run_id})", flush=True)
    started = datetime.now(timezone.utc).isoformat(timespec="seconds")
    t0 = time.perf_counter()
    outcome = spawn_trial(c, run_id, results_dir)
    ids = {"run_id": run_id, "started_at": started, "wall_time_s": time.perf_counter() - t0,
           "sweep_id": sweep_id, "config_hash": h}  # fmt: skip
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


def progress_info(c: dict) -> tuple[int, int | str, str]:
    """(trial number, total, sweep id) from Hydra's runtime config; (1, 1, run dir name) outside a sweep."""
    try:
        hc = HydraConfig.get()
    except ValueError:  # called outside a Hydra app (tests, tools)
        return 1, 1, c["sweep_id"] or "single"
    if hc.mode == RunMode.MULTIRUN:
        info = sweep_info(hc.sweep.dir)
        return hc.job.num + 1, info.get("total") or "?", c["sweep_id"] or info["sweep_id"]
    return 1, 1, c["sweep_id"] or Path(hc.run.dir).name


def spawn_trial(c: dict, run_id: str, results_dir: Path) -> dict:
    """Run one trial in a fresh process; never raises for anything the trial does. Returns the child's result,
    or a status of the parent's making (crashed / timeout / oom from the host-memory watchdog)."""
    logs = results_dir / "logs"
    logs.mkdir(parents=True, exist_ok=True)
    log_path = logs / f"{run_id}.log"
    with tempfile.TemporaryDirectory(prefix="bench-") as tmp:
        payload, result = Path(tmp) / "payload.json", Path(tmp) / "result.json"
        payload.write_text(json.dumps(c))
        env = {**os.environ, **trial_env(c)}
        with open(log_path, "wb") as log:
            proc = subprocess.Popen(
                [sys.executable, "-m", "bench.runner", str(payload), str(result)],
                stdout=log,
                stderr=subprocess.STDOUT,
                env=env,
                cwd=REPO,
                start_new_session=True,
            )
            limit = c["max_host_mem_mb"]
            with HostMemWatchdog(proc.pid, limit, on_exceed=lambda mb: kill_session(proc)) as watchdog:
                try:
                    proc.wait(timeout=c["timeout_s"])
                    timed_out = False
                except subprocess.TimeoutExpired:
                    kill_session(proc)
                    proc.wait()
                    timed_out = True
        out = json.loads(result.read_text()) if result.exists() else {}
    out.setdefault("host_peak_rss_mb", round(watchdog.max_seen_mb, 1))
    if watchdog.exceeded.is_set():
        return {
            **out,
            "status": "oom",
            "peak_mem_mb": watchdog.exceeded_mb,
            "mem_method": "host_rss_watchdog",
            "error": f"host memory limit max_host_mem_mb={limit} exceeded: rss {watchdog.exceeded_mb:.0f} MiB",
        }
    if timed_out:
        return {**out, "status": "timeout", "error": f"no result within timeout_s={c['timeout_s']}"}
    if "status" in out:
        return out
    rc = proc.returncode
    how = f"killed by {signal.Signals(-rc).name}" if rc < 0 else f"exit code {rc}"
    return {**out, "status": "crashed", "error": f"trial process died ({how}): {log_tail(log_path)}"}


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


def write_result(path: str, out: dict) -> None:
    tmp = Path(path).with_suffix(".tmp")
    tmp.write_text(json.dumps(out))
    tmp.replace(path)  # atomic: the parent sees a whole result or none


if __name__ == "__main__":
    child_main(sys.argv[1], sys.argv[2])
