"""The model scenario's trial, in its own spawned process (with parallel=ddp|fsdp in torch: in every rank's).

Import one framework, set up the world (its devices and processes), build the weights, the batches and the
trainer, record the resident baseline, warm up (the first step compiles), then time `steps` synced steps (or
`epochs` passes) while the memory trackers watch. After the window, optionally: held-out loss and accuracy
(evaluate), and the cosine between the mode's gradient estimate and the exact gradient (measure_grad_cosine).
Every process measures its own devices; the main process gathers them into the trial's one result: memory as the
largest over devices (every device's in the history), time as the slowest process's.
"""

from __future__ import annotations

import _thread
import gc
import json
import math
import os
import signal
import time
from collections.abc import Callable
from contextlib import ExitStack
from dataclasses import replace
from pathlib import Path

import numpy as np
import psutil

from bench import data, estimators, models
from bench.config import TRACES, BenchConfig, model_spec, step_spec
from bench.harness.scenario import RUN_ID_ENV
from bench.harness.signals import maybe_inject_fault
from bench.measure.energy import EnergyWindow, energy_counter
from bench.measure.flop_model import predict as predict_flops
from bench.measure.flop_model import published_peak, useful_flops
from bench.measure.memory_model import predict
from bench.measure.system import cpu_name
from bench.measure.timeline import explain, load_events
from bench.measure.timing import StepTimer, timed
from bench.measure.trackers import HostMemWatchdog, HostRssTracker, MiB
from bench.parallel import expected_comm_bytes, global_batch_size, timed_steps
from bench.scenarios.model.schedule import next_evaluation
from bench.scenarios.model.target import Target
from bench.spec import World, implementation
from bench.weights import build_weights, weights_digest


def measure(cfg: BenchConfig, on_progress=None) -> dict:
    """The trial: this process's part of it, and on the main process the whole trial's result. `on_progress`
    receives the curve so far at each evaluation (a trial that dies or is stopped keeps it)."""
    par = implementation(cfg.framework, "parallel")
    world = par.start(cfg)  # before anything touches a device: JAX fixes its CPU device count here
    try:
        mine = measure_process(cfg, world, on_progress if world.main else None)
        everyone = world.gather(mine)
    finally:
        world.close()
    if not world.main:
        return {"status": "ok", "rank": world.rank}
    return merge(cfg, everyone)


