"""The runner: every trial in its own freshly spawned process.

Parent (`run_job`, one Hydra job): resume check, spawn `python -m bench.runner payload result`, watch it (timeout,
host-memory limit), classify the outcome, append the CSV row, log the W&B run, print progress. The parent never
imports torch or jax.

Child (`measure`): import one framework, build the weights, the batches and the trainer, record the resident
baseline, warm up (the first step compiles), then time `steps` synced steps (or `epochs` passes) while the memory
trackers watch. After the window, optionally: held-out loss and accuracy (evaluate), and the cosine between the
mode's gradient estimate and the exact gradient (measure_grad_cosine).

Statuses: ok | oom (CUDA OOM, XLA RESOURCE_EXHAUSTED, MemoryError, host limit) | crashed (the child died: signal,
abort, "Fatal Python error") | timeout | error (an exception: the message is in the row) | skipped (resume).

scenario=ops goes through the same parent and child (record_ops, bench/ops/measure.py): one trial is one
framework x every op and shape, and it writes one row per op and shape to ops.csv. Rows finished before a trial
died are kept; the op it died in, and those it never reached, get the trial's status.
"""

from __future__ import annotations

import faulthandler
import gc
import json
import math
import os
import platform
import signal
import subprocess
import sys
import tempfile
import time
import uuid
from contextlib import ExitStack
from datetime import datetime, timezone
from importlib import metadata
from pathlib import Path

from bench.config import OPS_KEYS, bert_spec, config_hash, ops_plan, step_spec, timed_steps, to_container, validate

REPO = Path(__file__).resolve().parent.parent
LOG_TAIL_LINES = 12  # stderr lines kept in the row of a crashed trial


# ---------------------------------------------------------------------------------------------------------------
# parent: one Hydra job


def run_job(cfg) -> dict:
    """One Hydra job: skip it if resume finds it recorded ok, else spawn the trial and record its rows. A model
    trial writes one runs.csv row; an ops trial (scenario=ops) one ops.csv row per op and shape."""
    validate(cfg)
    c = to_container(cfg)
    ops = c.get("scenario") == "ops"
    results_dir = Path(c["results_dir"])
    csv_path = results_dir / ("ops.csv" if ops else "runs.csv")
    index, total, sweep_id = _progress_info(c)
    progress = f"[{index}/{total}] {ops_label(c) if ops else trial_label(c)}"
    h = config_hash(cfg)
    if c["resume"]:
        run_id = recorded_ok(csv_path, h)
        if run_id:
            print(f"{progress}: skipped (recorded ok as {run_id})", flush=True)
            return {"run_id": run_id, "status": "skipped"}
    outcome, ids = launch(c, "ops" if ops else c["mode"], progress, results_dir)
    ids.update(sweep_id=sweep_id, config_hash=h)
    record = record_ops if ops else record_trial
    print(f"{progress}: {record(c, outcome, ids, csv_path)}", flush=True)
    return {"run_id": ids["run_id"], "status": outcome["status"]}


def recorded_ok(csv_path: Path, config_hash: str) -> str | None:
    """The run_id of the latest run of this configuration whose every row is ok (a model trial writes one row,
    an ops trial one per op and shape), or None."""
    from bench.sinks import read_rows

    runs: dict[str, bool] = {}
    for r in read_rows(csv_path):
        if r.get("config_hash") == config_hash:
            runs[r["run_id"]] = runs.get(r["run_id"], True) and r.get("status") == "ok"
    ok = [run_id for run_id, all_ok in runs.items() if all_ok]
    return ok[-1] if ok else None


def record_trial(c: dict, outcome: dict, ids: dict, csv_path: Path) -> str:
    """scenario=model: the trial's runs.csv row, its history JSON and W&B run; returns the progress line's end."""
    from bench.sinks import CsvSink

    row = make_row(c, outcome, **ids)
    CsvSink(csv_path).write(row)
    save_history(csv_path.parent, row["run_id"], outcome.get("history"))
    if c["logger"]["name"] == "wandb":
        log_wandb(c, row, outcome.get("history", {}), csv_path.parent)
    return describe(row)


