"""A recorded trial can be run again from the config it kept (python -m bench rerun RUN_ID) and repeats its
losses bit for bit, dropout on; a run_id that is not recorded, or whose config is missing or damaged, is one line
and exit 2, and nothing runs. The trial is recorded in the test's process (run_here) and run again by the command,
in a process of its own: the same losses either way."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from bench.config import default
from bench.harness import rerun
from bench.store.read import read_rows
from tests.support import bench_here, run_here

REPO = Path(__file__).resolve().parents[2]
TRIAL = [
    "model=tiny",
    "batch_size=4",
    "seq_len=32",
    "steps=3",
    "warmup_steps=1",
    "data.num_train=64",
    "data.num_eval=16",
    "logger=none",
]


def bench(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "bench", *args], cwd=REPO, capture_output=True, text=True, timeout=600)


@pytest.fixture(scope="module")
def recorded(tmp_path_factory):
    results = tmp_path_factory.mktemp("rerun")
    (outcome,) = run_here(*TRIAL, "framework=torch", "mode=jvp", results=results)
    assert outcome["status"] == "ok", outcome
    (row,) = read_rows(results / "runs.csv")
    return results, row["run_id"]


@pytest.mark.slow
def test_a_rerun_repeats_the_losses_bit_for_bit(recorded):
    results, run_id = recorded
    out = bench("rerun", run_id, "--results", str(results))
    assert out.returncode == 0, out.stdout + out.stderr
    assert f"{run_id} -> " in out.stdout and "losses identical, bit for bit, over 3 steps" in out.stdout
    rows = read_rows(results / "runs.csv")
    assert len(rows) == 2 and rows[0]["config_hash"] == rows[1]["config_hash"]
    assert rows[0]["loss_last"] == rows[1]["loss_last"]
    assert rows[1]["deterministic"] == "False" and int(rows[1]["num_threads"]) >= 1


def test_bad_run_ids_and_configs_are_one_line_and_run_nothing(recorded, tmp_path):
    results, run_id = recorded
    before = len(read_rows(results / "runs.csv"))
    out = bench_here("rerun", "20990101-000000-torch-jvp-nope", "--results", str(results))
    assert out.returncode == 2 and len(out.stderr.strip().splitlines()) == 1
    assert "run_id=20990101-000000-torch-jvp-nope: not recorded in" in out.stderr
    config = results / "configs" / f"{run_id}.json"
    saved = config.read_text()
    try:
        config.write_text(saved[: len(saved) // 2])  # cut off: not JSON
        out = bench_here("rerun", run_id, "--results", str(results))
        assert out.returncode == 2 and "its config" in out.stderr and "is damaged" in out.stderr
        config.unlink()
        out = bench_here("rerun", run_id, "--results", str(results))
        assert out.returncode == 2 and "is missing" in out.stderr and "nothing was run" in out.stderr
    finally:
        config.write_text(saved)
    assert len(read_rows(results / "runs.csv")) == before


@pytest.mark.parametrize("run_id", ["../rerun/x", "history/x", "/etc/passwd", "..", "a\\b"])
def test_a_path_is_not_a_run_id(recorded, run_id):
    """A run_id names its files (history/, configs/): a path is refused as one, even where a row carries it (a
    results folder someone sent), not read as a trial that records no losses."""
    results, _ = recorded
    path = results / "elsewhere"
    path.mkdir(exist_ok=True)
    shutil.copy(results / "runs.csv", path / "runs.csv")
    with (path / "runs.csv").open("a") as f:
        f.write(run_id + "," * (len(read_rows(results / "runs.csv")[0]) - 1) + "\n")
    out = bench_here("rerun", run_id, "--results", str(path))
    assert out.returncode == 2 and out.stderr.strip() == (
        f"bench rerun: error: run_id={run_id}: not a run_id (a file name, never a path); accepted: a run_id of "
        f"{path}'s rows, e.g. 20260101-120000-torch-backprop-1a2b3c"
    )


def test_a_saved_config_naming_a_package_to_import_runs_nothing(recorded, tmp_path, monkeypatch):
    """A results folder can come from someone else: its saved config's package: checkpoint is checked against the
    known weight packages, never imported."""
    results, run_id = recorded
    ran = tmp_path / "ran"
    (tmp_path / "planted.py").write_text(f"open({str(ran)!r}, 'w').close()\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    config = results / "configs" / f"{run_id}.json"
    saved = config.read_text()
    before = len(read_rows(results / "runs.csv"))
    try:
        cfg = json.loads(saved)
        cfg["model"]["checkpoint"] = "package:planted"
        config.write_text(json.dumps(cfg))
        out = bench_here("rerun", run_id, "--results", str(results))
    finally:
        config.write_text(saved)
    assert out.returncode == 2 and len(out.stderr.strip().splitlines()) == 1, out.stderr
    assert "model.checkpoint='package:planted': not a known weight package" in out.stderr
    assert not ran.exists() and "planted" not in sys.modules
    assert len(read_rows(results / "runs.csv")) == before


@pytest.mark.skipif(os.geteuid() == 0 and shutil.which("setpriv") is None, reason="root without setpriv")
def test_a_rerun_into_folders_it_cannot_write_is_one_line_and_runs_nothing(recorded):
    results, run_id = recorded
    before = (results / "runs.csv").read_bytes()
    caps = "-dac_override,-dac_read_search"  # root writes anything: drop the capability that lets it (as CI runs)
    setpriv = ["setpriv", f"--inh-caps={caps}", f"--bounding-set={caps}"] if os.geteuid() == 0 else []
    for folder in ("history", "configs"):
        (results / folder).chmod(0o555)
        try:
            out = subprocess.run(
                [*setpriv, sys.executable, "-m", "bench", "rerun", run_id, "--results", str(results)],
                cwd=REPO,
                capture_output=True,
                text=True,
                timeout=300,
            )
        finally:
            (results / folder).chmod(0o755)
        assert out.returncode == 2 and len(out.stderr.strip().splitlines()) == 1, out.stderr
        assert f"its {folder}/ folder cannot be written" in out.stderr
    assert (results / "runs.csv").read_bytes() == before


def test_a_saved_config_holding_an_interpolation_runs_nothing_and_leaks_nothing(recorded, monkeypatch):
    """The issue's case: `"sweep_id": "${oc.env:WANDB_API_KEY}"` in a results folder someone sent wrote the key's
    value into runs.csv and the rerun's config; now one line naming the key, exit 2, nothing recorded."""
    results, run_id = recorded
    monkeypatch.setenv("BENCH_TEST_SECRET", "s3cr3t-token-value")
    config = results / "configs" / f"{run_id}.json"
    saved = config.read_text()
    before = (results / "runs.csv").read_bytes(), sorted((results / "configs").iterdir())
    try:
        config.write_text(json.dumps({**json.loads(saved), "sweep_id": "${oc.env:BENCH_TEST_SECRET}"}))
        out = bench_here("rerun", run_id, "--results", str(results))
    finally:
        config.write_text(saved)
    assert out.returncode == 2 and len(out.stderr.strip().splitlines()) == 1, out.stderr
    assert "sweep_id holds an interpolation" in out.stderr and "not accepted from a saved config" in out.stderr
    assert "s3cr3t" not in out.stdout + out.stderr
    assert ((results / "runs.csv").read_bytes(), sorted((results / "configs").iterdir())) == before


def test_a_rerun_never_reads_the_compilation_cache_its_saved_config_names(recorded, tmp_path, monkeypatch):
    """XLA loads what its cache folder holds as compiled code: a saved config's compile_cache_dir (a folder in a
    results folder someone sent) is not the one a rerun uses; the host's default is."""
    results, run_id = recorded
    ran = []
    monkeypatch.setattr(rerun, "run_job", lambda cfg, scenarios: ran.append(cfg) or {"status": "error", "run_id": "x"})
    config = results / "configs" / f"{run_id}.json"
    saved = config.read_text()
    try:
        config.write_text(json.dumps({**json.loads(saved), "compile_cache_dir": str(tmp_path / "planted")}))
        out = bench_here("rerun", run_id, "--results", str(results))
    finally:
        config.write_text(saved)
    assert out.returncode == 1 and [c.compile_cache_dir for c in ran] == [default("compile_cache_dir")], out.stderr
