"""Configuration: typed schema registered in Hydra's ConfigStore, the presets in conf/, and validation.

The YAML files in conf/ hold the values; the dataclasses here hold the types and the help text (`--help` prints
it). `validate` turns a composed config into one clear line per problem (option, bad value, what is accepted),
and `trial_identity` is what `resume=true` compares.

Two scenarios share this schema: `model` (the default: one AD mode on BERT) and `ops` (op-level micro-benchmarks,
bench/ops/). Each reads its own keys and ignores the other's; a model trial's identity leaves the ops keys out, so
it hashes as it did before scenarios existed.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any

from omegaconf import MISSING, DictConfig, OmegaConf

from bench.ops.spec import OP_NAMES
from bench.spec import FRAMEWORKS, JVP_IMPLS, MODES, OPTIMIZERS, TRAINABLE_SCOPES, BertSpec, OptimizerSpec, StepSpec

CONF_DIR = Path(__file__).resolve().parent.parent / "conf"
DEVICES = ("auto", "cpu", "cuda")
DTYPES = ("fp32",)
SCENARIOS = ("model", "ops")
OPS_DTYPES = ("fp32", "fp64", "bf16")
THREADS = ("1", "all")
ATTN_IMPLEMENTATIONS = ("eager", "sdpa")
LOGGERS = ("wandb", "none")


class ConfigError(ValueError):
    """Bad user input; the message is one line naming the option, the bad value and what is accepted."""


def _f(default, help: str, **kw):  # noqa: A002 (help is the natural name here)
    if isinstance(default, (list, dict)):
        return field(default_factory=lambda: default, metadata={"help": help, **kw})
    return field(default=default, metadata={"help": help, **kw})


@dataclass
class ModelConfig:
    name: str = _f("tiny", "preset name (conf/model)")
    checkpoint: Any = _f(None, "null: seeded random init; a HF checkpoint dir/.safetensors; package:<module>")
    vocab_size: int = _f(30522, "vocabulary size (bert-base-uncased WordPiece)")
    hidden_size: int = _f(768, "hidden width H")
    num_layers: int = _f(12, "encoder layers L")
    num_heads: int = _f(12, "attention heads")
    intermediate_size: int = _f(3072, "feed-forward width")
    max_position_embeddings: int = _f(512, "maximum sequence length the model supports")
    type_vocab_size: int = _f(2, "token type (segment) vocabulary")
    num_labels: int = _f(4, "classes of the classifier head (>= 2)")
    dropout: float = _f(0.1, "hidden and attention dropout, active in the training modes")
    layer_norm_eps: float = _f(1e-12, "LayerNorm epsilon")


@dataclass
class DataConfig:
    name: str = _f("synthetic", "synthetic | ag_news")
    path: Any = _f(None, "ag_news: local CSV (class index 1-4, title, description) or a dir with train/test.csv")
    num_train: Any = _f(2048, "training examples (ag_news: null = the whole split)")
    num_eval: Any = _f(512, "held-out examples for accuracy (ag_news: null = the whole split)")
    seed: int = _f(0, "which synthetic corpus / which ag_news subsets (batch order follows the trial seed)")


@dataclass
class OptimizerConfig:
    name: str = _f("sgd", "sgd | adamw (same hyperparameters in torch.optim and optax)")
    lr: float = _f(1e-3, "learning rate")
    momentum: float = _f(0.0, "sgd momentum")
    weight_decay: float = _f(0.0, "weight decay (decoupled for adamw)")
    beta1: float = _f(0.9, "adamw beta1")
    beta2: float = _f(0.999, "adamw beta2")
    eps: float = _f(1e-8, "adamw epsilon")


@dataclass
class LoggerConfig:
    name: str = _f("wandb", "wandb | none")
    project: str = _f("bench", "W&B project")
    entity: Any = _f(None, "W&B entity (team or user)")
    mode: str = _f("offline", "offline (default; sync later with `wandb sync`) | online")
    tags: list = _f([], "extra W&B tags")


@dataclass
class OpsConfig:
    name: str = _f("default", "preset name (conf/ops)")
    names: Any = _f([], f"ops to time, e.g. [matmul,exp] (default: all): {' | '.join(OP_NAMES)}")
    sizes: Any = _f([], "square sizes n: each op runs at (n, n)")
    shapes: Any = _f([], "further [rows, cols] shapes, e.g. [[64,4096]]")
    compile: bool = _f(False, "torch: torch.compile the primal, jvp and vjp (fullgraph); jax is always jax.jit")
    warmup: int = _f(1, "untimed calls of each function first; the first one compiles")
    repeats: int = _f(5, "timed samples per function; the row holds their median")
    min_sample_s: float = _f(
        0.005, "a sample repeats the call until it lasts this long (perf_counter resolution, dispatch jitter)"
    )
    check: bool = _f(True, "compare each result with the analytic derivative (numpy, float64), untimed")


@dataclass
class BenchConfig:
    scenario: str = _f("model", "model (one AD mode on BERT -> runs.csv) | ops (op micro-benchmarks -> ops.csv)")
    framework: str = _f("torch", "torch | jax")
    mode: str = _f("backprop", "inference | backprop | jvp | jacfwd | mezo")
    model: ModelConfig = MISSING
    data: DataConfig = MISSING
    optimizer: OptimizerConfig = MISSING
    logger: LoggerConfig = MISSING
    ops: OpsConfig = MISSING
    threads: Any = _f("all", "scenario=ops: 1 | all (intra-op threads of torch and XLA on the CPU)")
    trainable: str = _f("all", "all | head (pooler+classifier) | bias (BitFit) | last_k")
    last_k: int = _f(1, "trainable=last_k: number of final encoder layers trained")
    batch_size: int = _f(8, "examples per micro-batch")
    seq_len: int = _f(128, "tokens per example (padded/truncated)")
    steps: int = _f(20, "timed steps (optimizer updates); ignored when epochs is set")
    max_timed_s: Any = _f(
        None,
        "stop the timed steps once they have taken this many seconds (at least one "
        "runs); steps_timed in the CSV says how many did",
    )
    epochs: Any = _f(
        None,
        "null: `steps` timed steps; N: N passes over data.num_train (num_train // batch_size "
        "// grad_accum updates each)",
    )
    warmup_steps: int = _f(3, "untimed steps before the timed ones; the first includes compilation")
    grad_accum: int = _f(1, "micro-batches per optimizer update")
    seed: int = _f(0, "weights, data order, tangents, perturbations, dropout")
    remat: bool = _f(False, "backprop with activation checkpointing per encoder layer")
    num_tangents: int = _f(1, "jvp: tangents K per step (looped)")
    jvp_impl: str = _f(
        "func", "jvp, torch only: func (torch.func.jvp) | lazy (tangent per module) | dual (forward_ad) | naive"
    )
    jacfwd_chunk: Any = _f("auto", "jacfwd: basis directions per vmapped jvp; auto: jax on CPU 8, else 256")
    jacfwd_max_params: int = _f(
        2_000_000, "jacfwd: refuse more trainable parameters (one forward-mode direction each) than this"
    )
    mezo_eps: float = _f(1e-3, "mezo: perturbation scale (Malladi et al. 2023)")
    dtype: str = _f("fp32", "fp32 (scenario=ops: fp32 | fp64 | bf16)")
    device: str = _f("auto", "auto | cpu | cuda")
    attn_implementation: str = _f("eager", "torch attention: eager | sdpa (sdpa has no forward-mode AD rule)")
    results_dir: str = _f("results", "where runs.csv, logs and W&B runs go")
    resume: bool = _f(False, "skip trials already recorded ok for the same configuration")
    timeout_s: int = _f(1800, "per-trial wall-clock limit")
    max_host_mem_mb: Any = _f(None, "kill a trial whose host RSS exceeds this (status oom)")
    sweep_id: Any = _f(None, "groups the trials of one sweep (default: the Hydra sweep directory name)")
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
    from hydra.core.config_store import ConfigStore

    cs = ConfigStore.instance()
    cs.store(name="bench_schema", node=BenchConfig)
    cs.store(group="model", name="model_schema", node=ModelConfig)
    cs.store(group="data", name="data_schema", node=DataConfig)
    cs.store(group="optimizer", name="optimizer_schema", node=OptimizerConfig)
    cs.store(group="logger", name="logger_schema", node=LoggerConfig)
    cs.store(group="ops", name="ops_schema", node=OpsConfig)


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
        seed=cfg["seed"],
    )


def to_container(cfg) -> dict:
    """A composed config as a plain resolved dict without Hydra's own node."""
    d = OmegaConf.to_container(cfg, resolve=True) if isinstance(cfg, DictConfig) else dict(cfg)
    d.pop("hydra", None)
    return d


