"""The model scenario's config checks: every key a model trial reads, before any process starts. One line per
problem (the option, the bad value, what is accepted), the first problem wins; the process keys every trial reads
(framework, device, logger, limits) are checked before, by bench.config.validate_process, and what the host and
the launcher can start by bench.harness.launch.check_launch."""

from __future__ import annotations

import importlib.util
import math
from dataclasses import fields, replace
from pathlib import Path

from bench import data, estimators, models
from bench.config import (
    MAX_ACCUM,
    MAX_HOLD,
    MAX_STEPS,
    TRACES,
    BenchConfig,
    LoraConfig,
    lora_spec,
    model_spec,
    shown,
    step_spec,
)
from bench.errors import ConfigError, above, at_least, choice, count, in_unit, is_number
from bench.estimators.base import TrialContext
from bench.measure.flop_model import predict as predict_flops
from bench.parallel import STRATEGIES, global_batch_size, timed_steps, world_size
from bench.scenarios.model.schedule import next_evaluation
from bench.spec import (
    ATTN_IMPLEMENTATIONS,
    DIRECTIONS,
    DTYPES,
    LORA_ROLES,
    OPTIMIZERS,
    TRAINABLE_SCOPES,
)
from bench.store.csv import unwritable
from bench.weights import WeightsError, check_checkpoint

# A trace is for a few steps: its events grow with every step traced (a BERT-base step's run to tens of MB), and the
# steps' batches are listed before the profiler starts.
MAX_PROFILE_STEPS = 100


def validate(cfg: BenchConfig) -> None:
    """Raise ConfigError (one line) for the first problem in a model trial's keys."""
    if cfg.threads != "all":
        raise ConfigError(f"threads={cfg.threads}: applies to scenario=ops only; the model scenario accepts all")
    m = cfg.model
    choice("mode", cfg.mode, estimators.names())
    choice("trainable", cfg.trainable, TRAINABLE_SCOPES)
    choice("optimizer", cfg.optimizer.name, OPTIMIZERS)
    choice("dtype", cfg.dtype, DTYPES)
    choice("directions", cfg.directions, DIRECTIONS)
    choice("attn_implementation", cfg.attn_implementation, ATTN_IMPLEMENTATIONS)
    for name in ("batch_size", "seq_len"):  # bounded by the data (num_train) and the model (its positions)
        at_least(name, getattr(cfg, name), 1)
    count("steps", cfg.steps, 1, MAX_STEPS)
    count("grad_accum", cfg.grad_accum, 1, MAX_ACCUM)
    count("warmup_steps", cfg.warmup_steps, 1, MAX_STEPS)  # the first step compiles; it must never be timed
    for name in ("vocab_size", "hidden_size", "num_layers", "num_heads", "intermediate_size"):
        at_least(f"model.{name}", getattr(m, name), 1)
    at_least("model.max_position_embeddings", m.max_position_embeddings, 2)
    if m.num_labels < 2:
        raise ConfigError(f"model.num_labels={m.num_labels}: must be an integer >= 2")
    in_unit("model.dropout", m.dropout)
    o = cfg.optimizer
    above("optimizer.lr", o.lr, 0)
    at_least("optimizer.weight_decay", o.weight_decay, 0)
    for name in ("momentum", "beta1", "beta2"):
        in_unit(f"optimizer.{name}", getattr(o, name))
    above("optimizer.eps", o.eps, 0)
    at_least("last_k", cfg.last_k, 1)
    for name in estimators.settings_nodes():  # each estimator's own settings, as its module checks them
        problem = estimators.get(name).check(getattr(cfg, name))
        if problem:
            raise ConfigError(problem)
    above("divergence_factor", cfg.divergence_factor, 1)
    if cfg.max_timed_s is not None:
        at_least("max_timed_s", cfg.max_timed_s, 0)
    spec = model_spec(m)
    data.check_seq_len(cfg.seq_len, spec.max_position_embeddings, m.name)
    check_vocab(m.vocab_size)
    if cfg.trainable == "last_k" and not 1 <= cfg.last_k <= spec.num_layers:
        raise ConfigError(f"last_k={cfg.last_k}: accepted 1..{spec.num_layers} (model.num_layers)")
    validate_lora(cfg)
    check_ranks(cfg, spec)
    estimator = estimators.get(cfg.mode)
    if cfg.remat and not estimator.remat:
        remats = [n for n in estimators.names() if estimators.get(n).remat]
        raise ConfigError(
            f"remat=true: applies to mode={' | '.join(remats)} only (got mode={cfg.mode}); use case=backprop_remat"
        )
    if cfg.compile and (cfg.framework == "jax" or not estimator.compiles):
        compiles = [n for n in estimators.names() if estimators.get(n).compiles]
        raise ConfigError(
            f"compile=true with framework={cfg.framework} mode={cfg.mode}: torch.compile is torch's (JAX's step is "
            "always compiled by XLA), and under torch.func's transforms (jvp, jacfwd) it skips every frame "
            f"(docs/speed.md); accepted: framework=torch with mode={' | '.join(compiles)}"
        )
    if cfg.framework == "torch" and not cfg.scan_layers:
        raise ConfigError(
            "scan_layers=false: JAX only (torch runs HF's layers one by one, eagerly, either way); "
            "framework=torch accepts scan_layers=true"
        )
    if cfg.xla_autotune_level is not None and cfg.xla_autotune_level not in range(5):
        raise ConfigError(
            f"xla_autotune_level={cfg.xla_autotune_level}: accepted: 0 (off) to 4, or null (XLA's default)"
        )
    if cfg.framework == "jax" and cfg.attn_implementation != "eager":
        raise ConfigError(f"attn_implementation={cfg.attn_implementation}: torch only; framework=jax accepts eager")
    if why := models.of(spec).refuses(cfg.framework, cfg.parallel, cfg.scan_layers):
        raise ConfigError(why)
    n, step = models.of(spec).count_params(spec, cfg.trainable, cfg.last_k, lora_spec(cfg.lora)), step_spec(cfg)
    if why := estimator.refuses(TrialContext(step, cfg.framework, cfg.parallel, n, forward_passes(cfg, spec, step))):
        raise ConfigError(why)
    validate_parallel(cfg)
    validate_outputs(cfg)  # the evaluation schedule first: the target's checks walk it
    validate_target(cfg)
    validate_data(cfg)
    if m.checkpoint is not None:
        try:
            check_checkpoint(m.checkpoint, spec)
        except WeightsError as e:
            raise ConfigError(str(e)) from e


