"""What a scenario is: the kind of measurement a trial makes. The runner (bench/runner.py) spawns, isolates,
watches, classifies and records every trial the same way and knows nothing of BERT or of ops; a scenario says
what its trial measures and how its rows read.

Parent side (the sweep's process, which never imports torch or jax): validate the config, name what makes a
trial's identity, label its progress line, set its process environment, turn the child's outcome into rows,
describe them in one line, log them to W&B, summarise a sweep. Child side (the spawned trial process): measure.

Adding a scenario is one module here that subclasses Scenario, plus one line in bench/scenarios/__init__.py.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable
from pathlib import Path

from bench.config import NOT_IDENTITY


class Scenario(ABC):
    name: str  # the `scenario=` value
    results_file: str  # under results_dir: one CSV per scenario
    columns: tuple[str, ...]  # that CSV's schema (bench.sinks)
    report_module: str  # `python -m <report_module>` builds tables and plots from the CSV

    # -- parent side -------------------------------------------------------------------------------------------
    @abstractmethod
    def validate(self, c: dict) -> None:
        """Raise ConfigError (one line) for the first problem in this scenario's keys; the process keys
        (framework, device, logger, limits) are checked before, by bench.config.validate_process."""

    @abstractmethod
    def identity_keys(self, c: dict) -> tuple[str, ...]:
        """The config keys that make this trial's identity: what resume compares and config_hash hashes."""

    def identity(self, c: dict) -> dict:
        return {k: c[k] for k in self.identity_keys(c)}

    def config_keys(self, c: dict) -> tuple[str, ...]:
        """The keys this scenario reads (its W&B run's config): the scenario, its identity, the process keys."""
        keys = ("scenario", *self.identity_keys(c), *NOT_IDENTITY)
        return tuple(k for k in dict.fromkeys(keys) if k in c)

    @abstractmethod
    def kind(self, c: dict) -> str:
        """The trial's kind in its run_id (<time>-<framework>-<kind>-<random>)."""

    @abstractmethod
    def label(self, c: dict) -> str:
        """What the progress line calls the trial."""

    def env(self, c: dict) -> dict[str, str]:
        """Environment variables of the trial's process beyond the runner's own (read when libraries load)."""
        return {}

    @abstractmethod
    def rows(self, c: dict, outcome: dict, ids: dict) -> list[dict]:
        """The CSV rows of a finished trial (ok or not): `outcome` is the child's result or the parent's verdict
        (crashed, timeout, oom), `ids` the row's identity (run_id, started_at, wall_time_s, sweep_id,
        config_hash)."""

    def save(self, results_dir: Path, rows: list[dict], outcome: dict) -> None:  # noqa: B027 (optional hook)
        """Files beside the CSV, if the scenario has any (the model's per-step history)."""

    @abstractmethod
    def describe(self, outcome: dict, rows: list[dict]) -> str:
        """The end of the trial's progress line."""

    @abstractmethod
    def log_wandb(self, c: dict, rows: list[dict], outcome: dict, results_dir: Path) -> None:
        """The trial's W&B run (logger=wandb)."""

    @abstractmethod
    def sweep_rows(self, rows: list[dict], hashes: list[str], sweep_id: str) -> list[dict]:
        """Which of the CSV's rows the sweep `sweep_id` of these config hashes shows in its summary: its own, and
        for a trial it skipped (resume), the earlier rows that made it skip; never another sweep's."""

    @abstractmethod
    def summary(self, rows: list[dict]) -> str:
        """The fixed-width table printed when a sweep ends."""

    # -- child side --------------------------------------------------------------------------------------------
    @abstractmethod
    def measure(self, c: dict, on_progress: Callable[[dict], None]) -> dict:
        """Run the trial in this (spawned) process and return its outcome: a JSON-able dict with "status".
        `on_progress(partial)` leaves what is done so far for the parent, should the process die."""
