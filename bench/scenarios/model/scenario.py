"""Scenario `model` (the default): one way of differentiating BERT, in one framework, as one trial -> one row of
runs.csv (columns.py), its per-step history (history/<run_id>.json) and one W&B run.

The trial itself (child side) is trial.py; its config checks validate.py; the rows it is compared by, select.py;
its report sections report/.
"""

from __future__ import annotations

import json
import os
from dataclasses import fields
from pathlib import Path

from bench import estimators, models, parallel
from bench.config import (
    NOT_IDENTITY,
    TRACES,
    BenchConfig,
    LoraConfig,
    TargetConfig,
    default,
    lora_columns,
    settings_columns,
)
from bench.estimators.jvp import AUTO_IMPL
from bench.harness.scenario import Scenario, finished_runs, identity_of
from bench.measure.system import cuda_memory_mb, host_facts, jaxlib_at_least
from bench.scenarios.model import trial
from bench.scenarios.model.columns import COLUMNS
from bench.scenarios.model.select import OPTIMIZER_COLUMNS, summary_table, variant
from bench.scenarios.model.validate import validate
from bench.store.read import read_history
from bench.store.wandb import WandbSink, device_summary, run_config, run_tags

# Keys only scenario=ops reads. A model trial's identity leaves them out: it hashes as it did before scenarios
# existed, so `resume` still finds rows recorded then.
OTHER_SCENARIOS_KEYS = ("scenario", "threads", "ops")
# Keys added after rows were recorded, with the value every earlier trial had: at that value a key is left out of
# the identity, so a single-device trial hashes as it did before multi-device trials existed.
ADDED_KEYS = {
    "parallel": "none",
    "devices": 1,
    "nodes": 1,
    "fsdp_reshard_after_forward": True,
    "fsdp_offload": False,
    "directions": "gaussian",
    "jvp_tangent": "auto",
    "deterministic": False,
    "compile": False,
    "divergence_factor": 10.0,
    "tune_stop_after": None,
    "eval_resolution": 0.0,
    "target": TargetConfig(),
    "profile": False,
    "profile_steps": 3,
    "lora": LoraConfig(),
    "scan_layers": False,  # JAX's layers were unrolled until scan_layers
    "xla_autotune_level": None,
    # a node's key: node.key. model.family came with the second family: rows recorded before it are the one family's
    # then, whose own fields every trial's identity carries (`recorded`, bench/models/<family>.py)
    "model.family": next(family for family, f, _ in models.settings().values() if f.metadata["recorded"]),
}


def settings_identity(cfg: BenchConfig) -> dict:
    """The estimators' settings as identity keys, by their columns: a setting that was a top-level key before it
    moved into its node as that key was (always, mezo_eps; or, jvp_tangent, off its ADDED_KEYS value), so a trial
    hashes as it did when it was recorded; the others only off their default (as ADDED_KEYS: a new estimator's
    settings leave every earlier trial's hash as it was)."""
    moved, options = estimators.moved(), estimators.setting_columns()
    added = lambda column, value: column in ADDED_KEYS and value == ADDED_KEYS[column]
    columns = settings_columns(cfg)
    if columns.get("jvp_impl") == "auto":
        # jvp.impl's default became auto (each framework's fastest pass; it was func): a jvp trial hashes with the
        # pass it runs (torch's dual is a new configuration, JAX's jax.jvp is not), any other with func, as before
        columns["jvp_impl"] = AUTO_IMPL[cfg.framework] if cfg.mode == "jvp" else "func"
    return {
        column: value
        for column, value in columns.items()
        if (column in moved and not added(column, value)) or (column not in moved and value != default(options[column]))
    }


def model_identity(model: dict) -> dict:
    """The model node as an identity key: its family's own fields, and another family's only off its default or
    where every trial's identity carried it (`recorded`), so a new family's fields leave every earlier trial's hash
    as it was."""
    own = models.settings()
    return {
        k: v
        for k, v in model.items()
        if k not in own or own[k][0] == model["family"] or own[k][1].metadata["recorded"] or v != own[k][1].default
    }


# Keys that mean something to one framework alone: left out of the other's identity (torch ignores scan_layers).
FRAMEWORK_KEYS = {"scan_layers": "jax", "xla_autotune_level": "jax"}


