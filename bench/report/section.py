"""The one interface every part of the report implements, and what the parts read.

A report is built from results folders (bench/report/build.py): each scenario declares its sections
(bench/scenarios/__init__.py: REPORT_SECTIONS, in the report's order), and each section reads the files it needs
from `Results`, draws its plots into the plots folder and returns its markdown.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from bench.store.read import load_rows

RUNS_CSV = "runs.csv"  # a results folder's trials of the model scenario: the file a report is named after
PLOT_DIR = "plots"  # under the report's folder; report.md links plots/<name>.png, so the folder moves as one


@dataclass
class Results:
    """The results a report reads: the model's CSVs it was given (`runs`, read whole, in order) and, beside them,
    every other scenario's file (ops.csv, capacity.csv, overhead.csv, history/). Each file is read once; `cache`
    keeps what several sections derive from the same rows."""

    runs: list[Path]
    cache: dict = field(default_factory=dict)

    @property
    def folders(self) -> list[Path]:
        return list(dict.fromkeys(p.parent for p in self.runs))

    def beside(self, name: str) -> list[Path]:
        """The files called `name` in the results folders that exist."""
        return [f / name for f in self.folders if (f / name).is_file()]

    def rows(self, name: str, required: Sequence[str] = ()) -> list[dict]:
        """Every row of the files called `name` (RUNS_CSV: the CSVs given), read once (bench.store.read)."""
        key = ("rows", name)
        if key not in self.cache:
            paths = [p for p in self.runs if p.exists()] if name == RUNS_CSV else self.beside(name)
            self.cache[key] = load_rows(paths, required)
        return self.cache[key]


class Section(ABC):
    """One part of report.md."""

    @abstractmethod
    def render(self, results: Results, plot_dir: Path) -> list[str]:
        """The section's markdown lines ([] when it has nothing to show); its plots are drawn into `plot_dir`
        and linked as plots/<name>.png, and a plot it would draw but cannot (no data) is removed from there."""
