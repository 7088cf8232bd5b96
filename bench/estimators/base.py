"""What a way of differentiating declares, framework-neutral: the interface every estimator module implements.

An estimator is one module here (bench/estimators/<name>.py, `mode=<name>`) holding an `ESTIMATOR`, an instance of
a subclass of `Estimator`: what the harness, the models of memory, FLOPs and communication, and the config's checks
need to know about it without importing a framework. Its gradient lives in the framework packages.

The models call an estimator's terms with a context of what they computed from the shapes (the model's byte and
FLOP sums, named here once so every estimator reads the same quantities); a term an estimator does not define
returns None, and the trial's row is `ok` with the model's cells empty and a note (a new method is measured before
anyone has modelled it).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, fields, replace
from typing import Any

from bench.spec import StepSpec


def setting(default, help: str, choices: tuple | None = None):  # noqa: A002 (as in bench/config.py)
    """A field of an estimator's settings: its default and its help (--help and docs/options.md show both), and
    for a setting that names one of a few ways, those ways in the order tables list them."""
    return field(default=default, metadata={"help": help, "choices": choices})


@dataclass(frozen=True)
class TrialContext:
    """What the config's checks hand an estimator (bench/scenarios/model/validate.py): the trial it is asked for."""

    step: StepSpec
    framework: str
    parallel: str  # none | ddp | fsdp
    n: int  # trainable parameters
    forwards: float | None = None  # the FLOP model's step in forward passes' FLOPs (None: not modelled)


@dataclass(frozen=True)
class MemoryContext:
    """What the memory model (bench/measure/memory_model.py) hands an estimator: bytes on one device."""

    step: StepSpec
    framework: str
    param_bytes: int  # a parameter's bytes (and its gradient's, direction's, optimizer moment's): 4, bf16_pure 2
    activation_bytes: int  # an activation's bytes: 4, bf16 and bf16_pure 2
    hidden: int  # H
    batch_size: int
    n: int  # trainable parameters
    share: int  # devices the parameters are sharded over (1 unless parallel=fsdp)
    largest: int  # bytes of the largest trainable tensor
    unit: int  # bytes of the largest unit torch draws a direction by (bench.spec.draw_units)
    layer_params: int  # trainable parameters of one encoder layer
    forward_temp: int  # a forward pass's working memory (one layer's live intermediates)
    one_layer: int  # one trained layer's saved activations, over every token (0 when no layer trains)
    saved: int  # what a backward pass keeps: every trained layer's activations, the embeddings' and the head's
    layer_inputs: int  # what a checkpointed (remat) backward keeps: each trained layer's input instead
    bf16_weight_copies: int  # dtype=bf16: the Linear weights' bf16 copies autocast keeps for a backward


@dataclass(frozen=True)
class MemoryTerms:
    """An estimator's categories of memory (bench/measure/memory_model.py's docstring defines each)."""

    grads: int = 0
    directions: int = 0
    saved: int = 0
    temp: int = 0
    state: int = 0  # what the estimator keeps across steps (HiZOO's Hessian estimate): counted with the optimizer's


@dataclass(frozen=True)
class FlopContext:
    """What the FLOP model (bench/measure/flop_model.py) hands an estimator: matmul FLOPs of one micro-batch."""

    step: StepSpec
    framework: str | None  # None: the maths alone; torch or jax: what that framework's program runs beyond it
    every: float  # F: every matmul of a forward pass
    derivative: float  # D: each matmul times the operands that carry a derivative
    zero_terms: float  # torch's forward mode: the matmuls whose zero tangent it multiplies anyway (0 elsewhere)
    trunk: float  # the encoder layers' matmuls
    pooler: float
    recompute: float  # remat: the forward matmuls of the checkpointed layers that have a backward
    hoists: bool  # XLA hoists the primal out of a loop over tangents (jax, unrolled layers)
    n: int  # trainable parameters


@dataclass(frozen=True)
class FlopTerms:
    forward: float = 0.0
    backward: float = 0.0
    recompute: float = 0.0
    tangent: float = 0.0


@dataclass(frozen=True)
class CommContext:
    """What bench/parallel.py hands an estimator: bytes one device exchanges (parallel=ddp|fsdp)."""

    step: StepSpec
    framework: str
    parallel: str  # ddp | fsdp
    scalar: int  # a loss or a directional derivative: 4 bytes in every dtype
    gather: int  # fsdp: one all-gather of the sharded parameters (0 under ddp)
    gradient: int  # the gradient's exchange: ddp's all-reduce, fsdp's reduce-scatter
    regathers: bool  # torch's FSDP2 with reshard_after_forward: a backward pass gathers the parameters again


@dataclass(frozen=True)
class CommTerms:
    per_micro: int = 0  # per micro-batch (fsdp's gathers)
    per_update: int = 0  # once per optimizer update in torch (DDP's no_sync), per micro-batch in JAX


