"""The one interface both frameworks implement.

Everything here is framework- and model-neutral: the names of the things we measure (frameworks, modes, trainable
scopes, optimizers, dtypes), the rules by which a trainable scope selects a family's parameters (Scopes), the roles
a LoRA adapter may take, a training step's settings, and the interfaces a world and a trainer implement. torch_impl/
and jax_impl/ read these; neither defines its own copy. What a model family is (its architecture, its parameters,
what each scope selects of them) lives in its own module, bench/models/<family>.py, found through the registry
(bench.models).

Parameter names are HF transformers' names for the family's sequence-classification model. They are the common
currency: weights travel between frameworks as a flat {hf_name: numpy array} dict, and a trainable scope is a
predicate on those names, so both frameworks freeze exactly the same tensors.
"""

from __future__ import annotations

import importlib
import re
from dataclasses import dataclass, field
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
# and a matmul probe of the device's achievable rate), kernels (the kernels a step launches and the host's share
# of it). A process imports only the modules it needs: an ops trial never loads a model.
IMPL_MODULES = (
    "device",
    "estimators",
    "parallel",
    "directions",
    "steps",
    "memory",
    "ops",
    "plain",
    "profile",
    "flops",
    "kernels",
)
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

# trainable=lora: the roles of a layer's linear layers an adapter may wrap, as lora.targets names them (BERT's module
# paths inside an encoder layer, which every family reads as roles and maps onto its own layers: bench/models/);
# lora.targets=all_linear wraps all six
LORA_ROLES = ("query", "key", "value", "attention.output.dense", "intermediate.dense", "output.dense")
LORA_DEFAULT_ROLES = ("query", "value")  # the LoRA paper's choice (Hu et al. 2021, section 7.1)

# A batch is a dict of numpy arrays, identical bytes for both frameworks (bench/data.py makes them), the same keys
# for every family: each reads those it needs (its INPUT_KEYS; OPT has no token_type_ids).
#   input_ids, token_type_ids, attention_mask: (B, T) int32;  labels: (B,) int32
BATCH_KEYS = ("input_ids", "token_type_ids", "attention_mask", "labels")
Batch = dict[str, np.ndarray]


@dataclass(frozen=True)
class LoraSpec:
    """LoRA adapters (Hu et al. 2021) on the model's layers' linear layers: y = W x + b + (alpha / rank) B A
    dropout(x), A (rank, in) drawn as PEFT draws it, B (out, rank) zero, so a model starts as its base. Built by
    HF PEFT in torch and Flax NNX's nnx.LoRA in JAX; trained with the classifier (PEFT's sequence-classification
    recipe), the base weights frozen."""

    rank: int = 8
    alpha: float = 16.0
    dropout: float = 0.0
    targets: tuple[str, ...] = LORA_DEFAULT_ROLES  # a subset of LORA_ROLES (a family may accept its own names)

    @property
    def scaling(self) -> float:
        return self.alpha / self.rank


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
            layer = self.layer_of(name)
            return head or (layer is not None and layer >= num_layers - last_k)
        raise ValueError(f"trainable={scope!r}: accepted {', '.join(TRAINABLE_SCOPES)}")

    def layer_of(self, name: str) -> int | None:
        """The index of the layer parameter `name` belongs to; None outside the layers."""
        m = self.layer.match(name)
        return None if m is None else int(m.group(1))


# Random directions are drawn a unit at a time: a run of consecutive trainable tensors of one dtype, drawn by one
# generator and one random op, cut into the tensors (torch_impl/directions.py). A unit holds no more entries than the
# largest tensor, or than UNIT_FLOOR where every tensor is smaller (BitFit's biases, LoRA's adapters: one draw for
# all of them, 4 MiB in fp32): a direction is held a unit at a time, never whole.
UNIT_FLOOR = 1 << 20


def draw_units(numels: list[int], kinds: list | None = None) -> list[range]:
    """The units of tensors with `numels` entries, in their order (indices into the list): consecutive tensors of
    the same kind (dtype, device) while their entries stay within max(largest tensor, UNIT_FLOOR)."""
    cap = max([*numels, UNIT_FLOOR])
    units, start, total = [], 0, 0
    for i, n in enumerate(numels):
        if i > start and (total + n > cap or (kinds is not None and kinds[i] != kinds[start])):
            units.append(range(start, i))
            start, total = i, 0
        total += n
    if numels:
        units.append(range(start, len(numels)))
    return units


def count_trained(shapes: dict[str, tuple[int, ...]], selects, scope: str, num_layers: int, last_k: int) -> int:
    """The parameters among `shapes` that `selects(name, scope, num_layers, last_k)` trains."""
    return sum(int(np.prod(s)) for n, s in shapes.items() if selects(n, scope, num_layers, last_k))


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
    remat: bool = False  # activation checkpointing per layer (backprop)
    scan_layers: bool = True  # JAX: the layers as a lax.scan over stacked layers (false: unrolled)
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