class ModelScenario(Scenario):
    name = "model"
    results_file = "runs.csv"
    columns = COLUMNS
    folders = ("history",)  # each trial's losses and per-step series

    # -- parent side -------------------------------------------------------------------------------------------
    def validate(self, cfg: BenchConfig) -> None:
        validate(cfg)

    def identity(self, cfg: BenchConfig) -> dict:
        nodes = estimators.settings_nodes()
        keys = [
            f
            for f in vars(cfg)
            if f not in NOT_IDENTITY + OTHER_SCENARIOS_KEYS
            and f not in nodes
            and not (f in ADDED_KEYS and getattr(cfg, f) == ADDED_KEYS[f])
            and FRAMEWORK_KEYS.get(f, cfg.framework) == cfg.framework
        ]
        identity = identity_of(cfg, keys) | settings_identity(cfg)
        identity["model"] = model_identity(identity["model"])
        for added, value in ADDED_KEYS.items():  # a node's key added since, at that value: left out of the node
            node, _, key = added.partition(".")
            if key and node in identity and identity[node].get(key) == value:
                identity[node] = {k: v for k, v in identity[node].items() if k != key}
        return identity

    def kind(self, cfg: BenchConfig) -> str:
        return cfg.mode

    def label(self, cfg: BenchConfig) -> str:
        return trial_label(cfg)

    def env(self, cfg: BenchConfig) -> dict[str, str]:
        env = {"CUBLAS_WORKSPACE_CONFIG": ":4096:8"} if cfg.deterministic else {}  # cuBLAS's deterministic mode
        if cfg.framework != "jax":
            return env
        gpus = cuda_memory_mb()
        if cfg.budget_mb is not None and gpus and cfg.device != "cpu":
            # XLA's allocator limit, read when the backend starts: the budget as a fraction of the (first) GPU
            env["XLA_PYTHON_CLIENT_MEM_FRACTION"] = f"{min(1.0, cfg.budget_mb / gpus[0]):.4f}"
        given = flags = os.environ.get("XLA_FLAGS", "")
        if jaxlib_at_least(0, 5) and "xla_cpu_enable_concurrency_optimized_scheduler" not in flags:
            # XLA:CPU's default scheduler orders the program for concurrency and ignores memory: it runs every
            # layer's rematerialisation during the forward pass, so checkpointing saves nothing, and every mode holds
            # more than it must (docs/methodology.md has the measurement). GPU backends ignore this flag. A setting
            # of the user's own stands.
            flags = f"{flags} --xla_cpu_enable_concurrency_optimized_scheduler=false".strip()
        if cfg.deterministic:
            flags = f"{flags} --xla_gpu_deterministic_ops=true".strip()
        if cfg.xla_autotune_level is not None and "xla_gpu_autotune_level" not in given:
            flags = f"{flags} --xla_gpu_autotune_level={cfg.xla_autotune_level}".strip()
        if flags != given:  # a setting of the user's own stands, inherited as it is
            env["XLA_FLAGS"] = flags
        return env

    def rows(self, cfg: BenchConfig, outcome: dict, ids: dict) -> list[dict]:
        return [make_row(cfg, outcome, ids)]

    def save(self, results_dir: Path, rows: list[dict], outcome: dict) -> None:
        save_history(results_dir, rows[0]["run_id"], outcome.get("history"))

    def describe(self, outcome: dict, rows: list[dict]) -> str:
        return describe(rows[0])

    def log_wandb(self, cfg: BenchConfig, rows: list[dict], outcome: dict, results_dir: Path) -> None:
        """The trial's W&B run: named by its label, grouped by its sweep, job_type its mode, tagged with framework,
        mode, experiment and strategy; config: the flattened config and the row's configuration columns
        (wandb_columns); summary: the row and each device's numbers; history: the per-step series."""
        lg, row = cfg.logger, rows[0]
        history = outcome.get("history") or {}
        strategy = cfg.parallel if cfg.parallel != "none" else ""
        WandbSink(
            project=lg.project,
            group=row["sweep_id"],
            name=self.label(cfg),
            config=run_config(identity_of(cfg, self.config_keys(cfg)), wandb_columns(cfg, row)),
            mode=lg.mode,
            dir=results_dir,
            entity=lg.entity,
            tags=run_tags(cfg.framework, cfg.mode, row.get("experiment"), strategy, *lg.tags),
            job_type=cfg.mode,
        ).write(
            row,
            per_step(history),
            summary=device_summary(history.get("devices") or []),
            artifacts={"trace": traces} if (traces := trace_files(results_dir, row)) else None,
        )

    def config_keys(self, cfg: BenchConfig) -> tuple[str, ...]:
        return tuple(k for k in vars(cfg) if k not in OTHER_SCENARIOS_KEYS[1:])  # every key but the ops scenario's

    def sweep_rows(self, rows: list[dict], hashes: list[str], sweep_id: str) -> list[dict]:
        # the sweep's rows (a tuning sweep's repeats too, whose configurations were not known up front); a
        # resumed trial shows the row that made it skip (the latest finished one: ok or diverged, as resume reads;
        # never a rerun's, which no sweep runs and which keeps its trial's hash)
        mine = {r["config_hash"]: r for r in rows if r.get("sweep_id") == sweep_id}
        earlier = finished_runs(r for r in rows if r.get("tuning") != "rerun")
        known = [mine.get(h) or earlier[h][0] for h in hashes if h in mine or h in earlier]
        return known + [r for h, r in mine.items() if h not in set(hashes)]

    def summary(self, rows: list[dict]) -> str:
        return summary_table(rows)

    def losses(self, results_dir: Path, run_id: str) -> list[float] | None:
        history = read_history({"run_id": run_id, "_source": str(Path(results_dir) / self.results_file)})
        return None if history is None else history.get("loss")

    # -- child side --------------------------------------------------------------------------------------------
    def measure(self, cfg: BenchConfig, on_progress) -> dict:
        return trial.measure(cfg, on_progress)


