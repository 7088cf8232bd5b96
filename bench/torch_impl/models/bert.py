"""BERT (Devlin et al. 2019) in torch: HF transformers' BertForSequenceClassification, loaded from the shared
numpy weights; with LoRA adapters injected by HF PEFT under trainable=lora (bench/torch_impl/models/common.py);
the halves of its forward pass the head scopes run apart. Mirror of jax_impl/models/bert.py; bench/models/bert.py
holds the family's framework-neutral facts."""

from __future__ import annotations

import numpy as np
import torch
from torch.func import functional_call
from transformers import BertConfig, BertForSequenceClassification

from bench.models.bert import INPUT_KEYS, BertSpec, param_shapes
from bench.spec import LoraSpec
from bench.torch_impl.models import common
from bench.torch_impl.models.common import hf_name  # noqa: F401 (every family's, as the registry reads it)
from bench.weights import check_weights

BUFFERS = ("position_ids", "token_type_ids")  # HF BERT's non-persistent buffers, in its state_dict: not weights


def hf_config(spec: BertSpec, attn_implementation: str = "eager") -> BertConfig:
    return BertConfig(
        vocab_size=spec.vocab_size,
        hidden_size=spec.hidden_size,
        num_hidden_layers=spec.num_layers,
        num_attention_heads=spec.num_heads,
        intermediate_size=spec.intermediate_size,
        hidden_act="gelu",  # exact (erf) GELU, as BERT
        hidden_dropout_prob=spec.dropout,
        attention_probs_dropout_prob=spec.dropout,
        max_position_embeddings=spec.max_position_embeddings,
        type_vocab_size=spec.type_vocab_size,
        initializer_range=spec.initializer_range,
        layer_norm_eps=spec.layer_norm_eps,
        pad_token_id=spec.pad_token_id,
        num_labels=spec.num_labels,
        problem_type="single_label_classification",
        attn_implementation=common.attention(attn_implementation),
    )


def build_model(
    spec: BertSpec,
    weights: dict[str, np.ndarray],
    device: str | torch.device = "cpu",
    attn_implementation: str = "eager",
    lora: LoraSpec | None = None,
    seed: int = 0,
):
    """HF BertForSequenceClassification with exactly `weights` (HF names, torch layout); with `lora`, PEFT's LoRA
    layers around its targets (common.build)."""
    config = hf_config(spec, attn_implementation)
    return common.build(BertForSequenceClassification, config, spec, weights, load_weights, device, lora, seed)


def load_weights(
    model, weights: dict[str, np.ndarray], device: str | torch.device = "cpu", lora: LoraSpec | None = None
) -> None:
    """Copy the numpy weights into the model (strict: every key checked, all problems reported together)."""
    spec = _spec_of(model)
    check_weights(weights, spec, lora=lora)
    # not strict: the position and token type buffers are made below; the weights' strictness is check_weights'
    common.assign_weights(model, weights, param_shapes(spec, lora), device, strict=False)
    # Non-persistent buffers were created on the meta device with the model; make real ones.
    emb = model.bert.embeddings
    n = model.config.max_position_embeddings
    emb.position_ids = torch.arange(n, device=device).expand((1, -1))
    emb.token_type_ids = torch.zeros((1, n), dtype=torch.long, device=device)


def _spec_of(model) -> BertSpec:
    c = model.config
    return BertSpec(
        vocab_size=c.vocab_size,
        hidden_size=c.hidden_size,
        num_layers=c.num_hidden_layers,
        num_heads=c.num_attention_heads,
        intermediate_size=c.intermediate_size,
        max_position_embeddings=c.max_position_embeddings,
        type_vocab_size=c.type_vocab_size,
        num_labels=c.num_labels,
        dropout=c.hidden_dropout_prob,
        layer_norm_eps=c.layer_norm_eps,
        initializer_range=c.initializer_range,
        pad_token_id=c.pad_token_id,
    )


def export_weights(model) -> dict[str, np.ndarray]:
    """The model's parameters as the shared {hf_name: numpy} dict (the inverse of load_weights), its buffers left
    out; FSDP2's sharded ones gathered whole (a collective: every rank calls it)."""
    return common.export_weights(model, BUFFERS)


def features(model, batch):
    """The trunk (embeddings + encoder) -> last hidden state (B, T, H): for the head scopes, where it is frozen."""
    return model.bert(**{k: batch[k] for k in INPUT_KEYS}).last_hidden_state


def head_logits(model, hidden, batch, params):
    """The trunk's output through pooler, dropout and classifier; `params` (HF names) are the head's parameters,
    passed functionally."""
    pooled = functional_call(model.bert.pooler, common.under(params, "bert.pooler."), (hidden,))  # (B, H)
    return functional_call(model.classifier, common.under(params, "classifier."), (model.dropout(pooled),))  # (B, C)


def layers(model) -> list:
    """The encoder's layers: FSDP's units, one each."""
    return list(model.bert.encoder.layer)
