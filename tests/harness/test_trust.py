"""Configs the suite reads back are data (docs/reproducibility.md, "What the suite trusts"): a saved config that
`python -m bench rerun` reads, and a --config-dir folder someone sent, are refused in one line, exit 2, before any
trial, when they hold an interpolation (an environment variable's value would reach the rows), a `_target_` or
Hydra's own settings (code Hydra would run); the line names the key and never prints what it would resolve to."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from bench.config import to_dict
from bench.errors import ConfigError
from bench.harness.rerun import saved_config
from tests.support import bench_here, composed

SECRET = "s3cr3t-token-value"
LEAK = "${oc.env:BENCH_TEST_SECRET}"


@pytest.fixture(autouse=True)
def secret(monkeypatch):
    monkeypatch.setenv("BENCH_TEST_SECRET", SECRET)


# ---------------------------------------------------------------------------------------------- saved configs


@pytest.mark.parametrize(
    "key,value",
    [
        ("sweep_id", LEAK),
        ("tune_group", LEAK),
        ("logger.project", LEAK),
        ("seed", LEAK),  # an integer: it was refused before, printing the resolved value
        ("logger.tags", ["a", f"x{LEAK}"]),  # inside a list, inside a longer string
        ("model.name", "\\${oc.env:BENCH_TEST_SECRET}"),  # escaped: OmegaConf unescapes it, to resolve later
    ],
)
def test_a_saved_config_holding_an_interpolation_is_refused_naming_the_key(tmp_path, key, value):
    data = to_dict(composed("model=tiny"))
    node, *rest = key.split(".")
    if rest:
        data[node][rest[0]] = value
    else:
        data[node] = value
    (tmp_path / "configs").mkdir()
    (tmp_path / "configs" / "r1.json").write_text(json.dumps(data))
    with pytest.raises(ConfigError) as e:
        saved_config(tmp_path, "r1")
    line = str(e.value)
    assert "\n" not in line and SECRET not in line
    assert f": {key}" in line and "interpolations are not accepted from a saved config" in line


def test_a_saved_config_naming_a_target_is_refused(tmp_path):
    data = to_dict(composed("model=tiny"))
    data["ops"]["names"] = {"_target_": "builtins.open", "_args_": [str(tmp_path / "made"), "w"]}  # a field of Any
    (tmp_path / "configs").mkdir()
    (tmp_path / "configs" / "r1.json").write_text(json.dumps(data))
    with pytest.raises(ConfigError, match=r"ops\.names\._target_: a _target_ .* not accepted from a saved config"):
        saved_config(tmp_path, "r1")
    assert not (tmp_path / "made").exists()


# ------------------------------------------------------------------------------------------------ config dirs


def experiment(folder: Path, text: str, name: str = "sent", path: str = "experiment") -> Path:
    (folder / path).mkdir(parents=True, exist_ok=True)
    (folder / path / f"{name}.yaml").write_text(text)
    return folder


@pytest.mark.parametrize(
    "text,expected",
    [
        (f"# @package _global_\nsweep_id: '{LEAK}'\n", "sweep_id holds an interpolation"),
        (f"# @package _global_\nseed: '{LEAK}'\n", "seed holds an interpolation"),
        (f"# @package _global_\nlogger:\n  project: pre-{LEAK}\n", "logger.project holds an interpolation"),
        (
            f"# @package _global_\nhydra:\n  sweeper:\n    params:\n      tune_group: a,'{LEAK}'\n",
            "hydra.sweeper.params.tune_group holds an interpolation",
        ),
        (f"defaults:\n  - /model: '{LEAK}'\n", "defaults[0]./model holds an interpolation"),
        (
            "# @package _global_\nhydra:\n  job:\n    env_set:\n      LD_PRELOAD: /tmp/x.so\n",
            "hydra.job: Hydra's own settings",
        ),
        ("# @package hydra.job\nenv_set:\n  LD_PRELOAD: /tmp/x.so\n", "@package hydra.job: Hydra's own settings"),
        ("defaults:\n  - /model/tiny@hydra.job_logging\n", "the defaults entry /model/tiny@hydra.job_logging"),
        (
            "# @package _global_\nhydra:\n  sweeper:\n    params:\n      hydra.job.env_set.X: a\n",
            "hydra.sweeper.params.hydra.job.env_set.X: Hydra's own settings",
        ),
        (
            "# @package _global_\nhydra:\n  launcher:\n    setup: ['touch /tmp/x']\n",
            "hydra.launcher: Hydra's own settings",
        ),
    ],
)
def test_a_config_dir_is_data(tmp_path, text, expected):
    folder = experiment(tmp_path / "sent", text)
    proc = bench_here("--config-dir", str(folder), "+experiment=sent", results=tmp_path / "results")
    lines = proc.stderr.strip().splitlines()
    assert proc.returncode == 2 and len(lines) == 1 and expected in lines[0], proc.stderr
    assert SECRET not in proc.stdout + proc.stderr
    assert not (tmp_path / "results").exists()


def test_a_config_dir_callback_creates_nothing(tmp_path):
    """The issue's case: Hydra would open (create) the file as it starts the run, before any trial."""
    made = tmp_path / "made"
    callback = f"x: {{_target_: builtins.open, _args_: [{made}, w]}}"
    text = f"# @package _global_\nhydra:\n  callbacks:\n    {callback}\n"
    folder = experiment(tmp_path / "sent", text)
    for args in (["+experiment=sent"], ["-m", "+experiment=sent"], ["+experiment=sent", "--cfg", "hydra"]):
        proc = bench_here("--config-dir", str(folder), *args, results=tmp_path / "results")
        lines = proc.stderr.strip().splitlines()
        assert proc.returncode == 2 and len(lines) == 1, proc.stderr
        assert "hydra.callbacks.x._target_: a _target_ (code Hydra would import and call) is not accepted" in lines[0]
    assert not made.exists() and not (tmp_path / "results").exists()


def test_a_config_dir_of_hydras_own_groups_or_named_by_searchpath_is_refused(tmp_path):
    folder = experiment(tmp_path / "sent", "version: 1\n", name="mine", path="hydra/job_logging")
    proc = bench_here("--config-dir", str(folder), "hydra/job_logging=mine", results=tmp_path / "results")
    assert proc.returncode == 2 and "its hydra/ folder" in proc.stderr and len(proc.stderr.splitlines()) == 1
    leaky = experiment(tmp_path / "leaky", f"# @package _global_\nsweep_id: '{LEAK}'\n")
    proc = bench_here(f"hydra.searchpath=[file://{leaky}]", "+experiment=sent", results=tmp_path / "results")
    assert proc.returncode == 2 and "sweep_id holds an interpolation" in proc.stderr, proc.stderr
    assert SECRET not in proc.stdout + proc.stderr and not (tmp_path / "results").exists()


def test_a_config_dir_of_settings_and_sweeps_still_composes(tmp_path):
    """What an experiment sets (values, a sweep, the tuning sweeper's settings) is data and is accepted."""
    text = (
        "# @package _global_\ndefaults:\n  - override /model: tiny\nseed: 3\n"
        "hydra:\n  sweeper:\n    params:\n      mode: inference,backprop\n"
    )
    folder = experiment(tmp_path / "sent", text)
    proc = bench_here("--config-dir", str(folder), "+experiment=sent", "--cfg", "job")
    assert proc.returncode == 0 and "seed: 3" in proc.stdout and "num_layers: 2" in proc.stdout, proc.stderr