def measure_process(cfg: BenchConfig, world: World, on_progress=None) -> dict:
    """Build, warm up, time and measure this process's part of the trial."""
    fw, m = cfg.framework, cfg.model
    dev, steps = implementation(fw, "device"), implementation(fw, "steps")
    # What the imports made is never garbage: frozen out of the collector, a gc.collect() below does not walk it,
    # nor does any collection during a timed step (docs/methodology.md).
    gc.collect()
    gc.freeze()
    device = world.device
    kind = dev.device_kind(device)
    dev.limit_memory(device, cfg.budget_mb)
    dev.deterministic(cfg.deterministic)
    spec = model_spec(m)
    weights = build_weights(spec, cfg.seed, m.checkpoint)
    digest = weights_digest(weights)

    # Batches: warmup + timed updates of grad_accum micro-batches each, cycling epochs as needed. With `epochs`
    # set, the timed steps are that many passes' worth of updates; the warmup steps take the first batches of the
    # stream, so the timed ones start that many batches into epoch 0 and end as far into one more pass. Every
    # micro-batch is made at its global size (batch_size x every device), exactly the single-device batch, and
    # each process keeps its devices' rows of it.
    dspec = data.data_spec(cfg.data)
    batch = global_batch_size(cfg)
    n_timed = timed_steps(cfg)
    n_micro = (cfg.warmup_steps + n_timed) * cfg.grad_accum
    per_epoch = max(1, (dspec.num_train or n_micro * batch) // batch)
    pad = spec.pad_token_id  # the model family's (OPT's head reads the last token that is not padding)
    micro = data.make_batches(
        dspec, batch, cfg.seq_len, cfg.seed, "train", epochs=math.ceil(n_micro / per_epoch), pad_id=pad
    )
    micro = micro[:n_micro]
    if len(micro) < n_micro:
        raise ValueError(f"data gave {len(micro)} batches, {n_micro} needed")
    data_fingerprint = data.fingerprint(micro)[:16]  # the same bytes reach both frameworks, and every world size
    micro = world.local_batches(micro)

    trainer = steps.make_trainer(
        spec, weights, step_spec(cfg), device, attn_implementation=cfg.attn_implementation, world=world
    )
    del weights
    gc.collect()
    ga = cfg.grad_accum
    updates = [trainer.to_device(micro[i * ga : (i + 1) * ga]) for i in range(cfg.warmup_steps + n_timed)]
    del micro
    # held-out batches (in dataset order, as every framework sees them) resident before the baseline, like the rest
    held_out, held_out_facts = [], {}
    if cfg.evaluate:
        held_out = data.make_batches(dspec, cfg.batch_size, cfg.seq_len, cfg.seed, "test", pad_id=pad)
        # the examples a target is met on: another held-out set is another target (the report's cost groups)
        held_out_facts = {
            "eval_examples": len(held_out) * cfg.batch_size,
            "eval_fingerprint": data.fingerprint(held_out)[:16],
        }
        held_out = trainer.to_device(held_out)
    every = cfg.eval_every
    due = next_evaluation(0, every, cfg.eval_resolution, cfg.warmup_steps) if every else 0  # 0: none in the window
    target = Target(cfg)
    trainer.sync()
    clock = Clock()  # the wall clock to a target starts here: compilation included, evaluations not, as AlgoPerf
    trainer.compile(updates[0])  # JAX: ahead of time, so the compiler's resident memory is in the baseline
    aot_compile_s = time.perf_counter() - clock.t0
    gc.collect()

    trackers = world.memory_trackers()  # primary first; on CUDA: allocator, NVML
    host = next((t for t in trackers if isinstance(t, HostRssTracker)), None)
    if host is None:
        host = HostRssTracker()
        trackers.append(host)
    for t in trackers:
        t.baseline()  # weights, every batch and (JAX) the compiled step; optimizer state comes with step 1

    warm = []
    where = {
        "device": kind,
        "device_name": dev.device_name(device) if kind == "cuda" else cpu_name(),
        "n_params": trainer.n_params,
        "n_trainable": trainer.n_trainable,
    }  # a diverged row says them too
    watch = LossWatch(cfg.divergence_factor, where)
    for i in range(cfg.warmup_steps):
        loss, dt = timed(trainer.step, updates[i], sync=trainer.sync)
        warm.append(dt)
        watch(float(loss), f"warm-up step {i + 1}")
    if every:
        clock.evaluate(trainer, held_out[:1])  # compile the evaluation before the window, as the warmup does the step
    maybe_inject_fault("after_warmup")
    maybe_inject_fault(f"after_warmup_rank{world.rank}")  # tests: one rank of a process group dies

    timer = StepTimer(sync=trainer.sync)
    energy = EnergyWindow(energy_counter(kind))  # the device's joules over the timed steps, where it counts them
    losses = []
    evals: dict[int, tuple[float, float]] = {}  # timed step index -> (eval loss, eval accuracy)

    def curve() -> dict:
        return {"loss": losses, "step_time_s": timer.times_s, **eval_series(evals, len(losses))}

    world.reset_comm()
    with ExitStack() as stack:
        for t in trackers:
            stack.enter_context(t.track())
        energy.start()
        for i in range(n_timed):
            losses.append(float(timer(trainer.step, updates[cfg.warmup_steps + i])))  # synced: the copy is not timed
            watch(losses[-1], f"timed step {i + 1}", losses)
            if cfg.max_timed_s is not None and sum(timer.times_s) >= cfg.max_timed_s:
                break  # time budget spent: steps_timed < steps
            if i + 1 == due and i + 1 < n_timed:
                due = next_evaluation(i + 1, every, cfg.eval_resolution, cfg.warmup_steps)
                # untimed, but inside the memory window: a no-grad forward at the step's batch size stays below
                # the peak of any training step, which runs at least that forward
                with energy.outside(i):
                    evals[i] = clock.evaluate(trainer, held_out)
                if on_progress is not None:
                    on_progress({"history": curve()})
                maybe_inject_fault("after_eval")  # tests: a trial that dies mid-curve keeps the curve so far
                if target.check(evals[i], i, clock.training_s()):
                    break  # reached (the last evaluation of the run that held), or capped: the trial ends
        energy.stop()
    n_done = len(losses)  # < n_timed when max_timed_s cut the window short or the target was reached
    comm = world.comm_bytes_per_step(trainer, n_done)
    # After the measurements: held-out accuracy at the final weights, then gradient quality on the first batch.
    if cfg.evaluate and n_done - 1 not in evals:
        evals[n_done - 1] = clock.evaluate(trainer, held_out)
        target.check(evals[n_done - 1], n_done - 1, clock.training_s())
    grad_cosine = cosine(*trainer.gradient_check(updates[0])) if cfg.measure_grad_cosine else None
    stats = timer.stats()
    devices = world.device_memory(trainer, trackers)
    state = trainer.state_bytes()
    # what holds the memory: one instrumented step (torch) or the compiled programs (JAX), never timed
    held = implementation(fw, "memory").breakdown(trainer, updates[0])
    # where the time goes: a profiler's trace of a few more steps (profile=true), then the FLOPs and the kernels of one
    explained = explain_time(cfg, world, trainer, updates) if cfg.profile else {}
    explained.update(flop_columns(cfg, trainer, updates[0], stats.median_s, device, kind))
    explained.update(kernel_columns(cfg, trainer, updates[0], stats.median_s))
    for d in devices:
        d.update(
            rank=world.rank,
            mem_params_mb=state["params"] / MiB,
            mem_optimizer_mb=state["optimizer"] / MiB,
            step_time_median_s=stats.median_s,
        )
        d.update(breakdown_columns(held, d))
    samples = global_batch_size(cfg) * ga
    result = {
        "status": "ok",
        **where,  # device, device_name, n_params, n_trainable
        "num_threads": dev.num_threads(),
        "n_sharded": trainer.n_sharded,
        "weights_digest": digest,
        "data_fingerprint": data_fingerprint,
        "compile_time_s": aot_compile_s + warm[0],
        "aot_compile_s": aot_compile_s,
        # JAX: whether those programs came from the persistent compilation cache (a hit's compile is its read)
        "compile_cache": getattr(trainer, "compile_cache", None),
        "warmup_time_s": aot_compile_s + sum(warm),
        **stats.to_row(),
        "samples_per_s": samples / stats.median_s,
        "tokens_per_s": samples * cfg.seq_len / stats.median_s,
        "loss_first": losses[0],
        "loss_last": losses[-1],
        "steps": n_timed,
        "steps_timed": n_done,
        "epochs": cfg.epochs,
        **estimators.step_columns(trainer.spec),  # its settings as it ran them (jacfwd.chunk=auto resolved)
        "total_train_time_s": sum(timer.times_s),
        "grad_cosine": grad_cosine,
        "comm_bytes_per_step": comm,
        "host_peak_rss_mb": host.result().peak_mb,
        "devices": devices,
        **explained,
        "history": curve(),
        **target.columns(warm, timer.times_s, global_batch_size(cfg) * ga),
    }
    result.update(energy.columns(n_done, sum(timer.times_s)))
    if target.reached is not None:
        step = target.reached[0]
        result["energy_to_target_j"] = energy.to_target(
            step, sum(timer.times_s[: step + 1]), result["seconds_to_target"]
        )
    energy.counter.close()
    primary = trackers[0].result()
    if primary.reserved_peak_mb is not None:
        result["gpu_peak_reserved_mb"] = primary.reserved_peak_mb
    nvml = [t for t in trackers if t.method.startswith("nvml")]
    if nvml:
        result["nvml_peak_mb"] = nvml[0].result().peak_mb
    if cfg.evaluate:
        result["eval_loss"], result["eval_accuracy"] = evals[n_done - 1]
        result["eval_time_s"] = clock.eval_s
        result.update(held_out_facts)
    return result


def explain_time(cfg: BenchConfig, world: World, trainer, updates: list) -> dict:
    """profile=true: profile_steps more steps under the framework's profiler, after the timed window and never
    in it, their trace under results_dir/traces/<run_id>/rank<r>/ (each process its own) with a summary.json of
    the time by category and the top operations, and the same in the row. A profiler that fails costs the trial
    only its trace: the row says trace_status missing, and why."""
    prof = implementation(cfg.framework, "profile")
    folder = Path(cfg.results_dir) / TRACES / os.environ.get(RUN_ID_ENV, "unnamed") / f"rank{world.rank}"
    batches = [updates[i % len(updates)] for i in range(cfg.profile_steps)]  # resident already: no new memory
    try:
        maybe_inject_fault("in_profile")  # tests: a profiler that fails
        path = record_within_memory(prof, trainer, batches, folder)
        events = load_events(path)
        explained = explain(events, prof.classify(trainer, events))
        del events
        columns = {**explained.columns(), "trace_status": "ok", "trace_path": str(path)}
        (folder / "summary.json").write_text(json.dumps({**columns, "top_ops": explained.top_ops}, indent=1))
    except Exception as e:  # noqa: BLE001 (the measurements are made: a failed profiler must not lose them)
        return {"trace_status": f"missing: {type(e).__name__}: {e}"[:300]}
    return columns


class ProfilerOutgrewMemory(Exception):
    """The profiler's events grew past what this host could spare: stopped, its trace not kept."""


def record_within_memory(prof, trainer, batches: list, folder: Path) -> Path:
    """prof.record, stopped (ProfilerOutgrewMemory) once this process holds PROFILER_HOST_SHARE of the host
    memory that was free when it began: a profiler keeps every event of the steps it traces, and torch's jacfwd
    on the head of MiniLM (hundreds of vmapped chunks a step) took its process past 24 GiB, to the kernel's OOM
    killer, which would have taken the trial's row with it. The watchdog interrupts the main thread; torch's
    jacfwd loops over its chunks in Python, so the interrupt lands within a chunk."""
    start = psutil.Process().memory_info().rss / MiB
    limit = start + PROFILER_HOST_SHARE * psutil.virtual_memory().available / MiB
    # interrupt_main does nothing where SIGINT is ignored: Python's own handler for the while
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        with HostMemWatchdog(os.getpid(), limit, on_exceed=lambda _: _thread.interrupt_main()) as dog:
            try:
                return prof.record(trainer, batches, folder)
            except KeyboardInterrupt:
                if not dog.exceeded.is_set():
                    raise
    finally:
        signal.signal(signal.SIGINT, previous)
    gc.collect()
    raise ProfilerOutgrewMemory(
        f"the profiler's events took this process past {limit:.0f} MiB ({start:.0f} "
        f"before it, + {PROFILER_HOST_SHARE:.0%} of the host's free memory); stopped"
    )


def flop_columns(cfg: BenchConfig, trainer, batches, step_s: float, device, kind: str) -> dict:
    """A step's matmul FLOPs as the framework counts them (torch: one more step under FlopCounterMode; JAX: the
    compiled programs' dots, nothing run) and as the model predicts them (bench/measure/flop_model.py), the rate
    the timed median step reached, and that rate against this host's matmul peak (a short probe in this process,
    the trial's dtype) and, on a GPU, against its published peak: MFU, as torchtitan reports it. Per device."""
    fl = implementation(cfg.framework, "flops")
    try:
        counted = fl.count(trainer, batches)
        peak = fl.matmul_peak(device, cfg.dtype)
    except Exception as e:  # noqa: BLE001 (the measurements are made: a failed count must not lose them)
        return {"flops_method": f"missing: {type(e).__name__}: {e}"[:300]}
    predicted = predict_flops(
        model_spec(cfg.model),
        trainer.spec,
        cfg.batch_size,
        cfg.seq_len,
        framework=cfg.framework,
    )
    # one forward pass over the step's samples, the model's (no tangents, no backward): the unit of forward-pass
    # equivalents, and 3x it the useful FLOPs of a training step that MFU counts (PaLM's, torchtitan's)
    forward = predict_flops(
        model_spec(cfg.model), replace(step_spec(cfg), mode=estimators.BASELINE), cfg.batch_size, cfg.seq_len
    )
    rate = counted["flops_per_step"] / step_s
    useful = useful_flops(forward.total if forward else None, cfg.mode)
    published = (
        published_peak(implementation(cfg.framework, "device").device_name(device), cfg.dtype)
        if kind == "cuda"
        else None
    )
    return {
        "flops_per_step": counted["flops_per_step"],
        "flops_method": counted["flops_method"],
        "flops_predicted": predicted.total if predicted else None,
        "flops_forward": forward.total if forward else None,
        "flops_per_s": rate,
        "matmul_peak_flops_per_s": peak,
        "utilisation": rate / peak if peak else None,
        "peak_flops_per_s": published,
        # the counted FLOPs' rate over the peak (hardware FLOPs: recomputation, forward mode's tangents) and the
        # model's useful FLOPs' (rows before hfu existed hold the former under mfu)
        "hfu": rate / published if published else None,
        "mfu": useful / step_s / published if published and useful else None,
    }


def kernel_columns(cfg: BenchConfig, trainer, batches, step_s: float) -> dict:
    """The kernels a step launches and the host's share of the timed median step `step_s`, from one more step
    (bench/<framework>_impl/kernels.py, docs/time.md). A count that fails costs the row only these columns."""
    try:
        counted = implementation(cfg.framework, "kernels").count(trainer, batches, step_s)
    except Exception as e:  # noqa: BLE001 (the measurements are made: a failed count must not lose them)
        return {"kernels_method": f"missing: {type(e).__name__}: {e}"[:300]}
    counted.pop("kernels_top")  # for a reader at the console, not a column
    return counted


def eval_series(evals: dict[int, tuple[float, float]], n: int) -> dict:
    """The held-out loss and accuracy aligned with the steps (None where no evaluation ran), so W&B logs each
    point at its step; {} without evaluations."""
    if not evals:
        return {}
    return {
        "eval_loss": [evals[i][0] if i in evals else None for i in range(n)],
        "eval_accuracy": [evals[i][1] if i in evals else None for i in range(n)],
    }


class Clock:
    """The wall clock to a target, as AlgoPerf's runner keeps it (accumulated_submission_time): seconds since
    the compilation began, less the held-out evaluations, which it keeps apart (accumulated_eval_time), so a
    schedule that looks more often is not charged for looking."""

    def __init__(self, now: Callable[[], float] = time.perf_counter):
        self.now = now  # a test's fake clock, which it advances, keeps the test off the host's speed
        self.t0, self.eval_s = now(), 0.0

    def evaluate(self, trainer, batches) -> tuple[float, float]:
        out, seconds = timed(trainer.evaluate, batches, clock=self.now)  # (loss, accuracy): synced already
        self.eval_s += seconds
        return out

    def training_s(self) -> float:
        return self.now() - self.t0 - self.eval_s


class Diverged(Exception):
    """The loss turned non-finite or grew past divergence_factor x its first value: the trial stops at once and
    its row says `diverged` and where (a diverged run's time and memory are not a measurement of the method)."""

    status = "diverged"

    def __init__(self, loss: float, where: str, losses: list[float], facts: dict):
        super().__init__(f"loss {loss!r} at {where}")
        self.fields = {**facts, "diverged_at": where, "history": {"loss": losses}}


class LossWatch:
    """Raises Diverged for a loss that is not finite, or above `factor` x the first loss seen; `facts` (where the
    trial ran, its model's size) go into the row with it."""

    def __init__(self, factor: float, facts: dict):
        self.factor, self.facts, self.first = factor, facts, None

    def __call__(self, loss: float, where: str, losses: list[float] = ()) -> None:
        if self.first is None:
            self.first = loss
        if not math.isfinite(loss) or (math.isfinite(self.first) and abs(loss) > self.factor * abs(self.first)):
            raise Diverged(loss, where, list(losses), self.facts)


# The share of the host's free memory a profiler may take before it is stopped (record_within_memory): half,
# so that the trial, its parent and whatever else runs keep the rest.
PROFILER_HOST_SHARE = 0.5
BREAKDOWN = ("trainable", "grads", "directions", "saved", "temp", "tracked_peak")


def breakdown_columns(held: dict, device: dict) -> dict:
    """The breakdown's mem_*_mb columns for one device. Where the framework has no allocator statistics (torch
    on the CPU), temp is what the device's measured excess leaves after the optimizer state and the other
    categories: labelled so in the method."""
    out = {f"mem_{k}_mb": held[k] / MiB for k in BREAKDOWN if held[k] is not None}
    method = held["method"]
    if held["temp"] is None and device.get("excess_mem_mb") is not None:
        # the heap keeps what a category freed in pieces the next buffers do not fit (bench/memory_model.py):
        # the high-water mark holds every category's peak, summed
        held_each = sum(out[f"mem_{k}_mb"] for k in ("grads", "directions", "saved"))
        rest = device["excess_mem_mb"] - device["mem_optimizer_mb"] - held_each
        out["mem_temp_mb"] = max(rest, 0.0)
        method += f"+{device['mem_method']}_remainder"
    return {**out, "mem_breakdown_method": method}


def merge(cfg: BenchConfig, results: list[dict]) -> dict:
    """The trial's result from every process's: memory as the largest over devices (each device's in the
    history), step time as the slowest process's, host RSS as the largest process's. The main process's result
    is the base (its loss is the global batch's, as every process's is)."""
    devices = [d for r in results for d in r["devices"]]
    slowest = max(results, key=lambda r: r["step_time_median_s"])
    worst = max(devices, key=lambda d: d["peak_mem_mb"] if d["peak_mem_mb"] is not None else -math.inf)
    main = results[0]
    out = {k: v for k, v in main.items() if k != "devices"}
    timing = ("samples_per_s", "tokens_per_s", "total_train_time_s")
    out.update({k: v for k, v in slowest.items() if k.startswith("step_time_") or k in timing})
    out["history"] = {**main["history"], "step_time_s": slowest["history"]["step_time_s"], "devices": devices}
    columns = (
        "peak_mem_mb",
        "excess_mem_mb",
        "baseline_mem_mb",
        "mem_params_mb",
        "mem_optimizer_mb",
        *(f"mem_{k}_mb" for k in BREAKDOWN),
    )
    for column in columns:
        values = [d[column] for d in devices if d.get(column) is not None]
        out[column] = max(values) if values else None
    out["mem_method"] = worst["mem_method"]
    out["mem_breakdown_method"] = worst.get("mem_breakdown_method")
    out.update(predicted_columns(cfg, main, len(devices)))
    out["host_peak_rss_mb"] = max(r["host_peak_rss_mb"] or 0 for r in results) or None
    out["world_size"] = len(devices)
    out["comm_bytes_expected"] = expected_comm_bytes(cfg, main["n_trainable"], main["n_sharded"])
    out["model_note"] = unmodelled(cfg, out)
    if out.get("seconds_to_target") is not None and out["excess_mem_mb"] is not None:
        out["mib_s_to_target"] = out["excess_mem_mb"] * out["seconds_to_target"]  # memory held x time it is held
    if out.get("steps_to_target") is not None and (passes := estimators.get(cfg.mode).forward_passes_for(out)):
        out["passes_to_target"] = out["steps_to_target"] * passes  # as the method counts them (MeZO's 2 a step)
    return out


def predicted_columns(cfg: BenchConfig, main: dict, world: int) -> dict:
    """The memory model's prediction for the trial (bench.memory_model), per device: the excess and each
    category the breakdown measures."""
    step = estimators.get(cfg.mode).resolved(step_spec(cfg), cfg.framework, main["device"])  # as the trainer's
    p = predict(
        model_spec(cfg.model),
        step,
        cfg.batch_size,
        cfg.seq_len,
        framework=cfg.framework,
        device=main["device"],
        world=world,
        sharded=cfg.parallel == "fsdp",
    )
    p = p.mib() if p is not None else dict.fromkeys(("excess", "saved", "grads", "directions", "temp"))
    return {
        "mem_predicted_mb": p["excess"],
        **{f"mem_predicted_{k}_mb": p[k] for k in ("saved", "grads", "directions", "temp")},
    }


def unmodelled(cfg: BenchConfig, row: dict) -> str | None:
    """A note naming the models that have no term for this trial's mode (bench/estimators/): its model cells are
    empty, what was measured stands."""
    missing = [
        name
        for name, column in (
            ("memory", "mem_predicted_mb"),
            ("FLOP", "flops_predicted"),
            ("communication", "comm_bytes_expected"),
        )
        if column in row and row[column] is None
    ]  # one device: 0 bytes expected, not None
    if not missing:
        return None
    which = " and ".join(missing) + (" models" if len(missing) > 1 else " model")
    family = models.of(model_spec(cfg.model))
    # a family the models do not know yet (bench/models/<family>.py), or a mode they do not
    what = f"model.family={family.NAME}" if {"memory", "flops"} - family.MODELLED else f"mode={cfg.mode}"
    return f"{what}: no term in the {which}; those cells are empty, the measurements stand"


def cosine(a, b) -> float:
    """cos(a, b) of two gradients given tensor by tensor (numpy), accumulated in float64: a float32 sum over
    10^8 entries would lose the small cosines (~1e-4) that a single forward-gradient direction gives."""
    dot = na = nb = 0.0
    for x, y in zip(a, b, strict=True):
        x, y = np.asarray(x, np.float64).ravel(), np.asarray(y, np.float64).ravel()
        dot, na, nb = dot + float(x @ y), na + float(x @ x), nb + float(y @ y)
    return dot / math.sqrt(na * nb) if na > 0 and nb > 0 else float("nan")
