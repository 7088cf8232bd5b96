"""What a panel shows, described once: the columns it plots and how. The report draws a description with
matplotlib over the rows it chose (bench/report/plots.py: a Chart per context), the W&B dashboard turns the same
description into a W&B panel over the runs (bench/report/dashboard.py), so the two views of one number agree."""

from __future__ import annotations

from dataclasses import dataclass

GROUP_BY = "framework_mode"  # a run's config key: one bar or line per framework x mode, as the report's tables


@dataclass(frozen=True)
class Panel:
    kind: str  # bar | line | scatter | table | media
    title: str  # the quantity and its unit, as an axis or a panel names it
    keys: tuple[str, ...]  # bar, scatter (y), table, media: CSV columns / summary keys; line: history keys
    x: str = ""  # scatter: the column along x
    x_measured: bool = False  # scatter: x is a measured column (a run's summary), not a configured one
    grouped: bool = True  # bar, line: one per GROUP_BY value (W&B: the mean of its runs, min-max as the range)
    log_y: bool = False
    scale: float = 1.0  # the report's axis: the column times this (seconds -> ms)

    def config_keys(self) -> tuple[str, ...]:
        x = "" if self.x_measured else self.x
        return tuple(k for k in (x, GROUP_BY if self.grouped and self.kind in ("bar", "line") else "") if k)

    def measured_x(self) -> tuple[str, ...]:
        """The summary key along x, where x is measured."""
        return (self.x,) if self.x_measured else ()

    def where(self) -> str:
        return "history" if self.kind == "line" else "summary"


def bar(title: str, *keys: str, grouped: bool = True, scale: float = 1.0) -> Panel:
    return Panel("bar", title, keys, grouped=grouped, scale=scale)


def line(title: str, *keys: str) -> Panel:
    return Panel("line", title, keys)


def scatter(title: str, y: str, x: str, log_y: bool = False, x_measured: bool = False) -> Panel:
    return Panel("scatter", title, (y,), x=x, log_y=log_y, x_measured=x_measured)


# The panels both views draw from runs.csv's columns: the report's bar charts and the dashboard's.
EXCESS_MEMORY = bar("excess memory (MiB)", "excess_mem_mb")
PEAK_MEMORY = bar("peak memory (MiB)", "peak_mem_mb")
STEP_TIME = bar("median step time (ms)", "step_time_median_s", scale=1e3)
