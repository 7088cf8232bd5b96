"""coordinate in JAX: the central difference along the step's coordinate (coordinate.py has the rule), traced
inside the trainer's step, the parameters flattened into one vector. Mirror of torch_coordinate.py."""

from __future__ import annotations

import jax.numpy as jnp
from jax.flatten_util import ravel_pytree

from bench.jax_impl.estimators import Held
from bench.jax_impl.loss import dropout_key
from bench.jax_impl.memory import per_device_bytes
from bench_plugin_example.coordinate import coordinate


def memory(trainer, micro_batches, temp) -> Held:
    # the estimate is dense (zeros but one entry), held within the step's program as backprop's gradient is
    grads = per_device_bytes(trainer.params)
    return Held(grads=grads, inside=grads)


def gradient(trainer, params, micro_batches, step, tangents=None):
    if tangents is not None:
        raise ValueError("mode=coordinate differentiates along its own coordinate: accepted no given tangents")
    s, settings = trainer.spec, trainer.estimator.settings_of(trainer.spec)
    key = dropout_key(s.seed, step)
    loss_of = lambda p, batch: trainer.loss_of(p, batch, key)  # noqa: E731
    return params, *coordinate_gradient(loss_of, params, micro_batches, eps=settings.eps, seed=s.seed, step=step)


def coordinate_gradient(loss_of, params, micro_batches, *, eps: float, seed: int, step):
    """(mean of the L+ and L-, the estimate n (L+ - L-) / (2 eps) e_i as a pytree like `params`), with
    `loss_of(params, batch)`; i indexes the parameters flattened in their order (ravel_pytree's)."""
    flat, unravel = ravel_pytree(params)
    n = flat.size
    i = coordinate(seed, step, n, jnp.uint32)
    total, proj, m = 0.0, 0.0, len(micro_batches)
    for batch in micro_batches:
        loss_plus = loss_of(unravel(flat.at[i].add(eps)), batch)
        loss_minus = loss_of(unravel(flat.at[i].add(-eps)), batch)
        proj = proj + (loss_plus - loss_minus) / (2 * eps) / m
        total = total + (loss_plus + loss_minus) / 2 / m
    return total, unravel(jnp.zeros_like(flat).at[i].set(n * proj))
