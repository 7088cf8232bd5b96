"""The report's "Speed" section: the harness against a plain training loop (overhead.csv, beside runs.csv), and
JAX's first step per mode from the model's rows; the jvp/backprop step target is in the modes' targets."""

from __future__ import annotations

from pathlib import Path

from bench.report.section import Results, Section
from bench.report.tables import md_table
from bench.scenarios.model.report.targets import HEAD, OVERHEAD_CSV, cells, perf
from bench.scenarios.model.select import view


class SpeedSection(Section):
    def render(self, results: Results, plot_dir: Path) -> list[str]:
        speed = perf(view(results).sel.ok, results.rows(OVERHEAD_CSV))
        if not speed:
            return []
        return [
            "## Speed",
            "",
            "The harness against a plain training loop of the same model, batch and optimizer (`python -m "
            "bench overhead`, interleaved runs: the ratio of medians), and JAX's first step (ahead-of-time "
            "compile plus the first run) per mode; the jvp/backprop step target is in the table above. "
            "docs/speed.md says why a target is missed.",
            "",
            md_table(HEAD, cells(speed), "lllrrl"),
            "",
        ]
