"""Timing: the statistics of a trial's steps, a step timed until its device work is done, and the op
micro-benchmarks' samples of calls (bench/measure/timing.py)."""

from __future__ import annotations

import statistics
import time

import pytest

from bench.measure.timing import StepTimer, TimingStats, time_calls, timed
from tests.support import FakeClock


def test_timing_stats_on_known_numbers():
    s = TimingStats.from_times([float(x) for x in range(1, 11)])  # 1..10 s
    assert s.n == 10
    assert s.median_s == pytest.approx(5.5)
    assert s.p10_s == pytest.approx(1.9)  # linear interpolation: 1 + 0.1 * 9
    assert s.p90_s == pytest.approx(9.1)
    assert s.mean_s == pytest.approx(5.5)
    assert s.stdev_s == pytest.approx(statistics.stdev(range(1, 11)))
    deciles = statistics.quantiles(range(1, 11), n=10, method="inclusive")
    assert (s.p10_s, s.p90_s) == pytest.approx((deciles[0], deciles[-1]))
    assert s.to_row() == {
        "step_time_median_s": s.median_s,
        "step_time_p10_s": s.p10_s,
        "step_time_p90_s": s.p90_s,
        "step_time_mean_s": s.mean_s,
        "step_time_stdev_s": s.stdev_s,
    }


def test_timing_stats_edge_cases():
    one = TimingStats.from_times([0.25])
    assert (one.median_s, one.p10_s, one.p90_s, one.mean_s, one.stdev_s) == (0.25, 0.25, 0.25, 0.25, None)
    with pytest.raises(ValueError, match="non-empty"):
        TimingStats.from_times([])


def test_timer_stops_the_clock_only_after_sync():
    seen = []

    def sync(out):  # stands in for block_until_ready: the device work "finishes" 50 ms after dispatch
        seen.append(out)
        time.sleep(0.05)

    out, dt = timed(lambda x: x + 1, 41, sync=sync)
    assert out == 42 and seen == [42]
    assert dt >= 0.05

    timer = StepTimer(sync=sync)
    for i in range(3):
        assert timer(lambda x: 2 * x, i) == 2 * i
    assert len(timer.times_s) == 3 and min(timer.times_s) >= 0.05
    assert timer.stats().n == 3


def test_time_calls_samples_enough_calls_per_sample():
    """A call that takes one tick of a fake clock (a power of two: the sums are exact): a sample of 10 ticks needs
    11 calls, the first count past it; each sample's time is one tick a call."""
    tick, now, calls = 2.0**-10, FakeClock(), []

    def fn():
        calls.append(1)
        now.advance(tick)
        return len(calls)

    r = time_calls(fn, warmup=2, repeats=3, min_sample_s=10 * tick, clock=now)
    assert len(calls) == 3 + 3 * 11  # 2 warm-up calls and 1 sizing call first
    assert r.out == len(calls) and r.stats.n == 3 and r.stats.median_s == tick and r.wall_s == 3 * 11 * tick


def test_time_calls_counts_the_process_cpu_apart_from_the_wall():
    r = time_calls(time.sleep, 0.001, warmup=0, repeats=3)
    assert 0 <= r.cpu_s < r.wall_s  # sleeping costs no CPU, and the wall runs at least the sleep
