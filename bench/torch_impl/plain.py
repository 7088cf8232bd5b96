"""The plain training loop a PyTorch user would write without the suite, around the suite's own model: what the
harness is measured against (bench/scenarios/overhead/). Mirror of jax_impl/plain.py.

The family's HF model (eager attention, as the suite's torch trials use, since forward-mode AD has no
rule for fused attention), `model(**batch).loss.backward()` and torch.optim.SGD; each step timed with
perf_counter until the device is done.
"""

from __future__ import annotations

import time

import torch

from bench import models
from bench.spec import Batch
from bench.torch_impl.device import resolve_device


def plain_loop(spec, weights: dict, batches: list[Batch], lr: float, warmup: int, seed: int) -> list[float]:
    """Train on `batches` with plain SGD; the times of the steps after the first `warmup`, in seconds."""
    torch.manual_seed(seed)  # dropout: a seeded run, as the suite's
    device = resolve_device("auto")  # the device the suite's device=auto takes
    net = models.implementation("torch", spec).build_model(spec, weights, device, "eager")
    net.train()
    opt = torch.optim.SGD(net.parameters(), lr=lr)
    keys = (*models.of(spec).INPUT_KEYS, "labels")
    inputs = [{k: torch.from_numpy(v).long().to(device) for k, v in b.items() if k in keys} for b in batches]
    times = []
    for i, b in enumerate(inputs):
        t0 = time.perf_counter()
        net(**b).loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        if i >= warmup:
            times.append(time.perf_counter() - t0)
    return times
