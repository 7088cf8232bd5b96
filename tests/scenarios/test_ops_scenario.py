"""scenario=ops (bench/scenarios/ops/): the ops trial end to end (ops.csv), a crash that keeps the finished rows,
bad input refused in one line, and the report's ops section. Each op's derivatives in each framework:
tests/frameworks/test_ops.py."""

from __future__ import annotations

import pytest

from bench.ops_spec import OP_NAMES
from bench.report.build import build, results_of
from bench.scenarios import SCENARIOS
from bench.scenarios.ops.columns import COLUMNS as OPS_CSV_COLUMNS
from bench.scenarios.ops.report import OpsSection, summary_table
from bench.store.csv import CsvSink
from bench.store.read import read_rows
from tests.support import bench, bench_here

# ---------------------------------------------------------------------------------------------------------------
# the trial, as a user runs it


# tiny and quick: one size, two samples of single calls
QUICK = ["scenario=ops", "ops.sizes=[8]", "ops.shapes=[[2,3]]", "ops.repeats=2", "ops.min_sample_s=0", "logger=none"]


@pytest.mark.slow
def test_ops_sweep_writes_ok_rows_for_every_op_and_framework(tmp_path):
    out = bench("-m", "framework=torch,jax", "threads=1", *QUICK, f"results_dir={tmp_path}")
    rows = read_rows(tmp_path / "ops.csv")
    assert len(rows) == 2 * len(OP_NAMES) * 2
    assert {(r["framework"], r["execution"]) for r in rows} == {("torch", "eager"), ("jax", "jit")}
    for r in rows:
        assert r["status"] == "ok", (r["op"], r["error"])
        assert r["threads"] == "1" and r["num_threads"] == "1" and r["device"] == "cpu" and r["dtype"] == "fp32"
        assert float(r["jvp_err"]) <= float(r["tolerance"]) and float(r["vjp_err"]) <= float(r["tolerance"])
        for col in ("primal_s", "jvp_s", "vjp_s", "vjp_backward_s"):
            assert 0 < float(r[col]) < 1, col
        assert float(r["jvp_over_primal"]) == pytest.approx(float(r["jvp_s"]) / float(r["primal_s"]))
        assert r["git_sha"] and r["config_hash"] and r["run_id"]
    assert {r["shape"] for r in rows} == {"8x8", "2x3"}
    assert not (tmp_path / "runs.csv").exists()  # the model scenario's file is untouched
    assert "[2/2]" in out.stdout and "vjp/primal" in out.stdout  # progress, and the summary at the sweep's end


@pytest.mark.slow
@pytest.mark.cuda
def test_ops_trial_on_cuda(tmp_path):
    bench("-m", "framework=torch,jax", "device=cuda", *QUICK, "ops.names=[matmul,exp]", f"results_dir={tmp_path}")
    rows = read_rows(tmp_path / "ops.csv")
    assert len(rows) == 8 and all(r["status"] == "ok" and r["device"] == "cuda" for r in rows), rows


@pytest.mark.slow
def test_a_crash_keeps_the_finished_rows(tmp_path):
    proc = bench(
        "framework=torch",
        *QUICK,
        "ops.names=[add,matmul,sum]",
        "ops.shapes=[]",
        f"results_dir={tmp_path}",
        env={"BENCH_INJECT_FAULT": "op=matmul:segv"},
        check=False,
    )
    assert proc.returncode == 1  # a crashed trial fails the command
    add, matmul, total = read_rows(tmp_path / "ops.csv")
    assert add["op"] == "add" and add["status"] == "ok"
    assert matmul["status"] == "crashed" and "SIGSEGV" in matmul["error"]
    assert total["status"] == "crashed" and total["error"] == "not reached: the trial ended in matmul 8x8 (crashed)"


def test_a_resumed_sweeps_summary_shows_the_run_that_made_a_trial_skip():
    """Resume skips an ops trial on its latest run whose every row finished; the sweep's summary shows that run's
    rows for it, not a later run that crashed part-way, and never another configuration's."""
    rows = [
        {"config_hash": "a", "sweep_id": "old", "run_id": "1", "status": "ok", "started_at": "1"},
        {"config_hash": "a", "sweep_id": "old", "run_id": "1", "status": "ok", "started_at": "1"},
        {"config_hash": "a", "sweep_id": "old", "run_id": "2", "status": "ok", "started_at": "2"},
        {"config_hash": "a", "sweep_id": "old", "run_id": "2", "status": "crashed", "started_at": "2"},
        {"config_hash": "b", "sweep_id": "old", "run_id": "3", "status": "ok", "started_at": "3"},
        {"config_hash": "c", "sweep_id": "new", "run_id": "4", "status": "ok", "started_at": "4"},
    ]
    shown = SCENARIOS["ops"].sweep_rows(rows, ["a", "c"], "new")
    assert [r["run_id"] for r in shown] == ["4", "1", "1"]


