"""The ops in PyTorch: the primal, forward mode (torch.func.jvp) and reverse mode (torch.func.vjp), eager or under
torch.compile. Mirror of jax_impl/ops.py: same names, same order. The framework-neutral definitions (inputs,
numpy primal and analytic derivatives) are in bench/ops_spec.py; the trial's loop is bench/scenarios/ops.py."""

from __future__ import annotations

import os

import numpy as np
import torch
from torch.func import jvp as func_jvp
from torch.func import vjp as func_vjp

from bench.ops_spec import Shape, Transforms
from bench.torch_impl.device import use_fp32

DTYPES = {"fp32": torch.float32, "fp64": torch.float64, "bf16": torch.bfloat16}


def setup(threads: str, dtype: str) -> int:
    """Threads and numerics for the trial; returns the intra-op thread count. OMP_NUM_THREADS came with the
    process's environment (bench/scenarios/ops.py env), before torch was imported."""
    n = 1 if threads == "1" else len(os.sched_getaffinity(0))
    torch.set_num_threads(n)
    use_fp32()
    return torch.get_num_threads()


def sync(device: torch.device):
    """What the timer calls on each output before it reads the clock. Eager CPU ops return finished results;
    CUDA kernels are only queued."""
    if device.type == "cuda":
        return lambda _: torch.cuda.synchronize(device)
    return lambda _: None


def to_device(arrays, dtype: str, device: torch.device) -> tuple[torch.Tensor, ...]:
    return tuple(torch.from_numpy(np.asarray(a)).to(device=device, dtype=DTYPES[dtype]) for a in arrays)


def to_numpy(x):
    """A result (an array or a tuple of them) as float64 numpy arrays."""
    if isinstance(x, (tuple, list)):
        return tuple(to_numpy(a) for a in x)
    return x.detach().to(torch.float64).cpu().numpy()


def functions(shape: Shape) -> dict:
    rows, cols = shape
    # transpose and broadcast are written out with .contiguous(): a jitted JAX function returns buffers, so XLA
    # writes the transposed / broadcast array, while torch's x.T and expand are stride tricks that move no data.
    # Without it, the two frameworks would not do the same work.
    return {
        "add": torch.add,
        "broadcast": lambda v: torch.broadcast_to(v, (rows, cols)).contiguous(),
        "copy": torch.clone,
        "divide": torch.div,
        "exp": torch.exp,
        "log": torch.log,
        "matmul": torch.matmul,
        "max": torch.maximum,
        "multiply": torch.mul,
        "negate": torch.neg,
        "power": torch.pow,
        "relu": torch.relu,
        "subtract": torch.sub,
        "sum": torch.sum,
        "transpose": lambda x: x.T.contiguous(),
    }


def build(name: str, shape: Shape, compile: bool = False) -> Transforms:  # noqa: A002 (the option's name)
    f = functions(shape)[name]

    def primal(x):
        return f(*x)

    def jvp(x, t):
        return func_jvp(f, x, t)

    def vjp(x, ct):
        out, pullback = func_vjp(f, *x)
        return out, pullback(ct)

    def forward(x):
        return func_vjp(f, *x)

    def backward(pullback, ct):
        return pullback(ct)

    if not compile:
        return Transforms(primal, jvp, vjp, forward, backward)
    # A fresh dynamo cache per op and shape: the closures above share their code objects across ops, and dynamo
    # would otherwise hit its recompile limit and fall back to eager without a word. fullgraph=True: a graph
    # break is an error in the row, never a silently half-eager measurement. The pullback closure cannot be
    # compiled on its own (dynamo loses its grad_fn linkage), so there is no backward-only timing.
    torch._dynamo.reset()
    compiled = [torch.compile(fn, fullgraph=True) for fn in (primal, jvp, vjp)]
    return Transforms(*compiled, forward, None)
