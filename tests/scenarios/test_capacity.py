"""What fits: the capacity search finds the largest value within a budget, by prediction then bisection, in a
bounded number of probes; a ladder measures every rung up to the first that does not fit; every probe is a real,
recorded trial, and a probe recorded out of memory in the same budget is not run again under resume; a budget too
small for the first value is a result ("does not fit"), not an error."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys

import pytest

from bench.config import to_dict
from bench.harness.launch import TRIAL_MODULE, child_env
from bench.harness.runner import trial_env
from bench.harness.scenario import config_hash
from bench.scenarios import SCENARIOS
from bench.scenarios.capacity.run import out_of_memory
from bench.scenarios.capacity.search import LARGEST_RUNG, Probe, ladder, search
from bench.store.read import read_rows
from tests.support import REPO, bench_here, composed


def synthetic(base: float, per_item: float, fails_above: float | None = None, log: list | None = None):
    """A probe whose peak memory is base + per_item * value, out of memory above the budget it is given."""

    def make(budget: float):
        def probe(value: int) -> Probe:
            peak = base + per_item * value
            if log is not None:
                log.append(value)
            status = "oom" if peak > budget else ("error" if fails_above is not None and value > fails_above else "ok")
            return Probe(value, status, peak if status == "ok" else None, f"run-{value}")

        return probe

    return make


@pytest.mark.parametrize(
    "base, per_item, budget", [(300, 37, 1000), (500, 3.5, 1000), (100, 900, 1000), (300, 37, 300 + 37 * 64)]
)
def test_the_search_finds_the_largest_value_that_fits(base, per_item, budget):
    s = search(synthetic(base, per_item)(budget), budget)
    want = int((budget - base) // per_item)
    assert s.verdict == "fits" and s.best.value == want
    values = [p.value for p in s.probes]
    assert want in values and want + 1 in values and len(values) <= 12
    assert len(set(values)) == len(values)  # no value probed twice


def test_a_probe_that_ran_past_the_budget_does_not_fit():
    """On the CPU the watchdog samples the RSS, so a probe can end ok with a peak over the budget: `over`, which
    the search treats as out of memory."""

    def probe(value: int) -> Probe:
        peak = 100 + 10 * value
        return Probe(value, "oom" if value > 40 else ("over" if peak > 300 else "ok"), peak, f"run-{value}")

    s = search(probe, 300)
    assert s.verdict == "fits" and s.best.value == 20
    assert {p.value: p.status for p in s.probes}[21] == "over"


def test_a_budget_below_the_first_value_does_not_fit():
    s = search(synthetic(300, 37)(200), 200)
    assert s.verdict == "does not fit" and s.best is None and len(s.probes) == 1


def test_the_search_stops_at_its_limit_and_within_its_probes():
    s = search(synthetic(300, 1)(10_000), 10_000, limit=40)
    assert s.verdict == "fits at the limit" and s.best.value == 40
    s = search(synthetic(0, 1e-9)(10), 10, limit=1 << 40, max_probes=5)
    assert s.verdict == "undecided" and len(s.probes) == 5


def test_a_probe_that_errors_ends_the_search_as_failed():
    s = search(synthetic(300, 37, fails_above=5)(1000), 1000)
    assert s.verdict == "failed" and s.probes[-1].status == "error"


def test_a_ladder_measures_every_rung_up_to_the_first_that_does_not_fit():
    """Peaks 300 + 37 x: 18 fits a budget of 1000, so the rungs 1, 4, 16 fit and 64 ends the ladder; its answer is
    the largest rung, known within the factor."""
    log: list[int] = []
    s = ladder(synthetic(300, 37, log=log)(1000), 4)
    assert log == [1, 4, 16, 64] and s.verdict == LARGEST_RUNG and s.best.value == 16
    s = ladder(synthetic(300, 1)(1000), 4, start=2, limit=32)
    assert [p.value for p in s.probes] == [2, 8, 32] and s.verdict == "fits at the limit" and s.best.value == 32
    s = ladder(synthetic(300, 37)(200), 4)
    assert s.verdict == "does not fit" and s.best is None and len(s.probes) == 1
    s = ladder(synthetic(300, 37)(1000), 4, max_probes=2)
    assert [p.value for p in s.probes] == [1, 4] and s.verdict == "undecided" and s.best.value == 4
    s = ladder(synthetic(300, 37, fails_above=3)(1000), 4)
    assert s.verdict == "failed" and s.best.value == 1 and s.probes[-1].status == "error"


def test_a_probe_recorded_out_of_memory_in_the_same_budget_is_its_answer():
    """Resume skips finished trials only; a ladder deepened by a later command would run its last rung, out of
    memory, again: the probe reads that row instead, when it ran in this budget and is the configuration's latest."""
    cfg = composed("framework=torch", "model=tiny", "mode=backprop", "batch_size=64")
    h = config_hash(SCENARIOS["model"], cfg)
    oom = {"run_id": "a", "config_hash": h, "status": "oom", "budget_mb": "1000.0"}
    assert out_of_memory([oom], cfg, 1000.0) == oom
    assert out_of_memory([oom], cfg, 2000.0) is None  # a larger budget may hold it
    assert out_of_memory([oom, {**oom, "run_id": "b", "status": "ok"}], cfg, 1000.0) is None
    assert out_of_memory([{**oom, "config_hash": "another"}], cfg, 1000.0) is None


