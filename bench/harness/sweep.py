"""Sweep bookkeeping as a Hydra callback: how many trials a sweep has (for "trial i of n"), and the summary table
printed when it ends. Works with every launcher: the callback runs in the launching process, jobs read the
sweep's facts from its plan (bench/harness/plan.py). The callback Hydra instantiates (conf/config.yaml) is
bench.cli's, which gives it the scenarios."""

from __future__ import annotations

import shlex
from collections import Counter
from pathlib import Path

from hydra.experimental.callback import Callback
from omegaconf import DictConfig

from bench.config import launch_id, resolve
from bench.harness.plan import read_plan, write_plan
from bench.harness.preflight import compose_trials, searchpath
from bench.harness.scenario import Registry, config_hash, scenario_of
from bench.store.read import read_rows
from bench.store.wandb import log_sweep

# From the worst to the best: a trial's status is its worst row's (an ops trial has one row per op and shape).
STATUS_ORDER = ("crashed", "error", "timeout", "diverged", "oom", "skipped", "ok")


class SweepCallback(Callback):
    scenarios: Registry  # set by the subclass Hydra instantiates (bench.cli.SweepCallback)

    def on_multirun_start(self, config: DictConfig, **kwargs) -> None:
        sweep_dir = Path(config.hydra.sweep.dir)
        repeats = below = 0
        try:
            # the hydra.* overrides too: a sweeper's params and space given on the command line are the sweep's
            overrides = [*config.hydra.overrides.task, *config.hydra.overrides.hydra, *config_dirs(config)]
            trials, total = compose_trials(overrides, multirun=True)
            hashes = self.hashes([cfg for _, cfg in trials])
            # the tuning sweeper (bench.harness.tuning) then runs each group's winner again (a group: a
            # combination in one study), once per repeat seed
            tags = ("tune_group=", "tune_study=")
            groups = {tuple(o for o in overrides if o.startswith(tags)) for overrides, _ in trials}
            groups.discard(())
            repeats = len(groups) * len(config.hydra.sweeper.get("repeats") or ())
            # and, within each group's budget, points beyond its search's and its confirming trials
            budget = config.hydra.sweeper.get("budget") or 0
            below = max(0, len(groups) * budget - total)
            total += below + repeats
        except Exception:  # noqa: BLE001 (a count is a nicety; never stop a sweep over it)
            total, hashes = None, []
        plan = {"sweep_id": config.sweep_id or launch_id(), "total": total, "config_hashes": hashes}
        write_plan(sweep_dir, plan)
        count = f"{'?' if total is None else total} trials"
        if repeats:  # a group none of whose points reaches the target has no winner to repeat
            studies = config.hydra.sweeper.get("studies") or 1
            per = f"; each group: {studies} study(ies) x {budget} trials" if budget else ""
            extended = f", up to {below} beyond grids or confirming" if below else ""
            count = (
                f"up to {total} trials ({total - repeats - below} to search{extended}, then up to {repeats} "
                f"repeating the winners{per})"
            )
        print(f"bench: sweep {plan['sweep_id']}: {count} -> {self.results_path(config)}", flush=True)

    def on_multirun_end(self, config: DictConfig, **kwargs) -> None:
        scenario = scenario_of(self.scenarios, config.scenario)
        plan = read_plan(config.hydra.sweep.dir)
        path = self.results_path(config)
        hashes = plan.get("config_hashes", []) + self.added_hashes(plan.get("added", []), config_dirs(config))
        rows = scenario.sweep_rows(read_rows(path), hashes, plan["sweep_id"])
        print(scenario.summary(rows), flush=True)
        log_sweep(config, rows, scenario.columns, plan["sweep_id"])  # the sweep's W&B run: its rows as a Table
        print(f"bench: rows in {path}; tables and plots: {report_command(config)}", flush=True)
        counts = Counter(trial_statuses(rows, plan["sweep_id"]))
        print(
            f"bench: {sum(counts.values())} trial(s): " + ", ".join(f"{n} {s}" for s, n in counts.most_common()),
            flush=True,
        )

    def hashes(self, composed) -> list[str]:
        return [config_hash(scenario_of(self.scenarios, cfg.scenario), resolve(cfg)) for cfg in composed]

    def added_hashes(self, added: list[list[str]], search: list[str]) -> list[str]:
        """The configurations of the trials a sweeper added as it went (a resumed sweep skips those too)."""
        try:
            return self.hashes([compose_trials([*o, *search], multirun=False)[0][0][1] for o in added])
        except Exception:  # noqa: BLE001 (as the count: never stop a sweep's summary over it)
            return []

    def results_path(self, config) -> Path:
        """The sweep's results file (one scenario per sweep: `scenario` is never swept)."""
        return Path(config.results_dir) / scenario_of(self.scenarios, config.scenario).results_file


def config_dirs(config) -> list[str]:
    """The overrides that add what --config-dir added to the sweep's configs (preflight composes with them)."""
    sources = config.hydra.runtime.get("config_sources") or []
    return [searchpath(Path(s.path)) for s in sources if s.provider == "command-line" and s.schema == "file"]


def worst(statuses) -> str:
    """The worst of these statuses (STATUS_ORDER; one it does not know counts as an error)."""
    rank = lambda s: STATUS_ORDER.index(s) if s in STATUS_ORDER else STATUS_ORDER.index("error")
    return min(statuses, key=rank, default="ok")


def trial_statuses(rows: list[dict], sweep_id: str) -> list[str]:
    """One status per trial (run_id) of the sweep's rows: an ops trial's rows carry its status per op, the worst
    of which is the trial's; a trial recorded by another sweep is one this sweep skipped (resume)."""
    by_run: dict[str, list[str]] = {}
    for r in rows:
        status = r.get("status", "") if r.get("sweep_id") == sweep_id else "skipped"
        by_run.setdefault(r.get("run_id", ""), []).append(status)
    return [worst(statuses) for statuses in by_run.values()]


def report_command(config) -> str:
    """The command that turns the sweep's results into tables and plots (the defaults when results_dir is), quoted
    as a shell reads it: a folder's name is never run."""
    results = Path(config.results_dir)
    folders = [] if results == Path("results") else [str(results), "--out", str(results)]
    return shlex.join(["python", "-m", "bench", "report", *folders])
