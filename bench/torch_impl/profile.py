"""A trial's profiler trace in PyTorch, and what its events are. Mirror image of jax_impl/profile.py.

`record` runs a few more steps, after the timed window and never inside it, under torch.profiler (CPU activity,
and CUDA on a GPU; input shapes recorded), each step in a "step" annotation, and exports the Chrome trace
(trace.json: Perfetto's UI and chrome://tracing open it). `classify` names each event's category for
bench.measure.timeline: aten operations by their name, an operation inside torch.optim's "Optimizer.step"
annotation as the optimizer's (unless it draws random numbers: the seeded estimates regenerate their directions
there).
"""

from __future__ import annotations

from pathlib import Path

import torch
from torch._C._profiler import _ExperimentalConfig
from torch.profiler import ProfilerActivity, profile, record_function

from bench.measure.timeline import STEP_EVENT

TRACE_FILE = "trace.json"
# aten operations by category (their backward kernels too); anything else an aten operation does is elementwise
# or normalisation work. Attention: eager BERT's scores and context are batched matmuls (bmm), its probabilities a
# softmax; the projections are linear layers (addmm/mm).
MATMUL = (
    "aten::mm",
    "aten::addmm",
    "aten::addmv",
    "aten::mv",
    "aten::dot",
    "aten::linear",
    "aten::matmul",
    "aten::_addmm_activation",
    "aten::einsum",
)
ATTENTION = (
    "aten::bmm",
    "aten::baddbmm",
    "aten::_softmax",
    "aten::softmax",
    "aten::_softmax_backward_data",
    "aten::scaled_dot_product_attention",
    "aten::_scaled_dot_product",
)
RANDOM = (
    "aten::normal_",
    "aten::randn",
    "aten::randint",
    "aten::random_",
    "aten::uniform_",
    "aten::bernoulli_",
    "aten::rand",
    "aten::native_dropout",
)
COLLECTIVES = ("c10d::", "nccl:", "gloo:", "record_param_comms")
OPTIMIZER = "Optimizer.step"
GPU_WORK = ("kernel", "gpu_memcpy", "gpu_memset")  # a CUDA trace's device-side events


def record(trainer, updates: list, folder: Path) -> Path:
    """Run one step per update under torch.profiler, synced, each in a "step" annotation; the trace -> folder.
    Returns the trace's path."""
    folder.mkdir(parents=True, exist_ok=True)
    activities = [ProfilerActivity.CPU]
    if torch.cuda.is_available() and trainer.device.type == "cuda":
        activities.append(ProfilerActivity.CUDA)
    with profile(activities=activities, record_shapes=True, experimental_config=every_thread()) as prof:
        for batches in updates:
            with record_function(STEP_EVENT):
                trainer.sync(trainer.step(batches))
    path = folder / TRACE_FILE
    prof.export_chrome_trace(str(path))
    return path


def every_thread() -> _ExperimentalConfig | None:
    """The profiler's config for every thread's operations: on the CPU a direction's chunks are drawn by a pool of
    threads (torch_impl/directions.fill). None where torch predates the option (torch>=2.4 is the project's bound):
    the calling thread's operations only, and a big draw's time then reads as overhead."""
    try:
        return _ExperimentalConfig(profile_all_threads=True)
    except TypeError:
        return None


def classify(trainer, events: list[dict]):
    """event, the names enclosing it -> its category, or None for what is not an operation. On the CPU the
    operations are the aten operations; in a CUDA trace they are the kernels (and copies), each of its launching
    operation's category (joined by the trace's External id), so that busy time is the GPU's and `overhead` the
    time the GPU waited for the host."""
    gpu = any(e.get("cat") in GPU_WORK for e in events)
    launched = {
        e["args"]["External id"]: e["name"]
        for e in events
        if e.get("cat") == "cpu_op" and "External id" in e.get("args", {})
    }

    def category(event: dict, enclosing: tuple[str, ...]) -> str | None:
        cat = event.get("cat", "")
        if gpu:
            if cat not in GPU_WORK:
                return None
            name = launched.get(event.get("args", {}).get("External id"), event["name"])
        elif cat == "cpu_op":
            name = event["name"]
        else:
            return None
        return op_category(name, enclosing)

    return category


def op_category(name: str, enclosing: tuple[str, ...]) -> str:
    if name.startswith(COLLECTIVES) or "nccl" in name.lower():
        return "collectives"
    if name in RANDOM:
        return "random"
    if name in ATTENTION:
        return "attention"
    if name in MATMUL:
        return "matmul"
    if any(e.startswith(OPTIMIZER) for e in enclosing):  # torch.optim's annotation (gpu_user_annotation on CUDA)
        return "optimizer"
    return "elementwise"
