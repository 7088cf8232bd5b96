"""The scenarios: what the suite measures, one package each, with its config checks, its run, the columns it
writes and its report section.

    model      scenario=model: one way of differentiating BERT in one framework -> runs.csv
    ops        scenario=ops: op-level AD micro-benchmarks in one framework     -> ops.csv
    capacity   python -m bench capacity: the largest batch / sequence in a budget -> capacity.csv; a ladder of
               them, the shapes users train at (its report section, shapes.py)
    overhead   python -m bench overhead: the harness against a plain loop        -> overhead.csv

SCENARIOS is what `scenario=` selects (one trial process each, run by bench/harness/); capacity and overhead are
commands that run model trials. REPORT_SECTIONS is the report's content, in order. A new trial scenario is a
package with a Scenario subclass (bench/harness/scenario.py) and one entry in SCENARIOS.
"""

from __future__ import annotations

from bench.harness.scenario import Registry
from bench.report.section import Section
from bench.scenarios.capacity.report import CapacitySection
from bench.scenarios.capacity.shapes import ShapesSection
from bench.scenarios.model.report import (
    cost,
    families,
    memory,
    modes,
    parallel,
    plots,
    targets,
    time_explained,
    zo_family,
)
from bench.scenarios.model.scenario import MODEL
from bench.scenarios.ops.report import OpsSection
from bench.scenarios.ops.scenario import OPS
from bench.scenarios.overhead.report import SpeedSection

SCENARIOS: Registry = {s.name: s for s in (MODEL, OPS)}
# Every column a trial scenario writes: the keys a W&B run of theirs can carry (the dashboard checks its panels).
COLUMNS: tuple[str, ...] = tuple(dict.fromkeys(c for s in SCENARIOS.values() for c in s.columns))

REPORT_SECTIONS: tuple[Section, ...] = (
    modes.ModesSection(),
    zo_family.ZoFamilySection(),
    families.FamiliesSection(),
    cost.CostSection(),
    modes.StudySection(),
    modes.PathologySection(),
    targets.TargetsSection(),
    SpeedSection(),
    modes.DepthSection(),
    memory.MemorySection(),
    time_explained.TimeSection(),
    parallel.ParallelSection(),
    plots.PlotsSection(),
    modes.FailedSection(),
    OpsSection(),
    CapacitySection(),
    ShapesSection(),
)
