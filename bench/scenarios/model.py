"""Scenario `model` (the default): one way of differentiating BERT, in one framework, as one trial -> one row of
runs.csv, its per-step history (history/<run_id>.json) and one W&B run.

The trial (child side, `measure`): import one framework, build the weights, the batches and the trainer, record
the resident baseline, warm up (the first step compiles), then time `steps` synced steps (or `epochs` passes)
while the memory trackers watch. After the window, optionally: held-out loss and accuracy (evaluate), and the
cosine between the mode's gradient estimate and the exact gradient (measure_grad_cosine).
"""

from __future__ import annotations

import gc
import importlib.util
import json
import math
import os
import time
from contextlib import ExitStack
from pathlib import Path

import numpy as np

from bench import data
from bench.config import NOT_IDENTITY, at_least, bert_spec, choice, step_spec, timed_steps
from bench.errors import ConfigError
from bench.results import summary_table
from bench.scenarios.base import Scenario
from bench.sinks import CSV_COLUMNS, WandbSink
from bench.spec import (
    ATTN_IMPLEMENTATIONS,
    JVP_IMPLS,
    MODES,
    OPTIMIZERS,
    TRAINABLE_SCOPES,
    count_params,
    implementation,
)
from bench.system import cpu_name, host_facts, jaxlib_at_least, maybe_inject_fault
from bench.timing import StepTimer, timed
from bench.trackers import HostRssTracker
from bench.weights import WeightsError, build_weights, resolve_checkpoint, weights_digest

DTYPES = ("fp32",)
# Keys only scenario=ops reads. A model trial's identity leaves them out: it hashes as it did before scenarios
# existed, so `resume` still finds rows recorded then.
OTHER_SCENARIOS_KEYS = ("scenario", "threads", "ops")
# The optimizer's hyperparameters as runs.csv columns (the optimizer's name is the `optimizer` column); `eps` is
# AdamW's epsilon, named apart from mezo_eps.
OPTIMIZER_COLUMNS = {"lr": "lr", "momentum": "momentum", "weight_decay": "weight_decay", "beta1": "beta1",
                     "beta2": "beta2", "eps": "adam_eps"}  # fmt: skip


class ModelScenario(Scenario):
    name = "model"
    results_file = "runs.csv"
    columns = CSV_COLUMNS
    report_module = "bench.report"

    # -- parent side -------------------------------------------------------------------------------------------
    def validate(self, c: dict) -> None:
        validate(c)

    def identity_keys(self, c: dict) -> tuple[str, ...]:
        return tuple(k for k in c if k not in NOT_IDENTITY + OTHER_SCENARIOS_KEYS)

    def kind(self, c: dict) -> str:
        return c["mode"]

    def label(self, c: dict) -> str:
        return trial_label(c)

    def env(self, c: dict) -> dict[str, str]:
        if c["framework"] != "jax" or not jaxlib_at_least(0, 5):
            return {}
        # XLA:CPU's default scheduler orders the program for concurrency and ignores memory: it runs every
        # layer's rematerialisation during the forward pass, so checkpointing saves nothing (MiniLM backprop
        # temp 500 MiB with or without remat), and every mode holds more than it must. The memory-minimising
        # scheduler gives remat its saving (185 MiB) and backprop 420 MiB; GPU backends ignore this flag.
        flags = os.environ.get("XLA_FLAGS", "")
        if "xla_cpu_enable_concurrency_optimized_scheduler" in flags:
            return {}  # the user's own choice stands
        return {"XLA_FLAGS": f"{flags} --xla_cpu_enable_concurrency_optimized_scheduler=false".strip()}

    def rows(self, c: dict, outcome: dict, ids: dict) -> list[dict]:
        return [make_row(c, outcome, ids)]

    def save(self, results_dir: Path, rows: list[dict], outcome: dict) -> None:
        save_history(results_dir, rows[0]["run_id"], outcome.get("history"))

    def describe(self, outcome: dict, rows: list[dict]) -> str:
        return describe(rows[0])

    def log_wandb(self, c: dict, rows: list[dict], outcome: dict, results_dir: Path) -> None:
        lg, row = c["logger"], rows[0]
        WandbSink(
            project=lg["project"],
            group=row["sweep_id"],
            name=row["run_id"],
            config={k: c[k] for k in self.config_keys(c)},
            mode=lg["mode"],
            dir=results_dir,
            entity=lg["entity"],
            tags=[c["framework"], c["mode"], *lg["tags"]],
            job_type=c["mode"],
        ).write(row, outcome.get("history", {}))

    def sweep_rows(self, rows: list[dict], hashes: list[str]) -> list[dict]:
        # the latest row of each trial of the sweep: resumed trials show their earlier result
        latest = {r["config_hash"]: r for r in rows}
        return [latest[h] for h in hashes if h in latest]

    def summary(self, rows: list[dict]) -> str:
        return summary_table(rows)

    # -- child side --------------------------------------------------------------------------------------------
    def measure(self, c: dict, on_progress) -> dict:
        return measure(c)


