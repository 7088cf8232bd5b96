"""Scenario `model` (the default): one way of differentiating BERT, in one framework, as one trial -> one row of
runs.csv, its per-step history (history/<run_id>.json) and one W&B run.

The trial (child side, `measure`): import one framework, build the weights, the batches and the trainer, record
the resident baseline, warm up (the first step compiles), then time `steps` synced steps (or `epochs` passes)
while the memory trackers watch. After the window, optionally: held-out loss and accuracy (evaluate), and the
cosine between the mode's gradient estimate and the exact gradient (measure_grad_cosine).
"""

from __future__ import annotations

import importlib.util
import json
import os
from pathlib import Path

from bench import data, parallel
from bench.config import NOT_IDENTITY, at_least, bert_spec, choice, timed_steps
from bench.errors import ConfigError
from bench.results import summary_table, variant
from bench.scenarios import model_trial
from bench.scenarios.base import Scenario
from bench.sinks import CSV_COLUMNS
from bench.spec import (
    ATTN_IMPLEMENTATIONS,
    DIRECTIONS,
    DTYPES,
    JVP_IMPLS,
    JVP_TANGENTS,
    MODES,
    OPTIMIZERS,
    TRAINABLE_SCOPES,
    count_params,
)
from bench.system import cuda_memory_mb, host_facts, jaxlib_at_least
from bench.wandb_runs import WandbSink, device_summary, run_config, run_tags
from bench.weights import WeightsError, check_checkpoint

