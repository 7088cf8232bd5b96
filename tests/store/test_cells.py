"""A cell that should hold a number and does not is shown as "-" by every reader, which says so once, naming the
file, the row's run_id and the column."""

from __future__ import annotations

import warnings

import pytest

from bench.report.tables import SkippedCell, num


def test_a_non_numeric_cell_is_skipped_and_said_once():
    row = {"run_id": "r1", "_source": "results/runs.csv", "peak_mem_mb": "lots", "excess_mem_mb": "12.5"}
    with pytest.warns(SkippedCell, match=r"results/runs.csv, run_id r1: column peak_mem_mb='lots' is not a number"):
        assert num(row, "peak_mem_mb") is None
    assert num(row, "excess_mem_mb") == 12.5
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("default")  # Python's own: each distinct warning once
        for _ in range(3):
            num(row, "peak_mem_mb")
    assert len([w for w in seen if issubclass(w.category, SkippedCell)]) == 1


def test_empty_and_non_finite_cells_are_no_measurement_and_no_warning(recwarn):
    assert num({"x": ""}, "x") is None and num({"x": "nan"}, "x") is None and num({}, "x") is None
    assert not [w for w in recwarn if issubclass(w.category, SkippedCell)]
