"""PyTorch OPT: HF transformers' OPTForSequenceClassification, loaded from the shared numpy weights; with LoRA
adapters injected by HF PEFT under trainable=lora. Mirror of jax_impl/models/opt.py."""

from __future__ import annotations

import numpy as np
import torch
from torch.func import functional_call
from transformers import OPTConfig, OPTForSequenceClassification

from bench.models.opt import OptSpec, param_shapes
from bench.spec import LoraSpec
from bench.torch_impl.models import common
from bench.torch_impl.models.common import hf_name  # noqa: F401 (every family's, as the registry reads it)
from bench.weights import check_weights


def hf_config(spec: OptSpec, attn_implementation: str = "eager") -> OPTConfig:
    return OPTConfig(
        vocab_size=spec.vocab_size,
        hidden_size=spec.hidden_size,
        num_hidden_layers=spec.num_layers,
        num_attention_heads=spec.num_heads,
        ffn_dim=spec.ffn_dim,
        max_position_embeddings=spec.max_position_embeddings,
        do_layer_norm_before=True,  # pre-LN, as every OPT but 350m
        word_embed_proj_dim=spec.hidden_size,  # no project_in / project_out
        dropout=spec.dropout,
        attention_dropout=spec.attention_dropout,
        activation_function="relu",
        layerdrop=0.0,
        init_std=spec.init_std,
        pad_token_id=spec.pad_token_id,
        enable_bias=spec.enable_bias,
        layer_norm_elementwise_affine=True,
        num_labels=spec.num_labels,
        problem_type="single_label_classification",
        use_cache=False,  # a classifier's forward: no KV cache
        attn_implementation=common.attention(attn_implementation),
    )


def build_model(
    spec: OptSpec,
    weights: dict[str, np.ndarray],
    device: str | torch.device = "cpu",
    attn_implementation: str = "eager",
    lora: LoraSpec | None = None,
    seed: int = 0,
):
    """HF OPTForSequenceClassification with exactly `weights` (HF names, torch layout); with `lora`, PEFT's LoRA
    layers around its targets (common.build)."""
    config = hf_config(spec, attn_implementation)
    return common.build(OPTForSequenceClassification, config, spec, weights, load_weights, device, lora, seed)


def load_weights(
    model, weights: dict[str, np.ndarray], device: str | torch.device = "cpu", lora: LoraSpec | None = None
) -> None:
    """Copy the numpy weights into the model (strict: every key checked, all problems reported together, and every
    parameter of the model must be given one)."""
    spec = _spec_of(model)
    check_weights(weights, spec, lora=lora)
    common.assign_weights(model, weights, param_shapes(spec, lora), device, strict=True)  # OPT has no buffers


def _spec_of(model) -> OptSpec:
    c = model.config
    return OptSpec(
        vocab_size=c.vocab_size,
        hidden_size=c.hidden_size,
        num_layers=c.num_hidden_layers,
        num_heads=c.num_attention_heads,
        ffn_dim=c.ffn_dim,
        max_position_embeddings=c.max_position_embeddings,
        num_labels=c.num_labels,
        dropout=c.dropout,
        attention_dropout=c.attention_dropout,
        init_std=c.init_std,
        pad_token_id=c.pad_token_id,
        enable_bias=c.enable_bias,
    )


def export_weights(model) -> dict[str, np.ndarray]:
    """The model's parameters as the shared {hf_name: numpy} dict in HF order (the inverse of load_weights);
    FSDP2's sharded ones gathered whole (a collective: every rank calls it)."""
    return common.export_weights(model)


def features(model, batch):
    """The decoder's layers -> their output before the final LayerNorm (B, T, H): for the head scopes, where the
    final LayerNorm belongs to the head (bench.models.opt.is_trainable), as JAX's features stops there too."""
    decoder, norm = model.model.decoder, model.model.decoder.final_layer_norm
    decoder.final_layer_norm = None  # HF's decoder skips a None final LayerNorm
    try:
        return decoder(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"]).last_hidden_state
    finally:
        decoder.final_layer_norm = norm


def head_logits(model, hidden, batch, params):
    """The final LayerNorm and the score over every token, read at the last token that is not padding
    (transformers 5.x's rule), as HF's forward does; `params` (HF names) are the head's parameters, passed
    functionally."""
    norm = model.model.decoder.final_layer_norm
    logits = functional_call(
        model.score,
        common.under(params, "score."),
        (functional_call(norm, common.under(params, "model.decoder.final_layer_norm."), (hidden,)),),
    )
    ids = batch["input_ids"]
    last = common.last_token(ids, model.config.pad_token_id)  # (B,)
    return logits[torch.arange(ids.shape[0], device=ids.device), last]  # (B, C)


def layers(model) -> list:
    """The decoder's layers: FSDP's units, one each."""
    return list(model.model.decoder.layers)
