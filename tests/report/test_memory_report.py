"""The report's "Memory, explained" section (bench/scenarios/model/report/memory.py), from synthetic rows written
with the real CsvSink: the predicted-vs-measured table and its flag, the stacked chart as a real PNG with how to
read it, the paragraph on torch's jvp implementations, and no section where no row has the breakdown."""

from __future__ import annotations

from pathlib import Path

import pytest

from bench.report.plots import Plot
from bench.scenarios.model.report.memory import DISAGREE, FLAG, breakdown_contexts, breakdown_plot, disagrees
from bench.scenarios.model.select import select
from bench.store.read import load_rows
from tests.support import COLUMNS, POISON, assert_real_png, build_report, trial, write_csv

BREAKDOWN = (
    "mem_trainable_mb",
    "mem_grads_mb",
    "mem_directions_mb",
    "mem_saved_mb",
    "mem_temp_mb",
    "mem_tracked_peak_mb",
    "mem_breakdown_method",
    "mem_predicted_mb",
    "mem_predicted_saved_mb",
    "mem_predicted_grads_mb",
    "mem_predicted_directions_mb",
    "mem_predicted_temp_mb",
)
PARAMS = 86.6  # MiniLM's parameters in fp32, MiB
NAIVE_SAVED, FUNC_SAVED = 1374.0, 0.0
LAZY_DIRECTIONS = 11.4  # the largest parameter tensor: the word embeddings


def measured(
    framework: str,
    mode: str,
    *,
    excess: float,
    predicted: float,
    saved=0.0,
    grads=0.0,
    directions=0.0,
    temp=0.0,
    optimizer_mb=0.0,
    **kw,
) -> dict:
    """A row with the breakdown; the predicted categories are the measured ones unless given."""
    cats = {"saved": saved, "grads": grads, "directions": directions, "temp": temp}
    row = {
        "excess_mem_mb": excess,
        "mem_params_mb": PARAMS,
        "mem_optimizer_mb": optimizer_mb,
        "mem_trainable_mb": PARAMS,
        "mem_tracked_peak_mb": saved + grads + directions,
        "mem_breakdown_method": "torch_saved_tensors_hooks+rss_hwm_remainder"
        if framework == "torch"
        else "jax_saved_residuals+xla_memory_analysis",
        "mem_predicted_mb": predicted,
        **{f"mem_{c}_mb": v for c, v in cats.items()},
        **{f"mem_predicted_{c}_mb": v for c, v in cats.items()},
    }
    row.update(kw)
    return trial(framework, mode, **row)


def breakdown_rows() -> list[dict]:
    rows = [
        # superseded by the later row of the same configuration: never shown
        measured("torch", "backprop", excess=POISON, predicted=POISON, saved=POISON),
        measured("torch", "backprop", excess=400.0, predicted=380.0, saved=150.0, grads=86.6, temp=60.0),
        measured(
            "torch",
            "jvp",
            excess=1800.0,
            predicted=1000.0,
            saved=NAIVE_SAVED,
            directions=86.6,
            temp=300.0,
            jvp_impl="naive",
            mem_predicted_saved_mb=900.0,
        ),
        measured("torch", "jvp", excess=200.0, predicted=190.0, saved=FUNC_SAVED, directions=86.6, temp=100.0),
        measured(
            "torch", "jvp", excess=210.0, predicted=190.0, saved=0.0, directions=86.6, temp=110.0, jvp_impl="func"
        ),
        measured(
            "torch",
            "jvp",
            excess=120.0,
            predicted=115.0,
            saved=0.0,
            directions=LAZY_DIRECTIONS,
            temp=100.0,
            jvp_impl="lazy",
        ),
        measured("jax", "backprop", excess=520.0, predicted=380.0, saved=160.0, grads=86.6, temp=70.0),
        measured("jax", "backprop", excess=300.0, predicted=280.0, saved=20.0, grads=86.6, temp=150.0, remat=True),
        measured("jax", "jvp", excess=300.0, predicted=190.0, directions=86.6, temp=120.0),
        measured("torch", "mezo", excess=116.0, predicted=100.0, directions=LAZY_DIRECTIONS, temp=90.0),
        # an inference row from a run before the breakdown: left out of the section, kept in the other tables
        trial("torch", "inference", excess_mem_mb=58.0),
        # a failed trial never enters a number, breakdown or not
        trial("jax", "mezo", "oom", mem_saved_mb=POISON, mem_predicted_mb=POISON),
    ]
    return rows


