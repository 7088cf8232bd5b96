"""The report from a results table that was tampered with or damaged: a header that repeats a column is refused in
one line; formula-like text reaches nothing it writes as a formula (OWASP's CSV-injection rule); a cell that
cannot be a measurement (not finite, a size below zero or past any memory, a step of 0 s) is shown as "-" and
never used in a ratio."""

from __future__ import annotations

import math
import re

import pytest

from bench.measure.system import cuda_gpu_names
from bench.report.build import main
from bench.report.tables import SkippedCell, num
from bench.scenarios import REPORT_SECTIONS
from tests.support import trial, write_csv

FORMULAS = ('=HYPERLINK("http://evil.example","click")', "+cmd|' /C calc'!A0", "@SUM(1+1)", "-2+3+cmd")


def test_a_header_that_repeats_a_column_is_refused_in_one_line(tmp_path, capsys):
    """`framework,status` twice: read either way, a torch row would be shown as jax; nothing is written."""
    path = write_csv(tmp_path / "runs.csv", [trial("torch", "backprop"), trial("torch", "jvp")])
    header, *body = path.read_text().splitlines()
    path.write_text("\n".join([header + ",framework,status", *(line + ",jax,ok" for line in body)]) + "\n")
    before = path.read_bytes()
    assert main([str(path), "--out", str(tmp_path / "out")], REPORT_SECTIONS) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "repeats the column(s) framework, status" in err[0] and "accepted" in err[0], err
    assert path.read_bytes() == before and not (tmp_path / "out").exists()


def test_formula_like_text_is_written_as_text_in_report_md_and_the_kept_copy(tmp_path):
    """In a heading (the device's name), a line of text (the experiment), a table cell (a failed trial's error):
    each payload is shown after a quote, never at the start of a cell as a spreadsheet would evaluate it."""
    experiment, device, error, sweep = FORMULAS
    rows = [
        trial("torch", "backprop", experiment=experiment, device_name=device),
        trial("jax", "backprop", experiment=experiment, device_name=device),
        trial("torch", "jvp", "crashed", error=error, sweep_id=sweep),
    ]
    path = write_csv(tmp_path / "runs.csv", rows)
    out, kept = tmp_path / "out", tmp_path / "benchmarks"
    assert main([str(path), "--out", str(out), "--benchmarks", str(kept)], REPORT_SECTIONS) == 0
    for text in ((out / "report.md").read_text(), next(kept.glob("*.md")).read_text()):
        for payload in FORMULAS:
            shown = [m.start() for m in re.finditer(re.escape(payload), text)]
            assert shown and all(text[i - 1] == "'" for i in shown), (payload, [text[i - 20 : i + 5] for i in shown])
        cells = [c.strip() for line in text.splitlines() if line.startswith("|") for c in line.split(" | ")]
        assert not [c for c in cells if c.startswith(("=", "+", "@")) or re.match(r"-[^\d.\s-]", c)]


@pytest.mark.parametrize(
    ("column", "value"),
    [
        ("peak_mem_mb", -1e308),
        ("peak_mem_mb", -5.0),
        ("excess_mem_mb", 1e308),
        ("step_time_median_s", 0.0),
        ("step_time_median_s", -0.3),
        ("compile_time_s", -1.0),
        ("primal_s", 0.0),
        ("comm_bytes_per_step", -8.0),
    ],
)
def test_a_value_that_cannot_be_a_measurement_is_a_damaged_cell(column, value):
    with pytest.warns(SkippedCell, match=rf"column {column}=.* cannot be a measurement"):
        assert num({column: repr(value), "run_id": "r"}, column) is None


@pytest.mark.parametrize(
    ("column", "value"),
    [("excess_mem_mb", -12.5), ("time_overhead_ms", -0.1), ("loss_first", -0.5), ("mem_grads_mb", 0.0)],
)
def test_a_measured_difference_or_a_negative_loss_stays_a_number(column, value, recwarn):
    assert num({column: repr(value)}, column) == value and not recwarn.list


@pytest.mark.parametrize("value", ["nan", "inf", "-inf"])
def test_a_non_finite_cell_is_no_number(value):
    assert num({"step_time_median_s": value}, "step_time_median_s") is None


def test_impossible_cells_are_shown_as_damaged_and_left_out_of_ratios(tmp_path):
    """-1e308 MiB, a 0 s step and an infinite compile: "-" in the table and in every ratio they would enter."""
    damaged = {"peak_mem_mb": -1e308, "step_time_median_s": 0.0, "compile_time_s": math.inf}
    rows = [trial("torch", "backprop"), {**trial("jax", "backprop"), **damaged}]
    path = write_csv(tmp_path / "runs.csv", rows)
    with pytest.warns(SkippedCell):
        assert main([str(path), "--out", str(tmp_path / "out")], REPORT_SECTIONS) == 0
    md = (tmp_path / "out" / "report.md").read_text()
    assert re.search(r"^\| jax \| backprop \| - \| [\d.]+ \| - \| - \|", md, flags=re.M), md
    (ratio,) = [line for line in md.splitlines() if line.startswith("| backprop: jax / torch |")]
    assert ratio.split(" | ")[1:] == ["-", "1.00×", "-", "- |"]
    assert "e+308" not in md and "1000000000000" not in md and "0.00×" not in md and not re.search(r"\binf\b", md)


@pytest.mark.skipif(bool(cuda_gpu_names()), reason="a GPU host names the kept copy after its own card")
def test_a_kept_copy_is_named_inside_its_folder_whatever_the_rows_say(tmp_path):
    """The kept copy is named after the rows' card and commit: a row edited to name a path, or with a devices cell
    that is no number, still gives one file in --benchmarks."""
    gpu = {"device": "cuda", "device_name": "NVIDIA ../../../evil1/x"}
    rows = [trial("torch", "backprop", **gpu, devices="x"), trial("jax", "backprop", **gpu, git_sha="../../y")]
    path = write_csv(tmp_path / "results" / "runs.csv", rows)
    kept = tmp_path / "results" / "benchmarks"
    with pytest.warns(SkippedCell, match="devices='x' is not a number"):
        assert main([str(path), "--out", str(tmp_path / "out"), "--benchmarks", str(kept)], REPORT_SECTIONS) == 0
    (copy,) = kept.iterdir()
    assert copy.is_file() and copy.name.endswith("_1gpu--evil1-x_y.md"), copy.name
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out", "results"]


@pytest.mark.parametrize("experiment", ["default_bench", "mode_targets", "shapes"])
def test_a_shape_cell_that_is_no_whole_number_makes_its_row_damaged(tmp_path, experiment):
    """The sections group and sort by layers, widths, batches and lengths as whole numbers: a row with 12.5 layers
    or a formula for its length is listed as damaged, with the cell, and the report still builds."""
    rows = [
        trial("torch", "backprop", experiment=experiment),
        {**trial("jax", "backprop", experiment=experiment), "num_layers": "12.5"},
        {**trial("jax", "jvp", experiment=experiment), "seq_len": "=1+1"},
    ]
    path = write_csv(tmp_path / "runs.csv", rows)
    assert main([str(path), "--out", str(tmp_path / "out")], REPORT_SECTIONS) == 0
    md = (tmp_path / "out" / "report.md").read_text()
    assert "num_layers='12.5' not a whole number" in md and 'seq_len="\'=1+1" not a whole number' in md, md