@pytest.mark.parametrize(
    "args,expected",
    [
        (["scenario=ops", "ops.names=[add,nope]"], "ops.names=nope: unknown op; accepted: add, broadcast, copy,"),
        (["scenario=ops", "threads=4"], "threads=4: accepted 1 | all"),
        (["scenario=ops", "dtype=fp16"], "dtype=fp16: accepted fp32 | fp64 | bf16"),
        (["scenario=ops", "ops.sizes=[0]"], "ops.sizes=0: accepted integers >= 1"),
        (["scenario=ops", "ops.shapes=[64,4096]"], "ops.shapes=[64, 4096]: accepted a list of [rows, cols] pairs"),
        (["scenario=ops", "ops.warmup=0"], "ops.warmup=0: accepted an integer in [1, 10,000]"),
        (["scenario=ops", "ops=nope"], "ops=nope: unknown option; accepted: default, large"),
        (["scenario=bench"], "scenario=bench: accepted model | ops"),
        (["threads=1"], "threads=1: applies to scenario=ops only"),
    ],
)
def test_bad_ops_config_is_one_line_and_nothing_runs(tmp_path, args, expected):
    proc = bench_here(*args, results=tmp_path)  # refused before any trial: the command's main, in this process
    assert proc.returncode == 2
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("bench: error: ") and expected in lines[0], proc.stderr
    assert not (tmp_path / "ops.csv").exists() and not (tmp_path / "hydra").exists()


# ---------------------------------------------------------------------------------------------------------------
# the report


def fake_rows() -> list[dict]:
    rows = []
    for framework, execution, speed in (("torch", "eager", 1.0), ("jax", "jit", 0.8)):
        for threads, par in (("all", 2.0), ("1", 1.0)):
            for op in ("add", "matmul"):
                for n in (64, 256):
                    primal = speed * (n / 64) ** (3 if op == "matmul" else 2) * 1e-5 / par
                    rows.append(
                        {
                            "run_id": f"{framework}-{threads}",
                            "framework": framework,
                            "execution": execution,
                            "op": op,
                            "shape": f"{n}x{n}",
                            "rows": n,
                            "cols": n,
                            "dtype": "fp32",
                            "threads": threads,
                            "num_threads": 2 if threads == "all" else 1,
                            "device": "cpu",
                            "primal_s": primal,
                            "jvp_s": 3 * primal,
                            "vjp_s": 3 * primal,
                            "vjp_backward_s": 2 * primal,
                            "jvp_over_primal": 3.0,
                            "vjp_over_primal": 3.0,
                            "status": "ok",
                        }
                    )
    rows.append({**rows[0], "shape": "64x4096", "rows": 64, "cols": 4096})
    rows.append({**rows[0], "op": "exp", "status": "oom", "error": "MemoryError: injected", "primal_s": None})
    return rows


@pytest.mark.slow
def test_ops_report_draws_every_plot(tmp_path):
    csv = tmp_path / "ops.csv"
    sink = CsvSink(csv, OPS_CSV_COLUMNS)
    for r in fake_rows():
        sink.write(r)
    text = build([OpsSection()], results_of([tmp_path]), tmp_path / "out").text  # the results folder: its ops.csv
    plots = sorted(p.name for p in (tmp_path / "out" / "plots").glob("*.png"))
    assert plots == [
        "ops_ratios_cpu_fp32_threads-1.png",
        "ops_ratios_cpu_fp32_threads-all.png",
        "ops_threads_cpu_fp32.png",
        "ops_time_cpu_fp32_threads-1.png",
        "ops_time_cpu_fp32_threads-all.png",
    ]
    for name in plots:
        assert f"(plots/{name})" in text
    assert "| matmul | 256 |" in text and "3.00×" in text and "64x4096" in text
    assert "MemoryError: injected" in text  # the failed op is listed, never plotted
    table = summary_table(read_rows(csv))
    assert "jax jit" in table and "matmul" in table and "oom" in table


def test_ops_report_cli(tmp_path):
    """The ops section is part of the one report: `python -m bench report RESULTS` reads the folder's ops.csv."""
    run = lambda *a: bench_here("report", *a)  # the command's main in this process: no trial to isolate
    missing = run(str(tmp_path / "none.csv"))
    assert missing.returncode == 2 and missing.stderr.count("\n") == 1 and "no such file" in missing.stderr
    csv = tmp_path / "ops.csv"
    CsvSink(csv, OPS_CSV_COLUMNS).write(fake_rows()[0])
    ok = run(str(tmp_path), "--out", str(tmp_path / "out"))
    assert ok.returncode == 0, ok.stderr
    # only ops.csv in the results: the report is the ops section alone
    assert (tmp_path / "out" / "report.md").read_text().startswith("# bench report\n\n## Op-level AD micro-benchmarks")
