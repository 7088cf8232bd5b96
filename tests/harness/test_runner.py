"""The runner as a user drives it: `python -m bench ...` in a subprocess, results read back from the CSV. What the
process is the point of (the CLI's sweep and its output, a memory limit, a crash, a timeout, resume, the launchers)
runs as the user runs it; what a trial measures and records (W&B, max_timed_s, evaluation) is measured in the test's
process by the same runner (run_here)."""

from __future__ import annotations

import dataclasses
import json
import os
import shlex
import subprocess
import sys

import pytest

from bench.harness.runner import LOG_TAIL_LINES, log_tail, record_job, recorded_finished, trial_env
from bench.scenarios import SCENARIOS
from bench.store.wandb import read_wandb_offline
from tests.support import FAST, REPO, bench, composed, rows, run_here


@pytest.mark.slow
def test_multirun_records_every_trial_ok_with_plausible_numbers(tmp_path):
    results = tmp_path / "sweep | touch $PWNED"  # a folder's name a pasted command must not run
    out = bench("-m", "framework=torch,jax", "mode=inference,backprop", *FAST, "logger=none", results=results)
    rs = rows(results)
    assert len(rs) == 4, out.stdout
    assert {(r["framework"], r["mode"]) for r in rs} == {
        (f, m) for f in ("torch", "jax") for m in ("inference", "backprop")
    }
    for r in rs:
        assert r["status"] == "ok", r["error"]
        assert r["device"] == "cpu" and r["mem_method"] == "rss_hwm"
        assert 0 < float(r["step_time_p10_s"]) <= float(r["step_time_median_s"]) <= float(r["step_time_p90_s"])
        assert float(r["compile_time_s"]) > 0 and float(r["samples_per_s"]) > 0
        assert 100 < float(r["peak_mem_mb"]) < 8000  # an interpreter with a framework and a 1 M-param model
        assert float(r["peak_mem_mb"]) >= float(r["baseline_mem_mb"])
        assert 1.0 < float(r["loss_first"]) < 2.0  # ~ln(4) for 4 classes at init
        assert int(r["n_params"]) == 1011492 and r["git_sha"] and r["config_hash"]
    # both frameworks started from the same weights and saw the same batches
    assert len({r["weights_digest"] for r in rs}) == 1
    assert len({r["data_fingerprint"] for r in rs}) == 1
    assert len({r["sweep_id"] for r in rs}) == 1
    # the sweep prints progress and a summary table at the end, then the command for its report, which works
    # pasted into a shell as printed
    assert "[4/4]" in out.stdout and "excess MiB" in out.stdout
    lines = out.stdout.strip().splitlines()
    assert lines[-1] == "bench: 4 trial(s): 4 ok"  # the last line counts the trials by status
    command = lines[-2].split("tables and plots: ")[1]
    assert command == f"python -m bench report '{results}' --out '{results}'"
    pasted = shlex.quote(sys.executable) + command.removeprefix("python")
    report = subprocess.run(
        pasted,
        shell=True,
        capture_output=True,
        text=True,
        cwd=REPO,
        env={**os.environ, "PWNED": str(tmp_path / "pwned")},
    )
    assert report.returncode == 0, report.stderr
    assert "| jax | backprop |" in (results / "report.md").read_text() and not (tmp_path / "pwned").exists()


@pytest.mark.slow
def test_wandb_offline_run_holds_the_logged_metrics(tmp_path):
    run_here("framework=torch", "mode=backprop", *FAST, "logger=wandb", results=tmp_path)
    (row,) = rows(tmp_path)
    runs = list((tmp_path / "wandb").glob("offline-run-*"))
    assert len(runs) == 1
    logged = read_wandb_offline(runs[0])
    assert logged["complete"]
    assert logged["summary"]["run_id"] == row["run_id"]
    assert float(logged["summary"]["step_time_median_s"]) == pytest.approx(float(row["step_time_median_s"]))
    assert logged["config"]["mode"] == "backprop" and logged["config"]["model.num_layers"] == 2
    assert len(logged["history"]) == 3 and all("loss" in h and "step_time_s" in h for h in logged["history"])


@pytest.mark.slow
def test_host_memory_limit_is_oom_and_the_sweep_goes_on(tmp_path):
    # 50 MiB is below what a Python process with torch imported needs: the watchdog kills the first trial.
    out = bench(
        "-m", "framework=torch", "mode=inference", "max_host_mem_mb=50,null", *FAST, "logger=none", results=tmp_path
    )
    first, second = rows(tmp_path)
    assert first["status"] == "oom" and "max_host_mem_mb=50" in first["error"]
    assert float(first["peak_mem_mb"]) > 50
    assert second["status"] == "ok"
    assert "OOM" in out.stdout


