"""BERT in JAX: our own Flax NNX BertForSequenceClassification (bench/jax_impl/model.py), its weights by HF name
(bench/jax_impl/params.py). Mirror of torch_impl/models/bert.py."""

from __future__ import annotations

from bench.jax_impl.model import build_model
from bench.jax_impl.params import export_weights, from_hf, hf_name, is_trained, load_weights, to_hf

__all__ = ["build_model", "export_weights", "from_hf", "hf_name", "is_trained", "load_weights", "to_hf"]
