"""PyTorch LLaMA: HF transformers' LlamaForSequenceClassification, loaded from the shared numpy weights; with LoRA
adapters injected by HF PEFT under trainable=lora. Mirror of jax_impl/models/llama.py."""

from __future__ import annotations

import numpy as np
import torch
from torch.func import functional_call
from transformers import LlamaConfig, LlamaForSequenceClassification

from bench.models.llama import LlamaSpec, param_shapes
from bench.spec import LoraSpec
from bench.torch_impl.models import common
from bench.torch_impl.models.common import hf_name  # noqa: F401 (every family's, as the registry reads it)
from bench.weights import check_weights

BUFFERS = ("inv_freq",)  # the rotary embedding's frequencies: non-persistent, made from the config


def hf_config(spec: LlamaSpec, attn_implementation: str = "eager") -> LlamaConfig:
    return LlamaConfig(
        vocab_size=spec.vocab_size,
        hidden_size=spec.hidden_size,
        intermediate_size=spec.intermediate_size,
        num_hidden_layers=spec.num_layers,
        num_attention_heads=spec.num_heads,
        num_key_value_heads=spec.kv_heads,
        hidden_act="silu",
        max_position_embeddings=spec.max_position_embeddings,
        initializer_range=spec.initializer_range,
        rms_norm_eps=spec.rms_norm_eps,
        rope_parameters={"rope_type": "default", "rope_theta": spec.rope_theta},
        attention_bias=False,
        attention_dropout=spec.dropout,
        mlp_bias=False,
        pad_token_id=spec.pad_token_id,
        num_labels=spec.num_labels,
        problem_type="single_label_classification",
        use_cache=False,  # a classifier's forward: no KV cache
        attn_implementation=common.attention(attn_implementation),
    )


def build_model(
    spec: LlamaSpec,
    weights: dict[str, np.ndarray],
    device: str | torch.device = "cpu",
    attn_implementation: str = "eager",
    lora: LoraSpec | None = None,
    seed: int = 0,
):
    """HF LlamaForSequenceClassification with exactly `weights` (HF names, torch layout); with `lora`, PEFT's LoRA
    layers around its targets (common.build)."""
    config = hf_config(spec, attn_implementation)
    return common.build(LlamaForSequenceClassification, config, spec, weights, load_weights, device, lora, seed)


def load_weights(
    model, weights: dict[str, np.ndarray], device: str | torch.device = "cpu", lora: LoraSpec | None = None
) -> None:
    """Copy the numpy weights into the model (strict: every key checked, all problems reported together)."""
    spec = _spec_of(model)
    check_weights(weights, spec, lora=lora)
    common.assign_weights(model, weights, param_shapes(spec, lora), device, strict=True)
    # The rotary frequencies were created on the meta device with the model; make real ones, as HF computes them.
    rotary = model.model.rotary_emb
    inv_freq, _ = rotary.compute_default_rope_parameters(model.config)
    rotary.inv_freq = inv_freq.to(device)
    rotary.original_inv_freq = inv_freq.clone().to(device)


def _spec_of(model) -> LlamaSpec:
    c = model.config
    return LlamaSpec(
        vocab_size=c.vocab_size,
        hidden_size=c.hidden_size,
        num_layers=c.num_hidden_layers,
        num_heads=c.num_attention_heads,
        num_key_value_heads=c.num_key_value_heads,
        intermediate_size=c.intermediate_size,
        max_position_embeddings=c.max_position_embeddings,
        num_labels=c.num_labels,
        dropout=c.attention_dropout,
        rope_theta=c.rope_parameters["rope_theta"],
        rms_norm_eps=c.rms_norm_eps,
        initializer_range=c.initializer_range,
        pad_token_id=c.pad_token_id,
    )


def export_weights(model) -> dict[str, np.ndarray]:
    """The model's parameters as the shared {hf_name: numpy} dict in HF order (the inverse of load_weights);
    FSDP2's sharded ones gathered whole (a collective: every rank calls it)."""
    return common.export_weights(model, BUFFERS)


def features(model, batch):
    """The decoder's layers -> their output before the final RMSNorm (B, T, H): for the head scopes, where the
    final norm belongs to the head (bench.models.llama.is_trainable), as JAX's features stops there too."""
    trunk, norm = model.model, model.model.norm
    trunk.norm = torch.nn.Identity()  # HF's LlamaModel always applies its norm: stand it aside for the call
    try:
        return trunk(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"]).last_hidden_state
    finally:
        trunk.norm = norm


def head_logits(model, hidden, batch, params):
    """The final RMSNorm and the score over every token, read at the last token that is not padding
    (transformers 5.x's rule), as HF's forward does; `params` (HF names) are the head's parameters, passed
    functionally."""
    normed = functional_call(model.model.norm, common.under(params, "model.norm."), (hidden,))
    logits = functional_call(model.score, common.under(params, "score."), (normed,))  # (B, T, C)
    ids = batch["input_ids"]
    last = common.last_token(ids, model.config.pad_token_id)  # (B,)
    return logits[torch.arange(ids.shape[0], device=ids.device), last]  # (B, C)


def layers(model) -> list:
    """The decoder's layers: FSDP's units, one each."""
    return list(model.model.layers)