def record_ops(c: dict, outcome: dict, ids: dict, csv_path: Path) -> str:
    """scenario=ops: one ops.csv row per op and shape (a torch trial never shares a process with jax) and one W&B
    run; returns the progress line's end."""
    from bench.sinks import OPS_CSV_COLUMNS, CsvSink

    rows = make_ops_rows(c, outcome, **ids)
    sink = CsvSink(csv_path, OPS_CSV_COLUMNS)
    for row in rows:
        sink.write(row)
    if c["logger"]["name"] == "wandb":
        log_wandb_ops(c, rows, csv_path.parent)
    return describe_ops(outcome, rows, ids["wall_time_s"])


def launch(c: dict, kind: str, progress: str, results_dir: Path) -> tuple[dict, dict]:
    """Name the trial, say it is running, spawn and watch its process: (outcome, the row's identity fields)."""
    run_id = f"{datetime.now():%Y%m%d-%H%M%S}-{c['framework']}-{kind}-{uuid.uuid4().hex[:6]}"
    print(f"{progress}: running ({run_id})", flush=True)
    started = datetime.now(timezone.utc).isoformat(timespec="seconds")
    t0 = time.perf_counter()
    outcome = spawn_trial(c, run_id, results_dir)
    return outcome, {"run_id": run_id, "started_at": started, "wall_time_s": time.perf_counter() - t0}


def ops_label(c: dict) -> str:
    from bench.ops.measure import execution

    return f"{c['framework']} ops {execution(c)} {c['dtype']} threads={c['threads']} device={c['device']}"


def make_ops_rows(c: dict, outcome: dict, **ids) -> list[dict]:
    """One row per op and shape of the plan, in its order. A trial that ended early (crashed, timeout, oom, or an
    error before the first op) leaves its finished rows; the op it ended in gets its status and error, and each
    op it never reached the same status with "not reached"."""
    from bench.ops.measure import execution
    from bench.ops.spec import shape_name
    from bench.sinks import OPS_CSV_COLUMNS

    common = {
        **ids,
        "framework": c["framework"],
        "execution": outcome.get("execution", execution(c)),
        "dtype": c["dtype"],
        "threads": str(c["threads"]),
        "num_threads": outcome.get("num_threads"),
        "device": outcome.get("device", c["device"]),
        "device_name": outcome.get("device_name"),
        "warmup": c["ops"]["warmup"],
        "repeats": c["ops"]["repeats"],
        "seed": c["seed"],
        "hostname": platform.node(),
        "python_version": platform.python_version(),
        "git_sha": git_sha(),
        **{k: v for k, v in versions().items() if k in OPS_CSV_COLUMNS},
    }
    done = {(r["op"], r["shape"]): r for r in outcome.get("rows", [])}
    current = tuple(outcome["current"]) if outcome.get("current") else None
    rows = []
    for name, shape in ops_plan(c):
        key = (name, shape_name(shape))
        if key in done:
            measured = done[key]
        elif current is None or key == current:
            measured = {"status": outcome["status"], "error": outcome.get("error")}
        else:
            cause = f"{' '.join(current)} ({outcome['status']})"
            measured = {"status": outcome["status"], "error": f"not reached: the trial ended in {cause}"}
        row = {**common, "op": name, "shape": key[1], "rows": shape[0], "cols": shape[1], **measured}
        rows.append({k: v for k, v in row.items() if k in OPS_CSV_COLUMNS})
    return rows


