"""A JAX trial's devices and processes: `start(c)` -> World. Mirror of torch_impl/parallel.py.

parallel=none: one process, one device. parallel=ddp|fsdp: one process owns every device of its node (on the CPU,
`jax_num_cpu_devices` of them), a Mesh with a `data` axis over the trial's devices, and the trainer's arrays
placed with NamedShardings on it; across nodes, jax.distributed. The framework-neutral rules are
bench/parallel.py.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from bench.jax_impl.device import memory_trackers, resolve_device
from bench.parallel import world_size
from bench.spec import Batch
from bench.trackers import MemoryTracker


@dataclass
class World:
    parallel: str
    size: int
    rank: int
    main: bool
    device: Any

    def local_batches(self, micro_batches: list[Batch]) -> list[Batch]:
        return list(micro_batches)

    def memory_trackers(self) -> list[MemoryTracker]:
        return memory_trackers(self.device)

    def device_memory(self, trainer, trackers: list[MemoryTracker]) -> list[dict[str, Any]]:
        return [{"device": 0, **trackers[0].result().to_row()}]

    def reset_comm(self) -> None:
        pass

    def comm_bytes_per_step(self, trainer, steps: int) -> float | None:
        return None

    def gather(self, item: dict) -> list[dict] | None:
        return [item]

    def close(self) -> None:
        pass


def start(c: dict) -> World:
    """This process's place in the trial (parallel=none: the whole trial, on one device)."""
    if c["parallel"] != "none":
        raise NotImplementedError(f"parallel={c['parallel']}: not built yet")
    assert world_size(c) == 1
    return World(parallel="none", size=1, rank=0, main=True, device=resolve_device(c["device"]))
