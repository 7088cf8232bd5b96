"""What the runner needs from JAX, beyond the steps: device, numerics, memory trackers. Mirror of
torch_impl/backend.py."""

from __future__ import annotations

import jax


def resolve_device(requested: str):
    gpus = [d for d in jax.devices() if d.platform == "gpu"]
    if requested == "auto":
        return gpus[0] if gpus else jax.devices("cpu")[0]
    if requested == "cuda":
        if not gpus:
            raise RuntimeError("device=cuda: jax sees no GPU (install jax[cuda12]; accepted here: cpu, auto)")
        return gpus[0]
    return jax.devices("cpu")[0]


def make_trainer(spec, weights, step_spec, device, c):
    from bench.jax_impl.model import build_model
    from bench.jax_impl.steps import Trainer

    # dtype=fp32 means true fp32 in both frameworks: XLA would use TF32 for f32 matmuls on Ampere+ GPUs
    # by default; torch does not.
    jax.config.update("jax_default_matmul_precision", "highest")
    remat = step_spec.mode == "backprop" and step_spec.remat
    return Trainer(build_model(spec, weights, remat=remat), step_spec, device)


def memory_trackers(device) -> list:
    """Primary tracker first: XLA's allocator peak on GPU, the process RSS high-water mark on CPU."""
    from bench.trackers import HostRssTracker, JaxDeviceTracker, NvmlTracker

    if device.platform == "gpu":
        return [JaxDeviceTracker(device), NvmlTracker()]
    return [HostRssTracker()]


def device_name(device) -> str:
    """GPU model name (CPU names come from the runner)."""
    return device.device_kind