@pytest.mark.slow
@pytest.mark.parametrize("fault,signal_name", [("segv", "SIGSEGV"), ("abort", "SIGABRT")])
def test_a_dying_trial_is_recorded_as_crashed(tmp_path, fault, signal_name):
    proc = bench(
        "framework=torch",
        "mode=backprop",
        *FAST,
        "logger=none",
        results=tmp_path,
        env={"BENCH_INJECT_FAULT": f"after_warmup:{fault}"},
        check=False,
    )
    assert proc.returncode == 1  # a trial that crashed: the command fails, for scripts to see
    (row,) = rows(tmp_path)
    assert row["status"] == "crashed"
    assert signal_name in row["error"]
    if fault == "segv":
        assert "Fatal Python error" in row["error"] or "Segmentation fault" in row["error"]


@pytest.mark.slow
def test_timeout_is_recorded(tmp_path):
    bench("framework=torch", "mode=backprop", *FAST, "logger=none", "timeout_s=1", results=tmp_path)
    (row,) = rows(tmp_path)
    assert row["status"] == "timeout" and "timeout_s=1" in row["error"]


@pytest.mark.slow
def test_resume_skips_trials_recorded_ok(tmp_path):
    run_here("-m", "framework=torch", "mode=inference,backprop", *FAST, "logger=none", results=tmp_path)
    assert [r["status"] for r in rows(tmp_path)] == ["ok", "ok"]
    out = bench(
        "-m", "framework=torch", "mode=inference,backprop,mezo", *FAST, "logger=none", "resume=true", results=tmp_path
    )
    rs = rows(tmp_path)
    assert [r["mode"] for r in rs] == ["inference", "backprop", "mezo"]  # only the new trial ran
    assert out.stdout.count(": skipped (recorded ok as") == 2
    assert "mezo" in out.stdout.split("excess MiB")[-1]  # the summary covers the whole sweep, resumed trials too
    assert out.stdout.strip().splitlines()[-1] == "bench: 3 trial(s): 2 skipped, 1 ok"


def test_resume_finds_the_latest_run_whose_every_row_finished(tmp_path):
    """What resume skips, on made-up rows: a run whose every row is ok or diverged (a tuning search's unstable
    learning rate, the same at every run of its seed); never one with a row that crashed, timed out, ran out of
    memory or raised, nor another configuration's."""
    made_up = [
        ("ok_then_error", "r1", "ok"),  # an earlier run finished, a later one failed: the earlier one stands
        ("ok_then_error", "r2", "error"),
        ("diverged", "r3", "diverged"),
        ("ops", "r4", "ok"),  # an ops trial: a row per op and shape, one of them failed
        ("ops", "r4", "crashed"),
        ("timeout", "r5", "timeout"),
        ("oom", "r6", "oom"),
        ("two_ok", "r7", "ok"),
        ("two_ok", "r8", "ok"),  # the latest
    ]
    csv_path = tmp_path / "runs.csv"
    csv_path.write_text("config_hash,run_id,status\n" + "".join(f"{h},{r},{s}\n" for h, r, s in made_up))
    runs = lambda h: [r["run_id"] for r in recorded_finished(csv_path, h)]  # noqa: E731
    found = {h: runs(h) for h, _, _ in made_up} | {"other": runs("other")}
    assert found == {
        "ok_then_error": ["r1"],
        "diverged": ["r3"],
        "ops": [],
        "timeout": [],
        "oom": [],
        "two_ok": ["r8"],
        "other": [],
    }


def test_resume_matches_only_rows_of_the_trials_own_kind(tmp_path):
    """A rerun keeps its trial's config_hash (tuning is not in it), yet a resumed search must not take a
    `tuning=rerun` row (python -m bench rerun of a search trial) for the search point it shadows: the point runs
    again, and once its own row is recorded, resume skips it. Made-up outcomes, no trial process."""
    cfg = composed("model=tiny", "logger=none", f"results_dir={tmp_path}", "tuning=search", "tune_group=g")
    ran = []

    def diverge(cfg, scenario, run_id, results_dir, task):  # a finished outcome resume would skip on
        ran.append(cfg.tuning)
        return {"status": "diverged", "error": "loss nan"}

    record = lambda **kw: record_job(dataclasses.replace(cfg, **kw), SCENARIOS["model"], run_trial=diverge)  # noqa: E731
    record(tuning="rerun")
    assert record(resume=True)["status"] == "diverged"  # run, not skipped as the rerun's row
    assert record(resume=True)["status"] == "skipped" and ran == ["rerun", "search"]
    assert [r["tuning"] for r in rows(tmp_path)] == ["rerun", "search"]
    h = rows(tmp_path)[0]["config_hash"]
    kinds = {k: [r["tuning"] for r in recorded_finished(tmp_path / "runs.csv", h, k)] for k in ("search", "rerun")}
    assert kinds == {"search": ["search"], "rerun": ["rerun"]} and recorded_finished(tmp_path / "runs.csv", h) == []