# Keys that do not change what a trial measures: `resume=true` ignores them when matching recorded trials.
_NOT_IDENTITY = ("results_dir", "resume", "logger", "timeout_s", "max_host_mem_mb", "sweep_id")
# Keys only scenario=ops reads. A model trial's identity leaves them out: it hashes as before they existed.
_OPS_ONLY = ("scenario", "threads", "ops")
# Everything an ops trial's measurements depend on (the ops node aside, model keys do not matter to it), and
# every key it reads.
_OPS_IDENTITY = ("scenario", "framework", "device", "dtype", "threads", "seed", "ops")
OPS_KEYS = _OPS_IDENTITY + ("results_dir", "resume", "logger", "timeout_s", "max_host_mem_mb", "sweep_id")


def trial_identity(cfg) -> dict:
    c = to_container(cfg)
    if c.get("scenario") == "ops":
        ident = {k: c[k] for k in _OPS_IDENTITY}
        ident["threads"] = str(ident["threads"])
        if c["framework"] == "jax":  # always jitted: ops.compile changes nothing
            ident["ops"] = {**ident["ops"], "compile": False}
        return ident
    return {k: v for k, v in c.items() if k not in _NOT_IDENTITY + _OPS_ONLY}


def config_hash(cfg) -> str:
    blob = json.dumps(trial_identity(cfg), sort_keys=True, default=str)
    return hashlib.sha1(blob.encode()).hexdigest()[:12]


