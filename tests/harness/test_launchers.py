"""Trials beyond one node's processes, as a user launches them: a multi-task submitit job runs one trial process
per task (torch: its rank over env://; jax: one process of jax.distributed), and only the first task records
the trial; a launcher that cannot start a trial's processes is refused before anything runs."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from tests.support import FAST, REPO, bench_here, rows, run_here

TINY = [*FAST, "model.dropout=0", "logger=none"]


@pytest.mark.slow
def test_a_two_task_submitit_job_writes_one_row_per_trial(tmp_path):
    """submitit_local with tasks_per_node=2: each task starts its own rank; the losses are the single-device
    trial's of the global batch, as when the runner starts both ranks itself."""
    cmd = [
        sys.executable,
        "-m",
        "bench",
        "-m",
        "hydra/launcher=submitit_local",
        "hydra.launcher.tasks_per_node=2",
        "hydra.launcher.timeout_min=10",
        "framework=torch,jax",
        "parallel=ddp",
        "devices=2",
        "mode=backprop",
        *TINY,
        f"results_dir={tmp_path}",
    ]
    with (tmp_path / "job.log").open("w+") as log:
        job = subprocess.Popen(cmd, cwd=REPO, stdout=log, stderr=subprocess.STDOUT, text=True)
        try:  # meanwhile the single-device reference in this process: what is compared is its losses, not its process
            run_here("-m", "framework=torch,jax", "mode=backprop", *TINY, "batch_size=8", results=tmp_path / "one")
            job.wait(timeout=600)
        finally:
            job.kill()  # a no-op for one that ended
        log.seek(0)
        out = log.read()
    assert job.returncode == 0, out
    rs = rows(tmp_path)
    assert sorted(r["framework"] for r in rs) == ["jax", "torch"], out
    assert all(r["status"] == "ok" for r in rs), [r["error"] for r in rs]
    assert {r["world_size"] for r in rs} == {"2"} and {r["global_batch_size"] for r in rs} == {"8"}
    single = {r["framework"]: r for r in rows(tmp_path / "one")}
    for r in rs:
        losses = json.loads((tmp_path / "history" / f"{r['run_id']}.json").read_text())["loss"]
        reference = json.loads((tmp_path / "one" / "history" / f"{single[r['framework']]['run_id']}.json").read_text())
        assert losses == pytest.approx(reference["loss"], rel=1e-5), r["framework"]


@pytest.mark.parametrize(
    "args, expected",
    [
        (
            ["parallel=ddp", "devices=2", "nodes=2"],
            "nodes=2: the launcher starts 1 node(s); accepted: "
            "hydra/launcher=submitit_slurm hydra.launcher.nodes=2 hydra.launcher.tasks_per_node=2",
        ),
        (
            ["parallel=ddp", "devices=2", "hydra/launcher=submitit_local", "hydra.launcher.tasks_per_node=3"],
            "hydra.launcher.tasks_per_node=3: a torch trial with parallel=ddp devices=2 runs 2 process(es) per node",
        ),
        (
            ["hydra/launcher=submitit_local", "hydra.launcher.tasks_per_node=2"],
            "hydra.launcher.tasks_per_node=2: a torch trial with parallel=none devices=1 runs 1 process(es) per node",
        ),
    ],
)
def test_a_launcher_that_cannot_start_the_trial_is_refused(tmp_path, args, expected):
    proc = bench_here("-m", "framework=torch", "mode=backprop", *TINY, *args, results=tmp_path)  # before any trial
    assert proc.returncode == 2 and proc.stderr.strip().startswith(f"bench: error: {expected}"), proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1 and not (tmp_path / "runs.csv").exists()