def describe_ops(outcome: dict, rows: list[dict], wall_s: float) -> str:
    ok = sum(r["status"] == "ok" for r in rows)
    text = f"{ok}/{len(rows)} ok in {wall_s:.1f} s"
    if outcome["status"] != "ok":
        return f"{outcome['status'].upper()} {outcome.get('error') or ''}  ({text})".strip()
    bad = [r for r in rows if r["status"] != "ok"]
    return text + "".join(f"\n    {r['op']} {r['shape']}: {r['status']}: {r.get('error')}" for r in bad[:5])


def log_wandb_ops(c: dict, rows: list[dict], results_dir: Path) -> None:
    """One W&B run per ops trial: the config, and a summary keyed op/shape/metric ("matmul/1024x1024/vjp_s")."""
    from bench.sinks import WandbSink

    lg = c["logger"]
    first = rows[0]
    summary = {k: first[k] for k in ("run_id", "sweep_id", "framework", "execution", "dtype", "threads",
                                      "num_threads", "device", "device_name", "git_sha")}  # fmt: skip
    summary["rows_ok"] = sum(r["status"] == "ok" for r in rows)
    summary["rows"] = len(rows)
    for r in rows:
        for k in ("primal_s", "jvp_s", "vjp_s", "vjp_backward_s", "jvp_over_primal", "vjp_over_primal", "status"):
            summary[f"{r['op']}/{r['shape']}/{k}"] = r.get(k)
    WandbSink(
        project=lg["project"],
        group=first["sweep_id"],
        name=first["run_id"],
        config={k: c[k] for k in OPS_KEYS},
        mode=lg["mode"],
        dir=results_dir,
        entity=lg["entity"],
        tags=[c["framework"], "ops", *lg["tags"]],
        job_type="ops",
    ).write(summary)


def save_history(results_dir: Path, run_id: str, history: dict | None) -> Path | None:
    """The trial's per-step series (loss, step_time_s; eval_loss and eval_accuracy with None between evaluations)
    as results_dir/history/<run_id>.json: the report's training curves. W&B gets the same series."""
    if not history:
        return None
    path = results_dir / "history" / f"{run_id}.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(history))
    return path


def trial_label(c: dict) -> str:
    extra = [
        "remat" if c["remat"] else "",
        f"K={c['num_tangents']}" if c["mode"] == "jvp" else "",
        c["jvp_impl"] if c["mode"] == "jvp" and c["framework"] == "torch" else "",
        f"trainable={c['trainable']}" if c["trainable"] != "all" else "",
    ]
    shape = f"L{c['model']['num_layers']} B{c['batch_size']} T{c['seq_len']}"
    return " ".join([c["framework"], c["mode"], *[e for e in extra if e], c["model"]["name"], shape])


def describe(row: dict) -> str:
    if row["status"] != "ok":
        return f"{row['status'].upper()} {row.get('error') or ''}".strip()
    return (
        f"ok  excess {row['excess_mem_mb']:.0f} MiB  peak {row['peak_mem_mb']:.0f} MiB  "
        f"step {row['step_time_median_s'] * 1e3:.1f} ms  compile {row['compile_time_s']:.1f} s  "
        f"loss {row['loss_first']:.4f} -> {row['loss_last']:.4f}"
    )


def _progress_info(c: dict) -> tuple[int, int | str, str]:
    """(trial number, total, sweep id) from Hydra's runtime config; (1, 1, run dir name) outside a sweep."""
    try:
        from hydra.core.hydra_config import HydraConfig
        from hydra.types import RunMode

        from bench.sweep import sweep_info

        hc = HydraConfig.get()
        if hc.mode == RunMode.MULTIRUN:
            info = sweep_info(hc.sweep.dir)
            return hc.job.num + 1, info.get("total") or "?", c["sweep_id"] or info["sweep_id"]
        return 1, 1, c["sweep_id"] or Path(hc.run.dir).name
    except (ImportError, ValueError):  # called outside a Hydra app (tests, tools)
        return 1, 1, c["sweep_id"] or "single"


