"""Configuration: typed schema registered in Hydra's ConfigStore, the presets in conf/, conversions to the
specs the frameworks read, and the validation every trial shares.

The YAML files in conf/ hold the values; the dataclasses here hold the types and the help text (`--help` prints
it). Two scenarios share this schema (bench/scenarios/): `model` (the default: one AD mode on BERT) and `ops`
(op-level micro-benchmarks). Each reads its own keys, validates them and says which of them make a trial's
identity; what every trial reads (framework, device, logger, limits) is validated here, by `validate_process`.
Validators raise ConfigError with one line: the option, the bad value and what is accepted.
"""

from __future__ import annotations

import hashlib
import json
import os
import uuid
from dataclasses import dataclass, field, fields
from datetime import datetime
from pathlib import Path
from typing import Any

from hydra.core.config_store import ConfigStore
from omegaconf import MISSING, DictConfig, OmegaConf

from bench.errors import ConfigError
from bench.ops_spec import OP_NAMES
from bench.parallel import global_batch_size
from bench.spec import FRAMEWORKS, MAX_SEED, BertSpec, OptimizerSpec, StepSpec
from bench.system import cuda_device_count

CONF_DIR = Path(__file__).resolve().parent.parent / "conf"
LAUNCH_ID = "BENCH_LAUNCH_ID"
DEVICES = ("auto", "cpu", "cuda")
LOGGERS = ("wandb", "none")


def _f(default, help: str, **kw):  # noqa: A002 (help is the natural name here)
    if isinstance(default, (list, dict)):
        return field(default_factory=lambda: default, metadata={"help": help, **kw})
    return field(default=default, metadata={"help": help, **kw})


@dataclass
class ModelConfig:
    name: str = _f("tiny", "preset name (conf/model; choose with model=NAME)")
    checkpoint: Any = _f(
        None, "null: seeded random init | an HF checkpoint folder or .safetensors file (never pickles) | package:<mod>"
    )
    vocab_size: int = _f(30522, "vocabulary size (bert-base-uncased WordPiece), integer >= 1")
    hidden_size: int = _f(768, "hidden width H, integer >= 1, a multiple of num_heads")
    num_layers: int = _f(12, "encoder layers L, integer >= 1")
    num_heads: int = _f(12, "attention heads, integer >= 1")
    intermediate_size: int = _f(3072, "feed-forward width, integer >= 1")
    max_position_embeddings: int = _f(512, "maximum sequence length the model supports, integer >= 2")
    type_vocab_size: int = _f(2, "token type (segment) vocabulary, integer >= 1")
    num_labels: int = _f(4, "classes of the classifier head, integer >= 2")
    dropout: float = _f(0.1, "hidden and attention dropout probability in [0, 1), active in the training modes")
    layer_norm_eps: float = _f(1e-12, "LayerNorm epsilon, > 0")


@dataclass
class DataConfig:
    name: str = _f("synthetic", "synthetic | ag_news")
    path: Any = _f(None, "ag_news: local CSV (class index 1-4, title, description) or a dir with train/test.csv")
    num_train: Any = _f(2048, "training examples, integer >= 1 (ag_news: null = the whole split)")
    num_eval: Any = _f(512, "held-out examples for accuracy, integer >= 1 (ag_news: null = the whole split)")
    seed: int = _f(0, "which synthetic corpus / ag_news subsets, integer in [0, 2^63) (batch order follows `seed`)")


@dataclass
class OptimizerConfig:
    name: str = _f("sgd", "sgd | adamw (same hyperparameters in torch.optim and optax)")
    lr: float = _f(1e-3, "learning rate, >= 0")
    momentum: float = _f(0.0, "sgd momentum in [0, 1)")
    weight_decay: float = _f(0.0, "weight decay, >= 0 (decoupled for adamw)")
    beta1: float = _f(0.9, "adamw beta1 in [0, 1)")
    beta2: float = _f(0.999, "adamw beta2 in [0, 1)")
    eps: float = _f(1e-8, "adamw epsilon, > 0")


@dataclass
class LoggerConfig:
    name: str = _f("wandb", "wandb | none")
    project: str = _f("bench", "W&B project")
    entity: Any = _f(None, "W&B entity (team or user)")
    mode: str = _f("offline", "offline (sync later with `wandb sync`) | online | disabled")
    tags: list = _f([], "extra W&B tags")


@dataclass
class OpsConfig:
    name: str = _f("default", "preset name (conf/ops)")
    names: Any = _f([], f"ops to time, e.g. [matmul,exp] (default: all): {' | '.join(OP_NAMES)}")
    sizes: Any = _f([], "square sizes n: each op runs at (n, n)")
    shapes: Any = _f([], "further [rows, cols] shapes, e.g. [[64,4096]]")
    compile: bool = _f(False, "torch: torch.compile the primal, jvp and vjp (fullgraph); jax is always jax.jit")
    warmup: int = _f(1, "untimed calls of each function first (the first one compiles), integer >= 1")
    repeats: int = _f(5, "timed samples per function, integer >= 1; the row holds their median")
    min_sample_s: float = _f(
        0.005, "seconds >= 0: a sample repeats the call until it lasts this long (timer resolution, dispatch jitter)"
    )
    check: bool = _f(True, "compare each result with the analytic derivative (numpy, float64), untimed")


