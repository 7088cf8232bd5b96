"""jacfwd in JAX: the exact gradient by forward mode, a vmapped jvp over chunks of the standard basis (lax.map with
batch_size). Mirror of torch_impl/estimators/jacfwd.py."""

from __future__ import annotations

import jax
import jax.numpy as jnp
from jax.flatten_util import ravel_pytree

from bench.jax_impl.estimators import Held
from bench.jax_impl.loss import dropout_key
from bench.jax_impl.memory import per_device_bytes


def memory(trainer, micro_batches, temp) -> Held:
    grads = per_device_bytes(trainer.params)
    chunk = trainer.estimator.settings_of(trainer.spec).chunk
    directions = chunk * sum(x.nbytes for x in jax.tree.leaves(trainer.params))  # the basis block
    return Held(grads=grads, directions=directions, inside=grads + directions)


def gradient(trainer, params, micro_batches, step, tangents=None):
    s = trainer.spec
    chunk = trainer.estimator.settings_of(s).chunk
    return params, *jacfwd_gradient(
        trainer.loss_of, params, micro_batches, dropout_key(s.seed, step), chunk=chunk, trunk=trainer.trunk
    )


def jacfwd_gradient(loss_of, params, micro_batches, key, *, chunk: int, trunk=None):
    """Exact gradient by forward mode: d(loss)/d(theta_i) for every basis direction e_i of the flattened trainable
    parameters, `chunk` directions per vmapped jvp (lax.map with batch_size). ceil(n / chunk) forward passes;
    the (chunk, n) basis block is the method's memory cost. One dropout key for every direction.

    `trunk` = (features_of, head_loss_of) when nothing before the head is trainable (trainable=head): the trunk
    has no tangent, so it runs once per batch outside the basis loop and only the head is pushed forward (XLA
    does not hoist the loop-invariant trunk out of the loop by itself; torch_impl does the same split)."""
    flat, unravel = ravel_pytree(params)
    n = flat.shape[0]
    total, grad_flat = 0.0, jnp.zeros_like(flat)
    for batch in micro_batches:
        if trunk is None:
            f = lambda x: loss_of(unravel(x), batch, key)  # noqa: B023 (used immediately)
        else:
            features_of, head_loss_of = trunk
            hidden = features_of(params, batch, key)  # (B, T, H), once
            f = lambda x: head_loss_of(unravel(x), hidden, batch, key)  # noqa: B023
        basis_derivative = lambda i: jax.jvp(f, (flat,), (jax.nn.one_hot(i, n, dtype=flat.dtype),))  # noqa: B023
        losses, d = jax.lax.map(basis_derivative, jnp.arange(n), batch_size=min(chunk, n))
        total, grad_flat = total + losses[0] / len(micro_batches), grad_flat + d / len(micro_batches)
    return total, unravel(grad_flat.astype(flat.dtype))  # the loss's fp32 derivatives, in the parameters' dtype
