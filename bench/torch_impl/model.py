"""PyTorch BERT: HF transformers' BertForSequenceClassification, loaded from the shared numpy weights; with LoRA
adapters injected by HF PEFT under trainable=lora. What every family's HF model shares (its parameters' HF names,
PEFT's adapters, loading and exporting by HF name) is here too, as jax_impl/model.py holds what the NNX models
share."""

from __future__ import annotations

import numpy as np
import torch
from transformers import BertConfig, BertForSequenceClassification

from bench.models import with_adapters
from bench.models.bert import BertSpec, checkpoint_name, lora_module, param_shapes
from bench.spec import ATTN_IMPLEMENTATIONS, LoraSpec
from bench.weights import check_weights

BUFFERS = ("position_ids", "token_type_ids")  # HF BERT's non-persistent buffers, in its state_dict: not weights


def hf_config(spec: BertSpec, attn_implementation: str = "eager"):
    # Eager attention by default: PyTorch's fused SDPA kernels have no forward-mode AD rule (NotImplementedError
    # under torch.func.jvp / forward_ad), and the same attention math in both frameworks keeps parity exact.
    if attn_implementation not in ATTN_IMPLEMENTATIONS:
        raise ValueError(f"attn_implementation={attn_implementation!r}: accepted {', '.join(ATTN_IMPLEMENTATIONS)}")
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


def hf_name(name: str) -> str:
    """The HF parameter name of a torch parameter or state_dict key: PEFT's wrapped layer keeps its weight under
    .base_layer and names its adapters lora_A.default / lora_B.default ("default" is the adapter's name).
    The mirror of jax_impl.params.hf_name."""
    return name.replace(".base_layer.", ".").replace(".default.", ".")


def inject_lora(model, modules: list[str], lora) -> None:
    """PEFT's LoRA layers (peft.LoraConfig) around `modules`, in place. inject_adapter_in_model is get_peft_model
    without the PeftModel wrapper: the model stays HF's class, which DDP, FSDP2 and torch.func see as before; its
    parameters gain PEFT's names (hf_name reads them). PEFT marks only the adapters trainable; the Trainer sets
    every flag itself."""
    from peft import LoraConfig, inject_adapter_in_model  # only trainable=lora needs PEFT

    config = LoraConfig(
        r=lora.rank, lora_alpha=lora.alpha, lora_dropout=lora.dropout, target_modules=modules, bias="none"
    )
    inject_adapter_in_model(config, model)


def assign_weights(model, weights: dict[str, np.ndarray], names, device, strict: bool) -> None:
    """Load `weights` under their HF `names` (in order) into the model's own keys (PEFT's, with adapters), on
    `device`, replacing the meta device's empty tensors."""
    keys = {hf_name(k): k for k in model.state_dict()}  # HF name -> the model's own key
    if strict and set(keys) != set(names):  # a bug in the family's modules, not in the weights
        raise ValueError(f"HF's model and its family's parameter names disagree: {sorted(set(keys) ^ set(names))}")
    state = {keys[k]: torch.tensor(weights[k], device=device) for k in names}
    model.load_state_dict(state, strict=strict, assign=True)


def export_hf_weights(model, buffers: tuple[str, ...] = ()) -> dict[str, np.ndarray]:
    """The model's parameters as the shared {hf_name: numpy} dict in its order, the state_dict's keys ending in
    `buffers` left out. FSDP2's sharded parameters (DTensors) are gathered whole: a collective, which every rank
    must call."""
    whole = lambda v: v.full_tensor() if hasattr(v, "full_tensor") else v
    return {
        hf_name(k): whole(v).detach().cpu().float().numpy().copy()
        for k, v in model.state_dict().items()
        if not k.endswith(buffers)
    }


def build_model(
    spec: BertSpec,
    weights: dict[str, np.ndarray],
    device: str | torch.device = "cpu",
    attn_implementation: str = "eager",
    lora: LoraSpec | None = None,
    seed: int = 0,
):
    """HF BertForSequenceClassification with exactly `weights` (HF names, torch layout); with `lora`, PEFT's LoRA
    layers around its targets, A and B from `weights` where it has them, else drawn from `seed` (with_adapters)."""
    # Build on the meta device: HF's own random init would be thrown away immediately.
    with torch.device("meta"):
        model = BertForSequenceClassification(hf_config(spec, attn_implementation))
    if lora is not None:
        add_adapters(model, spec, lora)
    load_weights(model, with_adapters(weights, spec, lora, seed), device, lora)
    return model


def add_adapters(model, spec: BertSpec, lora: LoraSpec) -> None:
    """PEFT's LoRA layers around every target of every encoder layer, in place (inject_lora)."""
    inject_lora(
        model, [f"bert.encoder.layer.{i}.{lora_module(t)}" for i in range(spec.num_layers) for t in lora.targets], lora
    )


def load_weights(
    model, weights: dict[str, np.ndarray], device: str | torch.device = "cpu", lora: LoraSpec | None = None
) -> None:
    """Copy the numpy weights into the model (strict: every key checked, all problems reported together)."""
    spec = _spec_of(model)
    check_weights(weights, spec, lora=lora)
    # not strict: the position and token type buffers are made below; the weights' strictness is check_weights'
    assign_weights(model, weights, param_shapes(spec, lora), device, strict=False)
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
    return export_hf_weights(model, BUFFERS)


def weights_from_state_dict(state_dict) -> dict[str, np.ndarray]:
    """A torch state_dict (tensors, HF names) as the shared numpy dict, e.g. to feed jax_impl.params."""
    return {
        checkpoint_name(k): v.detach().cpu().float().numpy().copy()
        for k, v in state_dict.items()
        if not checkpoint_name(k).endswith(BUFFERS)
    }