@dataclass
class BenchConfig:
    scenario: str = _f("model", "model (one AD mode on BERT -> runs.csv) | ops (op micro-benchmarks -> ops.csv)")
    framework: str = _f("torch", "torch | jax")
    mode: str = _f("backprop", "inference | backprop | jvp | jacfwd | mezo (or a case=, see config groups)")
    model: ModelConfig = MISSING
    data: DataConfig = MISSING
    optimizer: OptimizerConfig = MISSING
    logger: LoggerConfig = MISSING
    ops: OpsConfig = MISSING
    threads: Any = _f("all", "scenario=ops: 1 | all (intra-op threads of torch and XLA on the CPU)")
    trainable: str = _f("all", "all | head (pooler+classifier) | bias (BitFit) | last_k")
    last_k: int = _f(1, "trainable=last_k: final encoder layers trained, integer in [1, model.num_layers]")
    batch_size: int = _f(8, "examples per micro-batch (per device with parallel), integer >= 1")
    seq_len: int = _f(128, "tokens per example (padded/truncated), integer in [8, 512]")
    steps: int = _f(20, "timed steps (optimizer updates), integer >= 1; ignored when epochs is set")
    max_timed_s: Any = _f(
        None,
        "null | seconds >= 0: stop the timed steps once they have taken this long (at least one runs); "
        "steps_timed in the CSV says how many did",
    )
    epochs: Any = _f(
        None,
        "null: `steps` timed steps | N >= 1: N passes over data.num_train (num_train // global batch "
        "// grad_accum updates each)",
    )
    warmup_steps: int = _f(3, "untimed steps before the timed ones (the first compiles), integer >= 1")
    grad_accum: int = _f(1, "micro-batches per optimizer update, integer >= 1")
    seed: int = _f(0, "weights, data order, tangents, perturbations, dropout: integer in [0, 2^63)")
    remat: bool = _f(False, "backprop with activation checkpointing per encoder layer")
    num_tangents: int = _f(1, "jvp: tangents K per step (looped), integer >= 1")
    jvp_impl: str = _f(
        "func", "jvp, torch only: func (torch.func.jvp) | lazy (tangent per module) | dual (forward_ad) | naive"
    )
    jacfwd_chunk: Any = _f(
        "auto", "jacfwd: basis directions per vmapped jvp, auto (jax on CPU 8, else 256) | integer >= 1"
    )
    jacfwd_max_params: int = _f(
        2_000_000, "jacfwd: refuse more trainable parameters (one forward-mode pass each) than this, integer >= 1"
    )
    mezo_eps: float = _f(1e-3, "mezo: perturbation scale, > 0 (Malladi et al. 2023)")
    directions: str = _f("gaussian", "jvp tangents and mezo perturbations: gaussian | rademacher (+-1 entries)")
    jvp_tangent: str = _f("auto", "jvp, one tangent: auto | keep (drawn once, held for the update) | redraw")
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
    resume: bool = _f(False, "skip trials already recorded ok for the same configuration")
    timeout_s: int = _f(1800, "per-trial wall-clock limit, seconds >= 1 (the trial ends as timeout)")
    max_host_mem_mb: Any = _f(None, "null | MiB >= 1: kill a trial process whose host RSS exceeds this (status oom)")
    budget_mb: Any = _f(
        None, "null | MiB >= 1: the device memory a trial may use (CUDA: the framework's own limit; CPU: host RSS)"
    )
    sweep_id: Any = _f(None, "groups the trials of one sweep (default: an id unique to each launch)")
    evaluate: bool = _f(
        False, "after the timed steps: loss and accuracy on the held-out split -> eval_loss, eval_accuracy"
    )
    eval_every: int = _f(
        0, "evaluate=true: also every N timed steps, untimed, for the accuracy curve (0: at the end only)"
    )
    measure_grad_cosine: bool = _f(
        False,
        "after the timed steps: cosine of the mode's gradient estimate with the "
        "exact gradient on the first batch, dropout off -> grad_cosine",
    )


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
    cs.store(group="model", name="model_schema", node=ModelConfig)
    cs.store(group="data", name="data_schema", node=DataConfig)
    cs.store(group="optimizer", name="optimizer_schema", node=OptimizerConfig)
    cs.store(group="logger", name="logger_schema", node=LoggerConfig)
    cs.store(group="ops", name="ops_schema", node=OpsConfig)


