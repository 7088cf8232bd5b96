"""The W&B views (bench/report/dashboard.py) and what the runs carry for them (bench/store/wandb.py, the
scenarios' W&B runs): one small sweep, offline, shared by the slow tests; the dashboard's spec is read back and
every key a panel plots is looked up in the runs' own files. No test talks to a W&B server. What a run carries is
recorded where the runner records it, so the trials are measured in the test's process (run_here) and the
commands' mains run here too (bench_here)."""

from __future__ import annotations

import contextlib
import io
import json
import os
import re
from pathlib import Path

import pytest
from hydra import initialize_config_dir
from hydra.core.global_hydra import GlobalHydra
from hydra.types import RunMode
from hydra.utils import instantiate

from bench.config import CONF_DIR, LAUNCH_ID, register_configs
from bench.report.dashboard import SECTIONS, Group, check_sections, ready
from bench.report.panels import Panel
from bench.scenarios import COLUMNS
from bench.scenarios.model.columns import COLUMNS as CSV_COLUMNS
from bench.store.read import read_rows
from bench.store.wandb import DEVICES, OPS_TABLE, REPORT_PLOTS, SWEEP_TABLE, geomean_key, offline_runs
from tests.support import FAST, bench_here, run_here

MARKER = "bench-marker-" + "5e" * 20  # the API key in the environment: it must reach no file
# What a single-device model sweep without evaluate / measure_grad_cosine (and one ops trial) does not log: the
# panels naming these are "not filled by these runs", and nothing else may be.
NOT_FILLED = {
    "eval_loss",
    "eval_accuracy",
    "grad_cosine",
    "comm_bytes_per_step",
    "steps_to_target",
    "wall_to_target_s",
    "mib_s_to_target",  # trials without a target
    *(f"{DEVICES}/{i}/peak_mem_mb" for i in range(1, 8)),
    *(["budget_mb"] if "budget_mb" in CSV_COLUMNS else []),
}  # budget_mb: no probe ran under one
SWEEP = ["-m", "framework=torch,jax", "mode=backprop,jvp", *FAST, "logger=wandb"]
OPS = [
    "scenario=ops",
    "framework=torch",
    "ops.names=[exp,matmul]",
    "ops.sizes=[8]",
    "ops.shapes=[]",
    "ops.repeats=2",
    "ops.min_sample_s=0",
]


def use_wandb_env(mp: pytest.MonkeyPatch, tmp: Path) -> None:
    """Offline, quiet, a marker API key in the environment, W&B's own folders kept in the test's."""
    for k in [k for k in os.environ if k.startswith("WANDB_")]:
        mp.delenv(k)
    env = {
        "WANDB_API_KEY": MARKER,
        "WANDB_SILENT": "true",
        "WANDB_CONFIG_DIR": str(tmp / "wandb-config"),
        "WANDB_CACHE_DIR": str(tmp / "wandb-cache"),
        "WANDB_DATA_DIR": str(tmp / "wandb-data"),
    }
    for k, v in env.items():
        mp.setenv(k, v)


def sweep_ends(*args: str, results: Path) -> None:
    """What Hydra does around a multirun's jobs (hydra/_internal/hydra.py, multirun): the callbacks conf/config.yaml
    names, given the sweep's config, at its start and its end. bench's writes the sweep-level W&B run."""
    register_configs()
    with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
        cfg = GlobalHydra.instance().hydra.compose_config(
            "config",
            [a for a in args if a != "-m"] + [f"results_dir={results}"],
            run_mode=RunMode.MULTIRUN,
            with_log_configuration=False,
        )
        callbacks = [instantiate(c) for c in cfg.hydra.callbacks.values()]
        for callback in callbacks:
            callback.on_multirun_start(config=cfg, config_name="config")
        for callback in reversed(callbacks):
            callback.on_multirun_end(config=cfg, config_name="config")


@pytest.fixture(scope="module")
def sweep(tmp_path_factory):
    """The sweep (its trials measured in this process: what they record is the subject, W&B's runs among it), its
    sweep-level run, one ops trial, `bench report` with W&B on, and the dashboard's spec."""
    tmp = tmp_path_factory.mktemp("dashboard")
    results, out = tmp / "results", io.StringIO()
    with pytest.MonkeyPatch.context() as mp:
        use_wandb_env(mp, tmp)
        with contextlib.redirect_stdout(out):
            outcomes = run_here(*SWEEP, results=results)
            mp.setenv(LAUNCH_ID, outcomes[0]["row"]["sweep_id"])  # the launch's id, as the command sets it for all
            sweep_ends(*SWEEP, results=results)
        outcomes += run_here(*OPS, "logger=wandb", results=results)
        assert [o["status"] for o in outcomes] == ["ok"] * 5, outcomes  # the command would have exited 0
        # the report writes its own run (W&B on: the results hold offline runs)
        report = bench_here("report", str(results / "runs.csv"), "--out", str(results))
        assert report.returncode == 0, report.stderr
        spec_path = results / "dashboard-spec.json"
        dash = bench_here("dashboard", "--results", str(results), "--dry-run", str(spec_path))
        assert dash.returncode == 0, dash.stderr
    runs = offline_runs(results)  # read_wandb_offline of each: W&B's own datastore, record by record
    return {
        "results": results,
        "stdout": out.getvalue(),
        "runs": runs,
        "dashboard": dash,
        "spec": json.loads(spec_path.read_text()),
    }


