"""The classifier's loss, for every estimator: whole, or in two halves when only the head trains. Mirror of
jax_impl/loss.py."""

from __future__ import annotations

import torch.nn.functional as F
from torch.func import functional_call

INPUT_KEYS = ("input_ids", "token_type_ids", "attention_mask")


def identity(values):
    """`reduce` on one device: its values are already the whole batch's."""
    return values


def loss_fn(model, batch, params=None):
    """Mean cross-entropy of the classifier; `params` (name -> tensor) override the module's own parameters.
    The loss is computed in fp32 whatever the model computes in (bf16: autocast's logits are bf16)."""
    inputs = {k: batch[k] for k in INPUT_KEYS}
    if params is None:
        logits = model(**inputs).logits
    else:
        logits = functional_call(model, params, args=(), kwargs=inputs).logits
    return F.cross_entropy(logits.float(), batch["labels"])  # (B, C) -> scalar


def features(model, batch):
    """The trunk (embeddings + encoder) -> last hidden state (B, T, H): for trainable=head, where it is frozen."""
    return model.bert(**{k: batch[k] for k in INPUT_KEYS}).last_hidden_state


def head_loss(model, hidden, batch, params):
    """The loss from the trunk's output through pooler, dropout and classifier; `params` (HF names) are the
    head's parameters, passed functionally as loss_fn does."""
    sub = lambda prefix: {k.removeprefix(prefix): v for k, v in params.items() if k.startswith(prefix)}
    pooled = functional_call(model.bert.pooler, sub("bert.pooler."), (hidden,))  # (B, H)
    logits = functional_call(model.classifier, sub("classifier."), (model.dropout(pooled),))  # (B, C)
    return F.cross_entropy(logits.float(), batch["labels"])
