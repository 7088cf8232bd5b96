"""inference in torch: the forward pass alone, no autograd state (the memory baseline). Mirror of
jax_impl/estimators/inference.py."""

from __future__ import annotations

import torch

from bench.torch_impl.loss import loss_fn


def step(trainer, micro_batches):
    with torch.inference_mode():
        loss = sum(loss_fn(trainer.module, b) for b in micro_batches) / len(micro_batches)
        return trainer.reduce(loss)
