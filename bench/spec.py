"""The one interface both frameworks implement.

Everything here is framework-neutral: the names of the things we measure (frameworks, modes, trainable scopes),
the BERT architecture both implementations build, and which parameters a trainable scope selects. torch_impl/ and
jax_impl/ read these; neither defines its own copy.

Parameter names are HF transformers' names for BertForSequenceClassification ("bert.encoder.layer.3.output.dense.
weight", "classifier.bias", ...). They are the common currency: weights travel between frameworks as a flat
{hf_name: numpy array} dict, and a trainable scope is a predicate on those names, so both frameworks freeze exactly
the same tensors.
"""

from __future__ import annotations

import importlib
import re
from dataclasses import asdict, dataclass, field
from types import ModuleType
from typing import Any, Protocol

import numpy as np

FRAMEWORKS = ("torch", "jax")
FRAMEWORK_NAMES = {"torch": "PyTorch", "jax": "JAX"}  # as a reader knows them
# What each framework package provides, module by module (bench/<framework>_impl/<module>.py, the same names in
# both): device (devices, numerics, memory trackers), parallel (a trial's devices and processes: `start(cfg)` ->
# World), steps (the modes, Trainer, make_trainer), memory (what holds a trial's memory: breakdown(trainer,
# batches)), ops (the op micro-benchmarks' builders), plain (the plain training loop a user would write: what the
# harness is measured against), profile (a profiler's trace of a few steps: record(trainer, updates, folder), and
# classify(trainer, events) naming each event's category), flops (a step's FLOPs as the framework counts them,
# and a matmul probe of the device's achievable rate). A process imports only the modules it needs: an ops trial
# never loads BERT.
IMPL_MODULES = ("device", "estimators", "parallel", "directions", "steps", "memory", "ops", "plain", "profile", "flops")
TRAINABLE_SCOPES = ("all", "head", "bias", "last_k", "classifier", "lora")
HEAD_ONLY = ("head", "classifier")  # scopes that train nothing before the pooler: the trunk runs once, untangented
OPTIMIZERS = ("sgd", "adamw", "signsgd")
# fp32; bf16: mixed precision (fp32 parameters and optimizer state, bf16 matmuls: torch.autocast's recipe, which
# jax_impl mirrors); bf16_pure: parameters, gradients, directions and optimizer state in bf16 too
DTYPES = ("fp32", "bf16", "bf16_pure")
# jvp's tangents and MeZO's perturbations: N(0, I), or +-1 entries (Rademacher; SPSA's own), both E[z z^T] = I
DIRECTIONS = ("gaussian", "rademacher")
MAX_SEED = 2**63  # seeds must fit both frameworks: jax.random.key takes an int64, torch's generators a uint64
# torch only (HF's attn_implementation): sdpa is PyTorch's fused attention, which has no forward-mode AD rule.
ATTN_IMPLEMENTATIONS = ("eager", "sdpa")

# trainable=lora: the linear layers of each encoder layer an adapter may wrap, named by their path inside the layer
# (HF's module names); lora.targets=all_linear wraps all six
LORA_TARGETS = ("query", "key", "value", "attention.output.dense", "intermediate.dense", "output.dense")
LORA_DEFAULT_TARGETS = ("query", "value")  # the LoRA paper's choice (Hu et al. 2021, section 7.1)

# A batch is a dict of numpy arrays, identical bytes for both frameworks (bench/data.py makes them).
#   input_ids, token_type_ids, attention_mask: (B, T) int32;  labels: (B,) int32
BATCH_KEYS = ("input_ids", "token_type_ids", "attention_mask", "labels")
Batch = dict[str, np.ndarray]


