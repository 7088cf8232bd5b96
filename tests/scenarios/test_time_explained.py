"""profile=true as a user runs it: `python -m bench framework=F mode=jvp profile=true` leaves a trace that opens
under results/traces/<run_id>/, a row whose step is the trace's and whose categories fill it, and `bench report` a
"Time, explained" section with both frameworks; a profiler that fails, or whose events outgrow the host, costs the
trial only its trace. The trials are measured in the test's process (run_here): what a profiled trial records is the
subject, and torch.profiler and jax.profiler trace the steps of the process they run in, a test's as a trial's."""

from __future__ import annotations

import json
import time
from pathlib import Path

import psutil
import pytest

from bench.measure.timeline import CATEGORIES, STEP_EVENT, complete, load_events
from bench.scenarios.model import trial
from tests.support import FAST, bench_here, rows, run_here

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def profiled(tmp_path_factory) -> Path:
    results = tmp_path_factory.mktemp("profiled")
    run_here(
        "-m",
        "framework=torch,jax",
        "mode=backprop,jvp",
        "profile=true",
        "profile_steps=2",
        *FAST,
        "logger=none",
        results=results,
    )
    return results


def test_each_trial_leaves_a_trace_that_opens(profiled):
    found = rows(profiled)
    assert sorted((r["framework"], r["mode"]) for r in found) == sorted(
        (f, m) for f in ("torch", "jax") for m in ("backprop", "jvp")
    )
    for r in found:
        assert r["status"] == "ok" and r["trace_status"] == "ok", r.get("trace_status")
        trace = Path(r["trace_path"])
        assert trace.is_relative_to(profiled / "traces" / r["run_id"] / "rank0")
        steps = [e for e in complete(load_events(trace)) if e["name"] == STEP_EVENT]
        assert len(steps) == 2 == int(r["profile_steps_traced"])
        summary = json.loads(
            (trace.parent if r["framework"] == "torch" else trace.parents[3]).joinpath("summary.json").read_text()
        )
        assert summary["top_ops"] and summary["trace_status"] == "ok"
        # the row's step is the trace's own steps (read here from the file), and its operations' categories fill
        # part of it, never more (how each category is counted: tests/measure/test_timeline.py, known traces)
        assert float(r["profile_step_ms"]) == pytest.approx(sum(e["dur"] for e in steps) / len(steps) / 1e3)
        busy = sum(float(r[f"time_{c}_ms"]) for c in CATEGORIES if c != "overhead")
        assert 0 < busy <= float(r["profile_step_ms"]) * (1 + 1e-9)
        assert float(r["time_matmul_ms"]) > 0 and float(r["time_overhead_ms"]) >= 0
        # every row says what a step launches and the host's share of it (tests/frameworks/test_kernels.py)
        assert int(r["kernels_per_step"]) > 0 and 0 <= float(r["host_share"]) <= 1, r["kernels_method"]


def test_the_report_explains_time_for_both_frameworks(profiled):
    report = bench_here("report", str(profiled), "--out", str(profiled))
    assert report.returncode == 0, report.stderr
    text = (profiled / "report.md").read_text()
    part = text.split("## Time, explained", 1)[1].split("\n## ", 1)[0]
    for label in ("| torch | backprop |", "| jax | backprop |", "| torch | jvp |", "| jax | jvp |"):
        assert label in part
    assert "a traced jvp step took" in part  # where jvp's time beyond backprop's goes, per framework
    assert "| kernels / step | host share |" in part
    assert (profiled / "plots" / "time_breakdown.png").exists()


def test_a_failed_profiler_keeps_the_row(tmp_path):
    # a MemoryError raised where the profiler starts: the trial catches it, so it need not run in a process
    run_here(
        "framework=torch",
        "mode=backprop",
        "profile=true",
        *FAST,
        "logger=none",
        results=tmp_path,
        env={"BENCH_INJECT_FAULT": "in_profile:oom"},
    )
    (r,) = rows(tmp_path)
    assert r["status"] == "ok" and float(r["step_time_median_s"]) > 0
    assert r["trace_status"].startswith("missing: MemoryError") and not r["time_matmul_ms"]


class Hoarder:
    """A profiler whose events grow without end, as torch's did tracing jacfwd on MiniLM's head (24 GiB)."""

    @staticmethod
    def record(trainer, batches, folder):
        held = []
        for _ in range(64):  # at most 2 GiB: a guard that never fires fails the test, never the host
            held.append(bytearray(32 * 2**20))  # touched: resident, as a profiler's event records are
            time.sleep(0.005)
        return folder


def test_a_profiler_that_outgrows_the_host_is_stopped(monkeypatch, tmp_path):
    monkeypatch.setattr(trial, "PROFILER_HOST_SHARE", 256 * 2**20 / psutil.virtual_memory().available)  # 256 MiB
    with pytest.raises(trial.ProfilerOutgrewMemory, match="the profiler's events took this process past"):
        trial.record_within_memory(Hoarder, None, [], tmp_path)