def spawn_trial(c: dict, run_id: str, results_dir: Path) -> dict:
    """Run one trial in a fresh process; never raises for anything the trial does. Returns the child's result,
    or a status of the parent's making (crashed / timeout / oom from the host-memory watchdog)."""
    from bench.trackers import HostMemWatchdog

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
            with HostMemWatchdog(proc.pid, limit, on_exceed=lambda mb: _kill(proc)) as watchdog:
                try:
                    proc.wait(timeout=c["timeout_s"])
                    timed_out = False
                except subprocess.TimeoutExpired:
                    _kill(proc)
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
    if c["framework"] == "jax" and c.get("scenario", "model") == "model" and _jaxlib_at_least(0, 5):
        # XLA:CPU's default scheduler orders the program for concurrency and ignores memory: it runs every
        # layer's rematerialisation during the forward pass, so checkpointing saves nothing (MiniLM backprop
        # temp 500 MiB with or without remat), and every mode holds more than it must. The memory-minimising
        # scheduler gives remat its saving (185 MiB) and backprop 420 MiB; GPU backends ignore this flag.
        flags = os.environ.get("XLA_FLAGS", "")
        if "xla_cpu_enable_concurrency_optimized_scheduler" not in flags:
            env["XLA_FLAGS"] = f"{flags} --xla_cpu_enable_concurrency_optimized_scheduler=false".strip()
    if c.get("scenario") == "ops":
        env.update(thread_env(str(c["threads"])))
    return env


def thread_env(threads: str) -> dict[str, str]:
    """threads=1 | all, as the trial's environment: read when the libraries load, so set before the child imports
    torch or jax. OpenMP sizes torch's intra-op pool (and numpy's BLAS) from OMP_NUM_THREADS;
    --xla_cpu_multi_thread_eigen=false makes XLA:CPU run its matmuls on the calling thread instead of Eigen's
    pool. The child also calls torch.set_num_threads (bench/ops/torch_ops.py setup)."""
    n = "1" if threads == "1" else str(len(os.sched_getaffinity(0)))
    env = {"OMP_NUM_THREADS": n, "MKL_NUM_THREADS": n, "OPENBLAS_NUM_THREADS": n}
    flags = os.environ.get("XLA_FLAGS", "")
    if threads == "1":
        flags = f"{flags} --xla_cpu_multi_thread_eigen=false".strip()
    if flags:
        env["XLA_FLAGS"] = flags
    return env


def _jaxlib_at_least(*version: int) -> bool:
    """Whether the installed jaxlib is at least `version`, read without importing jax (the parent never does)."""
    try:
        release = metadata.version("jaxlib").split(".")
        return tuple(int("".join(ch for ch in p if ch.isdigit()) or 0) for p in release[:3]) >= version
    except metadata.PackageNotFoundError:
        return False


def _kill(proc) -> None:
    try:
        os.killpg(proc.pid, signal.SIGKILL)  # the whole session: the child and anything it started
    except ProcessLookupError:
        pass


def log_tail(path: Path, n: int = LOG_TAIL_LINES) -> str:
    lines = [ln.strip() for ln in path.read_text(errors="replace").splitlines() if ln.strip()]
    return " | ".join(lines[-n:]) or "(no output)"


def versions() -> dict[str, str]:
    """Installed versions, read from package metadata: importing the frameworks here would defeat isolation."""
    out = {}
    for name in ("jax", "jaxlib", "flax", "torch", "transformers"):
        try:
            out[f"{name}_version"] = metadata.version(name)
        except metadata.PackageNotFoundError:
            out[f"{name}_version"] = ""
    return out


def git_sha() -> str:
    try:
        sha = subprocess.run(
            ["git", "rev-parse", "--short=12", "HEAD"], cwd=REPO, capture_output=True, text=True, timeout=10
        ).stdout.strip()
        dirty = subprocess.run(
            ["git", "status", "--porcelain", "--untracked-files=no"],
            cwd=REPO,
            capture_output=True,
            text=True,
            timeout=10,
        ).stdout.strip()
        return f"{sha}-dirty" if sha and dirty else sha
    except (OSError, subprocess.SubprocessError):
        return ""