def memory_plot(csv_path: Path) -> Plot:
    """The section's chart as it plans it from the CSV's rows (drawn when its grid is not empty)."""
    return breakdown_plot(breakdown_contexts(select(load_rows([csv_path]))))


@pytest.fixture(scope="module")
def report(tmp_path_factory):
    results = tmp_path_factory.mktemp("results")
    csv_path = write_csv(results / "runs.csv", breakdown_rows())
    out = results / "report"
    rep = build_report([csv_path], out)
    md = (out / "report.md").read_text()
    return {
        "out": out,
        "report": rep,
        "md": md,
        "section": md.split("## Memory, explained", 1)[1].split("\n## ")[0],
        "plot": memory_plot(csv_path),
    }


def table_line(section: str, framework: str, mode: str) -> str:
    found = [line for line in section.splitlines() if line.startswith(f"| {framework} | {mode} | ")]
    assert len(found) == 1, (framework, mode, section)
    return found[0]


def test_the_section_has_measured_against_predicted_and_flags_only_a_miss_beyond_a_quarter(report):
    section = report["section"]
    naive = table_line(section, "torch", "jvp[naive]")  # 1800 measured, 1000 predicted: 80% off
    assert "| 1800 | 1000 | 1.80× |" in naive and FLAG in naive
    assert f"| {NAIVE_SAVED:.0f} / 900 |" in naive  # the category that misses, measured / predicted
    backprop = table_line(section, "torch", "backprop")  # 400 against 380: 5% off
    assert "| 400 | 380 | 1.05× |" in backprop and FLAG not in backprop
    assert "| 150 / 150 | 87 / 87 | 0 / 0 | 60 / 60 |" in backprop  # saved, grads, directions, temp
    assert FLAG in table_line(section, "jax", "backprop")  # 520 against 380: 37% off
    assert FLAG not in table_line(section, "jax", "backprop+remat")
    assert "rss_hwm_remainder" in backprop
    assert str(int(POISON)) not in report["md"]
    assert "| torch | inference |" not in section  # no breakdown: not in this section
    assert "| torch | inference |" in report["md"]  # ...but in the framework x mode table
    assert "| jax | mezo |" not in section


def test_the_flag_is_a_quarter_of_the_prediction_either_way():
    assert disagrees({"excess_mem_mb": 100.0 * (1 + DISAGREE) + 1, "mem_predicted_mb": 100.0})
    assert disagrees({"excess_mem_mb": 100.0 * (1 - DISAGREE) - 1, "mem_predicted_mb": 100.0})
    assert not disagrees({"excess_mem_mb": 100.0 * (1 + DISAGREE) - 1, "mem_predicted_mb": 100.0})
    assert disagrees({"excess_mem_mb": "", "mem_predicted_mb": 100.0}) is None