# ---------------------------------------------------------------------------------------------------------------
# validation: one line per problem, the first problem wins


def _choice(name: str, value, accepted) -> None:
    if value not in accepted:
        raise ConfigError(f"{name}={value}: accepted {' | '.join(map(str, accepted))}")


def _at_least(name: str, value, low) -> None:
    if not isinstance(value, (int, float)) or isinstance(value, bool) or value < low:
        raise ConfigError(f"{name}={value}: must be a number >= {low}")


def validate(cfg) -> None:
    """Raise ConfigError (one line) for the first problem in a composed config."""
    c = to_container(cfg)
    _choice("scenario", c.get("scenario", "model"), SCENARIOS)
    if c.get("scenario") == "ops":
        validate_ops(c)
        return
    if str(c.get("threads", "all")) != "all":
        raise ConfigError(f"threads={c['threads']}: applies to scenario=ops only; the model scenario accepts all")
    _validate_process(c)
    m = c["model"]
    _choice("mode", c["mode"], MODES)
    _choice("trainable", c["trainable"], TRAINABLE_SCOPES)
    _choice("optimizer", c["optimizer"]["name"], OPTIMIZERS)
    _choice("jvp_impl", c["jvp_impl"], JVP_IMPLS)
    _choice("dtype", c["dtype"], DTYPES)
    _choice("attn_implementation", c["attn_implementation"], ATTN_IMPLEMENTATIONS)
    for name in ("batch_size", "seq_len", "steps", "grad_accum", "num_tangents"):
        _at_least(name, c[name], 1)
    _at_least("warmup_steps", c["warmup_steps"], 1)  # the first step compiles; it must never be timed
    for name in ("vocab_size", "hidden_size", "num_layers", "num_heads", "intermediate_size"):
        _at_least(f"model.{name}", m[name], 1)
    _at_least("model.max_position_embeddings", m["max_position_embeddings"], 2)
    if not isinstance(m["num_labels"], int) or m["num_labels"] < 2:
        raise ConfigError(f"model.num_labels={m['num_labels']}: must be an integer >= 2")
    if not 0.0 <= m["dropout"] < 1.0:
        raise ConfigError(f"model.dropout={m['dropout']}: must be in [0, 1)")
    _at_least("optimizer.lr", c["optimizer"]["lr"], 0)
    if c["mezo_eps"] <= 0:
        raise ConfigError(f"mezo_eps={c['mezo_eps']}: must be > 0")
    if c["max_timed_s"] is not None:
        _at_least("max_timed_s", c["max_timed_s"], 0)
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
        from bench.spec import count_params

        n = count_params(spec, c["trainable"], c["last_k"])
        if n > c["jacfwd_max_params"]:
            raise ConfigError(
                f"mode=jacfwd with trainable={c['trainable']}: {n:,} trainable parameters, one forward-mode pass "
                f"each (> jacfwd_max_params={c['jacfwd_max_params']:,}); accepted: trainable=head|bias|last_k with "
                "fewer parameters, or a larger jacfwd_max_params"
            )
    _validate_outputs(c)
    _validate_data(c)
    if m["checkpoint"] is not None:
        from bench.weights import WeightsError, resolve_checkpoint

        try:
            resolve_checkpoint(m["checkpoint"])
        except WeightsError as e:
            raise ConfigError(str(e)) from e