def check_vocab(vocab_size: int) -> None:
    """The embedding table holds every id the tokenizer emits: a smaller one would index past its end (torch: an
    IndexError mid-trial; JAX clamps the index and the loss drifts into a row named diverged)."""
    ids = data.tokenizer_vocab_size()
    if vocab_size < ids:
        raise ConfigError(
            f"model.vocab_size={vocab_size}: smaller than the tokenizer's {ids:,} ids (bert-base-uncased WordPiece, "
            f"the suite's tokenizer); accepted: an integer >= {ids}"
        )


def check_ranks(cfg: BenchConfig, spec) -> None:
    """lora.rank and lozo.rank against the matrices they factor: a rank past a matrix's smaller side is no longer
    low rank, only dearer (its factors grow with the rank, U V^T's scale with it too)."""
    family = models.of(spec)
    if cfg.trainable == "lora":  # every wrapped layer gets the rank: each must be wider than it
        shapes = family.param_shapes(spec, lora_spec(cfg.lora))
        sides = {min(s[1], shapes[k.replace(".lora_A.", ".lora_B.")][0]) for k, s in shapes.items() if ".lora_A." in k}
        if sides and cfg.lora.rank > min(sides):
            raise ConfigError(
                f"lora.rank={cfg.lora.rank}: above the smaller side ({min(sides)}) of a layer lora.targets wraps; "
                f"accepted an integer in [1, {min(sides)}]"
            )
    if cfg.mode == "lozo":  # the rank applies to every trained matrix; the classifier's (num_labels rows) is narrow
        lora = lora_spec(cfg.lora) if cfg.trainable == "lora" else None
        sides = [
            min(s[0], math.prod(s[1:]))
            for n, s in family.param_shapes(spec, lora).items()
            if len(s) >= 2 and family.is_trainable(n, cfg.trainable, spec.num_layers, cfg.last_k)
        ]
        if sides and cfg.lozo.rank > max(sides):
            raise ConfigError(
                f"lozo.rank={cfg.lozo.rank}: above the smaller side of every matrix trainable={cfg.trainable} trains "
                f"(the widest: {max(sides)}), so no perturbation is low rank; accepted an integer in [1, {max(sides)}]"
            )


