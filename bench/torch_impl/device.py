"""What a PyTorch trial needs of its device, whatever the scenario: the device itself, fp32 numerics and the
memory trackers. Mirror of jax_impl/device.py."""

from __future__ import annotations

import torch

from bench.measure.trackers import HostRssTracker, MemoryTracker, MiB, NvmlTracker, TorchCudaTracker


def resolve_device(requested: str | torch.device) -> torch.device:
    """device=auto | cpu | cuda as a torch.device; `auto` takes the GPU when torch sees one."""
    if isinstance(requested, torch.device):
        return requested
    if requested == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if requested == "cuda" and not torch.cuda.is_available():
        raise RuntimeError("device=cuda: torch sees no CUDA device (accepted here: cpu, auto)")
    return torch.device(requested)


def device_kind(device: torch.device) -> str:
    """cpu | cuda: the row's `device`."""
    return "cuda" if device.type == "cuda" else "cpu"


def device_name(device: torch.device) -> str:
    """GPU model name (CPU names come from bench.measure.system.cpu_name)."""
    return torch.cuda.get_device_name(device)


def use_fp32() -> None:
    """dtype=fp32 means true fp32 in both frameworks: no TF32 matmuls (torch's default already; jax_impl pins
    "highest" matmul precision)."""
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False


def deterministic(on: bool) -> None:
    """deterministic=true: torch's deterministic kernels only (an error where an op has none). On CUDA it also
    needs CUBLAS_WORKSPACE_CONFIG in the environment before cuBLAS starts: the trial's environment carries it
    (the model scenario's env). On the CPU at a fixed thread count torch is bit-reproducible without it."""
    torch.use_deterministic_algorithms(on)


def num_threads() -> int:
    """The intra-op threads a step runs on (the CPU's; what a bit-identical rerun must match)."""
    return torch.get_num_threads()


def limit_memory(device: torch.device, budget_mb: float | None) -> None:
    """budget_mb on CUDA: the caching allocator refuses to hold more (an OutOfMemoryError: status oom); on the CPU
    the runner enforces it on the process's RSS instead."""
    if budget_mb is not None and device.type == "cuda":
        # set_per_process_memory_fraction needs an index: a bare "cuda" is the current device
        index = torch.cuda.current_device() if device.index is None else device.index
        total = torch.cuda.get_device_properties(index).total_memory
        torch.cuda.set_per_process_memory_fraction(min(1.0, budget_mb * MiB / total), index)


def memory_trackers(device: torch.device) -> list[MemoryTracker]:
    """Primary tracker first: the caching allocator's peak on CUDA, the process RSS high-water mark on CPU."""
    if device.type == "cuda":
        return [TorchCudaTracker(device), NvmlTracker()]
    return [HostRssTracker()]