# Keys only scenario=ops reads. A model trial's identity leaves them out: it hashes as it did before scenarios
# existed, so `resume` still finds rows recorded then.
OTHER_SCENARIOS_KEYS = ("scenario", "threads", "ops")
# Keys added after rows were recorded, with the value every earlier trial had: at that value a key is left out of
# the identity, so a single-device trial hashes as it did before multi-device trials existed.
ADDED_KEYS = {"parallel": "none", "devices": 1, "nodes": 1, "fsdp_reshard_after_forward": True, "fsdp_offload": False,
              "directions": "gaussian", "jvp_tangent": "auto"}  # fmt: skip
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
        return tuple(
            k for k in c
            if k not in NOT_IDENTITY + OTHER_SCENARIOS_KEYS and not (k in ADDED_KEYS and c[k] == ADDED_KEYS[k])
        )  # fmt: skip

    def kind(self, c: dict) -> str:
        return c["mode"]

    def label(self, c: dict) -> str:
        return trial_label(c)

    def env(self, c: dict) -> dict[str, str]:
        env = {}
        if c["framework"] != "jax":
            return env
        gpus = cuda_memory_mb()
        if c.get("budget_mb") is not None and gpus and c["device"] != "cpu":
            # XLA's allocator limit, read when the backend starts: the budget as a fraction of the (first) GPU
            env["XLA_PYTHON_CLIENT_MEM_FRACTION"] = f"{min(1.0, c['budget_mb'] / gpus[0]):.4f}"
        flags = os.environ.get("XLA_FLAGS", "")
        if jaxlib_at_least(0, 5) and "xla_cpu_enable_concurrency_optimized_scheduler" not in flags:
            # XLA:CPU's default scheduler orders the program for concurrency and ignores memory: it runs every
            # layer's rematerialisation during the forward pass, so checkpointing saves nothing (MiniLM backprop
            # temp 500 MiB with or without remat), and every mode holds more than it must. The memory-minimising
            # scheduler gives remat its saving (185 MiB) and backprop 420 MiB; GPU backends ignore this flag. A
            # setting of the user's own stands.
            env["XLA_FLAGS"] = f"{flags} --xla_cpu_enable_concurrency_optimized_scheduler=false".strip()
        return env

    def rows(self, c: dict, outcome: dict, ids: dict) -> list[dict]:
        return [make_row(c, outcome, ids)]

    def save(self, results_dir: Path, rows: list[dict], outcome: dict) -> None:
        save_history(results_dir, rows[0]["run_id"], outcome.get("history"))

    def describe(self, outcome: dict, rows: list[dict]) -> str:
        return describe(rows[0])

    def log_wandb(self, c: dict, rows: list[dict], outcome: dict, results_dir: Path) -> None:
        """The trial's W&B run: named by its label, grouped by its sweep, job_type its mode, tagged with framework,
        mode, experiment and strategy; config: the flattened config and the row's configuration columns
        (wandb_columns); summary: the row and each device's numbers; history: the per-step series."""
        lg, row = c["logger"], rows[0]
        history = outcome.get("history") or {}
        strategy = c["parallel"] if c["parallel"] != "none" else ""
        WandbSink(
            project=lg["project"],
            group=row["sweep_id"],
            name=self.label(c),
            config=run_config({k: c[k] for k in self.config_keys(c)}, wandb_columns(c, row)),
            mode=lg["mode"],
            dir=results_dir,
            entity=lg["entity"],
            tags=run_tags(c["framework"], c["mode"], row.get("experiment"), strategy, *lg["tags"]),
            job_type=c["mode"],
        ).write(row, per_step(history), summary=device_summary(history.get("devices") or []))

    def config_keys(self, c: dict) -> tuple[str, ...]:
        return tuple(k for k in c if k not in OTHER_SCENARIOS_KEYS[1:])  # every key but the ops scenario's

    def sweep_rows(self, rows: list[dict], hashes: list[str], sweep_id: str) -> list[dict]:
        # the sweep's row of each trial; a resumed trial shows the row that made it skip (the latest ok one)
        mine = {r["config_hash"]: r for r in rows if r.get("sweep_id") == sweep_id}
        earlier = {r["config_hash"]: r for r in rows if r.get("status") == "ok"}
        return [mine.get(h) or earlier[h] for h in hashes if h in mine or h in earlier]

    def summary(self, rows: list[dict]) -> str:
        return summary_table(rows)

    # -- child side --------------------------------------------------------------------------------------------
    def measure(self, c: dict, on_progress) -> dict:
        return model_trial.measure(c)


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
    choice("directions", c["directions"], DIRECTIONS)
    choice("jvp_tangent", c["jvp_tangent"], JVP_TANGENTS)
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
    o = c["optimizer"]
    at_least("optimizer.lr", o["lr"], 0)
    at_least("optimizer.weight_decay", o["weight_decay"], 0)
    for name in ("momentum", "beta1", "beta2"):
        if not isinstance(o[name], (int, float)) or isinstance(o[name], bool) or not 0 <= o[name] < 1:
            raise ConfigError(f"optimizer.{name}={o[name]}: accepted a number in [0, 1)")
    for name, value in (("optimizer.eps", o["eps"]), ("model.layer_norm_eps", m["layer_norm_eps"])):
        if not isinstance(value, (int, float)) or isinstance(value, bool) or value <= 0:
            raise ConfigError(f"{name}={value}: accepted a number > 0")
    at_least("jacfwd_max_params", c["jacfwd_max_params"], 1)
    at_least("last_k", c["last_k"], 1)
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
    if c["dtype"] == "bf16_pure" and c["mode"] == "mezo":
        raise ConfigError(
            "mode=mezo with dtype=bf16_pure: MeZO's in-place +eps, -2eps, +eps round trip does not bring bf16 "
            "parameters back (three steps at lr=0 move them by 0.6%, fp32's by 1e-7); accepted: dtype=bf16 "
            "(fp32 parameters, bf16 compute) or dtype=fp32"
        )
    if c["jvp_tangent"] == "keep" and (c["mode"] != "jvp" or c["num_tangents"] != 1 or c["jvp_impl"] == "lazy"):
        raise ConfigError(
            f"jvp_tangent=keep: applies to mode=jvp with num_tangents=1 and a jvp_impl that holds the tangent "
            f"(got mode={c['mode']}, num_tangents={c['num_tangents']}, jvp_impl={c['jvp_impl']}); accepted: "
            "auto | redraw, or keep with mode=jvp num_tangents=1"
        )
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
    parallel.validate(c)
    validate_outputs(c)
    validate_data(c)
    if m["checkpoint"] is not None:
        try:
            check_checkpoint(m["checkpoint"], spec)
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
                f"of batch_size={c['batch_size']} x grad_accum={c['grad_accum']} x {parallel.world_size(c)} "
                "device(s); accepted: a larger data.num_train"
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
    data.validate(spec, parallel.global_batch_size(c), c["seq_len"])
    if c["evaluate"]:
        data.validate(spec, parallel.global_batch_size(c), c["seq_len"], split="test")
    data.check_source(spec, parallel.global_batch_size(c), c["evaluate"])
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
        "parallel": c["parallel"],
        "devices": c["devices"],
        "nodes": c["nodes"],
        "world_size": parallel.world_size(c),
        "global_batch_size": parallel.global_batch_size(c),
        "fsdp_reshard_after_forward": c["fsdp_reshard_after_forward"],
        "fsdp_offload": c["fsdp_offload"],
        "budget_mb": c["budget_mb"],
        "mezo_eps": c["mezo_eps"],
        "directions": c["directions"],
        "jvp_tangent": c["jvp_tangent"],
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


def wandb_columns(c: dict, row: dict) -> dict:
    """The row's configuration columns, which its W&B run's config carries under the CSV's names: every column the
    row has without a measurement (make_row of an empty outcome: the configuration, where and with what it ran),
    its sweep, experiment and config_hash, and two that views group by: variant (the mode with its knobs, as the
    report names it: backprop+remat, jvp(K=4)) and framework_mode ("torch backprop+remat")."""
    columns = {k: row.get(k) for k in make_row(c, {}, {})}
    columns.update(sweep_id=row.get("sweep_id"), experiment=row.get("experiment") or "",
                   config_hash=row.get("config_hash"), variant=variant(row))  # fmt: skip
    columns["framework_mode"] = f"{row['framework']} {columns['variant']}"
    return columns


def per_step(history: dict) -> dict:
    """The history's per-step series (loss, step_time_s, eval_*): what W&B logs step by step; the per-device
    numbers ("devices", one entry per device) go to the run's summary instead (device_summary)."""
    return {k: v for k, v in history.items() if k != "devices"}


def save_history(results_dir: Path, run_id: str, history: dict | None) -> Path | None:
    """The trial's per-step series (loss, step_time_s; eval_loss and eval_accuracy with None between evaluations)
    as results_dir/history/<run_id>.json: the report's training curves. W&B gets the same series."""
    if not history:
        return None
    path = results_dir / "history" / f"{run_id}.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(history))
    return path