def forward_passes(cfg: BenchConfig, spec, step) -> float | None:
    """The FLOP model's price of the trial's step in forward passes (None where the mode has no FLOP term)."""
    resolved = estimators.get(cfg.mode).resolved(step, cfg.framework, "cuda" if cfg.device == "cuda" else "cpu")
    full = predict_flops(spec, resolved, cfg.batch_size, cfg.seq_len, framework=cfg.framework)
    forward = replace(step, mode=estimators.BASELINE, settings=None)
    one = predict_flops(spec, forward, cfg.batch_size, cfg.seq_len, framework=cfg.framework)
    return full.total / one.total if full is not None and one is not None and one.total else None


def validate_lora(cfg: BenchConfig) -> None:
    """lora.*: meaningful under trainable=lora only (refused elsewhere rather than silently ignored)."""
    lo, defaults = cfg.lora, LoraConfig()
    if cfg.trainable != "lora":
        for f in fields(LoraConfig):
            value, default = getattr(lo, f.name), getattr(defaults, f.name)
            if (list(value) if isinstance(value, (list, tuple)) else value) != default:
                raise ConfigError(
                    f"lora.{f.name}={shown(value)}: applies to trainable=lora only (got trainable={cfg.trainable})"
                )
        return
    if not isinstance(lo.rank, int) or isinstance(lo.rank, bool) or lo.rank < 1:
        raise ConfigError(f"lora.rank={lo.rank}: must be an integer >= 1")
    above("lora.alpha", lo.alpha, 0)
    if not is_number(lo.dropout) or not 0 <= lo.dropout < 1:
        raise ConfigError(f"lora.dropout={lo.dropout}: must be a number in [0, 1)")
    names = [lo.targets] if isinstance(lo.targets, str) else list(lo.targets)
    if names != ["all_linear"]:
        bad = [t for t in names if t not in LORA_ROLES]
        if bad or not names:
            raise ConfigError(
                f"lora.targets={shown(lo.targets)}: {'unknown ' + bad[0] if bad else 'empty'}; accepted "
                f"a list of {' | '.join(LORA_ROLES)}, or all_linear"
            )
    if cfg.last_k != 1:
        raise ConfigError(
            f"last_k={cfg.last_k} with trainable=lora: last_k applies to trainable=last_k; lora "
            "adapts every encoder layer (lora.targets says which of its linear layers)"
        )


def validate_parallel(cfg: BenchConfig) -> None:
    """A parallel setting this framework or mode cannot run (bench/parallel.py's rules); what the host and the
    launcher can start is bench.harness.launch.check_launch's."""
    p, fw = cfg.parallel, cfg.framework
    choice("parallel", p, STRATEGIES)
    at_least("devices", cfg.devices, 1)
    at_least("nodes", cfg.nodes, 1)
    if p == "none":
        if world_size(cfg) > 1:
            raise ConfigError(
                f"devices={cfg.devices} nodes={cfg.nodes}: parallel=none runs on one device; accepted: "
                "parallel=ddp|fsdp for more"
            )
    if p != "fsdp" and (cfg.fsdp_offload or not cfg.fsdp_reshard_after_forward):
        which = "fsdp_offload=true" if cfg.fsdp_offload else "fsdp_reshard_after_forward=false"
        raise ConfigError(f"{which}: applies to parallel=fsdp only (got parallel={p})")
    if fw != "torch" and not cfg.fsdp_reshard_after_forward:
        raise ConfigError(
            "fsdp_reshard_after_forward=false: torch only (FSDP2's SHARD_GRAD_OP); in jax XLA decides when gathered "
            "parameters are freed; accepted: true"
        )
    if cfg.fsdp_offload:
        if fw != "torch":
            raise ConfigError("fsdp_offload=true: torch only (FSDP2's CPUOffloadPolicy); framework=jax accepts false")
        if cfg.device == "cpu":
            raise ConfigError(
                "fsdp_offload=true: the parameters already live in host memory on a CPU device, there is nothing to "
                "offload to; accepted on a CUDA device"
            )
    if p != "none" and (cfg.evaluate or cfg.measure_grad_cosine):
        which = "evaluate=true" if cfg.evaluate else "measure_grad_cosine=true"
        raise ConfigError(f"{which}: not measured with parallel={p} yet; accepted with parallel=none")


