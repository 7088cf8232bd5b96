"""backprop in JAX: reverse mode by jax.value_and_grad (remat=true: jax.checkpoint per encoder layer, in the
model). Mirror of torch_impl/estimators/backprop.py."""

from __future__ import annotations

import jax
import jax.numpy as jnp

from bench.jax_impl.estimators import Held
from bench.jax_impl.loss import dropout_key
from bench.jax_impl.memory import per_device_bytes, saved_bytes


def memory(trainer, micro_batches, temp) -> Held:
    saved, grads = saved_bytes(trainer, micro_batches), per_device_bytes(trainer.params)
    return Held(saved=saved, grads=grads, inside=saved + grads)


def gradient(trainer, params, micro_batches, step, tangents=None):
    key = dropout_key(trainer.spec.seed, step)
    return params, *backprop_gradient(trainer.loss_of, params, micro_batches, key)


def backprop_gradient(loss_of, params, micro_batches, key):
    """Reverse mode: jax.value_and_grad, accumulated over micro-batches."""
    total, grads = 0.0, jax.tree.map(jnp.zeros_like, params)
    for batch in micro_batches:
        loss, g = jax.value_and_grad(loss_of)(params, batch, key)
        total = total + loss / len(micro_batches)
        grads = jax.tree.map(lambda a, b: a + b / len(micro_batches), grads, g)
    return total, grads