def trial_runs(sweep) -> list[dict]:
    return [r for r in sweep["runs"] if r["run"]["job_type"] not in ("sweep", "report", "ops")]


# ------------------------------------------------------------------------------------------- the panel table


def test_panels_name_only_keys_the_suite_logs():
    check_sections(COLUMNS)
    typo = (Group("x", "", (Panel("bar", "t", ("exces_mem_mb",)), Panel("line", "u", ("loss",), x="depth"))),)
    with pytest.raises(ValueError, match=r"x / t: summary key exces_mem_mb; x / u: config key depth"):
        check_sections(COLUMNS, typo)
    assert len({s.name for s in SECTIONS}) == len(SECTIONS)
    # a section waiting for columns that do not exist yet is left out, and says what it waits for
    later = Group("later", "", (Panel("bar", "t", ("mem_activations_mb",)),), needs=("mem_activations_mb",))
    built, waiting = ready(COLUMNS, (*SECTIONS, later))
    assert later not in built and waiting[-1] == {"section": "later", "needs": ["mem_activations_mb"]}
    check_sections(COLUMNS, (*SECTIONS, later))


def test_no_runs_is_one_line_and_exit_2(tmp_path, monkeypatch):
    use_wandb_env(monkeypatch, tmp_path)
    proc = bench_here("dashboard", "--results", str(tmp_path / "none"))
    assert proc.returncode == 2 and proc.stdout == ""
    assert proc.stderr.count("\n") == 1 and proc.stderr.startswith("bench dashboard: error: no W&B runs under")
    assert not (tmp_path / "none").exists()  # nothing written


@pytest.mark.parametrize(
    "args, expected",
    [
        (["--bogus"], "unrecognized arguments: --bogus"),
        (["--sweep", ""], "--sweep='': empty"),
        (["--title", "t" * 129], "--title: 129 characters; accepted at most 128"),
        (["--online", "--dry-run", "x.json"], "--online with --dry-run: accepted one of them"),
    ],
)
def test_bad_options_are_one_line_and_exit_2(tmp_path, monkeypatch, args, expected):
    use_wandb_env(monkeypatch, tmp_path)
    proc = bench_here("dashboard", "--results", str(tmp_path), *args)
    assert proc.returncode == 2 and proc.stderr.count("\n") == 1 and expected in proc.stderr, proc.stderr


# ---------------------------------------------------------------------------------------------- with a sweep


def spec_keys(spec: dict) -> dict[str, set[str]]:
    """Every key the built W&B objects refer to, read from their specification as W&B would store it."""
    found: dict[str, set[str]] = {"summary": set(), "history": set(), "config": set()}
    panels = [p for s in spec["workspace"]["spec"]["section"]["panelBankConfig"]["sections"] for p in s["panels"]]
    panels += [
        p
        for b in spec["report"]["spec"]["blocks"]
        if b["type"] == "panel-grid"
        for p in b["metadata"]["panelBankSectionConfig"]["panels"]
    ]
    for p in panels:
        cfg, kind = p["config"], p["viewType"]
        if kind == "Bar Chart":
            found["summary"] |= set(cfg["metrics"])
        elif kind == "Run History Line Plot":
            found["history"] |= set(cfg["metrics"])
        elif kind == "Scatter Plot":
            where, key = re.fullmatch(r"(config|summary):(\w+?)(?:\.value)?", cfg["xAxis"]).groups()
            found[where].add(key)
            found["summary"].add(re.fullmatch(r"summary:(\w+)", cfg["yAxis"])[1])
        elif kind == "Media Browser":
            found["summary"] |= set(cfg["mediaKeys"])
        elif kind == "Weave":
            found["summary"] |= set(
                re.findall(r'"nodeType": "const", "type": "string", "val": "(\w+)"', json.dumps(cfg))
            )
        else:
            raise AssertionError(f"a panel of an unexpected kind: {kind}")
        if "groupBy" in cfg:
            found["config"].add(cfg["groupBy"].removesuffix(".value"))
    return found


