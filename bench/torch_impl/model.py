"""PyTorch BERT: HF transformers' BertForSequenceClassification, loaded from the shared numpy weights."""

from __future__ import annotations

import numpy as np
import torch
from transformers import BertConfig, BertForSequenceClassification

from bench.spec import ATTN_IMPLEMENTATIONS, BertSpec, param_shapes
from bench.weights import check_weights, normalize_name


def hf_config(spec: BertSpec, attn_implementation: str = "eager"):
    # Eager attention by default: PyTorch's fused SDPA kernels have no forward-mode AD rule (NotImplementedError
    # under torch.func.jvp / forward_ad), and the same attention math in both frameworks keeps parity exact.
    if attn_implementation not in ATTN_IMPLEMENTATIONS:
        raise ValueError(
            f"attn_implementation={attn_implementation!r}: accepted {', '.join(ATTN_IMPLEMENTATIONS)}"
        )
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
        attn_implementation=attn_implementation,
    )


def build_model(
    spec: BertSpec,
    weights: dict[str, np.ndarray],
    device: str | torch.device = "cpu",
    attn_implementation: str = "eager",
):
    """HF BertForSequenceClassification with exactly `weights` (HF names, torch layout)."""
    # Build on the meta device: HF's own random init would be thrown away immediately.
    with torch.device("meta"):
        model = BertForSequenceClassification(hf_config(spec, attn_implementation))
    load_weights(model, weights, device)
    return model


def load_weights(model, weights: dict[str, np.ndarray], device: str | torch.device = "cpu") -> None:
    """Copy the numpy weights into the model (strict: every key checked, all problems reported together)."""
    check_weights(weights, _spec_of(model))
    state = {k: torch.tensor(weights[k], device=device) for k in param_shapes(_spec_of(model))}
    model.load_state_dict(state, strict=False, assign=True)  # strictness is check_weights' job
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
    """The model's parameters as the shared {hf_name: numpy} dict (the inverse of load_weights)."""
    return {k: v.detach().cpu().float().numpy().copy() for k, v in model.state_dict().items() if not _is_buffer(k)}


def weights_from_state_dict(state_dict) -> dict[str, np.ndarray]:
    """A torch state_dict (tensors, HF names) as the shared numpy dict, e.g. to feed jax_impl.params."""
    return {
        normalize_name(k): v.detach().cpu().float().numpy().copy()
        for k, v in state_dict.items()
        if not _is_buffer(normalize_name(k))
    }


def _is_buffer(name: str) -> bool:
    return name.endswith(("position_ids", "token_type_ids"))
