"""The zeroth-order family's section: every estimator of `+experiment=zo_family` beside backprop and inference,
both frameworks, in one table (their optimizers differ, so the framework x mode tables would split them)."""

from __future__ import annotations

from pathlib import Path

from bench import estimators
from bench.report.section import Results, Section
from bench.report.tables import fmt_value, md_table, num
from bench.scenarios.model.select import experiment_of, framework_order, mode_order, variant, view
from bench.spec import FRAMEWORK_NAMES

EXPERIMENT = "zo_family"  # conf/experiment/zo_family.yaml


def label(row: dict) -> str:
    """The estimator as the table names it: its variant, and its optimizer where it is not SGD (ZO-Adam is MeZO
    with AdamW, ZO-SignSGD MeZO with the sign of its estimate)."""
    name = variant(row)
    return name if row.get("optimizer") in (None, "", "sgd") else f"{name} + {row['optimizer']}"


def passes(row: dict) -> str:
    """Forward passes per step, in words, with the row's own settings (2q forward for mezo.q=q)."""
    mode = row.get("mode", "")
    return estimators.get(mode).passes_for(row) if mode in estimators.names() else ""


class ZoFamilySection(Section):
    """Peak and excess memory, step time and forward passes of each estimator of the family, per framework."""

    def render(self, results: Results, plot_dir: Path) -> list[str]:
        rows = [r for r in view(results).sel.ok if experiment_of(r) == EXPERIMENT]
        if not rows:
            return []
        frameworks = sorted({r["framework"] for r in rows}, key=framework_order)
        cells = {(label(r), r["framework"]): r for r in rows}
        order = sorted({(mode_order(r), label(r)) for r in rows})
        head = ["estimator", "forward passes / step"]
        for fw in frameworks:
            name = FRAMEWORK_NAMES.get(fw, fw)
            head += [f"{name} peak MiB", f"{name} excess MiB", f"{name} step ms"]
        body = []
        for _, name in order:
            any_row = next(cells[name, fw] for fw in frameworks if (name, fw) in cells)
            line = [name, passes(any_row)]
            for fw in frameworks:
                r = cells.get((name, fw), {})
                line += [
                    fmt_value(num(r, "peak_mem_mb")),
                    fmt_value(num(r, "excess_mem_mb")),
                    fmt_value(num(r, "step_time_median_s"), 1e3),
                ]
            body.append(line)
        shape = rows[0]
        device = shape.get("device_name") or shape.get("device")
        return [
            "## The zeroth-order family",
            "",
            f"Rows of experiment `{EXPERIMENT}` (conf/experiment/zo_family.yaml): model {shape.get('model')}, batch "
            f"{shape.get('batch_size')}, sequence {shape.get('seq_len')}, {device}. "
            "Peak and excess memory as in the framework x mode tables (excess: above the trial's own baseline); step "
            "time the median of the timed steps. An estimator's label names its settings off their defaults "
            "(`mezo(q=4)`) and its optimizer where it is not SGD. docs/estimators.md says what each computes.",
            "",
            md_table(head, body, "ll" + "r" * (len(head) - 2)),
            "",
        ]