@dataclass(frozen=True)
class BertSpec:
    """BERT for sequence classification: the architecture both frameworks build (HF BertConfig semantics)."""

    vocab_size: int = 30522
    hidden_size: int = 768
    num_layers: int = 12
    num_heads: int = 12
    intermediate_size: int = 3072
    max_position_embeddings: int = 512
    type_vocab_size: int = 2
    num_labels: int = 4
    dropout: float = 0.1  # hidden dropout and attention-probability dropout, as in HF's BertConfig defaults
    layer_norm_eps: float = 1e-12  # BERT's value (HF BertConfig default)
    initializer_range: float = 0.02  # std of the normal init (HF BertConfig default)
    pad_token_id: int = 0  # [PAD] in the bert-base-uncased vocab

    def __post_init__(self):
        if self.hidden_size % self.num_heads:
            raise ValueError(
                f"model.hidden_size={self.hidden_size} must be divisible by model.num_heads={self.num_heads}"
            )

    @property
    def head_dim(self) -> int:
        return self.hidden_size // self.num_heads

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(frozen=True)
class LoraSpec:
    """LoRA adapters (Hu et al. 2021) on the encoder layers' linear layers: y = W x + b + (alpha / rank) B A
    dropout(x), A (rank, in) drawn as PEFT draws it, B (out, rank) zero, so a model starts as its base. Built by
    HF PEFT in torch and Flax NNX's nnx.LoRA in JAX; trained with the classifier (PEFT's sequence-classification
    recipe), the base weights frozen."""

    rank: int = 8
    alpha: float = 16.0
    dropout: float = 0.0
    targets: tuple[str, ...] = LORA_DEFAULT_TARGETS  # a subset of LORA_TARGETS

    @property
    def scaling(self) -> float:
        return self.alpha / self.rank


def lora_shapes(spec: BertSpec, lora: LoraSpec) -> dict[str, tuple[int, ...]]:
    """The adapters' parameters with their torch-layout shapes, named as the wrapped layer plus PEFT's
    lora_A/lora_B (its ".default" adapter name dropped): bert.encoder.layer.0.attention.self.query.lora_A.weight
    (rank, in), ...lora_B.weight (out, rank)."""
    H, I = spec.hidden_size, spec.intermediate_size  # noqa: E741
    dims = {
        "query": (H, H),
        "key": (H, H),
        "value": (H, H),
        "attention.output.dense": (H, H),
        "intermediate.dense": (H, I),
        "output.dense": (I, H),
    }  # (in, out)
    shapes = {}
    for i in range(spec.num_layers):
        for target in LORA_TARGETS:  # HF's order, whatever order the targets were given in
            if target in lora.targets:
                n_in, n_out = dims[target]
                name = f"bert.encoder.layer.{i}.{lora_module(target)}"
                shapes[name + ".lora_A.weight"] = (lora.rank, n_in)
                shapes[name + ".lora_B.weight"] = (n_out, lora.rank)
    return shapes


def lora_module(target: str) -> str:
    """A LORA_TARGETS name as the module's path inside an encoder layer (HF naming)."""
    return f"attention.self.{target}" if target in ("query", "key", "value") else target


def param_shapes(spec: BertSpec, lora: LoraSpec | None = None) -> dict[str, tuple[int, ...]]:
    """Every parameter of HF BertForSequenceClassification, in HF's order, with its torch-layout shape; with
    `lora`, the adapters' parameters after them (lora_shapes)."""
    H, I = spec.hidden_size, spec.intermediate_size  # noqa: E741
    shapes: dict[str, tuple[int, ...]] = {
        "bert.embeddings.word_embeddings.weight": (spec.vocab_size, H),
        "bert.embeddings.position_embeddings.weight": (spec.max_position_embeddings, H),
        "bert.embeddings.token_type_embeddings.weight": (spec.type_vocab_size, H),
        "bert.embeddings.LayerNorm.weight": (H,),
        "bert.embeddings.LayerNorm.bias": (H,),
    }
    for i in range(spec.num_layers):
        p = f"bert.encoder.layer.{i}."
        for name in ("query", "key", "value"):
            shapes[p + f"attention.self.{name}.weight"] = (H, H)
            shapes[p + f"attention.self.{name}.bias"] = (H,)
        shapes[p + "attention.output.dense.weight"] = (H, H)
        shapes[p + "attention.output.dense.bias"] = (H,)
        shapes[p + "attention.output.LayerNorm.weight"] = (H,)
        shapes[p + "attention.output.LayerNorm.bias"] = (H,)
        shapes[p + "intermediate.dense.weight"] = (I, H)
        shapes[p + "intermediate.dense.bias"] = (I,)
        shapes[p + "output.dense.weight"] = (H, I)
        shapes[p + "output.dense.bias"] = (H,)
        shapes[p + "output.LayerNorm.weight"] = (H,)
        shapes[p + "output.LayerNorm.bias"] = (H,)
    shapes["bert.pooler.dense.weight"] = (H, H)
    shapes["bert.pooler.dense.bias"] = (H,)
    shapes["classifier.weight"] = (spec.num_labels, H)
    shapes["classifier.bias"] = (spec.num_labels,)
    return shapes if lora is None else {**shapes, **lora_shapes(spec, lora)}


