"""Memory tracking. Knows nothing of BERT: it watches memory (timing is bench/timing.py).

Memory trackers share one small interface, so the runner can treat every method alike:

    mem = HostRssTracker()          # or TorchCudaTracker(), JaxDeviceTracker(), NvmlTracker()
    mem.baseline()                  # what is resident now: weights + batch loaded, before any step
    warm_up()                       # compile; its transient memory is not part of the timed peak
    with mem.track():               # resets the peak on entry, reads it on exit
        run_timed_steps()
    r = mem.result()                # r.peak_mb, r.baseline_mb, r.excess_mb (= peak - baseline), r.method

MB means MiB (2**20 bytes) everywhere, as nvidia-smi and torch's memory summaries use.
torch and jax are imported lazily, inside the tracker that needs them: a JAX trial process must never import
torch, nor a torch one jax (each would load its own CUDA runtime and allocator into the process we measure).
"""

from __future__ import annotations

import contextlib
import ctypes
import ctypes.util
import math
import os
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import psutil

MiB = 2**20


# --------------------------------------------------------------------------------------------------- memory


@dataclass(frozen=True)
class MemoryResult:
    method: str  # how the numbers were obtained; "(lifetime)" marks a peak that may predate the window
    baseline_mb: float | None  # resident when baseline() was called (or at track() entry if it never was)
    peak_mb: float | None  # highest value during the last track() window; None when not measurable
    reserved_peak_mb: float | None = None  # allocator's reserved/pool peak, where the allocator reports one

    @property
    def excess_mb(self) -> float | None:
        """Peak during the timed steps minus the resident baseline. Can be negative if memory resident at the
        baseline was freed before the window (reported as measured, not clamped)."""
        if self.peak_mb is None or self.baseline_mb is None:
            return None
        return self.peak_mb - self.baseline_mb

    def to_row(self) -> dict[str, float | str | None]:
        """The primary memory columns of a results row; which tracker is primary is the runner's choice."""
        return {
            "peak_mem_mb": self.peak_mb,
            "excess_mem_mb": self.excess_mb,
            "baseline_mem_mb": self.baseline_mb,
            "mem_method": self.method,
        }