def make_row(c: dict, outcome: dict, **ids) -> dict:
    from bench.sinks import CSV_COLUMNS

    m = c["model"]
    row = {
        **ids,
        "framework": c["framework"],
        "mode": c["mode"],
        "model": m["name"],
        "data": c["data"]["name"],
        "trainable": c["trainable"],
        "optimizer": c["optimizer"]["name"],
        "batch_size": c["batch_size"],
        "seq_len": c["seq_len"],
        "steps": c["steps"],
        "epochs": c["epochs"],
        "max_timed_s": c["max_timed_s"],
        "seed": c["seed"],
        "remat": c["remat"],
        "num_tangents": c["num_tangents"],
        "dtype": c["dtype"],
        "jvp_impl": c["jvp_impl"],
        "warmup_steps": c["warmup_steps"],
        "num_layers": m["num_layers"],
        "hidden_size": m["hidden_size"],
        "grad_accum": c["grad_accum"],
        "last_k": c["last_k"],
        "jacfwd_chunk": c["jacfwd_chunk"],
        "hostname": platform.node(),
        "python_version": platform.python_version(),
        "git_sha": git_sha(),
        **{k: v for k, v in versions().items() if k in CSV_COLUMNS},
        **{k: v for k, v in outcome.items() if k in CSV_COLUMNS},
    }
    row.setdefault("device", c["device"])
    return row


def log_wandb(c: dict, row: dict, history: dict, results_dir: Path) -> None:
    from bench.sinks import WandbSink

    lg = c["logger"]
    WandbSink(
        project=lg["project"],
        group=row["sweep_id"],
        name=row["run_id"],
        config={k: v for k, v in c.items() if k not in ("ops", "threads")},  # scenario=ops keys, unused here
        mode=lg["mode"],
        dir=results_dir,
        entity=lg["entity"],
        tags=[c["framework"], c["mode"], *lg["tags"]],
        job_type=c["mode"],
    ).write(row, history)


# ---------------------------------------------------------------------------------------------------------------
# child: the trial itself