# ---------------------------------------------------------------------------------------------------------------
# validation


def validate(c: dict) -> None:
    """Raise ConfigError (one line) for the first problem in a model trial's keys."""
    if str(c.get("threads", "all")) != "all":
        raise ConfigError(f"threads={c['threads']}: applies to scenario=ops only; the model scenario accepts all")
    m = c["model"]
    choice("mode", c["mode"], MODES)
    choice("trainable", c["trainable"], TRAINABLE_SCOPES)
    choice("optimizer", c["optimizer"]["name"], OPTIMIZERS)
    choice("jvp_impl", c["jvp_impl"], JVP_IMPLS)
    choice("dtype", c["dtype"], DTYPES)
    choice("attn_implementation", c["attn_implementation"], ATTN_IMPLEMENTATIONS)
    for name in ("batch_size", "seq_len", "steps", "grad_accum", "num_tangents"):
        at_least(name, c[name], 1)
    at_least("warmup_steps", c["warmup_steps"], 1)  # the first step compiles; it must never be timed
    for name in ("vocab_size", "hidden_size", "num_layers", "num_heads", "intermediate_size"):
        at_least(f"model.{name}", m[name], 1)
    at_least("model.max_position_embeddings", m["max_position_embeddings"], 2)
    if not isinstance(m["num_labels"], int) or m["num_labels"] < 2:
        raise ConfigError(f"model.num_labels={m['num_labels']}: must be an integer >= 2")
    if not 0.0 <= m["dropout"] < 1.0:
        raise ConfigError(f"model.dropout={m['dropout']}: must be in [0, 1)")
    at_least("optimizer.lr", c["optimizer"]["lr"], 0)
    if c["mezo_eps"] <= 0:
        raise ConfigError(f"mezo_eps={c['mezo_eps']}: must be > 0")
    if c["max_timed_s"] is not None:
        at_least("max_timed_s", c["max_timed_s"], 0)
    if c["jacfwd_chunk"] != "auto" and (not isinstance(c["jacfwd_chunk"], int) or c["jacfwd_chunk"] < 1):
        raise ConfigError(f"jacfwd_chunk={c['jacfwd_chunk']}: accepted auto | an integer >= 1")
    spec = bert_spec(m)
    if c["seq_len"] > spec.max_position_embeddings:
        raise ConfigError(
            f"seq_len={c['seq_len']}: above model.max_position_embeddings={spec.max_position_embeddings} "
            f"of model={m['name']}; accepted 1..{spec.max_position_embeddings}"
        )
    if c["trainable"] == "last_k" and not 1 <= c["last_k"] <= spec.num_layers:
        raise ConfigError(f"last_k={c['last_k']}: accepted 1..{spec.num_layers} (model.num_layers)")
    if c["remat"] and c["mode"] != "backprop":
        raise ConfigError(f"remat=true: applies to mode=backprop only (got mode={c['mode']}); use case=backprop_remat")
    if c["framework"] == "jax" and c["jvp_impl"] != "func":
        raise ConfigError(f"jvp_impl={c['jvp_impl']}: torch only; framework=jax accepts jvp_impl=func (jax.jvp)")
    if c["framework"] == "jax" and c["attn_implementation"] != "eager":
        raise ConfigError(f"attn_implementation={c['attn_implementation']}: torch only; framework=jax accepts eager")
    if c["mode"] == "jacfwd":
        n = count_params(spec, c["trainable"], c["last_k"])
        if n > c["jacfwd_max_params"]:
            raise ConfigError(
                f"mode=jacfwd with trainable={c['trainable']}: {n:,} trainable parameters, one forward-mode pass "
                f"each (> jacfwd_max_params={c['jacfwd_max_params']:,}); accepted: trainable=head|bias|last_k with "
                "fewer parameters, or a larger jacfwd_max_params"
            )
    validate_outputs(c)
    validate_data(c)
    if m["checkpoint"] is not None:
        try:
            resolve_checkpoint(m["checkpoint"])
        except WeightsError as e:
            raise ConfigError(str(e)) from e


