"""Memory trackers and the host-memory watchdog, on real allocations (no mocks for RSS). Timing: test_timing.py."""

from __future__ import annotations

import gc
import subprocess
import sys
import textwrap
import time

import numpy as np
import psutil
import pytest

from bench.measure import trackers
from bench.measure.trackers import (
    HostMemWatchdog,
    HostRssTracker,
    JaxDeviceTracker,
    MemoryResult,
    MiB,
    NvmlTracker,
)
from tests.support import REPO

# RSS moves with the interpreter's own bookkeeping (allocator metadata, page tables, numpy caches); 15 MiB is
# ~7% of the 200 MiB we allocate and several times the noise seen on this machine (< 1 MiB).
TOL_MB = 15.0


def touched(mb: int) -> np.ndarray:
    """`mb` MiB of committed memory (np.ones writes every page, np.empty would only reserve address space)."""
    return np.ones(mb * MiB // 8, dtype=np.float64)


# ------------------------------------------------------------------------------------------------- host RSS


def settled() -> None:
    """The test process's garbage collected before a baseline. In the whole suite it holds earlier tests' cycles
    (tensors, compiled programs) that a collection set off by the allocations below can free between the baseline
    and the tracked peak, and the peak then reads low. A trial process is fresh and has none."""
    gc.collect()


def _hwm_or_skip() -> HostRssTracker:
    settled()
    t = HostRssTracker("auto")
    if t.method != "rss_hwm":
        pytest.skip("/proc/self/clear_refs cannot reset VmHWM here")
    return t


def _sampler() -> HostRssTracker:
    settled()
    return HostRssTracker("rss_sampler", interval_s=0.002)


def held_until_seen(t: HostRssTracker, mb: int) -> None:
    """Hold an allocation of `mb` MiB until the tracker can have seen it whole, then free it.

    The HWM method needs no wait. The sampler needs a reading that began after the memory was written; a fixed
    sleep is not enough on a loaded 2-core CI host, where its thread can stay unscheduled for tens of ms (it once
    read 15 of 50 MiB mid-fill and nothing after). So wait, up to 5 s, for two more completed readings (the first
    may have begun mid-fill); a sampler that never reads leaves its peak low and the caller's assertion fails.
    """
    a = touched(mb)
    if t.readings is not None:
        seen = t.readings + 2
        deadline = time.monotonic() + 5.0
        while t.readings < seen and time.monotonic() < deadline:
            time.sleep(0.002)
    del a


@pytest.mark.parametrize("make", [_hwm_or_skip, _sampler], ids=["rss_hwm", "rss_sampler"])
def test_rss_tracker_sees_allocation_inside_track(make):
    t = make()
    base = t.baseline()
    with t.track():
        held_until_seen(t, 200)
    r = t.result()
    assert r.method == t.method and r.baseline_mb == base
    assert r.excess_mb == pytest.approx(200, abs=TOL_MB)
    assert r.to_row()["excess_mem_mb"] == r.excess_mb


@pytest.mark.parametrize("make", [_hwm_or_skip, _sampler], ids=["rss_hwm", "rss_sampler"])
def test_rss_tracker_ignores_memory_freed_before_reset(make):
    t = make()
    t.baseline()
    warmup = touched(300)  # e.g. compilation: transient, freed before the timed steps
    del warmup
    with t.track():
        held_until_seen(t, 50)
    assert t.result().excess_mb == pytest.approx(50, abs=TOL_MB)


@pytest.mark.skipif(trackers._malloc_trim is None, reason="no glibc malloc_trim")
def test_baseline_is_not_inflated_by_freed_heap_memory():
    # 64 KiB blocks sit below glibc's mmap threshold, so they live in the heap; the pins between them stop
    # glibc trimming the heap top by itself on free. Without malloc_trim ~190 MiB stay resident.
    trackers._malloc_trim(0)  # earlier tests' freed heap would otherwise be returned too, below `before`
    before = psutil.Process().memory_info().rss / MiB
    blocks, pins = [], []
    for _ in range(3000):
        blocks.append(np.ones(64 * 1024 // 8))
        pins.append(np.ones(16))
    del blocks
    assert HostRssTracker("auto").baseline() < before + TOL_MB


def test_rss_tracker_rejects_unknown_method():
    with pytest.raises(ValueError, match="rss_sampler"):
        HostRssTracker("vmrss")


def test_trackers_and_sinks_import_no_framework():
    code = textwrap.dedent(
        """
        import sys, tempfile, os
        from bench.measure.trackers import HostRssTracker, NvmlTracker
        from bench.measure.timing import StepTimer
        from bench.store.csv import CsvSink
        from bench.store.wandb import WandbSink
        t = HostRssTracker(); t.baseline()
        with t.track():
            pass
        NvmlTracker().close()
        CsvSink(os.path.join(tempfile.mkdtemp(), "r.csv"), ("run_id",)).write({"run_id": "x"})
        WandbSink("p", None, None, {}, mode="disabled").write({"run_id": "x"})
        bad = [m for m in ("torch", "jax", "jaxlib", "wandb") if m in sys.modules]
        assert not bad, bad
        """
    )
    subprocess.run([sys.executable, "-c", code], check=True, cwd=REPO, timeout=60)


# ------------------------------------------------------------------------------------------------- NVML / JAX


def test_nvml_tracker_never_crashes():
    with NvmlTracker() as t:
        t.baseline()
        with t.track():
            pass
        r = t.result()
    if t.available:
        assert r.method == "nvml_process_used"
    else:  # no driver / no GPU: absent, not an error
        assert r == MemoryResult("nvml(unavailable)", None, None)
        assert t.unavailable


class _FakeJaxDevice:
    """Mimics jaxlib's Device.memory_stats(): a lifetime peak and no reset method."""

    def __init__(self):
        self.stats = {"bytes_in_use": 100 * MiB, "peak_bytes_in_use": 500 * MiB}

    def memory_stats(self):
        return dict(self.stats)


def test_jax_tracker_marks_a_lifetime_peak():
    pytest.importorskip("jax")
    dev = _FakeJaxDevice()
    t = JaxDeviceTracker(dev)
    assert t.baseline() == 100
    with t.track():  # the window stays below the compile-time peak of 500 MiB: the window's own peak is unknown
        dev.stats["bytes_in_use"] = 150 * MiB
    r = t.result()
    assert (r.method, r.peak_mb) == ("jax_peak_bytes_in_use(lifetime)", 500)
    with t.track():  # the lifetime peak rises inside the window: its new value is the window's exact peak
        dev.stats["peak_bytes_in_use"] = 800 * MiB
    r = t.result()
    assert (r.method, r.peak_mb, r.excess_mb) == ("jax_peak_bytes_in_use", 800, 700)


def test_jax_tracker_refuses_a_device_without_memory_stats():
    jax = pytest.importorskip("jax")
    with pytest.raises(RuntimeError, match="HostRssTracker"):
        JaxDeviceTracker(jax.devices("cpu")[0])


# ------------------------------------------------------------------------------------------------- CUDA


@pytest.mark.cuda
def test_torch_cuda_tracker_sees_allocation():
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available():
        pytest.skip("torch has no CUDA here")
    t = trackers.TorchCudaTracker()
    # What earlier tests left allocated counts too: on an H100 a matmul's cuBLAS workspaces (64 MiB) stay in the
    # caching allocator's allocated bytes for the life of the process.
    before = torch.cuda.memory_allocated() / MiB
    keep = torch.ones(64 * MiB // 4, device="cuda")  # resident before the baseline: 64 MiB more
    t.baseline()
    with t.track():
        tmp = torch.ones(256 * MiB // 4, device="cuda")
        del tmp
    r = t.result()
    assert r.baseline_mb == pytest.approx(before + 64, abs=1)
    assert r.excess_mb == pytest.approx(256, abs=1)  # the caching allocator rounds to 2 MiB blocks at most
    assert r.reserved_peak_mb >= r.peak_mb
    del keep


@pytest.mark.cuda
def test_torch_limit_memory_takes_a_bare_cuda_device():
    """A trial's device is "cuda" with no index; torch's memory fraction wants one (the first shapes lease failed
    every torch trial on it), and the limit must then refuse an allocation past the budget."""
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available():
        pytest.skip("torch has no CUDA here")
    from bench.torch_impl.device import limit_memory

    limit_memory(torch.device("cuda"), 1024)
    try:
        with pytest.raises(torch.cuda.OutOfMemoryError):
            torch.empty(2048 * MiB // 4, device="cuda")
    finally:
        torch.cuda.set_per_process_memory_fraction(1.0)


@pytest.mark.cuda
def test_nvml_tracker_sees_this_process():
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available():
        pytest.skip("torch has no CUDA here")
    x = torch.ones(256 * MiB // 4, device="cuda")
    with NvmlTracker(interval_s=0.005) as t:
        if not t.available or t.current_mb() is None:
            pytest.skip(f"NVML cannot see this PID ({t.unavailable or 'PID namespace'})")
        with t.track():
            time.sleep(0.05)
        assert t.result().peak_mb >= 256  # our tensor plus the CUDA context
    del x


@pytest.mark.cuda
def test_jax_device_tracker_sees_allocation():
    jax = pytest.importorskip("jax")
    if jax.default_backend() != "gpu":
        pytest.skip("jax has no GPU backend here")
    import jax.numpy as jnp

    t = JaxDeviceTracker()
    t.baseline()
    with t.track():
        x = jnp.ones(1024 * MiB // 4, dtype=jnp.float32).block_until_ready()  # 1 GiB: above any earlier peak
        del x
    r = t.result()
    assert r.method == "jax_peak_bytes_in_use"
    assert r.excess_mb == pytest.approx(1024, abs=8)


# ------------------------------------------------------------------------------------------------- watchdog

_ALLOCATOR = textwrap.dedent(
    """
    import sys, time
    chunks = []
    for _ in range(int(sys.argv[1])):
        chunks.append(b"x" * (50 * 2**20))  # 50 MiB, every page written
        time.sleep(0.05)
    print("done", flush=True)
    time.sleep(float(sys.argv[2]))
    """
)


def _kill_tree(pid: int) -> None:
    try:
        proc = psutil.Process(pid)
        procs = [*proc.children(recursive=True), proc]
    except psutil.NoSuchProcess:
        return
    for p in procs:
        try:
            p.kill()
        except psutil.NoSuchProcess:
            pass


def test_watchdog_flags_a_child_past_the_limit():
    child = subprocess.Popen([sys.executable, "-c", _ALLOCATOR, "12", "5"], stdout=subprocess.PIPE, text=True)
    seen = []
    try:
        with HostMemWatchdog(child.pid, max_host_mem_mb=300, on_exceed=lambda mb: (seen.append(mb), child.kill())):
            child.wait(timeout=30)
    finally:
        child.kill()
    out = child.stdout.read()
    assert len(seen) == 1 and seen[0] > 300
    assert "done" not in out  # killed on the way to 600 MiB
    assert child.returncode != 0


def test_watchdog_counts_grandchildren_and_records_max():
    # The child only waits; its own child allocates 4 x 50 MiB. The limit is about the whole tree's RSS.
    launcher = f"import subprocess, sys; subprocess.run([sys.executable, '-c', {_ALLOCATOR!r}, '4', '0.3'])"
    child = subprocess.Popen([sys.executable, "-c", launcher], stdout=subprocess.PIPE, text=True)
    try:
        with HostMemWatchdog(child.pid, max_host_mem_mb=10_000) as wd:
            child.wait(timeout=30)
            wd.finished.wait(timeout=5)
    finally:
        _kill_tree(child.pid)
    assert not wd.exceeded.is_set() and wd.exceeded_mb is None
    assert wd.max_seen_mb > 200  # 200 MiB in the grandchild, plus two interpreters
    assert wd.finished.is_set()