@dataclass(frozen=True)
class Scopes:
    """What each trainable scope selects of a family's parameters, by their HF names: the rules are every family's
    (bench/models/), the names its own.

    all     every parameter
    head    what follows the last layer: BERT's pooler and classifier, OPT's final LayerNorm and score
    classifier  the classifier alone: a linear probe
    bias    BitFit (Ben Zaken et al. 2022): every bias vector (LayerNorm betas included) plus the classifier
    last_k  the last `last_k` layers, plus the head
    lora    the LoRA adapters plus the classifier (PEFT's sequence-classification recipe); with any other scope an
            adapter is frozen (a model has adapters only under lora)
    """

    layer: re.Pattern  # a layer's parameters, its index the first group
    head: tuple[str, ...]  # prefixes of the head's parameters
    classifier: str  # prefix of the classifier's

    def selects(self, name: str, scope: str, num_layers: int, last_k: int = 1) -> bool:
        if scope == "lora":
            return ".lora_" in name or name.startswith(self.classifier)
        if scope == "all":
            return True
        head = name.startswith(self.head)
        if scope == "head":
            return head
        if scope == "classifier":
            return name.startswith(self.classifier)
        if scope == "bias":
            return name.endswith(".bias") or name.startswith(self.classifier)
        if scope == "last_k":
            m = self.layer.match(name)
            return head or (m is not None and int(m.group(1)) >= num_layers - last_k)
        raise ValueError(f"trainable={scope!r}: accepted {', '.join(TRAINABLE_SCOPES)}")


def count_trained(shapes: dict[str, tuple[int, ...]], selects, scope: str, num_layers: int, last_k: int) -> int:
    """The parameters among `shapes` that `selects(name, scope, num_layers, last_k)` trains."""
    return sum(int(np.prod(s)) for n, s in shapes.items() if selects(n, scope, num_layers, last_k))


BERT_SCOPES = Scopes(re.compile(r"bert\.encoder\.layer\.(\d+)\."), ("bert.pooler.", "classifier."), "classifier.")


def is_trainable(name: str, scope: str, num_layers: int, last_k: int = 1) -> bool:
    """Whether BERT's parameter `name` (HF naming) is trained under `scope` (Scopes: the head is pooler +
    classifier)."""
    return BERT_SCOPES.selects(name, scope, num_layers, last_k)


def count_params(spec: BertSpec, scope: str = "all", last_k: int = 1, lora: LoraSpec | None = None) -> int:
    """The parameters `scope` trains (trainable=lora: over the adapters `lora` describes, LoraSpec() if None)."""
    shapes = param_shapes(spec, (lora or LoraSpec()) if scope == "lora" else None)
    return count_trained(shapes, is_trainable, scope, spec.num_layers, last_k)


@dataclass(frozen=True)
class OptimizerSpec:
    """Same hyperparameters in torch.optim and optax (decoupled weight decay for adamw)."""

    name: str = "sgd"
    lr: float = 1e-3
    momentum: float = 0.0  # sgd only
    weight_decay: float = 0.0
    beta1: float = 0.9  # adamw only (torch/optax defaults)
    beta2: float = 0.999
    eps: float = 1e-8


@dataclass(frozen=True)
class StepSpec:
    """Everything a training step needs to know, beyond the model and the batch."""

    mode: str = "backprop"
    trainable: str = "all"
    last_k: int = 1
    optimizer: OptimizerSpec = OptimizerSpec()
    remat: bool = False  # activation checkpointing per encoder layer (backprop)
    scan_layers: bool = True  # JAX: the encoder as a lax.scan over stacked layers (false: unrolled)
    compile: bool = False  # torch: torch.compile the model (inductor); JAX's step is always compiled
    grad_accum: int = 1  # micro-batches per optimizer update
    seed: int = 0  # tangent / perturbation / dropout randomness
    dtype: str = "fp32"  # fp32 | bf16 (mixed precision) | bf16_pure (see DTYPES)
    directions: str = "gaussian"  # gaussian | rademacher (see DIRECTIONS)
    lora: LoraSpec = LoraSpec()  # trainable=lora: the adapters the model gets (none under any other scope)
    # the estimator's own settings node (bench/estimators/<mode>.py's settings), None for its defaults; not hashed
    settings: Any = field(default=None, hash=False)

    @property
    def adapters(self) -> LoraSpec | None:
        """The adapters the model is built with: `lora` under trainable=lora, else None."""
        return self.lora if self.trainable == "lora" else None