def validate_outputs(c: dict) -> None:
    """epochs, evaluate, eval_every and measure_grad_cosine: what a trial records beyond the timed steps."""
    for name in ("evaluate", "measure_grad_cosine"):
        if not isinstance(c[name], bool):
            raise ConfigError(f"{name}={c[name]}: accepted true | false")
    if c["epochs"] is not None:
        if not isinstance(c["epochs"], int) or isinstance(c["epochs"], bool) or c["epochs"] < 1:
            raise ConfigError(f"epochs={c['epochs']}: accepted null | an integer >= 1")
        if c["data"]["num_train"] is None:
            raise ConfigError(f"epochs={c['epochs']}: needs data.num_train (samples per epoch); got null")
        if timed_steps(c) < 1:
            raise ConfigError(
                f"epochs={c['epochs']}: data.num_train={c['data']['num_train']} holds no full update "
                f"of batch_size={c['batch_size']} x grad_accum={c['grad_accum']}; accepted: a larger "
                "data.num_train"
            )
    at_least("eval_every", c["eval_every"], 0)
    if c["eval_every"] and not c["evaluate"]:
        raise ConfigError(f"eval_every={c['eval_every']}: needs evaluate=true")
    if c["measure_grad_cosine"] and c["mode"] == "inference":
        raise ConfigError(
            "measure_grad_cosine=true: mode=inference has no gradient; accepted with backprop | jvp | jacfwd | mezo"
        )


def validate_data(c: dict) -> None:
    """The data module's own checks, plus whether an ag_news source exists at all (its contents are checked when
    the trial reads it; a bad file is reported as one line naming the file and line)."""
    spec = data.data_spec(c["data"])
    data.validate(spec, c["batch_size"], c["seq_len"])
    if c["evaluate"]:
        data.validate(spec, c["batch_size"], c["seq_len"], split="test")
    if spec.name == "ag_news":
        if spec.path is not None:
            p = Path(spec.path).expanduser()
            if not (p / "train.csv" if p.is_dir() else p).is_file():
                raise ConfigError(
                    f"data.path={spec.path}: no such file (accepted: an AG News CSV or a directory "
                    "with train.csv and test.csv)"
                )
        elif importlib.util.find_spec("datasets") is None:
            raise ConfigError(
                "data=ag_news: no local CSV (data.path=null) and the datasets package is not "
                "installed; pass data.path=/path/to/ag_news/train.csv (class index 1-4, title, "
                "description)"
            )


# ---------------------------------------------------------------------------------------------------------------
# parent side: labels, rows, history