class Estimator:
    """A way of differentiating. Subclasses set the attributes and override the terms they model."""

    name: str  # mode=NAME
    label: str  # as a reader knows it
    summary: str  # one line: what it computes
    updates: bool = True  # takes optimizer steps (inference: a forward pass only)
    backward: bool = False  # autograd records the forward for a backward pass (torch: parameters require grad)
    dropout: bool = True  # the model runs with dropout on (MeZO's reference runs it in eval mode)
    remat: bool = False  # remat=true applies: its backward can recompute each layer's activations
    draws: bool = False  # draws random directions from its seed, of the distribution directions= names
    compiles: bool = True  # torch.compile applies (torch.func's transforms skip its frames)
    passes: str = ""  # forward passes per step, in words (the reports' and docs' column)
    # forward passes per step as the method counts them, a number (passes_to_target): a forward-mode pass is one per
    # tangent it carries, a backward pass is not one (the FLOP-equivalent count, the report's, prices it)
    forward_passes: int = 1
    # The mode whose step this one's is read against in the reports' ratios (the forward gradient against the
    # exact gradient it estimates; a zeroth-order step against the forward passes it is made of), or None
    compared_with: str | None = None
    color: str | None = None  # its colour in the plots (None: one drawn from its name)
    # Where the reports list it: the baseline, the exact gradients, then the estimates, by rank; an estimator that
    # declares none comes after these, alphabetically
    rank: int | None = None
    # {framework: the module of its gradient}: a plug-in's, from an installed package (bench/plugins.py); this
    # package's estimators leave it empty and live in bench/<framework>_impl/estimators/<name>.py
    implementations: dict[str, str] = {}
    # A dataclass of setting() fields: the config node NAME.* (mode=NAME's own options, e.g. mezo.eps), or None.
    # Its values reach the trainers as StepSpec.settings and runs.csv as the columns NAME_<field>.
    settings: type | None = None
    # Options that were top-level keys before they moved into the node: {old key: field}, so that the old
    # spelling is refused with the new one, and a results folder recorded under it still reads, reruns, resumes
    # (runs.csv keeps the old key as the setting's column)
    moved: dict[str, str] = {}

    def passes_for(self, row: dict) -> str:
        """Forward passes per step in words, for a runs.csv row (its own settings' columns): `passes` by default."""
        return self.passes

    def forward_passes_for(self, row: dict) -> int | None:
        """Forward passes per step as the estimator declares them, for a runs.csv row (its own settings' columns;
        None where the row lacks one it needs): `forward_passes` by default."""
        return self.forward_passes

    def settings_of(self, step: StepSpec) -> Any:
        """This step's settings: the node the config gave it, or the defaults (a StepSpec built by hand, or one
        of another mode, whose node is its own)."""
        if step.settings is not None and step.mode == self.name:
            return step.settings
        return self.settings() if self.settings is not None else None

    def variant(self, off: dict[str, str]) -> tuple[list[str], list[str]]:
        """What a row's name shows of its settings: `off` holds those off their default {field: value as text};
        returns what goes in parentheses and in brackets after the mode's name: mezo(eps=0.0001), jvp(K=4)[lazy]."""
        return [f"{k}={v}" for k, v in off.items()], []

    def check(self, settings) -> str | None:
        """What is wrong with `settings` in one line (the option as typed, its value, what is accepted), or None.
        Every estimator's node is checked, whichever mode runs: a sweep may set it for the modes that read it."""
        return None

    def refuses(self, c: TrialContext) -> str | None:
        """Why this estimator cannot run the trial `c` describes, as one line naming the options and what is
        accepted (None: it can). Asked of the mode that runs only."""
        return None

    def resolve(self, settings, framework: str, device_kind: str) -> Any:
        """`settings` with what the device decides filled in (jacfwd.chunk=auto); the trainers run the result."""
        return settings

    def resolved(self, step: StepSpec, framework: str, device_kind: str) -> StepSpec:
        """`step` with its settings resolved for the device (what the trainers and the models of a trial read)."""
        return replace(step, settings=self.resolve(self.settings_of(step), framework, device_kind))

    def records_graph(self, step: StepSpec) -> bool:
        """Whether torch's parameters require grad in this step (a backward pass, or a setting that records one)."""
        return self.backward

    def memory(self, c: MemoryContext) -> MemoryTerms | None:
        return None

    def flops(self, c: FlopContext) -> FlopTerms | None:
        return None

    def comm(self, c: CommContext) -> CommTerms | None:
        return None


def setting_fields(estimator: Estimator) -> list:
    """The dataclass fields of an estimator's settings (none without settings)."""
    return list(fields(estimator.settings)) if estimator.settings is not None else []


# What an estimator's check() says of one setting: a line naming it, its value and what is accepted, or None.
def _number(value) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def positive(option: str, value) -> str | None:
    return None if _number(value) and value > 0 else f"{option}={value}: accepted a finite number > 0"


def fraction(option: str, value) -> str | None:
    return None if _number(value) and 0 <= value < 1 else f"{option}={value}: accepted a number in [0, 1)"


def integer(option: str, value, low: int, high: int | None = None) -> str | None:
    if isinstance(value, int) and not isinstance(value, bool) and low <= value and (high is None or value <= high):
        return None
    return f"{option}={value}: accepted an integer " + (f"in [{low}, {high}]" if high is not None else f">= {low}")


def choice(option: str, value, accepted: tuple) -> str | None:
    return None if value in accepted else f"{option}={value}: accepted {' | '.join(map(str, accepted))}"
