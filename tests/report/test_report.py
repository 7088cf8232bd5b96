"""The report (`python -m bench report`: bench/report/build.py with the model scenario's sections,
bench/scenarios/model/report/) built from one results folder holding every experiment's rows, written with the
real CsvSink (the `full` fixture, tests/report/conftest.py): tables, ratios, the UMass study's table, real PNG
plots, failed trials listed and never plotted. Partial CSVs and the command line: test_report_inputs.py; rows
that differ in a knob: test_report_contexts.py; beyond one device: test_report_parallel.py."""

from __future__ import annotations

import os

import pytest
from matplotlib.figure import Figure

from bench.report.plots import Chart, Series, draw_panel
from bench.scenarios.model.report.modes import depth_growth
from bench.scenarios.model.report.plots import plan_plots
from bench.scenarios.model.select import group_contexts, select
from bench.store.read import load_rows
from tests.support import MIB, POISON, assert_real_png, bert_params, first_table, planned_plots


@pytest.mark.slow
def test_every_plot_is_drawn_as_a_real_png_and_embedded_with_how_to_read(full):
    plots = {p.name: p for p in planned_plots([full["csv"]])}  # what the report planned from the rows
    assert set(plots) == {
        "excess_memory",
        "step_time",
        "memory_vs_depth",
        "memory_vs_seq_len",
        "memory_vs_batch",
        "jacfwd_vs_trainable",
        "grad_quality",
        "training_curves",
        "memory_vs_devices",
        "comm_bytes",
    }
    assert {p.stem for p in full["report"].plots} == set(plots)  # the plots report.md shows
    for name, p in plots.items():
        assert p.drawn, f"{name} skipped: needs {p.needs}"
        path = full["out"] / "plots" / f"{name}.png"
        assert path in full["report"].plots
        assert_real_png(path)
        link = f"![{p.title}](plots/{name}.png)"
        assert link in full["md"]
        after = full["md"].split(link, 1)[1].lstrip("\n")
        assert after.startswith(f"*How to read it:* {p.how_to_read}")
    assert "Skipped for lack of data" not in full["md"]


def test_the_csv_is_never_modified(full):
    assert (full["csv"].read_bytes(), os.stat(full["csv"]).st_mtime_ns) == full["before"]


def test_framework_by_mode_table_has_the_latest_ok_row_and_says_so(full):
    md = full["md"]
    lines = first_table(md.split("### minilm_l6 (6 layers, hidden 384) · synthetic · B8 T128 · sgd", 1)[1])
    table = "\n".join(lines)
    assert lines[0].startswith("| framework | mode | peak MiB | excess MiB | compile s | step ms (median) | samples/s")
    assert "| torch | backprop | " in table and "| 400 |" in table  # the later of the two ok backprop rows
    assert str(int(POISON)) not in md
    assert "latest ok row" in md
    # mode order, torch before jax within a mode
    modes = [line.split(" | ")[1] for line in lines[2:]]
    assert modes[:6] == ["inference", "inference", "backprop", "backprop", "backprop+remat", "backprop+remat"]
    assert modes[6:] == ["jvp", "jvp", "jacfwd[head]", "jacfwd[head]", "mezo", "mezo"]  # the scope is in the name


def test_ratios_that_matter(full):
    section = full["md"].split("### minilm_l6", 1)[1].split("\n### ", 1)[0]
    assert "| torch: jvp / backprop | " in section
    row = next(line for line in section.splitlines() if line.startswith("| torch: jvp / backprop |"))
    assert row.split(" | ")[2] == "0.50×"  # excess memory 200 / 400
    assert row.split(" | ")[3] == "1.00×"  # step time 3.2 / 3.2
    row = next(line for line in section.splitlines() if line.startswith("| jvp: jax / torch |"))
    assert row.split(" | ")[2] == "1.50×" and row.split(" | ")[3] == "0.62×"  # 300 / 200, 2.0 / 3.2
    assert "| torch: mezo / inference | " in section and "| jax: mezo / inference | " in section
    assert "jacfwd[head]: jax / torch" not in section  # jax's jacfwd failed: nothing to divide


def test_study_table_in_the_umass_studys_order(full):
    section = full["md"].split("## The UMass forward-AD study's table", 1)[1].split("\n## ", 1)[0]
    lines = [line for line in section.splitlines() if line.startswith("| ")]
    assert lines[0].startswith("|  | Peak memory (MiB) | Excess memory (MiB) | Total training time (s) | Eval accuracy")
    names = [line.split(" | ")[0].strip("| ") for line in lines[1:]]  # [0] is the header; "|:---" the rule
    assert names == ["PyTorch backprop", "PyTorch JVP", "JAX backprop", "JAX JVP"]
    assert lines[2].split(" | ")[1:5] == ["1500", "600", "290", "42.0%"]


def test_failed_rows_are_listed_with_status_and_error(full):
    md = full["md"]
    failed = [r for r in full["rows"] if r["status"] != "ok"]
    assert {r["status"] for r in failed} == {"oom", "crashed", "error", "timeout"}
    section = md.split("## Trials that did not finish", 1)[1]
    for r in failed:
        line = next(ln for ln in section.splitlines() if ln.startswith(f"| {r['run_id']} |"))
        assert f"| {r['status']} |" in line
        assert r["error"].splitlines()[0][:40] in line
    oom_first = next(ln for ln in section.splitlines() if "CUDA out of memory" in ln)
    assert "| yes |" in oom_first  # torch jvp failed first, then ran ok
    # in its cell: jax's jacfwd never ran ok, so the table shows its status instead of numbers
    assert "| jax | jacfwd[head] | **oom** |" in md
    assert "| jax | mezo[last_k=2] | **error** |" in md  # the scope as scope_label names it


