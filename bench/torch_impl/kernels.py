"""Kernels a PyTorch step launches, and the host's share of it. Mirror image of jax_impl/kernels.py.

    count(trainer, micro_batches, step_s)   one more step (untimed) with every operator it dispatches counted

A TorchDispatchMode sees each operator the step dispatches below autograd and torch.func's transforms, as
FlopCounterMode does (bench/torch_impl/flops.py). Under inference_mode, where tensors carry no autograd key, the
composite operators (linear, matmul, dropout, reshape) reach the mode whole; they are decomposed here into the
operators they run, as autograd decomposes them in every other mode, so both are counted alike. Each operator is
then either a kernel (it computes, copies or draws: one launch on a GPU, one call into a CPU kernel) or launches
nothing: a view or alias (view, t, transpose, detach, expand, _unsafe_view), metadata (is_same_size,
_has_same_storage_numel), an allocation without a fill (empty, empty_like), or a profiler annotation
(record_function, around each torch.optim step). A foreach operator (aten._foreach_add_ over many tensors) is one
dispatch and counts one kernel; on CUDA it launches one kernel per chunk of its tensors (docs/time.md).

The host's share of the step: on the CPU a kernel runs within its operator's call, so the calls' wall time holds
the time the step's kernels ran, and the rest of the timed step (`step_s`) is the host's: Python, the dispatcher,
the optimizer's loops. Each call also pays the dispatcher's fixed cost (argument parsing, the output's
allocation), host work too: the least a call on a one-element tensor takes (`call_floor`, measured first) is
taken off each. A call within the step meets colder caches than those calibrating calls, so the share is a lower
bound. On CUDA a call only launches its kernel: the share is read from one more step traced by torch.profiler
(bench/torch_impl/profile.py), the time in which the GPU ran none of the step's kernels.
"""

from __future__ import annotations

import functools
import time
from collections import Counter

import torch
from torch.utils._python_dispatch import TorchDispatchMode

from bench.measure.timeline import traced_overhead_share
from bench.torch_impl import profile

METHOD = "torch_dispatch_mode"
TOP = 10  # kernels named per step in kernels_top
FLOOR_CALLS = 200  # call_floor's calls: a few milliseconds, past the first calls' warm-up
# operators that move no data and compute nothing, beyond what their schema says (views are read from the schema:
# OpOverload.is_view, and the inplace_view tag)
NO_KERNEL = frozenset(
    {
        "aten::_unsafe_view",  # reshape's alias of a fresh copy
        "aten::_efficientzerotensor",  # forward mode's zero tangent: no storage, nothing written
        "aten::is_same_size",
        "aten::_has_same_storage_numel",
        "aten::empty",
        "aten::empty_strided",
        "aten::empty_like",
        "aten::new_empty",
        "aten::new_empty_strided",
        "aten::resize_",
        "aten::set_",
        "aten::sym_size",
        "aten::sym_stride",
        "aten::sym_numel",
        "aten::sym_storage_offset",
        "aten::is_contiguous",
    }
)
NO_KERNEL_NAMESPACES = ("profiler::",)  # record_function's enter and exit


def launches_nothing(op: torch._ops.OpOverload) -> bool:
    name = op._schema.name
    return op.is_view or torch.Tag.inplace_view in op.tags or name in NO_KERNEL or name.startswith(NO_KERNEL_NAMESPACES)


COMPOSITE = torch._C.DispatchKey.CompositeImplicitAutograd


@functools.cache
def composite(op: torch._ops.OpOverload) -> bool:
    """Whether `op` has a CompositeImplicitAutograd kernel in ATen, made of other operators. ATen's own, which eager
    autograd runs, not a Python decomposition (OpOverload.decompose prefers those: torch._decomp's dropout clones
    its input in eval mode, where ATen's returns it)."""
    return torch._C._dispatch_has_kernel_for_dispatch_key(op.name(), COMPOSITE)


class Dispatches(TorchDispatchMode):
    """The operators dispatched within it, by name: `kernels` and `empty` (those that launch nothing), and the
    wall time of the kernels' calls."""

    def __init__(self, floor_s: float = 0.0):
        super().__init__()
        self.kernels, self.empty, self.kernel_s, self.floor_s = Counter(), Counter(), 0.0, floor_s

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if composite(func):
            with self:  # the composite operator's own operators come back here
                return func._op_dk(COMPOSITE, *args, **kwargs)
        name = str(func.overloadpacket)
        if launches_nothing(func):
            self.empty[name] += 1
            return func(*args, **kwargs)
        t0 = time.perf_counter()
        out = func(*args, **kwargs)
        self.kernel_s += max(time.perf_counter() - t0 - self.floor_s, 0.0)
        self.kernels[name] += 1
        return out


def count(trainer, micro_batches, step_s: float) -> dict:
    """One more step of `trainer` on these device micro-batches, its operators counted (run it after the timed
    window); on CUDA one more, traced. `step_s`: the timed median step, the CPU share's denominator. Keys:

    kernels_per_step                operators dispatched that launch a kernel
    kernels_method                  "torch_dispatch_mode"
    no_kernel_dispatches_per_step   operators dispatched that launch nothing (views, metadata, annotations)
    host_share                      the share of the step in which none of its kernels ran
    host_share_method               torch_dispatch_op_times (CPU) or torch_profiler_step (CUDA)
    kernels_top                     the most dispatched kernels {name: count}, for the reader (not a column)
    """
    cpu = trainer.device.type == "cpu"
    with Dispatches(call_floor() if cpu else 0.0) as seen:
        trainer.sync(trainer.step(micro_batches))
    if cpu:
        share, method = max(0.0, 1.0 - seen.kernel_s / step_s), "torch_dispatch_op_times"
    else:
        share, method = traced_overhead_share(profile, trainer, micro_batches), "torch_profiler_step"
    return {
        "kernels_per_step": sum(seen.kernels.values()),
        "kernels_method": METHOD,
        "no_kernel_dispatches_per_step": sum(seen.empty.values()),
        "host_share": share,
        "host_share_method": method,
        "kernels_top": dict(seen.kernels.most_common(TOP)),
    }


def call_floor(calls: int = FLOOR_CALLS) -> float:
    """Seconds of the fastest of `calls` calls of aten.add on a one-element CPU tensor, made as the mode makes
    them (an OpOverload's call): what a call costs the host whatever its kernel computes."""
    x, add = torch.zeros(1), torch.ops.aten.add.Tensor
    best = float("inf")
    for _ in range(calls):
        t0 = time.perf_counter()
        add(x, x)
        best = min(best, time.perf_counter() - t0)
    return best