# ---------------------------------------------------------------------------------------------------------------
# parent side: labels, rows, history


def settings_off_default(cfg: BenchConfig) -> list[tuple[str, object]]:
    """(option, value) of the mode's own settings that differ from their defaults: jvp.num_tangents=4."""
    node = getattr(cfg, cfg.mode, None)
    if node is None or cfg.mode not in estimators.settings_nodes():
        return []
    return [(f"{cfg.mode}.{f.name}", getattr(node, f.name)) for f in fields(node) if getattr(node, f.name) != f.default]


def trial_label(cfg: BenchConfig) -> str:
    extra = [
        "remat" if cfg.remat else "",
        "unrolled" if not cfg.scan_layers else "",
        *(f"{option}={value}" for option, value in settings_off_default(cfg)),
        f"trainable={cfg.trainable}" if cfg.trainable != "all" else "",
    ]
    shape = f"L{cfg.model.num_layers} B{cfg.batch_size} T{cfg.seq_len}"
    return " ".join([cfg.framework, cfg.mode, *[e for e in extra if e], cfg.model.name, shape])


def held_out_examples(cfg: BenchConfig) -> int | None:
    """The held-out examples an evaluation sees, as the config gives them (every row has them, a crashed one too;
    the trial's own count replaces it, also where data.num_eval=null takes a whole split): whole batches only."""
    if not cfg.evaluate or cfg.data.num_eval is None:
        return None
    return cfg.data.num_eval // cfg.batch_size * cfg.batch_size


