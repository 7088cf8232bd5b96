"""Sweep bookkeeping as a Hydra callback: how many trials a sweep has (for "trial i of n"), and the summary table
printed when it ends. Works with every launcher: the callback runs in the launching process, jobs read the
sweep's facts from a small JSON file in the sweep directory (shared storage on SLURM)."""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

from hydra.experimental.callback import Callback
from omegaconf import DictConfig

from bench.config import launch_id
from bench.preflight import compose_trials
from bench.scenarios import config_hash, scenario_of
from bench.sinks import read_rows
from bench.wandb_runs import log_sweep

SWEEP_FILE = "bench_sweep.json"
LAST_STATUSES: list[str] | None = None  # set when a sweep ends in this process: `python -m bench`'s exit code


class SweepCallback(Callback):
    def on_multirun_start(self, config: DictConfig, **kwargs) -> None:
        sweep_dir = Path(config.hydra.sweep.dir)
        sweep_dir.mkdir(parents=True, exist_ok=True)
        try:
            trials, total = compose_trials(list(config.hydra.overrides.task), multirun=True)
            hashes = [config_hash(cfg) for _, cfg in trials]
        except Exception:  # noqa: BLE001 (a count is a nicety; never stop a sweep over it)
            total, hashes = None, []
        info = {"sweep_id": config.sweep_id or launch_id(), "total": total, "config_hashes": hashes}
        (sweep_dir / SWEEP_FILE).write_text(json.dumps(info))
        print(f"bench: sweep {info['sweep_id']}: {total if total is not None else '?'} trials -> "
              f"{results_path(config)}", flush=True)

    def on_multirun_end(self, config: DictConfig, **kwargs) -> None:
        global LAST_STATUSES
        scenario = scenario_of_sweep(config)
        info = sweep_info(config.hydra.sweep.dir)
        rows = scenario.sweep_rows(read_rows(results_path(config)), info.get("config_hashes", []), info["sweep_id"])
        print(scenario.summary(rows), flush=True)
        log_sweep(config, rows, scenario.columns, info["sweep_id"])  # the sweep's W&B run: its rows as a Table
        print(next_step(config), flush=True)
        LAST_STATUSES = trial_statuses(rows)
        counts = Counter(LAST_STATUSES)
        print(f"bench: {len(LAST_STATUSES)} trial(s): " + ", ".join(f"{n} {s}" for s, n in counts.most_common()),
              flush=True)


def trial_statuses(rows: list[dict]) -> list[str]:
    """One status per trial (run_id) of the sweep's rows: an ops trial's rows carry its status per op, the worst
    of which is the trial's."""
    worst = ("crashed", "error", "timeout", "oom", "skipped", "ok")
    by_run: dict[str, str] = {}
    for r in rows:
        status = r.get("status", "")
        prev = by_run.get(r.get("run_id", ""))
        if prev is None or (status in worst and (prev not in worst or worst.index(status) < worst.index(prev))):
            by_run[r.get("run_id", "")] = status
    return list(by_run.values())


def next_step(config) -> str:
    """The command that turns the sweep's CSV into tables and plots (the defaults when results_dir is)."""
    results, csv = Path(config.results_dir), results_path(config)
    args = "" if results == Path("results") else f" {csv} --out {results}"
    return f"bench: rows in {csv}; tables and plots: python -m {scenario_of_sweep(config).report_module}{args}"


def scenario_of_sweep(config):
    """The sweep's scenario (one per sweep: `scenario` is never swept, its trials write one results file)."""
    return scenario_of({"scenario": config.get("scenario")})


def results_path(config) -> Path:
    return Path(config.results_dir) / scenario_of_sweep(config).results_file


def sweep_info(sweep_dir) -> dict:
    path = Path(sweep_dir) / SWEEP_FILE
    return json.loads(path.read_text()) if path.exists() else {"sweep_id": Path(sweep_dir).name, "total": None}