def _validate_process(c: dict) -> None:
    """What every trial's process reads, whatever the scenario: framework, device, logger and limits."""
    _choice("framework", c["framework"], FRAMEWORKS)
    _choice("device", c["device"], DEVICES)
    _choice("logger", c["logger"]["name"], LOGGERS)
    _choice("logger.mode", c["logger"]["mode"], ("offline", "online", "disabled"))
    _at_least("timeout_s", c["timeout_s"], 1)
    if c["max_host_mem_mb"] is not None:
        _at_least("max_host_mem_mb", c["max_host_mem_mb"], 1)


def timed_steps(c: dict) -> int:
    """How many timed steps a trial runs: `steps`, or with `epochs` set, that many passes over data.num_train."""
    if c.get("epochs") is None:
        return c["steps"]
    return c["epochs"] * (c["data"]["num_train"] // c["batch_size"]) // c["grad_accum"]


def _validate_outputs(c: dict) -> None:
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
    _at_least("eval_every", c["eval_every"], 0)
    if c["eval_every"] and not c["evaluate"]:
        raise ConfigError(f"eval_every={c['eval_every']}: needs evaluate=true")
    if c["measure_grad_cosine"] and c["mode"] == "inference":
        raise ConfigError(
            "measure_grad_cosine=true: mode=inference has no gradient; accepted with backprop | jvp | jacfwd | mezo"
        )


def _validate_data(c: dict) -> None:
    """The data module's own checks, plus whether an ag_news source exists at all (its contents are checked when
    the trial reads it; a bad file is reported as one line naming the file and line)."""
    import importlib.util

    from bench import data

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
# scenario=ops


def _as_list(value) -> list:
    """A list option given as one value (ops.names=matmul, ops.sizes=1024) is a list of one."""
    if value is None:
        return []
    return list(value) if isinstance(value, (list, tuple)) else [value]


def ops_plan(c: dict) -> list[tuple[str, tuple[int, int]]]:
    """(op, (rows, cols)) in the order an ops trial measures them: op by op, the square sizes, then the shapes."""
    o = c["ops"]
    names = _as_list(o["names"]) or list(OP_NAMES)
    shapes = [(n, n) for n in _as_list(o["sizes"])] + [(s[0], s[1]) for s in _as_list(o["shapes"])]
    shapes = list(dict.fromkeys(shapes))  # sizes=[64] and shapes=[[64,64]] name one measurement
    return [(name, shape) for name in names for shape in shapes]


def _positive_int(v) -> bool:
    return isinstance(v, int) and not isinstance(v, bool) and v >= 1


def validate_ops(c: dict) -> None:
    """The keys scenario=ops reads; the model keys are not looked at."""
    o = c["ops"]
    _validate_process(c)
    _choice("dtype", c["dtype"], OPS_DTYPES)
    _choice("threads", str(c["threads"]), THREADS)
    names = _as_list(o["names"])
    for name in names:
        if name not in OP_NAMES:
            raise ConfigError(f"ops.names={name}: unknown op; accepted: {', '.join(OP_NAMES)}")
        if names.count(name) > 1:
            raise ConfigError(f"ops.names: {name} is listed {names.count(name)} times; accepted: each op once")
    for n in _as_list(o["sizes"]):
        if not _positive_int(n):
            raise ConfigError(f"ops.sizes={n}: accepted integers >= 1 (square sizes n, e.g. ops.sizes=[64,1024])")
    for s in _as_list(o["shapes"]):
        if not (isinstance(s, (list, tuple)) and len(s) == 2 and all(_positive_int(v) for v in s)):
            raise ConfigError(
                f"ops.shapes={o['shapes']}: accepted a list of [rows, cols] pairs of integers >= 1, e.g. "
                "ops.shapes=[[64,4096]]"
            )
    if not _as_list(o["sizes"]) and not _as_list(o["shapes"]):
        raise ConfigError("ops.sizes=[] and ops.shapes=[]: nothing to measure; accepted: at least one size or shape")
    _at_least("ops.warmup", o["warmup"], 1)  # the first call compiles; it must never be timed
    _at_least("ops.repeats", o["repeats"], 1)
    _at_least("ops.min_sample_s", o["min_sample_s"], 0)
    for name in ("compile", "check"):
        if not isinstance(o[name], bool):
            raise ConfigError(f"ops.{name}={o[name]}: accepted true | false")
