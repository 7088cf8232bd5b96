"""BERT in torch: HF transformers' BertForSequenceClassification, built and loaded by bench/torch_impl/model.py;
here the halves of its forward pass the head scopes run apart. Mirror of jax_impl/models/bert.py."""

from __future__ import annotations

from torch.func import functional_call

from bench.models.bert import INPUT_KEYS
from bench.torch_impl.model import build_model, export_weights, hf_name, load_weights

__all__ = ["build_model", "export_weights", "hf_name", "load_weights", "features", "head_logits", "layers"]


def features(model, batch):
    """The trunk (embeddings + encoder) -> last hidden state (B, T, H): for the head scopes, where it is frozen."""
    return model.bert(**{k: batch[k] for k in INPUT_KEYS}).last_hidden_state


def head_logits(model, hidden, batch, params):
    """The trunk's output through pooler, dropout and classifier; `params` (HF names) are the head's parameters,
    passed functionally."""
    sub = lambda prefix: {k.removeprefix(prefix): v for k, v in params.items() if k.startswith(prefix)}
    pooled = functional_call(model.bert.pooler, sub("bert.pooler."), (hidden,))  # (B, H)
    return functional_call(model.classifier, sub("classifier."), (model.dropout(pooled),))  # (B, C)


def layers(model) -> list:
    """The encoder's layers: FSDP's units, one each."""
    return list(model.bert.encoder.layer)