def make_row(cfg: BenchConfig, outcome: dict, ids: dict) -> dict:
    """The trial's runs.csv row: its configuration (every knob that can change a measured number among it), where
    it ran, and what the child measured (or the parent's verdict)."""
    m, o = cfg.model, cfg.optimizer
    row = {
        **ids,
        "framework": cfg.framework,
        "mode": cfg.mode,
        "model": m.name,
        "data": cfg.data.name,
        "trainable": cfg.trainable,
        "optimizer": o.name,
        **{column: getattr(o, key) for key, column in OPTIMIZER_COLUMNS.items()},
        "batch_size": cfg.batch_size,
        "seq_len": cfg.seq_len,
        "steps": cfg.steps,
        "epochs": cfg.epochs,
        "max_timed_s": cfg.max_timed_s,
        "seed": cfg.seed,
        "remat": cfg.remat,
        "scan_layers": cfg.scan_layers if cfg.framework == "jax" else None,
        "xla_autotune_level": cfg.xla_autotune_level if cfg.framework == "jax" else None,
        "dtype": cfg.dtype,
        "attn_implementation": cfg.attn_implementation,
        "parallel": cfg.parallel,
        "devices": cfg.devices,
        "nodes": cfg.nodes,
        "world_size": parallel.world_size(cfg),
        "global_batch_size": parallel.global_batch_size(cfg),
        "fsdp_reshard_after_forward": cfg.fsdp_reshard_after_forward,
        "fsdp_offload": cfg.fsdp_offload,
        "budget_mb": cfg.budget_mb,
        **settings_columns(cfg),
        "directions": cfg.directions,
        "dropout": m.dropout,
        "warmup_steps": cfg.warmup_steps,
        "num_layers": m.num_layers,
        "hidden_size": m.hidden_size,
        "grad_accum": cfg.grad_accum,
        "last_k": cfg.last_k,
        **lora_columns(cfg),
        "deterministic": cfg.deterministic,
        "compile": cfg.compile,
        "profile": cfg.profile,
        "profile_steps": cfg.profile_steps,
        "target_metric": cfg.target.metric,
        "target_value": cfg.target.value,
        "target_max_steps": cfg.target.max_steps,
        "target_hold": cfg.target.hold if cfg.target.metric else None,
        "eval_every": cfg.eval_every if cfg.evaluate else None,
        "eval_resolution": cfg.eval_resolution if cfg.evaluate and cfg.eval_every else None,
        "eval_examples": held_out_examples(cfg),
        "tuning": cfg.tuning,
        "tune_group": cfg.tune_group,
        "tune_study": cfg.tune_study,
        "tune_stop_after": cfg.tune_stop_after,
        **{k: v for k, v in host_facts().items() if k in COLUMNS},
        **{k: v for k, v in outcome.items() if k in COLUMNS},
    }
    row.setdefault("device", cfg.device)
    return row


def describe(row: dict) -> str:
    if row["status"] != "ok":
        return f"{row['status'].upper()} {row.get('error') or ''}".strip()
    target = ""
    if row.get("target_status") == "reached":
        target = (
            f"  {row['target_metric']} {row['target_value']:g} reached in {row['steps_to_target']} steps, "
            f"{row['wall_to_target_s']:.1f} s"
        )
    elif row.get("target_status") == "not_reached":
        target = f"  {row['target_metric']} {row['target_value']:g} not reached in {row['target_max_steps']} steps"
    elif row.get("target_status") == "capped":
        target = (
            f"  {row['target_metric']} {row['target_value']:g} not reached in {row['tune_stop_after']} steps, "
            "its group's best: capped"
        )
    return (
        f"ok  excess {row['excess_mem_mb']:.0f} MiB  peak {row['peak_mem_mb']:.0f} MiB  "
        f"step {row['step_time_median_s'] * 1e3:.1f} ms  compile {row['compile_time_s']:.1f} s  "
        f"loss {row['loss_first']:.4f} -> {row['loss_last']:.4f}{target}"
    )


def wandb_columns(cfg: BenchConfig, row: dict) -> dict:
    """The row's configuration columns, which its W&B run's config carries under the CSV's names: every column the
    row has without a measurement (make_row of an empty outcome: the configuration, where and with what it ran),
    its sweep, experiment and config_hash, and two that views group by: variant (the mode with its knobs, as the
    report names it: backprop+remat, jvp(K=4)) and framework_mode ("torch backprop+remat")."""
    columns = {k: row.get(k) for k in make_row(cfg, {}, {})}
    columns.update(
        sweep_id=row.get("sweep_id"),
        experiment=row.get("experiment") or "",
        config_hash=row.get("config_hash"),
        variant=variant(row),
    )
    columns["framework_mode"] = f"{row['framework']} {columns['variant']}"
    return columns


def trace_files(results_dir: Path, row: dict) -> list[Path]:
    """profile=true: every file of the trial's traces (each rank's), which its W&B run keeps as an artifact."""
    folder = Path(results_dir) / TRACES / row["run_id"]
    return sorted(p for p in folder.rglob("*") if p.is_file()) if row.get("trace_status") == "ok" else []


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


MODEL = ModelScenario()
