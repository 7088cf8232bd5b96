"""Sweep bookkeeping as a Hydra callback: how many trials a sweep has (for "trial i of n"), and the summary table
printed when it ends. Works with every launcher: the callback runs in the launching process, jobs read the
sweep's facts from a small JSON file in the sweep directory (shared storage on SLURM). The callback Hydra
instantiates (conf/config.yaml) is bench.cli's, which gives it the scenarios."""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

from hydra.experimental.callback import Callback
from omegaconf import DictConfig

from bench.config import launch_id, resolve
from bench.harness.preflight import compose_trials
from bench.harness.scenario import Registry, config_hash, scenario_of
from bench.store.read import read_rows
from bench.store.wandb import log_sweep

SWEEP_FILE = "bench_sweep.json"
# From the worst to the best: a trial's status is its worst row's (an ops trial has one row per op and shape).
STATUS_ORDER = ("crashed", "error", "timeout", "diverged", "oom", "skipped", "ok")


class SweepCallback(Callback):
    scenarios: Registry  # set by the subclass Hydra instantiates (bench.cli.SweepCallback)

    def on_multirun_start(self, config: DictConfig, **kwargs) -> None:
        sweep_dir = Path(config.hydra.sweep.dir)
        sweep_dir.mkdir(parents=True, exist_ok=True)
        try:
            trials, total = compose_trials(list(config.hydra.overrides.task), multirun=True)
            hashes = [config_hash(scenario_of(self.scenarios, cfg.scenario), resolve(cfg)) for _, cfg in trials]
            # the tuning sweeper (bench.harness.tuning) then runs each group's winner again, once per repeat seed
            groups = {o for overrides, _ in trials for o in overrides if o.startswith("tune_group=")}
            total += len(groups) * len(config.hydra.sweeper.get("repeats") or ())
        except Exception:  # noqa: BLE001 (a count is a nicety; never stop a sweep over it)
            total, hashes = None, []
        info = {"sweep_id": config.sweep_id or launch_id(), "total": total, "config_hashes": hashes}
        (sweep_dir / SWEEP_FILE).write_text(json.dumps(info))
        print(f"bench: sweep {info['sweep_id']}: {total if total is not None else '?'} trials -> "
              f"{self.results_path(config)}", flush=True)

    def on_multirun_end(self, config: DictConfig, **kwargs) -> None:
        scenario = scenario_of(self.scenarios, config.scenario)
        info = sweep_info(config.hydra.sweep.dir)
        path = self.results_path(config)
        rows = scenario.sweep_rows(read_rows(path), info.get("config_hashes", []), info["sweep_id"])
        print(scenario.summary(rows), flush=True)
        log_sweep(config, rows, scenario.columns, info["sweep_id"])  # the sweep's W&B run: its rows as a Table
        print(f"bench: rows in {path}; tables and plots: {report_command(config)}", flush=True)
        counts = Counter(trial_statuses(rows))
        print(f"bench: {sum(counts.values())} trial(s): " + ", ".join(f"{n} {s}" for s, n in counts.most_common()),
              flush=True)

    def results_path(self, config) -> Path:
        """The sweep's results file (one scenario per sweep: `scenario` is never swept)."""
        return Path(config.results_dir) / scenario_of(self.scenarios, config.scenario).results_file


def worst(statuses) -> str:
    """The worst of these statuses (STATUS_ORDER; one it does not know counts as an error)."""
    rank = lambda s: STATUS_ORDER.index(s) if s in STATUS_ORDER else STATUS_ORDER.index("error")
    return min(statuses, key=rank, default="ok")


def trial_statuses(rows: list[dict]) -> list[str]:
    """One status per trial (run_id) of the sweep's rows: an ops trial's rows carry its status per op, the worst
    of which is the trial's."""
    by_run: dict[str, list[str]] = {}
    for r in rows:
        by_run.setdefault(r.get("run_id", ""), []).append(r.get("status", ""))
    return [worst(statuses) for statuses in by_run.values()]


def report_command(config) -> str:
    """The command that turns the sweep's results into tables and plots (the defaults when results_dir is)."""
    results = Path(config.results_dir)
    return "python -m bench report" + ("" if results == Path("results") else f" {results} --out {results}")


def sweep_info(sweep_dir) -> dict:
    path = Path(sweep_dir) / SWEEP_FILE
    return json.loads(path.read_text()) if path.exists() else {"sweep_id": Path(sweep_dir).name, "total": None}