SMALL = [
    "framework=torch",
    "model=tiny",
    "seq_len=512",
    "steps=1",
    "warmup_steps=1",
    "data.num_train=256",
    "logger=none",
]


def capacity(*args: str, tmp_path) -> subprocess.CompletedProcess:
    cmd = [sys.executable, "-m", "bench", "capacity", *args, *SMALL, f"results_dir={tmp_path}"]
    return subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=900)


def measured_peaks(tmp_path, *batches: int) -> dict[int, float]:
    """Each batch's backprop trial in a fresh trial process of its own, as the runner spawns one, side by side; its
    peak memory: the whole process's (the interpreter, torch, the weights), as a probe's."""
    tmp_path.mkdir(parents=True)
    procs = {}
    for b in batches:
        cfg = composed(*SMALL, "mode=backprop", f"batch_size={b}", f"results_dir={tmp_path}")
        payload, result = tmp_path / f"{b}.json", tmp_path / f"{b}.out.json"
        payload.write_text(json.dumps(to_dict(cfg)))
        env = {**os.environ, **trial_env(cfg, SCENARIOS["model"]), **child_env()}
        procs[b] = (
            result,
            subprocess.Popen(
                [sys.executable, "-m", TRIAL_MODULE, str(payload), str(result)],
                cwd=REPO,
                env=env,
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,
            ),
        )
    peaks = {}
    for b, (result, proc) in procs.items():
        log = proc.communicate(timeout=900)[0].decode(errors="replace")
        assert proc.returncode == 0, log[-3000:]
        peaks[b] = json.loads(result.read_text())["peak_mem_mb"]
    return peaks


@pytest.mark.slow
def test_a_real_search_between_two_measured_batches(tmp_path):
    """The budget is placed between the peaks of two batch sizes measured first: the search lands between them,
    the largest value's probe ran ok and the next one's did not, and every probe is a row of runs.csv."""
    peak = measured_peaks(tmp_path / "measured", 2, 12)
    budget = (peak[2] + peak[12]) / 2
    out = capacity(f"budget_mb={budget:.0f}", "mode=backprop", tmp_path=tmp_path)
    assert out.returncode == 0, out.stderr
    (result,) = read_rows(tmp_path / "capacity.csv")
    assert result["verdict"] == "fits" and 2 <= int(result["max_value"]) < 12, result
    probes = {r["run_id"]: r for r in read_rows(tmp_path / "runs.csv")}
    assert set(result["probe_run_ids"].split()) == set(probes) and int(result["probes"]) == len(probes) <= 12
    largest, beyond = (
        next(r for r in probes.values() if int(r["batch_size"]) == v)
        for v in (int(result["max_value"]), int(result["max_value"]) + 1)
    )
    assert largest["status"] == "ok" and float(largest["peak_mem_mb"]) <= budget
    # the next one ran out (the watchdog killed it), or ran past the budget between the watchdog's samples
    assert beyond["status"] == "oom" or float(beyond["peak_mem_mb"]) > budget
    assert "largest" in out.stdout and "fits" in out.stdout  # the table it prints at the end


@pytest.mark.slow
def test_a_budget_too_small_for_one_example_is_a_result(tmp_path):
    out = capacity("budget_mb=50", "mode=backprop", tmp_path=tmp_path)
    assert out.returncode == 0, out.stderr
    (result,) = read_rows(tmp_path / "capacity.csv")
    assert result["verdict"] == "does not fit" and result["max_value"] == "" and result["probes"] == "1"
    assert [r["status"] for r in read_rows(tmp_path / "runs.csv")] == ["oom"]


@pytest.mark.parametrize(
    "args, expected",
    [
        (["batch_size=4", "budget_mb=100"], "batch_size: it is what --search=batch_size varies"),
        (["--search", "vocab", "budget_mb=100"], "argument --search: invalid choice: 'vocab'"),
        pytest.param(
            ["mode=backprop"],
            "budget_mb=null: no GPU here to take the budget from",
            marks=pytest.mark.skipif(bool(shutil.which("nvidia-smi")), reason="a GPU gives the budget"),
        ),
        (["budget_mb=0"], "budget_mb=0.0: must be a number >= 1"),
        # bounded: a typo must not probe until killed
        (["--max-probes", "1000000000", "budget_mb=100"], "accepted start >= 1, max-probes in [3, 64]"),
    ],
)
def test_bad_input_is_one_line(tmp_path, args, expected):
    out = bench_here("capacity", *args, *SMALL, results=tmp_path)  # refused before any probe: no process needed
    assert out.returncode == 2 and len(out.stderr.strip().splitlines()) == 1 and expected in out.stderr, out.stderr
    assert not (tmp_path / "runs.csv").exists()
