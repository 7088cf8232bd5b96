"""The ops in JAX: the primal, forward mode (jax.jvp) and reverse mode (jax.vjp), each under jax.jit. Mirror of
torch_impl/ops.py: same names, same order."""

from __future__ import annotations

import os

import jax
import jax.numpy as jnp
import numpy as np

from bench.jax_impl.device import use_fp32
from bench.ops_spec import Shape, Transforms

DTYPES = {"fp32": jnp.float32, "fp64": jnp.float64, "bf16": jnp.bfloat16}


def setup(threads: str, dtype: str) -> int:
    """Threads and numerics for the trial; returns the intra-op thread count. XLA_FLAGS
    (--xla_cpu_multi_thread_eigen=false for threads=1) came with the process's environment (bench/scenarios/ops.py
    env): XLA reads it once, when its CPU client starts."""
    if dtype == "fp64":
        jax.config.update("jax_enable_x64", True)  # without it jnp.float64 arrays are silently float32
    use_fp32()
    return 1 if threads == "1" else len(os.sched_getaffinity(0))


def sync(device):
    """What the timer calls on each output before it reads the clock. JAX dispatches asynchronously on every
    backend, the CPU included: a call returns before its result is computed."""
    return jax.block_until_ready


def to_device(arrays, dtype: str, device) -> tuple[jax.Array, ...]:
    return tuple(jax.device_put(jnp.asarray(a, dtype=DTYPES[dtype]), device) for a in arrays)


def to_numpy(x):
    """A result (an array or a tuple of them) as float64 numpy arrays."""
    if isinstance(x, (tuple, list)):
        return tuple(to_numpy(a) for a in x)
    return np.asarray(x).astype(np.float64)


def functions(shape: Shape) -> dict:
    rows, cols = shape
    return {
        "add": jnp.add,
        "broadcast": lambda v: jnp.broadcast_to(v, (rows, cols)),
        "copy": jnp.copy,
        "divide": jnp.divide,
        "exp": jnp.exp,
        "log": jnp.log,
        "matmul": jnp.matmul,
        "max": jnp.maximum,
        "multiply": jnp.multiply,
        "negate": jnp.negative,
        "power": jnp.power,
        "relu": jax.nn.relu,
        "subtract": jnp.subtract,
        "sum": jnp.sum,
        "transpose": jnp.transpose,
    }


def build(name: str, shape: Shape, compile: bool = False) -> Transforms:  # noqa: A002 (the option's name)
    f = functions(shape)[name]

    def primal(x):
        return f(*x)

    def jvp(x, t):
        return jax.jvp(f, x, t)

    def vjp(x, ct):
        out, pullback = jax.vjp(f, *x)
        return out, pullback(ct)

    def forward(x):
        return jax.vjp(f, *x)

    def backward(pullback, ct):
        return pullback(ct)

    # Always jitted, compile or not (that option is torch's): op-by-op JAX goes through the same compiler one
    # primitive at a time, which no one benchmarks. The pullback is a pytree (its residuals are arrays), so the
    # backward half compiles on its own.
    return Transforms(*(jax.jit(fn) for fn in (primal, jvp, vjp, forward, backward)))
