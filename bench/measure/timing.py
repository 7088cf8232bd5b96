"""Timing statistics. Knows nothing of BERT: it times callables, syncing the device after each call.

timer = StepTimer(sync=trainer.sync)        # a step's time includes the device finishing its work
loss = timer(trainer.step, batch)           # one timed call; timer.times_s holds every step
timer.stats()                               # median, p10, p90, mean, stdev (seconds)
time_calls(f, x, sync=..., warmup=1, repeats=5, min_sample_s=0.005)   # a micro-benchmark's samples
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np


@dataclass(frozen=True)
class TimingStats:
    """Summary of per-step wall times, in seconds."""

    n: int
    median_s: float
    p10_s: float
    p90_s: float
    mean_s: float
    stdev_s: float | None  # sample standard deviation (n - 1); None for a single step, where it is undefined

    @classmethod
    def from_times(cls, times_s: Sequence[float]) -> TimingStats:
        t = np.asarray(times_s, dtype=np.float64)
        if t.ndim != 1 or t.size == 0:
            raise ValueError(f"step times: need a non-empty 1-D sequence of seconds, got shape {t.shape}")
        # numpy's default (linear) interpolation, the same as statistics.quantiles(method="inclusive")
        p10, median, p90 = np.percentile(t, [10, 50, 90])
        return cls(
            n=int(t.size),
            median_s=float(median),
            p10_s=float(p10),
            p90_s=float(p90),
            mean_s=float(t.mean()),
            stdev_s=float(t.std(ddof=1)) if t.size > 1 else None,
        )

    def to_row(self) -> dict[str, float | None]:
        return {
            "step_time_median_s": self.median_s,
            "step_time_p10_s": self.p10_s,
            "step_time_p90_s": self.p90_s,
            "step_time_mean_s": self.mean_s,
            "step_time_stdev_s": self.stdev_s,
        }


Sync = Callable[[Any], Any]


Now = Callable[[], float]  # seconds: time.perf_counter, or a test's fake clock that it advances itself


def timed(
    fn: Callable[..., Any], *args: Any, sync: Sync | None = None, clock: Now = time.perf_counter, **kwargs: Any
) -> tuple[Any, float]:
    """(fn(*args, **kwargs), wall seconds), with `sync(output)` called before the clock stops.

    Both frameworks dispatch work asynchronously: without the sync we would time the launch, not the step.
    sync receives the step's output: `jax.block_until_ready` for JAX, `lambda _: torch.cuda.synchronize()`
    for torch on CUDA, None on CPU torch (eager CPU ops are synchronous).
    """
    t0 = clock()
    out = fn(*args, **kwargs)
    if sync is not None:
        sync(out)
    return out, clock() - t0


class StepTimer:
    """Times repeated calls of a step; `stats()` summarises them.

    timer = StepTimer(sync=jax.block_until_ready)
    for batch in batches:
        out = timer(step, state, batch)
    timer.stats().to_row()
    """

    def __init__(self, sync: Sync | None = None):
        self.sync = sync
        self.times_s: list[float] = []

    def __call__(self, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        out, dt = timed(fn, *args, sync=self.sync, **kwargs)
        self.times_s.append(dt)
        return out

    def stats(self) -> TimingStats:
        return TimingStats.from_times(self.times_s)


MAX_CALLS_PER_SAMPLE = 100_000  # a 1 us call at min_sample_s = 0.1 s; beyond this the sample is long enough


@dataclass(frozen=True)
class CallTiming:
    stats: TimingStats  # per-call wall time, over the samples
    out: Any  # the last call's output
    cpu_s: float  # process CPU time over the samples, every thread's: cpu_s / wall_s ~ the threads at work
    wall_s: float  # wall time over the samples


def time_calls(
    fn: Callable[..., Any],
    *args: Any,
    sync: Sync | None = None,
    warmup: int = 1,
    repeats: int = 5,
    min_sample_s: float = 0.0,
    clock: Now = time.perf_counter,
) -> CallTiming:
    """Per-call wall time of fn(*args), timeit-style, over `repeats` samples.

    `warmup` untimed calls first (the first one compiles), then one more, untimed, to size the samples: each
    sample makes `number` back-to-back calls, sync after every call as StepTimer does, with `number` large
    enough that a sample lasts min_sample_s. A microsecond op timed one call at a time would measure
    perf_counter's resolution and the scheduler's jitter rather than the op.
    """
    out = None
    for _ in range(warmup):
        out, _ = timed(fn, *args, sync=sync, clock=clock)
    out, dt = timed(fn, *args, sync=sync, clock=clock)
    number = 1 if dt >= min_sample_s else min(MAX_CALLS_PER_SAMPLE, int(min_sample_s / max(dt, 1e-9)) + 1)
    samples = []
    cpu0, wall0 = time.process_time(), clock()
    for _ in range(repeats):
        t0 = clock()
        for _ in range(number):
            out = fn(*args)
            if sync is not None:
                sync(out)
        samples.append((clock() - t0) / number)
    cpu_s, wall_s = time.process_time() - cpu0, clock() - wall0
    return CallTiming(TimingStats.from_times(samples), out, cpu_s, wall_s)
