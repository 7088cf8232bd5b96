"""Results that stay trustworthy when things go wrong around them: sweeps started together, and results files
with rows that are not whole (cut off mid-write). Foreign or unwritable results files and input a trial would
only find bad once running are refused up front: test_preflight.py."""

from __future__ import annotations

import subprocess
import sys

import pytest

from bench.scenarios.model.columns import COLUMNS
from bench.store.csv import CsvSink
from bench.store.read import read_rows
from tests.support import FAST, REPO, build_report, whole_rows


@pytest.mark.slow
def test_two_sweeps_started_together_keep_apart(tmp_path):
    """Started in the same second into one results_dir: two sweep ids, two Hydra folders, and each sweep's summary
    shows its own trial only."""
    cmd = lambda mode: [
        sys.executable,
        "-m",
        "bench",
        "-m",
        "framework=torch",
        f"mode={mode}",
        *FAST,
        "logger=none",
        f"results_dir={tmp_path}",
    ]
    procs = {
        m: subprocess.Popen(cmd(m), cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        for m in ("inference", "backprop")
    }
    outs = {m: p.communicate(timeout=600) for m, p in procs.items()}
    assert all(p.returncode == 0 for p in procs.values()), outs
    rs = read_rows(tmp_path / "runs.csv")
    assert len(rs) == 2 and len({r["sweep_id"] for r in rs}) == 2
    assert len(list((tmp_path / "hydra").glob("sweep_*"))) == 2
    for mode, (out, _) in outs.items():
        table = out.split("framework  mode")[1].split("bench: rows in")[0]
        other = "backprop" if mode == "inference" else "inference"
        assert f"torch      {mode}" in table and other not in table, out


# ---------------------------------------------------------------------------------------------------------------
# the results file: damaged rows (foreign, unreadable and unwritable files: test_preflight.py)


def cuts(data: bytes) -> dict[str, int]:
    """Offsets inside the last row: in a plain cell, just after a comma, inside its quoted cell."""
    last = data.rstrip(b"\n").rfind(b"\nr2,") + 1
    quoted = data.index(b'"ValueError', last) + 5
    return {"plain cell": last + 2, "after a comma": last + 3, "quoted cell": quoted}


@pytest.mark.parametrize("where", ["plain cell", "after a comma", "quoted cell"])
def test_a_cut_off_last_row_is_set_aside_and_never_swallows_the_next(tmp_path, where):
    path = tmp_path / "runs.csv"
    data = whole_rows(path)
    path.write_bytes(data[: cuts(data)[where]])
    with pytest.warns(RuntimeWarning, match=r"1 row\(s\) not whole \(line \d+: .*\) set aside in runs.csv.damaged-"):
        CsvSink(path, COLUMNS).write({"run_id": "r3", "framework": "jax", "status": "ok", "config_hash": "h3"})
    assert [r["run_id"] for r in read_rows(path)] == ["r0", "r1", "r3"]
    (side,) = tmp_path.glob("runs.csv.damaged-*")
    assert side.read_bytes() == data[data.rstrip(b"\n").rfind(b"\nr2,") + 1 : cuts(data)[where]]
    CsvSink(path, COLUMNS).write({"run_id": "r4", "status": "ok"})  # a whole file again: nothing more is set aside
    assert [r["run_id"] for r in read_rows(path)] == ["r0", "r1", "r3", "r4"]


def test_rows_swallowed_by_an_old_cut_are_found_again(tmp_path):
    """Before this check existed, a row appended after a cut inside a quoted cell became part of that cell: the
    scan costs the cut row only, and the row written after it is whole again."""
    path = tmp_path / "runs.csv"
    data = whole_rows(path)
    path.write_bytes(data[: cuts(data)["quoted cell"]] + b"\n" + data.split(b"\n", 1)[1][: data.index(b"\nr1,")])
    assert [r["run_id"] for r in read_rows(path)][:3] == ["r0", "r1", "r0"]


def test_the_report_lists_a_damaged_row_as_such(tmp_path):
    path = tmp_path / "runs.csv"
    data = whole_rows(path)
    path.write_bytes(data[: cuts(data)["quoted cell"]])
    md = build_report([path], tmp_path / "out").path.read_text()
    failures = md.split("## Trials that did not finish")[1]
    assert "| damaged |" in failures and "runs.csv line " in failures and "row not whole" in failures