TARGET_METRICS = ("eval_accuracy", "eval_loss")


def training_modes() -> list[str]:
    return [n for n in estimators.names() if estimators.get(n).updates]


def validate_target(cfg: BenchConfig) -> None:
    """target.*: a trial that stops at a held-out accuracy or loss, checked at each evaluation."""
    t = cfg.target
    if cfg.tune_stop_after is not None:
        if t.metric is None:
            raise ConfigError(
                f"tune_stop_after={cfg.tune_stop_after}: caps a trial short of its target; accepted with "
                "target.metric set (the tuning sweeper sets it: hydra.sweeper.capping=true)"
            )
        at_least("tune_stop_after", cfg.tune_stop_after, 1)
    if t.metric is None:
        if t.value is not None or t.max_steps is not None or t.hold != 1 or t.levels:
            raise ConfigError(
                "target.value/max_steps/hold/levels without target.metric; accepted: target.metric="
                "eval_accuracy|eval_loss with them, or none of them"
            )
        return
    choice("target.metric", t.metric, TARGET_METRICS)
    if not estimators.get(cfg.mode).updates:
        raise ConfigError(
            f"target.metric: mode={cfg.mode} does not train, so it never reaches a target; accepted with "
            f"mode={' | '.join(training_modes())}"
        )
    if t.value is None or t.max_steps is None:
        raise ConfigError(f"target.metric={t.metric}: needs target.value and target.max_steps (the step cap)")
    if t.metric == "eval_accuracy" and (not is_number(t.value) or not 0 < t.value <= 1):
        raise ConfigError(f"target.value={t.value}: an accuracy; accepted a number in (0, 1]")
    above("target.value", t.value, 0)
    if not cfg.evaluate or cfg.eval_every < 1:
        raise ConfigError(
            f"target.metric={t.metric}: the target is checked at each evaluation; accepted with "
            "evaluate=true eval_every=N (N >= 1 timed steps)"
        )
    if cfg.epochs is not None:
        raise ConfigError(
            f"epochs={cfg.epochs} with target.metric: the target's step cap decides the length; accepted: epochs=null"
        )
    count("target.max_steps", t.max_steps, 1, MAX_STEPS)
    if t.max_steps < cfg.warmup_steps + cfg.eval_every:
        raise ConfigError(
            f"target.max_steps={t.max_steps}: smaller than warmup_steps={cfg.warmup_steps} + one "
            f"evaluation interval (eval_every={cfg.eval_every}); accepted >= "
            f"{cfg.warmup_steps + cfg.eval_every}"
        )
    validate_hold(cfg)