def test_the_chart_is_a_real_png_embedded_with_how_to_read(report):
    p = report["plot"]
    path = report["out"] / "plots" / "memory_breakdown.png"
    assert p.name == "memory_breakdown" and p.drawn and path in report["report"].plots
    assert_real_png(path)
    link = f"![{p.title}](plots/{p.name}.png)"
    assert link in report["section"]
    assert report["md"].split(link, 1)[1].lstrip("\n").startswith(f"*How to read it:* {p.how_to_read}")
    # one bar per cell with the breakdown, stacked by category, the measured and predicted excess as guides
    (panel,) = [row[0] for row in p.grid]
    assert panel.categories == [
        "torch backprop",
        "jax backprop",
        "jax backprop+remat",
        "torch jvp",
        "jax jvp",
        "torch jvp[func]",
        "torch jvp[lazy]",
        "torch jvp[naive]",
        "torch mezo",
    ]
    stacks = {s.mode: s.ys for s in p.grid[0][0].series if not s.guide}
    assert list(stacks) == ["params", "optimizer", "grads", "directions", "saved", "temp"]
    naive = panel.categories.index("torch jvp[naive]")
    assert stacks["saved"][naive] == NAIVE_SAVED and stacks["params"][naive] == PARAMS
    guides = {s.guide: dict(zip(s.xs, s.ys)) for s in panel.series if s.guide}
    assert guides["params + measured excess"][naive] == pytest.approx(PARAMS + 1800.0)
    assert guides["params + predicted excess"][naive] == pytest.approx(PARAMS + 1000.0)


def test_the_jvp_impl_paragraph_compares_what_each_implementation_saves_and_holds(report):
    line = next(line for line in report["section"].splitlines() if line.startswith("Torch's `jvp` by `jvp_impl`"))
    assert f"`naive` saves {NAIVE_SAVED - FUNC_SAVED:.0f} MiB of activations that `dual` does not" in line
    assert "require grad" in line
    assert (
        f"`lazy` saves as much as `dual` (0 MiB) and holds {LAZY_DIRECTIONS:.0f} MiB of tangent at once "
        "instead of 87 MiB" in line
    )
    assert "`func` saves as much as `dual` (0 MiB) and holds the same 87 MiB of tangent" in line


def test_each_context_has_its_table_and_panel_and_one_jvp_impl_has_no_paragraph(tmp_path):
    rows = [
        measured("torch", "jvp", excess=200.0, predicted=190.0, directions=86.6),
        measured("jax", "jvp", excess=300.0, predicted=190.0, directions=86.6),
        measured(
            "torch",
            "backprop",
            excess=900.0,
            predicted=800.0,
            saved=500.0,
            grads=86.6,
            optimizer_mb=173.3,
            optimizer="adamw",
            batch_size=32,
        ),
    ]
    csv_path = write_csv(tmp_path / "runs.csv", rows)
    rep = build_report([csv_path], tmp_path / "out")
    section = rep.path.read_text().split("## Memory, explained", 1)[1].split("\n## ")[0]
    assert section.count("\n### ") == 2 and "B32 T128 · adamw" in section and "B8 T128 · sgd" in section
    assert "by `jvp_impl`" not in section
    (path,) = [p for p in rep.plots if p.stem == "memory_breakdown"]
    assert_real_png(path)
    plot = memory_plot(csv_path)
    panels = [row[0] for row in plot.grid]
    assert [p.categories for p in panels] == [["torch jvp", "jax jvp"], ["torch backprop"]]  # the richest first
    optimizer = next(s for s in panels[1].series if s.mode == "optimizer")
    assert optimizer.ys == [173.3]


@pytest.mark.parametrize("columns", ["older", "empty"])
def test_rows_without_the_breakdown_produce_no_section(tmp_path, columns):
    rows = [trial("torch", mode) for mode in ("inference", "backprop", "jvp")]
    rows.append(trial("torch", "jvp", jvp_impl="naive"))
    schema = tuple(c for c in COLUMNS if c not in BREAKDOWN) if columns == "older" else COLUMNS
    csv_path = write_csv(tmp_path / "runs.csv", rows, schema)
    out = tmp_path / "out"
    (out / "plots").mkdir(parents=True)
    (out / "plots" / "memory_breakdown.png").write_bytes(b"stale")  # from an earlier report into the same folder
    rep = build_report([csv_path], out)
    md = rep.path.read_text()
    assert "Memory, explained" not in md and "memory_breakdown" not in md
    assert "memory_breakdown" not in {p.stem for p in rep.plots} and not memory_plot(csv_path).drawn
    assert not Path(out / "plots" / "memory_breakdown.png").exists()
