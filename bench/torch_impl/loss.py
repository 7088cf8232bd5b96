"""The classifier's loss, for every estimator: whole, or in two halves when only the head trains. Mirror of
jax_impl/loss.py. A batch on the device holds the model's inputs and its labels (Trainer.to_device keeps its
family's INPUT_KEYS), so the loss passes the model what the batch holds."""

from __future__ import annotations

import torch.nn.functional as F
from torch.func import functional_call


def identity(values):
    """`reduce` on one device: its values are already the whole batch's."""
    return values


def loss_fn(model, batch, params=None):
    """Mean cross-entropy of the classifier; `params` (name -> tensor) override the module's own parameters.
    The loss is computed in fp32 whatever the model computes in (bf16: autocast's logits are bf16)."""
    inputs = {k: v for k, v in batch.items() if k != "labels"}
    if params is None:
        logits = model(**inputs).logits
    else:
        logits = functional_call(model, params, args=(), kwargs=inputs).logits
    return F.cross_entropy(logits.float(), batch["labels"])  # (B, C) -> scalar


def head_loss(family, model, hidden, batch, params):
    """The loss from the trunk's output (family.features) through the head of the model's `family` module;
    `params` (HF names) are the head's parameters, passed functionally as loss_fn does."""
    return F.cross_entropy(family.head_logits(model, hidden, batch, params).float(), batch["labels"])
