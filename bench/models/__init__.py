"""Model families, as plug-ins: one framework-neutral module each (bench/models/<family>.py: its spec, parameter
names and shapes as HF names them, what each trainable scope selects, its LoRA targets, its initialisation, the
batch keys it reads), beside one model module per framework (bench/torch_impl/models/<family>.py,
bench/jax_impl/models/<family>.py). `model.family=NAME` selects one; a preset (conf/model/) names its family.

What a family module defines (the same names in each; tests/contracts/test_models.py checks):

    NAME, SPEC                      its name and its spec's dataclass (BertSpec, OptSpec)
    INPUT_KEYS, HEAD_KEYS           the batch keys the model reads, and those its head reads beside the trunk's
                                    output (OPT's head finds the last token that is not padding)
    LORA_TARGETS                    the linear layers an adapter may wrap (lora.targets)
    MODELLED                        the models that have its terms ({"memory", "flops"}): another's cells of its
                                    rows are empty, with a note
    matmuls(spec, ...) -> [Matmul]  every matmul of its forward pass, for the FLOP model; POOLER, the head's matmul
                                    before the classifier (or None)
    spec_from(values) -> SPEC       its spec from the config's model.* values
    param_shapes, is_trainable, count_params, init_weights, with_adapters, check_weights
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass
from types import ModuleType

FAMILIES = ("bert", "opt")


@dataclass(frozen=True)
class Matmul:
    """One matmul of a family's forward pass: its FLOPs, and how many of its operands carry a derivative (0, 1, 2);
    what the FLOP model (bench/measure/flop_model.py) sums."""

    name: str
    flops: int  # 2 M N K
    carrying: int  # operands that are a trainable weight or an activation downstream of one
    layer: int | None  # its layer; None for the head's (pooler, classifier)


def get(name: str) -> ModuleType:
    """The family `model.family=name` builds (ValueError naming the accepted ones for another name)."""
    if name not in FAMILIES:
        raise ValueError(f"model.family={name}: accepted {' | '.join(FAMILIES)}")
    return importlib.import_module(f"{__name__}.{name}")


def of(spec) -> ModuleType:
    """The family whose spec `spec` is."""
    for name in FAMILIES:
        if isinstance(spec, get(name).SPEC):
            return get(name)
    raise TypeError(f"{type(spec).__name__}: not the spec of a model family ({' | '.join(FAMILIES)})")


def implementation(framework: str, spec) -> ModuleType:
    """The framework's model module of `spec`'s family: bench.<framework>_impl.models.<family>."""
    return importlib.import_module(f"bench.{framework}_impl.models.{of(spec).NAME}")