def measure(c: dict) -> dict:
    """Build, warm up, time and measure one trial. Runs in the child process only."""
    from bench import data
    from bench.trackers import HostRssTracker, StepTimer, timed
    from bench.weights import build_weights, weights_digest

    fw, m = c["framework"], c["model"]
    impl = _framework(fw)
    device = impl.resolve_device(c["device"])
    spec = bert_spec(m)
    sspec = step_spec(c)
    weights = build_weights(spec, c["seed"], m["checkpoint"])
    digest = weights_digest(weights)

    # Batches: warmup + timed updates of grad_accum micro-batches each, cycling epochs as needed. With `epochs`
    # set, the timed steps are that many passes' worth of updates; the warmup steps take the first batches of the
    # stream, so the timed ones start that many batches into epoch 0 and end as far into one more pass.
    dspec = data.data_spec(c["data"])
    n_timed = timed_steps(c)
    n_micro = (c["warmup_steps"] + n_timed) * c["grad_accum"]
    per_epoch = max(1, (dspec.num_train or n_micro * c["batch_size"]) // c["batch_size"])
    micro = data.make_batches(
        dspec, c["batch_size"], c["seq_len"], c["seed"], "train", epochs=math.ceil(n_micro / per_epoch)
    )[:n_micro]
    if len(micro) < n_micro:
        raise ValueError(f"data gave {len(micro)} batches, {n_micro} needed")
    data_fingerprint = data.fingerprint(micro)[:16]  # the same bytes reach both frameworks

    trainer = impl.make_trainer(spec, weights, sspec, device, c)
    del weights
    gc.collect()
    ga = c["grad_accum"]
    updates = [trainer.to_device(micro[i * ga : (i + 1) * ga]) for i in range(c["warmup_steps"] + n_timed)]
    del micro
    # held-out batches (in dataset order, as every framework sees them) resident before the baseline, like the rest
    held_out = (
        trainer.to_device(data.make_batches(dspec, c["batch_size"], c["seq_len"], c["seed"], "test"))
        if c["evaluate"]
        else []
    )
    every = c["eval_every"]
    trainer.sync()
    t0 = time.perf_counter()
    trainer.compile(updates[0])  # JAX: ahead of time, so the compiler's resident memory is in the baseline
    aot_compile_s = time.perf_counter() - t0
    gc.collect()

    trackers = impl.memory_trackers(device)  # primary first; on CUDA: allocator, NVML
    host = trackers[0] if isinstance(trackers[0], HostRssTracker) else HostRssTracker()
    if host is not trackers[0]:
        trackers.append(host)
    for t in trackers:
        t.baseline()  # weights, every batch and (JAX) the compiled step; optimizer state comes with step 1

    warm = []
    for i in range(c["warmup_steps"]):
        _, dt = timed(trainer.step, updates[i], sync=trainer.sync)
        warm.append(dt)
    if every:
        trainer.evaluate(held_out[:1])  # compile the evaluation before the window, as the warmup does the step
    _maybe_inject_fault("after_warmup")

    timer = StepTimer(sync=trainer.sync)
    losses = []
    evals: dict[int, tuple[float, float]] = {}  # timed step index -> (eval loss, eval accuracy)
    with ExitStack() as stack:
        for t in trackers:
            stack.enter_context(t.track())
        for i in range(n_timed):
            losses.append(timer(trainer.step, updates[c["warmup_steps"] + i]))
            if c["max_timed_s"] is not None and sum(timer.times_s) >= c["max_timed_s"]:
                break  # time budget spent: steps_timed < steps
            if every and (i + 1) % every == 0 and i + 1 < n_timed:
                # untimed, but inside the memory window: a no-grad forward at the step's batch size stays below
                # the peak of any training step, which runs at least that forward
                evals[i] = trainer.evaluate(held_out)
    losses = [float(x) for x in losses]  # after the window: the host transfer is not timed
    n_done = len(losses)  # < n_timed when max_timed_s cut the window short
    # After the measurements: held-out accuracy at the final weights, then gradient quality on the first batch.
    if c["evaluate"]:
        evals[n_done - 1] = trainer.evaluate(held_out)
    grad_cosine = cosine(*trainer.gradient_check(updates[0])) if c["measure_grad_cosine"] else None
    stats = timer.stats()
    primary = trackers[0].result()
    samples = c["batch_size"] * ga
    result = {
        "status": "ok",
        "device": device_kind(device),
        "device_name": impl.device_name(device) if device_kind(device) == "cuda" else cpu_name(),
        "n_params": trainer.n_params,
        "n_trainable": trainer.n_trainable,
        "weights_digest": digest,
        "data_fingerprint": data_fingerprint,
        "compile_time_s": aot_compile_s + warm[0],
        "warmup_time_s": aot_compile_s + sum(warm),
        **stats.to_row(),
        "samples_per_s": samples / stats.median_s,
        "tokens_per_s": samples * c["seq_len"] / stats.median_s,
        **primary.to_row(),
        "loss_first": losses[0],
        "loss_last": losses[-1],
        "steps": n_timed,
        "steps_timed": n_done,
        "epochs": c["epochs"],
        "jacfwd_chunk": trainer.jacfwd_chunk,
        "total_train_time_s": sum(timer.times_s),
        "grad_cosine": grad_cosine,
        "history": {"loss": losses, "step_time_s": timer.times_s},
    }
    if c["evaluate"]:
        result["eval_loss"], result["eval_accuracy"] = evals[n_done - 1]
        # aligned with the steps (None where no evaluation ran), so W&B logs each point at its step
        result["history"]["eval_loss"] = [evals[i][0] if i in evals else None for i in range(n_done)]
        result["history"]["eval_accuracy"] = [evals[i][1] if i in evals else None for i in range(n_done)]
    for t in trackers[1:]:
        r = t.result()
        if isinstance(t, HostRssTracker):
            result["host_peak_rss_mb"] = r.peak_mb
        elif t.method.startswith("nvml"):
            result["nvml_peak_mb"] = r.peak_mb
    if primary.reserved_peak_mb is not None:
        result["gpu_peak_reserved_mb"] = primary.reserved_peak_mb
    return result


def cosine(a, b) -> float:
    """cos(a, b) of two gradients given tensor by tensor (numpy), accumulated in float64: a float32 sum over
    10^8 entries would lose the small cosines (~1e-4) that a single forward-gradient direction gives."""
    import numpy as np

    dot = na = nb = 0.0
    for x, y in zip(a, b, strict=True):
        x, y = np.asarray(x, np.float64).ravel(), np.asarray(y, np.float64).ravel()
        dot, na, nb = dot + float(x @ y), na + float(x @ x), nb + float(y @ y)
    return dot / math.sqrt(na * nb) if na > 0 and nb > 0 else float("nan")


def device_kind(device) -> str:
    return "cuda" if "cuda" in str(device).lower() or "gpu" in str(device).lower() else "cpu"


def cpu_name() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            model = next(line.split(":", 1)[1].strip() for line in f if line.startswith("model name"))
    except (OSError, StopIteration):
        model = platform.processor() or "cpu"
    return f"{model} x{os.cpu_count()}"


def _framework(name: str):
    if name == "torch":
        from bench.torch_impl import backend
    else:
        from bench.jax_impl import backend
    return backend


def _maybe_inject_fault(where: str) -> None:
    """BENCH_INJECT_FAULT=<where>:<segv|abort|exit|oom> makes the trial fail for real at `where`; the tests use
    it to check that every failure is recorded with the right status and the sweep goes on."""
    spec = os.environ.get("BENCH_INJECT_FAULT", "")
    if not spec.startswith(where + ":"):
        return
    kind = spec.split(":", 1)[1]
    if kind == "segv":
        import ctypes

        ctypes.string_at(0)  # a real segmentation fault
    elif kind == "abort":
        os.abort()
    elif kind == "exit":
        os._exit(3)
    elif kind == "oom":
        raise MemoryError("injected")


def classify(e: BaseException) -> str:
    text = f"{type(e).__name__}: {e}"
    if isinstance(e, MemoryError) or "OutOfMemoryError" in type(e).__name__:
        return "oom"
    if "RESOURCE_EXHAUSTED" in text or "out of memory" in text.lower():
        return "oom"
    return "error"


def child_main(payload: str, result: str) -> None:
    faulthandler.enable()  # a segfault leaves a Python traceback in the log
    c = json.loads(Path(payload).read_text())
    progress: dict = {}

    def on_progress(partial: dict) -> None:
        # scenario=ops: the rows so far, without a status; the parent completes them if this process dies
        progress.clear()
        progress.update(partial)
        _write_result(result, partial)

    try:
        if c.get("scenario") == "ops":
            from bench.ops.measure import measure_ops

            out = measure_ops(c, on_progress)
        else:
            out = measure(c)
    except BaseException as e:  # noqa: BLE001 (every failure becomes a row)
        import traceback

        traceback.print_exc()
        msg = " ".join(str(e).split())[:500]
        out = {**progress, "status": classify(e), "error": f"{type(e).__name__}: {msg}"}
    _write_result(result, out)


def _write_result(path: str, out: dict) -> None:
    tmp = Path(path).with_suffix(".tmp")
    tmp.write_text(json.dumps(out))
    tmp.replace(path)  # atomic: the parent sees a whole result or none


if __name__ == "__main__":
    child_main(sys.argv[1], sys.argv[2])
