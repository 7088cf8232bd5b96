"""What a JAX trial needs of its device, whatever the scenario: the device itself, fp32 numerics and the memory
trackers. Mirror of torch_impl/device.py."""

from __future__ import annotations

import os

import jax

from bench.measure.trackers import HostRssTracker, JaxDeviceTracker, MemoryTracker, NvmlTracker


def resolve_device(requested):
    """device=auto | cpu | cuda as a jax.Device; `auto` takes the GPU when jax sees one."""
    if not isinstance(requested, str):
        return requested
    gpus = [d for d in jax.devices() if d.platform == "gpu"]
    if requested == "auto":
        return gpus[0] if gpus else jax.devices("cpu")[0]
    if requested == "cuda":
        if not gpus:
            raise RuntimeError("device=cuda: jax sees no GPU (install jax[cuda12]; accepted here: cpu, auto)")
        return gpus[0]
    return jax.devices("cpu")[0]


def device_kind(device) -> str:
    """cpu | cuda: the row's `device`."""
    return "cuda" if device.platform == "gpu" else "cpu"


def device_name(device) -> str:
    """GPU model name (CPU names come from bench.measure.system.cpu_name)."""
    return device.device_kind


def use_fp32() -> None:
    """dtype=fp32 means true fp32 in both frameworks: XLA would use TF32 for f32 matmuls on Ampere+ GPUs by
    default; torch does not."""
    jax.config.update("jax_default_matmul_precision", "highest")


def deterministic(on: bool) -> None:
    """deterministic=true: XLA's deterministic GPU kernels (--xla_gpu_deterministic_ops, no atomics in
    reductions), which must be in XLA_FLAGS before the backend starts: the trial's environment carries it (the
    model scenario's env), so this only checks it is there. XLA:CPU is deterministic at a fixed thread count."""
    if on and "--xla_gpu_deterministic_ops=true" not in os.environ.get("XLA_FLAGS", ""):
        raise RuntimeError("deterministic=true: XLA_FLAGS lacks --xla_gpu_deterministic_ops=true")


def num_threads() -> int:
    """The threads a step runs on: XLA:CPU's Eigen pool takes every core this process may use."""
    return len(os.sched_getaffinity(0))


def limit_memory(device, budget_mb: float | None) -> None:
    """budget_mb on a GPU is XLA's own allocator limit, XLA_PYTHON_CLIENT_MEM_FRACTION, which must be in the
    environment before the backend starts: the trial's environment carries it (the model scenario's env);
    nothing is left to do here. On the CPU the runner enforces the budget on the process's RSS."""


def memory_trackers(device) -> list[MemoryTracker]:
    """Primary tracker first: XLA's allocator peak on GPU, the process RSS high-water mark on CPU."""
    if device.platform == "gpu":
        return [JaxDeviceTracker(device), NvmlTracker()]
    return [HostRssTracker()]