def implementation(framework: str, module: str) -> ModuleType:
    """bench.<framework>_impl.<module>: the one place a framework's name becomes code (AlgoPerf's convention:
    the runner finds the framework by name and fails loudly on anything else). Imported on demand, so a process
    imports only the framework its trial runs."""
    if framework not in FRAMEWORKS:
        raise ValueError(f"framework={framework}: accepted {' | '.join(FRAMEWORKS)}")
    if module not in IMPL_MODULES:
        raise ValueError(f"{module}: not a framework module; accepted {' | '.join(IMPL_MODULES)}")
    return importlib.import_module(f"bench.{framework}_impl.{module}")


class World(Protocol):
    """A trial's devices and processes, as each framework's `parallel.start(cfg)` sets them up (torch: a process
    group of one process per device; JAX: one process owning its node's devices, a Mesh with a `data` axis).
    parallel=none is a world of one device. bench/parallel.py holds the framework-neutral rules."""

    parallel: str  # none | ddp | fsdp
    size: int  # devices in the trial (world size)
    rank: int  # this process's rank among the trial's processes (0 in a one-process trial)
    main: bool  # this process reports the trial (rank 0)
    device: Any  # the device this process computes on (JAX: its first; the trainer shards over the mesh)

    def local_batches(self, micro_batches: list[Batch]) -> list[Batch]:
        """The part of each global micro-batch (batch_size x size rows) that this process feeds its device(s)."""

    def memory_trackers(self) -> list:
        """This process's memory trackers, primary first (bench.trackers): what device_memory reads."""

    def device_memory(self, trainer: Trainer, trackers: list) -> list[dict]:
        """This process's devices' memory over the timed steps, one dict each: device, peak_mem_mb,
        baseline_mem_mb, excess_mem_mb, mem_method; `trackers` are memory_trackers() after the window."""

    def reset_comm(self) -> None:
        """Start counting the collectives this process issues (the timed window begins)."""

    def comm_bytes_per_step(self, trainer: Trainer, steps: int) -> float | None:
        """Bytes one device exchanged per step over the `steps` steps since reset_comm(), counted from what the
        program did (torch: the collectives issued; JAX: the collectives in the compiled step); None for
        parallel=none."""

    def gather(self, item: dict) -> list[dict] | None:
        """Every process's `item`, in rank order, on the main process; None on the others."""

    def close(self) -> None:
        """Leave the process group (torch) / the distributed runtime (multi-process JAX)."""


class Trainer(Protocol):
    """What each framework's `steps.make_trainer(spec, weights, step_spec, device, world=...)` returns. The runner
    and the tests only ever talk to this; torch_impl/steps.py and jax_impl/steps.py implement it with the same
    names."""

    n_params: int  # every parameter of the model
    n_trainable: int  # the parameters the trainable scope trains
    n_sharded: int  # the parameters the world's strategy shards over its devices (0 unless parallel=fsdp)
    spec: StepSpec  # the step it runs: its estimator's settings resolved for the device (jacfwd.chunk=auto)

    def state_bytes(self) -> dict[str, int]:
        """Bytes of parameters ("params") and optimizer state ("optimizer") held on one device of this process
        (the largest, where it has several), counted from the tensors themselves."""

    def to_device(self, micro_batches: list[Batch]) -> Any:
        """Copy numpy micro-batches (one update's worth) to the device."""

    def sync(self, value: Any = None) -> None:
        """Wait for the device to finish (torch.cuda.synchronize / block_until_ready)."""

    def compile(self, micro_batches: Any) -> None:
        """Compile the timed step for these batch shapes ahead of time (JAX); a no-op where nothing compiles."""

    def step(self, micro_batches: Any) -> Any:
        """One update (or one forward for inference) on device batches; returns the loss before the update,
        as a device scalar (not synced)."""

    def gradient(self, micro_batches: Any, tangents: Any = None) -> tuple[Any, Any]:
        """(loss, the mode's gradient or estimate over the trainable parameters), without updating; `tangents`
        replaces jvp's seeded ones (tests)."""

    def apply(self, grads: Any) -> None:
        """The optimizer update with `grads`."""

    def weights(self) -> dict[str, np.ndarray]:
        """The model's current weights as {hf_name: numpy, torch layout}."""

    def evaluate(self, micro_batches: Any) -> tuple[float, float]:
        """(mean loss, accuracy) over held-out device batches, dropout off; never on the timed path."""

    def gradient_check(self, micro_batches: Any) -> tuple[list[np.ndarray], list[np.ndarray]]:
        """(the mode's estimate, the exact gradient by reverse mode), tensor by tensor as numpy, dropout off."""
