"""What every family's HF model shares in torch: one build template (HF's class on the meta device, PEFT's
adapters, the weights assigned by HF name), parameters' HF names, and the weights exported back. A family's
module (bench/torch_impl/models/<family>.py) gives its HF config and class; nothing here knows a family. Mirror of
jax_impl/models/common.py."""

from __future__ import annotations

import numpy as np
import torch

from bench import models
from bench.models import with_adapters
from bench.spec import ATTN_IMPLEMENTATIONS, LoraSpec


def attention(attn_implementation: str) -> str:
    """HF's attn_implementation, checked. Eager by default in every family: PyTorch's fused SDPA kernels have no
    forward-mode AD rule (NotImplementedError under torch.func.jvp / forward_ad), and the same attention math in
    both frameworks keeps parity exact."""
    if attn_implementation not in ATTN_IMPLEMENTATIONS:
        raise ValueError(f"attn_implementation={attn_implementation!r}: accepted {', '.join(ATTN_IMPLEMENTATIONS)}")
    return attn_implementation


def hf_name(name: str) -> str:
    """The HF parameter name of a torch parameter or state_dict key: PEFT's wrapped layer keeps its weight under
    .base_layer and names its adapters lora_A.default / lora_B.default ("default" is the adapter's name).
    The mirror of jax_impl's hf_name."""
    return name.replace(".base_layer.", ".").replace(".default.", ".")


def adapted_modules(spec, lora: LoraSpec) -> list[str]:
    """The modules `lora` wraps, by HF name: those whose adapters the family's lora_shapes names."""
    suffix = ".lora_A.weight"
    return [n.removesuffix(suffix) for n in models.of(spec).lora_shapes(spec, lora) if n.endswith(suffix)]


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


def build(hf_class, config, spec, weights, load, device, lora: LoraSpec | None, seed: int):
    """HF's `hf_class(config)` with exactly `weights` (HF names, torch layout), `load`ed by its family; with `lora`,
    PEFT's LoRA layers around its targets, A and B from `weights` where it has them, else drawn from `seed`
    (with_adapters)."""
    # Build on the meta device: HF's own random init would be thrown away immediately.
    with torch.device("meta"):
        model = hf_class(config)
    if lora is not None:
        inject_lora(model, adapted_modules(spec, lora), lora)
    load(model, with_adapters(weights, spec, lora, seed), device, lora)
    return model


def assign_weights(model, weights: dict[str, np.ndarray], names, device, strict: bool) -> None:
    """Load `weights` under their HF `names` (in order) into the model's own keys (PEFT's, with adapters), on
    `device`, replacing the meta device's empty tensors."""
    keys = {hf_name(k): k for k in model.state_dict()}  # HF name -> the model's own key
    if strict and set(keys) != set(names):  # a bug in the family's modules, not in the weights
        raise ValueError(f"HF's model and its family's parameter names disagree: {sorted(set(keys) ^ set(names))}")
    state = {keys[k]: torch.tensor(weights[k], device=device) for k in names}
    model.load_state_dict(state, strict=strict, assign=True)


def export_weights(model, buffers: tuple[str, ...] = ()) -> dict[str, np.ndarray]:
    """The model's parameters as the shared {hf_name: numpy} dict in its order, the state_dict's keys ending in
    `buffers` left out. FSDP2's sharded parameters (DTensors) are gathered whole: a collective, which every rank
    must call."""
    whole = lambda v: v.full_tensor() if hasattr(v, "full_tensor") else v
    return {
        hf_name(k): whole(v).detach().cpu().float().numpy().copy()
        for k, v in model.state_dict().items()
        if not k.endswith(buffers)
    }


def weights_from_state_dict(state_dict, spec) -> dict[str, np.ndarray]:
    """A torch state_dict (tensors, HF names) of `spec`'s family as the shared numpy dict, its buffers left out
    (e.g. to feed a JAX model)."""
    family = models.of(spec)
    return {
        family.checkpoint_name(k): v.detach().cpu().float().numpy().copy()
        for k, v in state_dict.items()
        if family.checkpoint_name(k) not in family.CHECKPOINT_BUFFERS
    }


def under(params: dict, prefix: str) -> dict:
    """The entries of `params` (HF names) below `prefix`, named as the submodule there names them: what
    functional_call takes for one module of the head."""
    return {k.removeprefix(prefix): v for k, v in params.items() if k.startswith(prefix)}


def last_token(input_ids: torch.Tensor, pad_token_id: int) -> torch.Tensor:
    """Each row's last token that is not padding, (B,): transformers 5.x's rule for a decoder's score, the rightmost
    non-pad token ((arange * (ids != pad)).argmax; row 0 where all are pad). Mirror of jax_impl's last_token."""
    positions = torch.arange(input_ids.shape[-1], device=input_ids.device)
    return (positions * (input_ids != pad_token_id)).argmax(-1)


def head_rows(token: str, hidden: torch.Tensor, batch: dict, pad_token_id: int) -> tuple[torch.Tensor, dict]:
    """The one row of the trunk's output (B, T, H) a head reads, (B, 1, H), its own storage, and the batch keys the
    head reads as they point at it: "first" (BERT's pooler, nothing of the batch) or "last" (a decoder's score at
    the last token that is not padding: that token's id alone, which is then the last of one). What evaluation
    keeps of a frozen trunk's pass (Trainer.evaluate). Mirror of jax_impl's head_rows."""
    if token == "first":
        return hidden[:, :1].clone(), {}
    ids = batch["input_ids"]
    rows, last = torch.arange(ids.shape[0], device=ids.device), last_token(ids, pad_token_id)
    return hidden[rows, last][:, None], {"input_ids": ids[rows, last][:, None]}  # indexing copies: no view
