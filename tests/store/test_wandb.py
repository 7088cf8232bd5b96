"""W&B runs (bench/store/wandb.py): the helpers that shape a run (flattened config, secrets scrubbed, mode,
tags), and what an offline W&B run really contains, read back from W&B's own files."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from bench.scenarios.model.columns import COLUMNS as CSV_COLUMNS
from bench.store import wandb as wandb_runs
from bench.store.csv import CsvSink
from bench.store.read import read_rows
from bench.store.wandb import (
    DEVICES,
    REDACTED,
    WandbSink,
    device_summary,
    flatten,
    log_report,
    log_sweep,
    read_wandb_offline,
    resolve_wandb_mode,
    run_config,
    run_tags,
    scrub_secrets,
)

FAKE_KEY = "0123456789abcdef0123456789abcdef01234567"  # 40 hex chars: the shape of a W&B API key


# ------------------------------------------------------------------------------------------------ W&B helpers


def test_flatten_joins_nested_keys_with_dots():
    cfg = {
        "model": {"num_layers": 2, "dims": {"hidden": 64}},
        "mode": "jvp",
        "tags": ("a", Path("/x")),
        "p": Path("/y"),
    }
    assert flatten(cfg) == {
        "model.num_layers": 2,
        "model.dims.hidden": 64,
        "mode": "jvp",
        "tags": ["a", "/x"],
        "p": "/y",
    }


def test_scrub_secrets(monkeypatch):
    monkeypatch.setenv("WANDB_API_KEY", "s3cr3t-value-from-env")
    out = scrub_secrets(
        {
            "wandb.api_key": "anything",
            "hf_token": "hf_abc",
            "db.password": "pw",
            "note": FAKE_KEY,  # shaped like a W&B key, under an innocent name
            "server": "local-" + FAKE_KEY,
            "cmd": "run --key=s3cr3t-value-from-env",
            "git_sha": FAKE_KEY,  # a SHA-1 is also 40 hex: kept under a hash-like name
            "weights_digest": "ab12",
            "tokens_per_s": 1234.5,
            "tokenizer": "bert-base-uncased",
            "num_tangents": 4,
        }
    )
    redacted = {k for k, v in out.items() if v == REDACTED}
    assert redacted == {"wandb.api_key", "hf_token", "db.password", "note", "server", "cmd"}
    assert out["git_sha"] == FAKE_KEY and out["tokens_per_s"] == 1234.5 and out["tokenizer"] == "bert-base-uncased"


@pytest.mark.parametrize(
    "mode, env, expected",
    [
        ("offline", {}, "offline"),
        ("offline", {"WANDB_MODE": "offline"}, "offline"),
        ("offline", {"WANDB_MODE": "online"}, "online"),  # the user asked for online explicitly
        ("online", {}, "online"),
        ("online", {"WANDB_MODE": "disabled"}, "disabled"),  # the user's off switch wins
        ("disabled", {"WANDB_MODE": "online"}, "disabled"),
        ("offline", {"WANDB_MODE": "dryrun"}, "offline"),
    ],
)
def test_resolve_wandb_mode(mode, env, expected):
    assert resolve_wandb_mode(mode, env) == expected


def test_run_config_keeps_the_config_and_names_columns_as_the_csv():
    config = {"device": "auto", "sweep_id": None, "model": {"name": "tiny", "num_layers": 2}, "mode": "jvp"}
    columns = {"device": "cpu", "sweep_id": "s-1", "model": "tiny", "num_layers": 2, "mode": "jvp"}
    assert run_config(config, columns) == {
        "device": "cpu",
        "requested.device": "auto",  # what ran, and what was asked
        "sweep_id": "s-1",  # nothing was asked (null): no requested.sweep_id
        "model.name": "tiny",
        "model.num_layers": 2,
        "model": "tiny",
        "num_layers": 2,
        "mode": "jvp",
    }


def test_device_summary_and_tags():
    devices = [{"device": 0, "peak_mem_mb": 10.5, "mem_method": "rss_hwm"}, {"device": 1, "peak_mem_mb": 12.0}]
    assert device_summary(devices) == {
        f"{DEVICES}/0/device": 0,
        f"{DEVICES}/0/peak_mem_mb": 10.5,
        f"{DEVICES}/0/mem_method": "rss_hwm",
        f"{DEVICES}/1/device": 1,
        f"{DEVICES}/1/peak_mem_mb": 12.0,
    }
    assert run_tags("torch", "jvp", "", None, "ddp", "torch") == ["torch", "jvp", "ddp"]


def test_resolve_wandb_mode_rejects_unknown():
    with pytest.raises(ValueError, match="offline, online, disabled"):
        resolve_wandb_mode("cloud", {})


# --------------------------------------------------------------------------------------------------- W&B runs


@pytest.fixture
def wandb_env(monkeypatch, tmp_path):
    """No network, no user settings: offline, quiet, a fake key in the environment (never to be written)."""
    monkeypatch.delenv("WANDB_MODE", raising=False)
    monkeypatch.setenv("WANDB_API_KEY", FAKE_KEY)
    monkeypatch.setenv("WANDB_SILENT", "true")
    monkeypatch.setenv("WANDB_CONFIG_DIR", str(tmp_path / "wandb-config"))  # keep ~/.config/wandb out of it
    monkeypatch.setenv("WANDB_CACHE_DIR", str(tmp_path / "wandb-cache"))
    return tmp_path


@pytest.mark.slow
def test_offline_run_holds_config_summary_and_history_and_no_key(wandb_env):
    pytest.importorskip("wandb")
    results = wandb_env / "results"
    config = {
        "framework": "jax",
        "mode": {"name": "jvp", "num_tangents": 4},
        "model": {"num_layers": 2, "hidden_size": 64},
        "wandb": {"project": "bench", "api_key": FAKE_KEY},
        "hf_token": "hf_not_really",
    }
    row = {
        "run_id": "r-1",
        "sweep_id": "s-1",
        "mode": "jvp",
        "status": "ok",
        "peak_mem_mb": 123.25,
        "step_time_median_s": 0.0125,
        "git_sha": "f" * 40,
        "error": None,
    }
    history = {"loss": [1.5, 1.25, 1.0], "step_time_s": [0.5, 0.0125, 0.0130]}

    run_dir = WandbSink("bench-test", None, None, config, dir=results, tags=["t1"]).write(row, history)

    assert run_dir is not None and run_dir.is_dir()
    assert run_dir.parent == results / "wandb" and run_dir.name.startswith("offline-run-")
    got = read_wandb_offline(run_dir)
    assert got["complete"]  # write() returns only once the run is on disk
    assert got["run"] == {
        "project": "bench-test",
        "entity": "",
        "name": "r-1",
        "group": "s-1",
        "job_type": "jvp",
        "tags": ["t1"],
    }
    cfg = got["config"]
    assert cfg["mode.num_tangents"] == 4 and cfg["model.num_layers"] == 2 and cfg["framework"] == "jax"
    assert cfg["wandb.api_key"] == REDACTED and cfg["hf_token"] == REDACTED
    summary = got["summary"]
    for k in ("run_id", "status", "peak_mem_mb", "step_time_median_s", "git_sha"):
        assert summary[k] == row[k]
    assert "error" not in summary  # None values are not logged
    steps = [h for h in got["history"] if "loss" in h]
    assert [h["_step"] for h in steps] == [0, 1, 2]
    assert [h["loss"] for h in steps] == history["loss"]
    assert [h["step_time_s"] for h in steps] == history["step_time_s"]

    for f in (wandb_env / "results").rglob("*"):  # every file W&B wrote: datastore, logs, requirements...
        if f.is_file():
            assert FAKE_KEY.encode() not in f.read_bytes(), f


def test_wandb_init_failure_warns_once_and_returns_none(wandb_env, monkeypatch):
    wandb = pytest.importorskip("wandb")

    def broken_init(**kwargs):
        raise wandb.errors.CommError("could not reach api.wandb.ai\nlong traceback text")

    monkeypatch.setattr(wandb, "init", broken_init)
    csv_path = wandb_env / "runs.csv"
    row = {"run_id": "r-2", "status": "ok"}
    CsvSink(csv_path, CSV_COLUMNS).write(row)
    with pytest.warns(RuntimeWarning, match=r"W&B init failed for run 'r-2'.*could not reach api.wandb.ai$"):
        assert WandbSink("p", "g", "r-2", {}, dir=wandb_env).write(row) is None
    assert [r["run_id"] for r in read_rows(csv_path)] == ["r-2"]


def test_disabled_mode_writes_nothing(wandb_env, monkeypatch):
    monkeypatch.setenv("WANDB_MODE", "disabled")
    assert WandbSink("p", "g", "n", {}, dir=wandb_env / "wb").write({"run_id": "x"}) is None
    assert not (wandb_env / "wb").exists()


def test_wandb_datastore_reader_rejects_other_files(tmp_path):
    (tmp_path / "run-x.wandb").write_bytes(b"not a datastore")
    with pytest.raises(ValueError, match="not a W&B datastore"):
        read_wandb_offline(tmp_path)
    assert wandb_runs.LOG_BLOCK == 32768


def test_tables_and_device_numbers_are_read_back_as_logged(wandb_env):
    pytest.importorskip("wandb")
    rows = [{"op": "exp", "shape": "8x8", "jvp_s": 1.5e-6, "note": FAKE_KEY}, {"op": "tanh", "shape": "8x8"}]
    run_dir = WandbSink("bench-test", "g", "ops", {}, dir=wandb_env / "results").write(
        {"run_id": "r-3"}, {"loss": [1.0, 0.5]}, summary={f"{DEVICES}/0/peak_mem_mb": 3.0}, tables={"t": rows}
    )
    got = read_wandb_offline(run_dir)
    assert got["summary"][f"{DEVICES}/0/peak_mem_mb"] == 3.0
    table = got["summary"]["t"]  # a nested summary value comes back as the dict wandb logged
    assert table["_type"] == "table-file" and table["nrows"] == 2 and table["ncols"] == 4
    assert [h["_step"] for h in got["history"] if "loss" in h] == [0, 1]  # the table comes after the steps
    data = json.loads((run_dir / "files" / table["path"]).read_text())
    assert data["columns"] == ["op", "shape", "jvp_s", "note"]
    assert data["data"] == [["exp", "8x8", 1.5e-6, REDACTED], ["tanh", "8x8", None, None]]  # scrubbed too


def test_sweep_and_report_runs_only_with_wandb_on(wandb_env, tmp_path):
    off = {
        "logger": {"name": "none", "project": "p", "entity": None, "mode": "offline", "tags": []},
        "results_dir": str(tmp_path / "r"),
    }
    assert log_sweep(off, [{"run_id": "a", "status": "ok"}], CSV_COLUMNS, "s-1") is None
    (tmp_path / "report.md").write_text("# report\n")
    assert log_report(tmp_path / "report.md", []) is None  # no offline runs beside the report: W&B is off
    assert not (tmp_path / "r").exists() and not (tmp_path / "wandb").exists()
