"""Each model family's JAX model (bench/models/<family>.py declares the family): our own Flax NNX module, its
layers one scan, loaded with weights by HF name. Mirror of torch_impl/models/.

What a module defines: build_model(spec, weights, *, remat, dtype, lora, seed, scan_layers, stacks) (an NNX model
whose __call__ and features take its family's INPUT_KEYS by name, and whose head(hidden, *HEAD_KEYS) reads the
trunk's output), load_weights, export_weights, hf_name (an NNX path's HF name), is_trained (a parameter's scope),
to_hf and from_hf (parameter-shaped pytrees as HF-named numpy, and back). What every family shares (precisions,
layers, LoRA, the scan over layers, weights by HF name) is common.py's, no family."""

from __future__ import annotations

import importlib
from types import ModuleType

from bench import models


def of(model) -> ModuleType:
    """The model module of `model`'s family (an NNX model's spec names it: bench.models.of)."""
    return importlib.import_module(f"{__name__}.{models.of(model.spec).NAME}")
