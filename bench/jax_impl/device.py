"""What a JAX trial needs of its device, whatever the scenario: the device itself, fp32 numerics and the memory
trackers. Mirror of torch_impl/device.py."""

from __future__ import annotations

import collections
import os

import jax

from bench.measure.trackers import HostRssTracker, JaxDeviceTracker, MemoryTracker, NvmlTracker

# JAX's monitoring events of its persistent compilation cache (jax._src.compiler): each program compiled while the
# cache is on is a request, and a hit when its executable was read from the cache instead of compiled.
CACHE_EVENTS = {
    "/jax/compilation_cache/compile_requests_use_cache": "requests",
    "/jax/compilation_cache/cache_hits": "hits",
}
_cache_events = collections.Counter()


def compilation_cache(folder: str | None) -> None:
    """compile_cache_dir: XLA's compiled programs kept in `folder` and read back by any later process that compiles
    the same program (JAX's key: the program, the compile options, the backend and jax/jaxlib versions, the XLA
    flags), however short its compile (JAX's default keeps only those over a second) and whatever its size. A
    folder the environment names (JAX_COMPILATION_CACHE_DIR, JAX's own setting: the tests' conftest sets one)
    stands; None turns the cache off. Called before the first compile; JAX's events say what each compile did
    (cache_counts)."""
    if folder is None:
        jax.config.update("jax_compilation_cache_dir", None)
        return
    if not os.environ.get("JAX_COMPILATION_CACHE_DIR"):
        jax.config.update("jax_compilation_cache_dir", os.path.expanduser(folder))
    jax.config.update("jax_persistent_cache_min_compile_time_secs", 0.0)
    jax.config.update("jax_persistent_cache_min_entry_size_bytes", -1)


def _count_cache_event(event: str, **kwargs) -> None:
    if event in CACHE_EVENTS:
        _cache_events[CACHE_EVENTS[event]] += 1


jax.monitoring.register_event_listener(_count_cache_event)  # counts only: nothing happens without the cache


def cache_counts() -> tuple[int, int]:
    """(programs compiled with the persistent cache on, of which read from it) so far in this process."""
    return _cache_events["requests"], _cache_events["hits"]


def cache_status(before: tuple[int, int], after: tuple[int, int]) -> str:
    """The row's compile_cache for the compiles between two cache_counts(): hit (every program read from the
    cache: compile_time_s is then the reads'), miss (none: compiled, and written), partial, or off (no folder:
    compile_cache_dir=null; JAX counts its requests even then)."""
    requests, hits = after[0] - before[0], after[1] - before[1]
    if requests == 0 or not jax.config.jax_compilation_cache_dir:
        return "off"
    return "hit" if hits == requests else "miss" if hits == 0 else "partial"


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
