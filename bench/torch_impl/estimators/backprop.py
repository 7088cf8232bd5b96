"""backprop in torch: reverse mode by loss.backward(); remat=true checkpoints each encoder layer. Mirror of
jax_impl/estimators/backprop.py."""

from __future__ import annotations

from bench.torch_impl.loss import identity, loss_fn
from bench.torch_impl.parallel import accumulating


def prepare(trainer) -> None:
    if trainer.spec.remat:
        # per-encoder-layer activation checkpointing; non-reentrant is the recommended implementation
        # (transformers 5 renamed the method; 4.x has only the old name)
        model = trainer.model
        if hasattr(model, "activation_checkpointing_enable"):
            model.activation_checkpointing_enable(activation_checkpointing_kwargs={"use_reentrant": False})
        else:
            model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})


def gradient(trainer, micro_batches, tangents=None, in_step=False):
    return backprop_gradient(trainer.module, trainer.params, micro_batches, trainer.reduce)


def backprop_gradient(model, params, micro_batches, reduce=identity):
    """Reverse mode: loss.backward() (not torch.func.grad, which keeps more memory alive). Under DDP or FSDP2
    the backward itself exchanges the gradient, in the last micro-batch's backward only."""
    total = 0.0
    for i, batch in enumerate(micro_batches):
        with accumulating(model, skip_sync=i < len(micro_batches) - 1):
            loss = loss_fn(model, batch) / len(micro_batches)
            loss.backward()
        total = total + loss.detach()
    return reduce(total), {n: p.grad for n, p in params.items()}
