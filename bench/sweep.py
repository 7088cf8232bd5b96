"""Sweep bookkeeping as a Hydra callback: how many trials a sweep has (for "trial i of n"), and the summary table
printed when it ends. Works with every launcher: the callback runs in the launching process, jobs read the
sweep's facts from a small JSON file in the sweep directory (shared storage on SLURM)."""

from __future__ import annotations

import json
from pathlib import Path

from hydra.experimental.callback import Callback
from omegaconf import DictConfig

SWEEP_FILE = "bench_sweep.json"


class SweepCallback(Callback):
    def on_multirun_start(self, config: DictConfig, **kwargs) -> None:
        from bench.__main__ import compose_trials
        from bench.config import config_hash

        sweep_dir = Path(config.hydra.sweep.dir)
        sweep_dir.mkdir(parents=True, exist_ok=True)
        try:
            trials, total = compose_trials(list(config.hydra.overrides.task), multirun=True)
            hashes = [config_hash(cfg) for _, cfg in trials]
        except Exception:  # noqa: BLE001 (a count is a nicety; never stop a sweep over it)
            total, hashes = None, []
        info = {"sweep_id": config.sweep_id or sweep_dir.name, "total": total, "config_hashes": hashes}
        (sweep_dir / SWEEP_FILE).write_text(json.dumps(info))
        print(f"bench: sweep {info['sweep_id']}: {total if total is not None else '?'} trials -> "
              f"{Path(config.results_dir) / results_file(config)}", flush=True)

    def on_multirun_end(self, config: DictConfig, **kwargs) -> None:
        from bench.sinks import read_rows

        hashes = sweep_info(config.hydra.sweep.dir).get("config_hashes", [])
        rows = read_rows(Path(config.results_dir) / results_file(config))
        if config.get("scenario") == "ops":
            from bench.ops_report import summary_table

            module = "bench.ops_report"
            # every row of this sweep's trials (one per op and shape); resumed trials show their earlier rows
            rows = [r for r in rows if r.get("config_hash") in hashes]
        else:
            from bench.report import summary_table

            module = "bench.report"
            # the latest row of each trial of this sweep: resumed trials show their earlier result
            latest = {r["config_hash"]: r for r in rows}
            rows = [latest[h] for h in hashes if h in latest]
        print(summary_table(rows), flush=True)
        print(next_step(config, module), flush=True)


def next_step(config, module: str) -> str:
    """The command that turns the sweep's CSV into tables and plots (the defaults when results_dir is)."""
    results = Path(config.results_dir)
    csv = results / results_file(config)
    args = "" if results == Path("results") else f" {csv} --out {results}"
    return f"bench: rows in {csv}; tables and plots: python -m {module}{args}"


def results_file(config) -> str:
    return "ops.csv" if config.get("scenario") == "ops" else "runs.csv"


def sweep_info(sweep_dir) -> dict:
    path = Path(sweep_dir) / SWEEP_FILE
    return json.loads(path.read_text()) if path.exists() else {"sweep_id": Path(sweep_dir).name, "total": None}