def validate_hold(cfg: BenchConfig) -> None:
    """target.hold and target.levels: evaluations in a row, and easier values met on the way by the same rule."""
    t = cfg.target
    count("target.hold", t.hold, 1, MAX_HOLD)
    done = [0]  # the timed steps of the schedule's evaluations: the run of `hold` must fit under the cap
    while len(done) <= t.hold:
        done.append(next_evaluation(done[-1], cfg.eval_every, cfg.eval_resolution, cfg.warmup_steps))
    if cfg.warmup_steps + done[-1] > t.max_steps:
        raise ConfigError(
            f"target.hold={t.hold}: {t.hold} evaluations in a row end at step {cfg.warmup_steps + done[-1]} at the "
            f"earliest, past target.max_steps={t.max_steps}; accepted: a larger cap, or a smaller hold"
        )
    lower = t.metric == "eval_loss"
    easier = [v for v in t.levels if is_number(v) and (v > t.value if lower else 0 < v < t.value)]
    if len(easier) < len(t.levels) or len(set(easier)) < len(easier):
        raise ConfigError(
            f"target.levels={shown(list(t.levels))}: accepted distinct values easier than target.value={t.value} "
            + ("(losses above it)" if lower else "(accuracies in (0, it))")
        )


def validate_outputs(cfg: BenchConfig) -> None:
    """epochs, evaluate, eval_every and measure_grad_cosine: what a trial records beyond the timed steps."""
    if cfg.epochs is not None:
        at_least("epochs", cfg.epochs, 1)
        if cfg.data.num_train is None:
            raise ConfigError(f"epochs={cfg.epochs}: needs data.num_train (samples per epoch); got null")
        count("epochs", cfg.epochs, 1, MAX_STEPS)
        if timed_steps(cfg) > MAX_STEPS:
            raise ConfigError(
                f"epochs={cfg.epochs}: {timed_steps(cfg):,} updates over data.num_train={cfg.data.num_train}; "
                f"accepted: {MAX_STEPS:,} updates at most (fewer epochs)"
            )
        if timed_steps(cfg) < 1:
            raise ConfigError(
                f"epochs={cfg.epochs}: data.num_train={cfg.data.num_train} holds no full update "
                f"of batch_size={cfg.batch_size} x grad_accum={cfg.grad_accum} x {world_size(cfg)} "
                "device(s); accepted: a larger data.num_train"
            )
    count("eval_every", cfg.eval_every, 0, MAX_STEPS)
    if cfg.eval_every and not cfg.evaluate:
        raise ConfigError(f"eval_every={cfg.eval_every}: needs evaluate=true")
    r = cfg.eval_resolution
    if not is_number(r) or not 0 <= r < 1:
        raise ConfigError(f"eval_resolution={r}: accepted a fraction in [0, 1) (0.1: steps known within 10%)")
    if r and not cfg.eval_every:
        raise ConfigError(f"eval_resolution={r}: needs evaluate=true eval_every=N (N >= 1: the longest interval)")
    if cfg.measure_grad_cosine and not estimators.get(cfg.mode).updates:
        raise ConfigError(
            f"measure_grad_cosine=true: mode={cfg.mode} has no gradient; accepted with "
            f"mode={' | '.join(training_modes())}"
        )
    steps = cfg.profile_steps
    if isinstance(steps, bool) or not isinstance(steps, int) or not 1 <= steps <= MAX_PROFILE_STEPS:
        raise ConfigError(
            f"profile_steps={steps}: accepted an integer in [1, {MAX_PROFILE_STEPS}] (steps traced after the timed "
            "ones)"
        )
    if cfg.profile:
        check_traces_folder(Path(cfg.results_dir) / TRACES)


def check_traces_folder(folder: Path) -> None:
    """profile=true: the traces' folder must be a folder this process can write (it is created if missing)."""
    if folder.exists() and not folder.is_dir():
        raise ConfigError(f"profile=true: the traces folder {folder} is a file; accepted: a folder (or none there)")
    if (existing := unwritable(folder)) is not None:
        raise ConfigError(
            f"profile=true: the traces folder {folder} cannot be written ({existing}: permission "
            "denied); accepted: a results_dir you can write"
        )


def validate_data(cfg: BenchConfig) -> None:
    """The data module's own checks, plus whether an ag_news source exists at all (its contents are checked when
    the trial reads it; a bad file is reported as one line naming the file and line)."""
    spec = data.data_spec(cfg.data)
    batch = global_batch_size(cfg)
    data.validate(spec, batch, cfg.seq_len)
    if cfg.evaluate:
        data.validate(spec, batch, cfg.seq_len, split="test")
    data.check_source(spec, batch, cfg.evaluate)
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