# ---------------------------------------------------------------------------------------------------------------
# launchers: every trial is still its own process, whoever launches the jobs


@pytest.mark.slow
@pytest.mark.parametrize("launcher", ["joblib", "submitit_local"])
def test_parallel_and_slurm_style_launchers_record_every_trial(tmp_path, launcher):
    extra = ["hydra.launcher.n_jobs=2"] if launcher == "joblib" else ["hydra.launcher.timeout_min=10"]
    out = bench(
        "-m",
        f"hydra/launcher={launcher}",
        *extra,
        "framework=torch,jax",
        "mode=inference",
        *FAST,
        "logger=none",
        results=tmp_path,
    )
    rs = rows(tmp_path)
    assert sorted(r["framework"] for r in rs) == ["jax", "torch"], out.stdout + out.stderr
    assert all(r["status"] == "ok" for r in rs), [r["error"] for r in rs]
    assert len({r["sweep_id"] for r in rs}) == 1
    assert "excess MiB" in out.stdout  # the summary table, printed by the launching process


# ---------------------------------------------------------------------------------------------------------------
# experiments and the optional measurements


@pytest.mark.slow
def test_max_timed_s_stops_the_timed_steps_and_says_how_many_ran(tmp_path):
    run_here("framework=torch", "mode=backprop", *FAST, "steps=50", "max_timed_s=0", "logger=none", results=tmp_path)
    (row,) = rows(tmp_path)
    assert row["status"] == "ok" and row["steps_timed"] == "1" and row["steps"] == "50"


@pytest.mark.slow
def test_evaluate_and_gradient_cosine_are_recorded(tmp_path):
    run_here(
        "-m",
        "framework=torch,jax",
        "mode=jvp",
        *FAST,
        "jvp.num_tangents=2",
        "evaluate=true",
        "eval_every=2",
        "measure_grad_cosine=true",
        "logger=none",
        results=tmp_path,
    )
    rs = rows(tmp_path)
    assert len(rs) == 2
    for r in rs:
        assert r["status"] == "ok", r["error"]
        assert 0 <= float(r["eval_accuracy"]) <= 1 and 1.0 < float(r["eval_loss"]) < 2.0
        assert -1 <= float(r["grad_cosine"]) <= 1 and float(r["grad_cosine"]) != 0
        history = json.loads((tmp_path / "history" / f"{r['run_id']}.json").read_text())
        assert len(history["loss"]) == 3 and history["eval_accuracy"][1] is not None
    # both frameworks evaluated the same held-out examples
    assert {(r["eval_examples"], r["eval_fingerprint"]) for r in rs} == {("16", rs[0]["eval_fingerprint"])}


def test_jax_trials_get_the_memory_minimising_xla_cpu_scheduler(monkeypatch):
    flag = "--xla_cpu_enable_concurrency_optimized_scheduler"
    monkeypatch.setenv("XLA_FLAGS", "--xla_force_host_platform_device_count=1")
    env = lambda framework: trial_env(composed("device=cpu", f"framework={framework}"), SCENARIOS["model"])
    jax_env = env("jax")
    assert jax_env["XLA_FLAGS"] == f"--xla_force_host_platform_device_count=1 {flag}=false"
    assert "XLA_FLAGS" not in env("torch")
    monkeypatch.setenv("XLA_FLAGS", f"{flag}=true")  # the user's own choice stands
    assert "XLA_FLAGS" not in env("jax")


def test_a_crash_row_names_the_fatal_error_however_long_the_dump(tmp_path):
    """faulthandler dumps every thread and extension module after its "Fatal Python error" line: with many
    threads that line falls out of the log's tail, and the row must still say what killed the trial."""
    log = tmp_path / "trial.log"
    dump = [f'  File "x.py", line {i} in f' for i in range(40)]
    log.write_text("\n".join(["setup", "Fatal Python error: Segmentation fault", "", *dump, "Extension modules: a"]))
    tail = log_tail(log)
    assert tail.startswith("Fatal Python error: Segmentation fault | ") and tail.endswith("Extension modules: a")
    assert tail.count(" | ") == LOG_TAIL_LINES and "setup" not in tail
    log.write_text("one\ntwo\n")
    assert log_tail(log) == "one | two"  # no fatal line: the tail as it is
