"""What the harness asks of a scenario: the kind of measurement a trial makes. The runner spawns, isolates,
watches, classifies and records every trial the same way and knows nothing of BERT or of ops; a scenario says
what its trial measures and how its rows read. The scenarios themselves (bench/scenarios/) sit above the harness
and hand themselves to it: the harness never imports one.

Parent side (the launching process, which never imports torch or jax): validate the config, name what makes a
trial's identity, label its progress line, set its process environment, turn the child's outcome into rows,
describe them in one line, log them to W&B, summarise a sweep. Child side (the spawned trial process): measure.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path

from bench.config import NOT_IDENTITY, BenchConfig, hash_identity, to_dict, validate_process
from bench.errors import ConfigError
from bench.store.read import latest

# The trial process's environment carries its run_id: what it writes beside its row (a profiler's trace, under
# results_dir/traces/<run_id>/) is named by it.
RUN_ID_ENV = "BENCH_RUN_ID"


# What the runner writes under results_dir for every trial, whatever its scenario: the resolved config (what
# `python -m bench rerun` runs again) and the trial's log.
CONFIGS, LOGS = "configs", "logs"
RUNNER_FOLDERS = (CONFIGS, LOGS)

# What resume skips: a trial that ran to its result. A diverged trial's result is that its learning rate is unstable
# (the same at every run of its seed); a tuning search reads it as such, so running it again would only repeat it.
FINISHED = ("ok", "diverged")


class Scenario(ABC):
    name: str  # the `scenario=` value
    results_file: str  # under results_dir: one CSV per scenario
    columns: tuple[str, ...]  # that CSV's schema (the scenario's columns.py)
    folders: tuple[str, ...] = ()  # what its trials write under results_dir beside the CSV (RUNNER_FOLDERS' too)

    # -- parent side -------------------------------------------------------------------------------------------
    @abstractmethod
    def validate(self, cfg: BenchConfig) -> None:
        """Raise ConfigError (one line) for the first problem in this scenario's keys; the process keys
        (framework, device, logger, limits) are checked before, by bench.config.validate_process."""

    @abstractmethod
    def identity(self, cfg: BenchConfig) -> dict:
        """The part of the config that makes this trial's identity: what resume compares and config_hash hashes."""

    def config_keys(self, cfg: BenchConfig) -> tuple[str, ...]:
        """The keys this scenario reads (its W&B run's config): the scenario, its identity, the process keys."""
        keys = ("scenario", *self.identity(cfg), *NOT_IDENTITY)
        return tuple(k for k in dict.fromkeys(keys) if hasattr(cfg, k))

    @abstractmethod
    def kind(self, cfg: BenchConfig) -> str:
        """The trial's kind in its run_id (<time>-<framework>-<kind>-<random>)."""

    @abstractmethod
    def label(self, cfg: BenchConfig) -> str:
        """What the progress line calls the trial."""

    def env(self, cfg: BenchConfig) -> dict[str, str]:
        """Environment variables of the trial's process beyond the runner's own (read when libraries load)."""
        return {}

    @abstractmethod
    def rows(self, cfg: BenchConfig, outcome: dict, ids: dict) -> list[dict]:
        """The CSV rows of a finished trial (ok or not): `outcome` is the child's result or the parent's verdict
        (crashed, timeout, oom), `ids` the row's identity (run_id, started_at, wall_time_s, sweep_id,
        config_hash)."""

    def save(self, results_dir: Path, rows: list[dict], outcome: dict) -> None:  # noqa: B027 (optional hook)
        """Files beside the CSV, if the scenario has any (the model's per-step history)."""

    @abstractmethod
    def describe(self, outcome: dict, rows: list[dict]) -> str:
        """The end of the trial's progress line."""

    @abstractmethod
    def log_wandb(self, cfg: BenchConfig, rows: list[dict], outcome: dict, results_dir: Path) -> None:
        """The trial's W&B run (logger=wandb)."""

    @abstractmethod
    def sweep_rows(self, rows: list[dict], hashes: list[str], sweep_id: str) -> list[dict]:
        """Which of the CSV's rows the sweep `sweep_id` of these config hashes shows in its summary: its own, and
        for a trial it skipped (resume), the earlier rows that made it skip; never another sweep's."""

    @abstractmethod
    def summary(self, rows: list[dict]) -> str:
        """The fixed-width table printed when a sweep ends."""

    def losses(self, results_dir: Path, run_id: str) -> list[float] | None:
        """The trial's per-step training losses, as recorded (what a rerun must repeat); None where the scenario
        records none."""
        return None

    # -- child side --------------------------------------------------------------------------------------------
    @abstractmethod
    def measure(self, cfg: BenchConfig, on_progress: Callable[[dict], None]) -> dict:
        """Run the trial in this (spawned) process and return its outcome: a JSON-able dict with "status".
        `on_progress(partial)` leaves what is done so far for the parent, should the process die."""


Registry = Mapping[str, Scenario]  # scenario name -> scenario: what `scenario=` selects (bench/scenarios/)


def scenario_of(scenarios: Registry, name: str) -> Scenario:
    """The scenario `scenario=name` selects; an unknown name is a ConfigError."""
    if name not in scenarios:
        raise ConfigError(f"scenario={name}: accepted {' | '.join(scenarios)}")
    return scenarios[name]


def validate(scenario: Scenario, cfg: BenchConfig) -> None:
    """Raise ConfigError (one line) for the first problem in a trial's config: the process keys every trial
    reads, then its scenario's own."""
    validate_process(cfg)
    scenario.validate(cfg)


def config_hash(scenario: Scenario, cfg: BenchConfig) -> str:
    return hash_identity(scenario.identity(cfg))


def finished_runs(rows: Iterable[dict]) -> dict[str, list[dict]]:
    """Per config hash, the rows of its latest run whose every row is finished (FINISHED: a model trial writes one
    row, an ops trial one per op and shape): what resume skips a trial on, and what a sweep's summary shows for it."""
    rows = list(rows)
    failed = {r["run_id"] for r in rows if r.get("status") not in FINISHED}
    finished = (r for r in rows if r["run_id"] not in failed)
    done = {r["config_hash"]: r["run_id"] for r in latest(finished, key=lambda r: r["config_hash"])}
    runs: dict[str, list[dict]] = {}
    for r in rows:
        if done.get(r.get("config_hash")) == r["run_id"]:
            runs.setdefault(r["config_hash"], []).append(r)
    return runs


def identity_of(cfg: BenchConfig, keys) -> dict:
    """The config's values of these keys, as plain data (nested nodes as dicts)."""
    d = to_dict(cfg)
    return {k: d[k] for k in keys}