@pytest.mark.slow
def test_the_dashboard_refers_only_to_what_the_runs_carry(sweep):
    spec, runs = sweep["spec"], sweep["runs"]
    assert spec["format"] == "bench.dashboard/1" and spec["mode"] == "offline" and spec["project"] == "bench"
    assert spec["runs"]["shown"] == len(runs) == 7  # 4 trials, the sweep-level run, an ops trial, the report's
    logged = {
        "summary": set().union(*(r["summary"] for r in runs)),
        "history": set().union(*(h for r in runs for h in r["history"])),
        "config": set().union(*(r["config"] for r in runs)),
    }
    referred = spec_keys(spec)
    assert referred["history"] and referred["config"] >= {"framework_mode", "num_layers", "num_tangents"}
    for where, keys in referred.items():
        absent = keys - logged[where]
        # the rule: a key the runs lack is one this sweep does not produce, and its panel says so
        assert absent <= NOT_FILLED, (where, absent - NOT_FILLED)
    missing = {k for p in spec["panels"] for k in p["missing"]}
    assert missing == NOT_FILLED
    for p in spec["panels"]:  # filled: some plotted key and every config key are in the runs
        plotted = set(p.get("summary", p.get("history", [])))
        assert p["filled"] == (not plotted <= NOT_FILLED and not set(p["config"]) & NOT_FILLED), p
    built, waiting = ready(COLUMNS)
    assert spec["waiting"] == waiting
    assert [s["name"] for s in spec["workspace"]["spec"]["section"]["panelBankConfig"]["sections"]] == [
        s.name for s in built
    ]
    out = sweep["dashboard"].stdout
    assert f"-> {sweep['results'] / 'dashboard-spec.json'}" in out and "not filled by these runs:" in out
    assert "to save them: wandb sync" in out and "python -m bench dashboard --online" in out


@pytest.mark.slow
def test_runs_are_named_grouped_tagged_and_keyed_as_the_csv(sweep):
    rows = {r["run_id"]: r for r in read_rows(sweep["results"] / "runs.csv")}
    labels = set(re.findall(r"^\[\d/\d\] (.+): running", sweep["stdout"], re.M))
    trials = trial_runs(sweep)
    assert len(trials) == 4 and {t["run"]["name"] for t in trials} == labels
    for t in trials:
        row, cfg, summary = rows[t["summary"]["run_id"]], t["config"], t["summary"]
        assert t["run"]["group"] == row["sweep_id"] and t["run"]["job_type"] == row["mode"]
        assert t["run"]["tags"] == [row["framework"], row["mode"]]  # no experiment, no strategy here
        for column in (
            "framework",
            "mode",
            "model",
            "num_layers",
            "batch_size",
            "seq_len",
            "num_tangents",
            "parallel",
            "devices",
            "world_size",
            "device",
            "sweep_id",
            "config_hash",
        ):
            assert str(cfg[column]) == row[column] == str(summary[column]), column
        assert cfg["model.num_layers"] == 2 and cfg["requested.device"] == "auto"  # the Hydra config stays too
        assert cfg["framework_mode"] == f"{row['framework']} {row['mode']}" and cfg["experiment"] == ""
        devices = json.loads((sweep["results"] / "history" / f"{row['run_id']}.json").read_text())["devices"]
        assert summary[f"{DEVICES}/0/peak_mem_mb"] == devices[0]["peak_mem_mb"]
        assert len(t["history"]) == 3 and all(set(h) >= {"loss", "step_time_s"} for h in t["history"])
        assert not any(k.startswith(DEVICES) for h in t["history"] for k in h)  # per device, not per step


@pytest.mark.slow
def test_the_sweep_and_the_report_have_runs_of_their_own(sweep):
    (swept,) = [r for r in sweep["runs"] if r["run"]["job_type"] == "sweep"]
    rows = read_rows(sweep["results"] / "runs.csv")
    assert swept["run"]["group"] == rows[0]["sweep_id"] and swept["summary"]["trials_ok"] == 4
    table = swept["summary"][SWEEP_TABLE]
    assert table["_type"] == "table-file" and table["nrows"] == 4
    data = json.loads((swept["dir"] / "files" / table["path"]).read_text())
    assert sorted(r[data["columns"].index("run_id")] for r in data["data"]) == sorted(r["run_id"] for r in rows)
    (report,) = [r for r in sweep["runs"] if r["run"]["job_type"] == "report"]
    plots = sorted(p.stem for p in (sweep["results"] / "plots").glob("*.png"))
    shown = [h[REPORT_PLOTS]["caption"] for h in report["history"] if REPORT_PLOTS in h]
    assert plots and shown == plots


@pytest.mark.slow
def test_no_api_key_reaches_any_file(sweep):
    files = [f for f in sweep["results"].rglob("*") if f.is_file()]
    assert len(files) > 20 and any(f.name == "dashboard-spec.json" for f in files)
    assert [f for f in files if MARKER.encode() in f.read_bytes()] == []


@pytest.mark.slow
def test_an_ops_run_carries_its_ratios_and_rows(sweep):
    (ops,) = [r for r in sweep["runs"] if r["run"]["job_type"] == "ops"]
    rows = read_rows(sweep["results"] / "ops.csv")
    assert ops["run"]["name"] == "torch ops eager fp32 threads=all device=auto"  # OpsScenario.label
    assert ops["run"]["group"] == rows[0]["sweep_id"] and ops["run"]["tags"] == ["torch", "ops", "eager"]
    assert ops["config"]["execution"] == rows[0]["execution"] and ops["config"]["requested.device"] == "auto"
    for ratio in ("jvp_over_primal", "vjp_over_primal"):
        values = [float(r[ratio]) for r in rows]
        assert min(values) <= ops["summary"][geomean_key(ratio)] <= max(values)
    assert ops["summary"][OPS_TABLE]["nrows"] == len(rows) >= 2
