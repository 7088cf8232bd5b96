"""The plain training loop a JAX user would write without the suite, around the suite's own model: what the
harness is measured against (bench/scenarios/overhead/). Mirror of torch_impl/plain.py.

The NNX BERT, one jax.jit'd value_and_grad + optax.sgd step with parameters and optimizer state donated; each step
timed with perf_counter until the device is done.
"""

from __future__ import annotations

import time

import jax
import optax
from flax import nnx

from bench import models
from bench.jax_impl.device import resolve_device, use_fp32
from bench.spec import Batch


def plain_loop(spec, weights: dict, batches: list[Batch], lr: float, warmup: int, seed: int) -> list[float]:
    """Train on `batches` with plain SGD; the times of the steps after the first `warmup`, in seconds."""
    use_fp32()  # true fp32 matmuls on a GPU, as the suite's (XLA would take TF32)
    device = resolve_device("auto")  # the device the suite's device=auto takes
    graphdef, params = nnx.split(models.implementation("jax", spec).build_model(spec, weights))
    keys = models.of(spec).INPUT_KEYS
    params = jax.device_put(params, device)
    tx = optax.sgd(lr)
    opt_state = tx.init(params)

    def loss_of(params, batch, key):
        logits = nnx.merge(graphdef, params)(
            **{k: batch[k] for k in keys},
            deterministic=False,
            rngs=nnx.Rngs(dropout=key),
        )
        return optax.softmax_cross_entropy_with_integer_labels(logits, batch["labels"]).mean()

    def train_step(params, opt_state, batch, key):
        loss, grads = jax.value_and_grad(loss_of)(params, batch, key)
        updates, opt_state = tx.update(grads, opt_state, params)
        return optax.apply_updates(params, updates), opt_state, loss

    train_step = jax.jit(train_step, donate_argnums=(0, 1))
    inputs = [jax.device_put({k: v.astype("int32") for k, v in b.items()}, device) for b in batches]
    key, times = jax.random.key(seed), []
    for i, b in enumerate(inputs):
        t0 = time.perf_counter()
        params, opt_state, loss = train_step(params, opt_state, b, jax.random.fold_in(key, i))
        jax.block_until_ready(params)
        if i >= warmup:
            times.append(time.perf_counter() - t0)
    return times
