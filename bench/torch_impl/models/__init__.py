"""Each model family's torch model (bench/models/<family>.py declares the family): built through HF transformers,
loaded with weights by HF name. Mirror of jax_impl/models/.

What a module defines: build_model(spec, weights, device, attn_implementation, lora, seed), load_weights,
export_weights, hf_name (a parameter's HF name from torch's), features(model, batch) and head_logits(model,
hidden, batch, params) (the forward pass in two halves, for the head scopes), layers(model) (FSDP's units). What
every family shares (the build template, PEFT's adapters, weights by HF name) is common.py's, no family."""

from __future__ import annotations

import importlib
from types import ModuleType


def of(model) -> ModuleType:
    """The model module of `model`'s family, by HF's model_type (bert, opt: the families' names)."""
    inner = getattr(model, "_orig_mod", model)  # torch.compile's wrapper
    return importlib.import_module(f"{__name__}.{inner.config.model_type}")