def launch_id() -> str:
    """This launch's id: BENCH_LAUNCH_ID as `python -m bench` set it for itself and every job it starts, or a new
    one (a process started some other way)."""
    if LAUNCH_ID not in os.environ:
        os.environ[LAUNCH_ID] = f"{datetime.now():%Y%m%d-%H%M%S}-{uuid.uuid4().hex[:6]}"
    return os.environ[LAUNCH_ID]


def available(group: str) -> list[str]:
    return sorted(p.stem for p in (CONF_DIR / group).glob("*.yaml"))


GROUPS = ("model", "data", "optimizer", "logger", "ops", "case", "experiment")


# ---------------------------------------------------------------------------------------------------------------
# presets and conversions


def model_preset(name: str, **overrides) -> tuple[BertSpec, str | None]:
    """(architecture, checkpoint) of a conf/model preset, with optional field overrides (tests, tools)."""
    path = CONF_DIR / "model" / f"{name}.yaml"
    if not path.exists():
        raise ConfigError(f"model={name}: unknown preset; accepted: {', '.join(available('model'))}")
    cfg = {**OmegaConf.to_container(OmegaConf.load(path)), **overrides}
    cfg.pop("defaults", None)
    return bert_spec(cfg), cfg.get("checkpoint")


def bert_spec(model_cfg) -> BertSpec:
    """The BertSpec fields of a model config node (other keys such as name and checkpoint are ignored)."""
    names = {f.name for f in fields(BertSpec)}
    try:
        return BertSpec(**{k: v for k, v in dict(model_cfg).items() if k in names})
    except ValueError as e:
        raise ConfigError(str(e)) from e


def step_spec(cfg) -> StepSpec:
    o = cfg["optimizer"]
    return StepSpec(
        mode=cfg["mode"],
        trainable=cfg["trainable"],
        last_k=cfg["last_k"],
        optimizer=OptimizerSpec(**{f.name: o[f.name] for f in fields(OptimizerSpec)}),
        remat=cfg["remat"],
        num_tangents=cfg["num_tangents"],
        jvp_impl=cfg["jvp_impl"],
        jacfwd_chunk=cfg["jacfwd_chunk"],
        mezo_eps=cfg["mezo_eps"],
        grad_accum=cfg["grad_accum"],
        dtype=cfg["dtype"],
        directions=cfg["directions"],
        jvp_tangent=cfg["jvp_tangent"],
        seed=cfg["seed"],
    )


def to_container(cfg) -> dict:
    """A composed config as a plain resolved dict without Hydra's own node."""
    d = OmegaConf.to_container(cfg, resolve=True) if isinstance(cfg, DictConfig) else dict(cfg)
    d.pop("hydra", None)
    return d


def timed_steps(c: dict) -> int:
    """How many timed steps a trial runs: `steps`, or with `epochs` set, that many passes over data.num_train
    (in global batches: batch_size x every device)."""
    if c.get("epochs") is None:
        return c["steps"]
    return c["epochs"] * (c["data"]["num_train"] // global_batch_size(c)) // c["grad_accum"]


# ---------------------------------------------------------------------------------------------------------------
# identity: what resume compares


# Keys that do not change what a trial measures: `resume=true` ignores them when matching recorded trials.
NOT_IDENTITY = ("results_dir", "resume", "logger", "timeout_s", "max_host_mem_mb", "budget_mb", "sweep_id")


def hash_identity(identity: dict) -> str:
    """A trial's config_hash: 12 hex digits of the SHA-1 of its identity (its scenario says which keys count)."""
    blob = json.dumps(identity, sort_keys=True, default=str)
    return hashlib.sha1(blob.encode()).hexdigest()[:12]


# ---------------------------------------------------------------------------------------------------------------
# validation shared by every scenario: one line per problem, the first problem wins


def choice(name: str, value, accepted) -> None:
    if value not in accepted:
        raise ConfigError(f"{name}={value}: accepted {' | '.join(map(str, accepted))}")


def at_least(name: str, value, low) -> None:
    if not isinstance(value, (int, float)) or isinstance(value, bool) or value < low:
        raise ConfigError(f"{name}={value}: must be a number >= {low}")


def validate_process(c: dict) -> None:
    """What every trial's process reads, whatever the scenario: framework, device, logger and limits."""
    choice("framework", c["framework"], FRAMEWORKS)
    choice("device", c["device"], DEVICES)
    choice("logger", c["logger"]["name"], LOGGERS)
    choice("logger.mode", c["logger"]["mode"], ("offline", "online", "disabled"))
    at_least("timeout_s", c["timeout_s"], 1)
    if not isinstance(c["seed"], int) or isinstance(c["seed"], bool) or not 0 <= c["seed"] < MAX_SEED:
        raise ConfigError(f"seed={c['seed']}: accepted an integer in [0, 2^63) (jax keys take an int64)")
    for name in ("max_host_mem_mb", "budget_mb"):
        if c[name] is not None:
            at_least(name, c[name], 1)