def test_failed_rows_are_never_plotted(full):
    rows = load_rows([full["csv"]])
    sel = select(rows)
    plots = plan_plots(sel, group_contexts(sel))
    values = [y for p in plots for row in p.grid for panel in row for s in panel.series for y in s.ys]
    assert values and POISON not in values and POISON + 1 not in values
    excess = next(p for p in plots if p.name == "excess_memory").grid[0][0]
    assert "minilm_l6" in excess.title
    jax = next(s for s in excess.series if s.framework == "jax")
    assert "jacfwd[head]" not in [excess.categories[int(x)] for x in jax.xs]
    torch = next(s for s in excess.series if s.framework == "torch")
    assert "jacfwd[head]" in [excess.categories[int(x)] for x in torch.xs]
    # the crashed 12-layer backprop is not a point of the depth plot
    depth = next(p for p in plots if p.name == "memory_vs_depth").grid[0][0]
    assert all(s.xs == [1.0, 2.0, 4.0, 8.0] for s in depth.series)


def test_depth_growth_is_the_slope_per_layer_against_a_layers_parameters(full):
    sel = select(load_rows([full["csv"]]))
    ((key, body),) = depth_growth(sel.ok)
    table = {(r[0], r[1]): r for r in body}
    layer_mb = 7_087_872 * 4 / MIB  # the cost model: backprop keeps 8 MiB of activations per layer and a gradient
    assert table["torch", "backprop"][2] == "1 → 8"  # the crashed 12-layer row is not a point
    assert float(table["torch", "backprop"][4]) == pytest.approx(8 + layer_mb, abs=0.05)
    assert table["torch", "backprop"][5] == f"{layer_mb:.1f}"
    assert table["jax", "jvp"][6] == f"{2 * layer_mb / layer_mb:.2f}×"  # two parameter-sized buffers per layer
    assert table["jax", "mezo"][4] == "0.0" and table["jax", "mezo"][6] == "0.00×"  # flat in depth
    assert "## Memory growth with depth" in full["md"] and "| torch | jvp | 1 → 8 |" in full["md"]


def test_scaling_plots_show_what_the_sweeps_varied(full):
    rows = load_rows([full["csv"]])
    sel = select(rows)
    plots = {p.name: p for p in plan_plots(sel, group_contexts(sel))}
    memory = plots["memory_vs_depth"].grid[0][0]
    lines = {s.label: s for s in memory.series}
    depth_rows = {
        r["num_layers"]: r["excess_mem_mb"]
        for r in full["rows"]
        if r.get("experiment") == "depth_scaling"
        and r["framework"] == "torch"
        and r["mode"] == "backprop"
        and r["status"] == "ok"
    }
    assert lines["torch backprop"].xs == [1, 2, 4, 8]
    assert lines["torch backprop"].ys == pytest.approx([depth_rows[n] for n in (1, 2, 4, 8)])
    guide = next(s for s in memory.series if s.guide)
    assert guide.ys[0] == pytest.approx(bert_params(1) * 4 / MIB)
    assert [s.xs for s in plots["memory_vs_seq_len"].grid[0][0].series if s.label == "jax mezo"] == [[32, 64, 128, 256]]
    assert [s.xs for s in plots["memory_vs_batch"].grid[0][0].series if s.label == "jax mezo"] == [[1, 2, 4, 8]]
    jacfwd = plots["jacfwd_vs_trainable"].grid[0][0]
    assert [s.xs for s in jacfwd.series if s.label == "torch jacfwd"] == [[772, 1188, 18276]]
    quality = plots["grad_quality"].grid
    assert len(quality) == 2  # head and bias
    q = quality[0][0]
    assert [s.xs for s in q.series if s.label == "torch jvp"] == [[1, 4, 16, 64, 256]]
    assert any(s.mode == "mezo" for s in q.series) and any(s.guide.startswith("expected") for s in q.series)
    curves = plots["training_curves"].grid[0]
    assert [p.ylabel for p in curves] == ["training loss", "held-out accuracy"]
    assert len(curves[0].series) == 4 and all(len(s.xs) == 625 for s in curves[0].series)
    assert all(s.xs == [125, 250, 375, 500, 625] for s in curves[1].series)


def test_pathology_is_explained_where_naive_jvp_rows_exist(full):
    section = full["md"].split("## The UMass study's jvp pathology", 1)[1].split("\n## ", 1)[0]
    assert "require" in section and "detach" in section
    assert "| jvp[naive] | ok | " in section and "| 2.00× |" in section  # 1800 / 900


def test_a_log_axis_is_ticked_at_the_measured_values_or_has_no_minor_labels():
    """A log axis over a few measured values (a model's trained scopes) is ticked at them, named in full; one over
    many values keeps the default decades without labelling its minor ticks, which overlapped over two decades."""

    def labels(xs: list[float]) -> tuple[list[str], list[str]]:
        ax = Figure().add_subplot()
        draw_panel(
            ax, Chart("t", "trained parameters", "steps", [Series("torch", "mezo", xs, [1.0] * len(xs))], logx=10)
        )
        ax.figure.canvas.draw()
        text = lambda minor: [t.get_text() for t in ax.get_xticklabels(minor=minor) if t.get_text()]
        return text(False), text(True)

    assert labels([1540, 10756, 27652, 75268]) == (["1,540", "10,756", "27,652", "75,268"], [])
    assert labels([1540, 1560, 75268])[1] == []  # two scopes too close to name apart: decades, unlabelled minors
    assert labels([float(x) for x in range(1500, 80000, 2000)])[1] == []
