"""What the runner needs from PyTorch, beyond the steps: device, numerics, memory trackers. Mirror of
jax_impl/backend.py."""

from __future__ import annotations

import torch


def resolve_device(requested: str) -> torch.device:
    if requested == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if requested == "cuda" and not torch.cuda.is_available():
        raise RuntimeError("device=cuda: torch sees no CUDA device (accepted here: cpu, auto)")
    return torch.device(requested)


def make_trainer(spec, weights, step_spec, device, c):
    from bench.torch_impl.steps import make_trainer

    # dtype=fp32 means true fp32 in both frameworks: no TF32 matmuls (torch's default already; jax is pinned
    # to "highest" in jax_impl/backend.py).
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    return make_trainer(spec, weights, step_spec, device, attn_implementation=c["attn_implementation"])


def memory_trackers(device: torch.device) -> list:
    """Primary tracker first: the caching allocator's peak on CUDA, the process RSS high-water mark on CPU."""
    from bench.trackers import HostRssTracker, NvmlTracker, TorchCudaTracker

    if device.type == "cuda":
        return [TorchCudaTracker(device), NvmlTracker()]
    return [HostRssTracker()]


def device_name(device: torch.device) -> str:
    """GPU model name (CPU names come from the runner)."""
    return torch.cuda.get_device_name(device)