class MemoryTracker:
    """Base class: subclasses implement current_mb(), peak_mb() and reset_peak(); sampling ones also
    _start()/_stop(), which track() calls around the window."""

    method: str = "none"

    def __init__(self) -> None:
        self._baseline_mb: float | None = None
        self._peak_mb: float | None = None
        self._reserved_peak_mb: float | None = None

    def current_mb(self) -> float | None:
        raise NotImplementedError

    def peak_mb(self) -> float | None:
        """Highest value since the last reset_peak()."""
        raise NotImplementedError

    def reset_peak(self) -> None:
        raise NotImplementedError

    def baseline(self) -> float | None:
        """Record (and return) what is resident now."""
        self._baseline_mb = self.current_mb()
        return self._baseline_mb

    def _start(self) -> None:
        pass

    def _stop(self) -> None:
        pass

    @contextlib.contextmanager
    def track(self) -> Iterator[MemoryTracker]:
        """Measure the peak of the enclosed block (the timed steps)."""
        self.reset_peak()
        if self._baseline_mb is None:
            self._baseline_mb = self.current_mb()
        self._start()
        try:
            yield self
        finally:
            self._stop()
            self._peak_mb = self.peak_mb()

    def result(self) -> MemoryResult:
        return MemoryResult(self.method, self._baseline_mb, self._peak_mb, self._reserved_peak_mb)

    def close(self) -> None:
        self._stop()

    def __enter__(self) -> MemoryTracker:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class _PeakSampler:
    """A daemon thread calling `read()` every `interval_s`, keeping the maximum (None readings ignored)."""

    def __init__(self, read: Callable[[], float | None], interval_s: float):
        self.read = read
        self.interval_s = interval_s
        self.peak: float | None = None
        self.readings = 0  # reads completed (HostRssTracker.readings)
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def _sample(self) -> None:
        v = self.read()
        if v is not None and (self.peak is None or v > self.peak):
            self.peak = v
        self.readings += 1

    def reset(self) -> None:
        self.peak = None
        self._sample()

    def _run(self) -> None:
        while not self._stop.wait(self.interval_s):
            self._sample()

    def start(self) -> None:
        if self._thread is not None:
            return
        self._stop.clear()
        self._sample()
        self._thread = threading.Thread(target=self._run, name="bench-mem-sampler", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        if self._thread is None:
            return
        self._stop.set()
        self._thread.join()
        self._thread = None
        self._sample()  # one last reading: whatever is resident at the end of the window counts too


# --- host RSS

_PROC_STATUS = "/proc/self/status"
_CLEAR_REFS = "/proc/self/clear_refs"


def _proc_status_mb(field: str) -> float | None:
    try:
        with open(_PROC_STATUS) as f:
            for line in f:
                if line.startswith(field + ":"):
                    return int(line.split()[1]) / 1024  # the kernel reports kB (KiB)
    except OSError:
        pass
    return None


def _load_malloc_trim() -> Callable[[int], int] | None:
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        fn = libc.malloc_trim  # glibc only; musl, macOS, jemalloc/tcmalloc builds lack it or ignore it
    except (OSError, AttributeError):
        return None
    fn.argtypes = [ctypes.c_size_t]
    fn.restype = ctypes.c_int
    return fn


_malloc_trim = _load_malloc_trim()


def malloc_trim() -> bool:
    """Hand free heap memory back to the OS (glibc `malloc_trim(0)`); False where unavailable.

    glibc keeps freed small and medium blocks (below the mmap threshold, up to 32 MiB) in its arenas, still
    resident. Compilation and warm-up free a lot of such memory; untrimmed it would inflate the baseline and
    the RSS the peak starts from, and the timed steps could then reuse it without RSS moving: the excess would
    be under-counted. Trimming before each reading makes RSS track live memory at both ends.
    """
    if _malloc_trim is None:
        return False
    _malloc_trim(0)
    return True


def _clear_refs_works() -> bool:
    """Whether writing "5" to /proc/self/clear_refs resets VmHWM here (Linux >= 4.0, procfs writable)."""
    if _proc_status_mb("VmHWM") is None:
        return False
    try:
        with open(_CLEAR_REFS, "w") as f:
            f.write("5")
    except OSError:
        return False
    return True


class HostRssTracker(MemoryTracker):
    """Resident set size of this process (CPU trials, and host-side memory of GPU trials).

    method "rss_hwm" (preferred): the kernel's own high-water mark VmHWM, reset by writing "5" to
      /proc/self/clear_refs. Exact, every page fault counts, no thread, no sampling gap, zero overhead.
    method "rss_sampler" (fallback, non-Linux or read-only procfs): a thread polls psutil RSS every
      interval_s; a spike shorter than the interval, or inside a C call that holds the GIL and frees before
      returning, can be missed, so this is a lower bound.
    method="auto" picks rss_hwm where clear_refs works.
    Caveats for both: RSS includes file-backed pages (shared libraries, mmapped checkpoints) and excludes
    memory of child processes (e.g. torch.compile workers).
    """

    METHODS = ("auto", "rss_hwm", "rss_sampler")

    def __init__(self, method: str = "auto", interval_s: float = 0.002):
        super().__init__()
        if method not in self.METHODS:
            raise ValueError(f"HostRssTracker method={method!r}: accepted {', '.join(self.METHODS)}")
        if method in ("auto", "rss_hwm"):
            works = _clear_refs_works()
            if method == "rss_hwm" and not works:
                raise RuntimeError(f"HostRssTracker method='rss_hwm': cannot reset VmHWM via {_CLEAR_REFS}")
            method = "rss_hwm" if works else "rss_sampler"
        self.method = method
        self._proc = psutil.Process()
        # 2 ms default: a BERT step takes tens of ms or more; psutil's read costs ~10 us, so <1% of a core.
        self._sampler = _PeakSampler(self._rss_mb, interval_s) if method == "rss_sampler" else None

    @property
    def readings(self) -> int | None:
        """How many RSS readings the sampler has completed (None for rss_hwm, which reads the kernel's mark)."""
        return None if self._sampler is None else self._sampler.readings

    def _rss_mb(self) -> float:
        return self._proc.memory_info().rss / MiB

    def current_mb(self) -> float:
        malloc_trim()
        return self._rss_mb()

    def reset_peak(self) -> None:
        malloc_trim()
        if self._sampler is not None:
            self._sampler.reset()
        else:
            with open(_CLEAR_REFS, "w") as f:
                # "5": reset the peak RSS to the current RSS (kernel Documentation/filesystems/proc.rst)
                f.write("5")

    def peak_mb(self) -> float | None:
        if self._sampler is not None:
            return self._sampler.peak
        return _proc_status_mb("VmHWM")

    def _start(self) -> None:
        if self._sampler is not None:
            self._sampler.start()

    def _stop(self) -> None:
        if self._sampler is not None:
            self._sampler.stop()


# --- torch CUDA caching allocator


class TorchCudaTracker(MemoryTracker):
    """torch's CUDA caching allocator: bytes given to tensors (allocated) and held from the driver (reserved).

    peak = max_memory_allocated over the window (reset_peak_memory_stats at entry); reserved_peak =
    max_memory_reserved. Neither includes the CUDA context, cuBLAS workspaces or other libraries' memory:
    NvmlTracker sees those.
    """

    method = "torch_max_memory_allocated"

    def __init__(self, device: Any = None):
        super().__init__()
        import torch  # lazily: a JAX process must never import torch

        if not torch.cuda.is_available():
            raise RuntimeError("TorchCudaTracker: torch.cuda.is_available() is False; use HostRssTracker")
        self._cuda = torch.cuda
        if device is None:
            device = torch.device("cuda", torch.cuda.current_device())
        self.device = torch.device(device)

    @staticmethod
    def is_available() -> bool:
        import torch

        return torch.cuda.is_available()

    def current_mb(self) -> float:
        self._cuda.synchronize(self.device)
        return self._cuda.memory_allocated(self.device) / MiB

    def reset_peak(self) -> None:
        self._cuda.synchronize(self.device)
        self._cuda.reset_peak_memory_stats(self.device)

    def peak_mb(self) -> float:
        self._cuda.synchronize(self.device)
        self._reserved_peak_mb = self._cuda.max_memory_reserved(self.device) / MiB
        return self._cuda.max_memory_allocated(self.device) / MiB


# --- JAX (XLA PJRT) device allocator

# Names a future jaxlib might give a peak reset. jaxlib 0.10.2 has none: its peak is the process lifetime's.
_JAX_RESET_NAMES = ("reset_memory_stats", "reset_peak_memory_stats")


class JaxDeviceTracker(MemoryTracker):
    """XLA's device allocator via `device.memory_stats()`: bytes_in_use (current) and peak_bytes_in_use.

    jaxlib has no peak reset (checked up to 0.10.2), so peak_bytes_in_use is the process-lifetime peak. Still,
    if that lifetime peak rose during the window, its new value was reached inside the window and is exact:
    method "jax_peak_bytes_in_use". If it did not rise, the window's own peak is unknown (at most the lifetime
    peak, perhaps reached while compiling or warming up): we report the lifetime peak with method
    "jax_peak_bytes_in_use(lifetime)", an upper bound. Where a reset method exists it is used.
    CPU devices report no memory_stats: construct this tracker only for GPU/TPU devices.
    """

    def __init__(self, device: Any = None):
        super().__init__()
        import jax  # lazily: a torch process must never import jax

        self.device = jax.devices()[0] if device is None else device
        if self.device.memory_stats() is None:
            raise RuntimeError(f"JaxDeviceTracker: device {self.device} reports no memory_stats; use HostRssTracker")
        resets = [getattr(self.device, n) for n in _JAX_RESET_NAMES if hasattr(self.device, n)]
        self._reset = resets[0] if resets else None
        self._peak_at_reset: int | None = None
        self.method = "jax_peak_bytes_in_use"

    def _stats(self) -> dict[str, int]:
        return self.device.memory_stats() or {}

    def current_mb(self) -> float | None:
        v = self._stats().get("bytes_in_use")
        return None if v is None else v / MiB

    def reset_peak(self) -> None:
        if self._reset is not None:
            self._reset()
            self._peak_at_reset = None
        else:
            self._peak_at_reset = self._stats().get("peak_bytes_in_use")

    def peak_mb(self) -> float | None:
        s = self._stats()
        peak = s.get("peak_bytes_in_use")
        pool = s.get("peak_pool_bytes", s.get("peak_bytes_reserved"))
        self._reserved_peak_mb = None if pool is None else pool / MiB
        if peak is None:
            return None
        exact = self._reset is not None or (self._peak_at_reset is not None and peak > self._peak_at_reset)
        self.method = "jax_peak_bytes_in_use" if exact else "jax_peak_bytes_in_use(lifetime)"
        return peak / MiB


# --- NVML: the process's GPU memory as nvidia-smi shows it


class NvmlTracker(MemoryTracker):
    """This process's GPU memory as the driver reports it (nvidia-smi's per-process "GPU Memory Usage"):
    everything, CUDA context and every library's pool included, summed over all visible GPUs.

    Sampled by a thread (NVML has no peak), so short spikes can be missed; caching allocators rarely give
    memory back to the driver, so in practice the reading is close to the pools' high-water mark.
    Absent, never an error: without pynvml, a driver or a GPU, or when NVML cannot see our PID (containers
    with their own PID namespace report host PIDs), readings are None and `unavailable` says why.
    """

    method = "nvml_process_used"

    def __init__(self, pid: int | None = None, interval_s: float = 0.01):
        super().__init__()
        self.pid = os.getpid() if pid is None else pid
        self.unavailable: str | None = None
        self._nvml: Any = None
        self._handles: list[Any] = []
        try:
            import pynvml

            pynvml.nvmlInit()
            self._handles = [pynvml.nvmlDeviceGetHandleByIndex(i) for i in range(pynvml.nvmlDeviceGetCount())]
            self._nvml = pynvml
        except Exception as e:  # ImportError, NVMLError_LibraryNotFound, NVMLError_DriverNotLoaded, ...
            self.unavailable = f"{type(e).__name__}: {e}"
        if self._nvml is not None and not self._handles:
            self.unavailable = "NVML sees no GPU"
        if self.unavailable:
            self.method = "nvml(unavailable)"
        # 10 ms: NVML queries cost ~0.1-1 ms each, and allocator pools grow in large, long-lived chunks.
        self._sampler = _PeakSampler(self.current_mb, interval_s)

    @property
    def available(self) -> bool:
        return self.unavailable is None

    def current_mb(self) -> float | None:
        if not self.available:
            return None
        total, found = 0, False
        for h in self._handles:
            try:
                procs = self._nvml.nvmlDeviceGetComputeRunningProcesses(h)
            except Exception:  # one GPU failing a query (MIG, permissions) must not end the trial
                continue
            for p in procs:
                if p.pid == self.pid and p.usedGpuMemory is not None:
                    total += p.usedGpuMemory
                    found = True
        return total / MiB if found else None

    def reset_peak(self) -> None:
        self._sampler.reset()

    def peak_mb(self) -> float | None:
        return self._sampler.peak

    def _start(self) -> None:
        self._sampler.start()

    def _stop(self) -> None:
        self._sampler.stop()

    def close(self) -> None:
        super().close()
        if self._nvml is not None:
            with contextlib.suppress(Exception):
                self._nvml.nvmlShutdown()
            self._nvml = None
            self.unavailable = self.unavailable or "closed"


# --------------------------------------------------------------------------------------------------- watchdog


class TreeRss:
    """RSS of a process plus all its descendants, in MiB, read repeatedly (`mb()`). Pages shared between them are
    counted once per process, so this can over-count (not an issue for spawned trials, which share little).
    The descendants are looked up at most every `rescan_s` (psutil finds them by scanning every process in
    /proc, ~0.8 ms of CPU; reading one process's RSS costs ~20 us). A parent
    polling its trial every 20 ms with a full scan took ~4% of a core from the trial it measures; on a 2-core
    host that stalled torch's two OpenMP threads in turn (MiniLM backprop 5% slower than a plain loop)."""

    def __init__(self, pid: int, rescan_s: float = 0.25):
        self.proc, self.rescan_s = psutil.Process(pid), rescan_s
        self.children: list[psutil.Process] = []
        self.scanned = -math.inf

    def mb(self) -> float:
        total = self.proc.memory_info().rss  # NoSuchProcess once the process is gone: the caller's signal
        now = time.monotonic()
        if now - self.scanned >= self.rescan_s:
            self.children, self.scanned = self.proc.children(recursive=True), now
        for child in self.children:
            with contextlib.suppress(psutil.NoSuchProcess, psutil.AccessDenied):
                total += child.memory_info().rss
        return total / MiB


class HostMemWatchdog:
    """Parent-side watch over a child process's host memory (its RSS plus its descendants').

    Polls every interval_s, keeps the maximum in `max_seen_mb`, and when it exceeds max_host_mem_mb sets
    `exceeded` and calls `on_exceed(mb)` once, from the watchdog thread. It measures and signals; killing the
    child and recording status "oom" is the caller's decision:

        with HostMemWatchdog(proc.pid, limit_mb, on_exceed=lambda mb: proc.kill()) as wd:
            proc.join(timeout)
        if wd.exceeded.is_set(): ...  # status oom, memory seen: wd.max_seen_mb
    """

    def __init__(
        self,
        pid: int,
        max_host_mem_mb: float | None = None,
        interval_s: float = 0.02,  # 20 ms: the brief's cadence; a scan of the process tree costs ~1 ms
        on_exceed: Callable[[float], Any] | None = None,
    ):
        self.pid = pid
        self.max_host_mem_mb = max_host_mem_mb
        self.interval_s = interval_s
        self.on_exceed = on_exceed
        self.max_seen_mb = 0.0
        self.exceeded_mb: float | None = None  # the reading that crossed the limit
        self.exceeded = threading.Event()
        self.finished = threading.Event()  # set once the watched process is gone
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._tree: TreeRss | None = None

    def poll(self) -> float | None:
        """One reading; None once the process is gone."""
        try:
            self._tree = self._tree or TreeRss(self.pid)
            mb = self._tree.mb()
        except (psutil.NoSuchProcess, psutil.AccessDenied):
            self.finished.set()
            return None
        self.max_seen_mb = max(self.max_seen_mb, mb)
        limit = self.max_host_mem_mb
        if limit is not None and mb > limit and not self.exceeded.is_set():
            self.exceeded_mb = mb
            self.exceeded.set()
            if self.on_exceed is not None:
                self.on_exceed(mb)
        return mb

    def _run(self) -> None:
        while self.poll() is not None and not self._stop.wait(self.interval_s):
            pass

    def start(self) -> HostMemWatchdog:
        if self._thread is None:
            self._thread = threading.Thread(target=self._run, name=f"bench-watchdog-{self.pid}", daemon=True)
            self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
            self._thread = None

    def __enter__(self) -> HostMemWatchdog:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