def trial_label(c: dict) -> str:
    extra = [
        "remat" if c["remat"] else "",
        f"K={c['num_tangents']}" if c["mode"] == "jvp" else "",
        c["jvp_impl"] if c["mode"] == "jvp" and c["framework"] == "torch" else "",
        f"trainable={c['trainable']}" if c["trainable"] != "all" else "",
    ]
    shape = f"L{c['model']['num_layers']} B{c['batch_size']} T{c['seq_len']}"
    return " ".join([c["framework"], c["mode"], *[e for e in extra if e], c["model"]["name"], shape])


def make_row(c: dict, outcome: dict, ids: dict) -> dict:
    """The trial's runs.csv row: its configuration (every knob that can change a measured number among it), where
    it ran, and what the child measured (or the parent's verdict)."""
    m, o = c["model"], c["optimizer"]
    row = {
        **ids,
        "framework": c["framework"],
        "mode": c["mode"],
        "model": m["name"],
        "data": c["data"]["name"],
        "trainable": c["trainable"],
        "optimizer": o["name"],
        **{column: o[key] for key, column in OPTIMIZER_COLUMNS.items()},
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
        "attn_implementation": c["attn_implementation"],
        "mezo_eps": c["mezo_eps"],
        "dropout": m["dropout"],
        "warmup_steps": c["warmup_steps"],
        "num_layers": m["num_layers"],
        "hidden_size": m["hidden_size"],
        "grad_accum": c["grad_accum"],
        "last_k": c["last_k"],
        "jacfwd_chunk": c["jacfwd_chunk"],
        **{k: v for k, v in host_facts().items() if k in CSV_COLUMNS},
        **{k: v for k, v in outcome.items() if k in CSV_COLUMNS},
    }
    row.setdefault("device", c["device"])
    return row


def describe(row: dict) -> str:
    if row["status"] != "ok":
        return f"{row['status'].upper()} {row.get('error') or ''}".strip()
    return (
        f"ok  excess {row['excess_mem_mb']:.0f} MiB  peak {row['peak_mem_mb']:.0f} MiB  "
        f"step {row['step_time_median_s'] * 1e3:.1f} ms  compile {row['compile_time_s']:.1f} s  "
        f"loss {row['loss_first']:.4f} -> {row['loss_last']:.4f}"
    )


def save_history(results_dir: Path, run_id: str, history: dict | None) -> Path | None:
    """The trial's per-step series (loss, step_time_s; eval_loss and eval_accuracy with None between evaluations)
    as results_dir/history/<run_id>.json: the report's training curves. W&B gets the same series."""
    if not history:
        return None
    path = results_dir / "history" / f"{run_id}.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(history))
    return path


# ---------------------------------------------------------------------------------------------------------------
# child side: the trial itself


def measure(c: dict) -> dict:
    """Build, warm up, time and measure one trial. Runs in the child process only."""
    fw, m = c["framework"], c["model"]
    dev, steps = implementation(fw, "device"), implementation(fw, "steps")
    device = dev.resolve_device(c["device"])
    kind = dev.device_kind(device)
    spec = bert_spec(m)
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

    trainer = steps.make_trainer(spec, weights, step_spec(c), device, attn_implementation=c["attn_implementation"])
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

    trackers = dev.memory_trackers(device)  # primary first; on CUDA: allocator, NVML
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
    maybe_inject_fault("after_warmup")

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
        "device": kind,
        "device_name": dev.device_name(device) if kind == "cuda" else cpu_name(),
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
    dot = na = nb = 0.0
    for x, y in zip(a, b, strict=True):
        x, y = np.asarray(x, np.float64).ravel(), np.asarray(y, np.float64).ravel()
        dot, na, nb = dot + float(x @ y), na + float(x @ x), nb + float(y @ y)
    return dot / math.sqrt(na * nb) if na > 0 and nb > 0 else float("nan")
