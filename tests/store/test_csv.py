"""The CSV sink (bench/store/csv.py) and reading rows back (bench/store/read.py): concurrent appends, schema
checks, older schemas widened, cut-off lines. W&B runs: test_wandb.py."""

from __future__ import annotations

import csv
import multiprocessing as mp

import pytest

from bench.scenarios.model.columns import COLUMNS as CSV_COLUMNS
from bench.scenarios.model.columns import REQUIRED_COLUMNS
from bench.store.csv import CsvSink, ResultsFileError, SchemaError, check_results_file
from bench.store.read import load_rows, read_rows
from tests.support import FAST, run_here

# ------------------------------------------------------------------------------------------------------ CSV


def test_schema_starts_with_the_required_columns_in_order():
    assert CSV_COLUMNS[: len(REQUIRED_COLUMNS)] == REQUIRED_COLUMNS
    assert REQUIRED_COLUMNS[0] == "run_id" and REQUIRED_COLUMNS[-1] == "git_sha"
    assert len(set(CSV_COLUMNS)) == len(CSV_COLUMNS)


def test_header_once_missing_cells_empty_floats_exact(tmp_path):
    path = tmp_path / "sub" / "runs.csv"
    sink = CsvSink(path, CSV_COLUMNS)
    sink.write({"run_id": "a", "framework": "jax", "step_time_median_s": 0.1 + 0.2, "steps": 5})
    sink.write({"run_id": "b", "error": 'boom, "quoted"\nsecond line', "status": "error"})
    text = path.read_text()
    assert text.count("run_id,started_at") == 1
    assert text.splitlines()[0] == ",".join(CSV_COLUMNS)
    rows = read_rows(path)
    assert [r["run_id"] for r in rows] == ["a", "b"]
    assert float(rows[0]["step_time_median_s"]) == 0.1 + 0.2  # repr round-trips the float exactly
    assert rows[0]["steps"] == "5" and rows[0]["peak_mem_mb"] == ""
    assert rows[1]["error"] == 'boom, "quoted"\nsecond line'
    assert set(rows[0]) == set(CSV_COLUMNS)


def test_unknown_column_is_rejected_and_file_untouched(tmp_path):
    path = tmp_path / "runs.csv"
    sink = CsvSink(path, CSV_COLUMNS)
    sink.write({"run_id": "a"})
    before = path.read_bytes()
    with pytest.raises(ValueError, match="peak_memory_mb"):
        sink.write({"run_id": "b", "peak_memory_mb": 1.0})
    assert path.read_bytes() == before


def test_read_rows_of_missing_file_is_empty(tmp_path):
    assert read_rows(tmp_path / "nope.csv") == []


def test_older_schema_file_is_appended_under_its_header_or_refused(tmp_path):
    path = tmp_path / "old.csv"
    old_header = ["run_id", "framework", "peak_mem_mb", "retired_column"]
    path.write_text(",".join(old_header) + "\nr0,torch,1.5,x\n")
    sink = CsvSink(path, CSV_COLUMNS)
    sink.write({"run_id": "r1", "framework": "jax", "git_sha": None})  # every set value has a column
    assert path.read_text().splitlines() == [",".join(old_header), "r0,torch,1.5,x", "r1,jax,,"]
    with pytest.raises(SchemaError, match=rf"{path.name}.*lacks excess_mem_mb"):
        sink.write({"run_id": "r2", "excess_mem_mb": 3.0})
    assert len(read_rows(path)) == 2


def test_an_earlier_version_of_the_schema_gets_the_new_columns_and_keeps_its_rows(tmp_path):
    """runs.csv written before columns were added at the end of CSV_COLUMNS: its header widens, its rows stay."""
    path = tmp_path / "runs.csv"
    old = CSV_COLUMNS[:-3]
    CsvSink(path, old).write({"run_id": "r0", "framework": "torch", "peak_mem_mb": 1.5})
    # nothing new set: the header stays
    CsvSink(path, CSV_COLUMNS).write({"run_id": "r1", "framework": "jax", old[-1]: "x"})
    before = path.read_bytes()
    assert before.split(b"\n")[0].decode().split(",") == list(old) and len(read_rows(path)) == 2
    CsvSink(path, CSV_COLUMNS).write({"run_id": "r2", CSV_COLUMNS[-1]: 0.5})
    lines = path.read_bytes().split(b"\n")
    assert lines[0].decode().split(",") == list(CSV_COLUMNS)
    pad = b"," * (len(CSV_COLUMNS) - len(old))
    assert lines[1:3] == [line + pad for line in before.split(b"\n")[1:3]]  # the old rows, empty new cells
    r0, r1, r2 = read_rows(path)
    assert r0["run_id"] == "r0" and r0["peak_mem_mb"] == "1.5" and r0[CSV_COLUMNS[-1]] == ""
    assert r2[CSV_COLUMNS[-1]] == "0.5" and not list(tmp_path.glob(".runs.csv.widen-*"))


def test_a_file_written_before_a_column_was_added_among_the_others_is_widened_by_name(tmp_path):
    """runs.csv from before e59713b, which added "compile" among the columns rather than at the end: accepted
    before any trial runs, and widened with every cell moved to its column."""
    COLUMNS = CSV_COLUMNS
    path = tmp_path / "runs.csv"
    old = [c for c in COLUMNS[: COLUMNS.index("diverged_at") + 3] if c != "compile"]
    CsvSink(path, old).write({"run_id": "r0", "framework": "torch", "diverged_at": 7, "target_metric": "eval_loss"})
    assert check_results_file(path, COLUMNS) is None
    CsvSink(path, COLUMNS).write({"run_id": "r1", "compile": True, "lora_rank": 8})
    assert path.read_text().splitlines()[0].split(",") == list(COLUMNS)
    r0, r1 = read_rows(path)
    assert (r0["framework"], r0["diverged_at"], r0["target_metric"], r0["compile"]) == ("torch", "7", "eval_loss", "")
    assert (r1["compile"], r1["lora_rank"], r1["diverged_at"]) == ("True", "8", "")
    with pytest.raises(ResultsFileError, match="differs at"):  # out of order: another schema
        swapped = tmp_path / "swapped.csv"
        swapped.write_text("framework,run_id\ntorch,r0\n")
        check_results_file(swapped, COLUMNS)


def test_a_cut_off_last_line_does_not_swallow_the_next_row(tmp_path):
    path = tmp_path / "runs.csv"
    CsvSink(path, CSV_COLUMNS).write({"run_id": "a"})
    with open(path, "a") as f:
        f.write("half-written,row")  # no newline: what a copy taken mid-write could leave
    CsvSink(path, CSV_COLUMNS).write({"run_id": "b"})
    assert path.read_text().splitlines()[-1].startswith("b,")


def _writer(path: str, worker: int, n: int) -> None:
    sink = CsvSink(path, CSV_COLUMNS)
    for i in range(n):
        # ~4 KiB rows with commas, quotes and newlines: big enough that a torn or interleaved write would show
        sink.write(
            {
                "run_id": f"w{worker}-{i}",
                "framework": "torch" if worker % 2 else "jax",
                "steps": i,
                "error": f'worker {worker}, row {i}: "x"\n' + "y" * 4000,
                "peak_mem_mb": worker * 1000 + i + 0.5,
            }
        )


@pytest.mark.slow
def test_concurrent_writers_lose_nothing_and_tear_nothing(tmp_path):
    path = tmp_path / "runs.csv"
    workers, per_worker = 4, 25
    ctx = mp.get_context("spawn")  # as the runner starts trials
    procs = [ctx.Process(target=_writer, args=(str(path), w, per_worker)) for w in range(workers)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(timeout=60)
    assert all(p.exitcode == 0 for p in procs)
    text = path.read_text()
    assert text.count("run_id,started_at") == 1
    rows = read_rows(path)
    assert len(rows) == workers * per_worker
    assert sorted(r["run_id"] for r in rows) == sorted(f"w{w}-{i}" for w in range(workers) for i in range(per_worker))
    for r in rows:
        w, i = (int(x) for x in r["run_id"][1:].split("-"))
        assert r["error"] == f'worker {w}, row {i}: "x"\n' + "y" * 4000
        assert float(r["peak_mem_mb"]) == w * 1000 + i + 0.5
        assert None not in r and len(r) == len(CSV_COLUMNS)  # no row with extra (interleaved) cells


# ---------------------------------------------------------------------------------------------- CSV injection


def test_formula_like_text_is_written_quoted_and_read_back_as_given(tmp_path):
    """OWASP's CSV-injection advice: a text cell a spreadsheet would evaluate (= + - @ tab CR first) is written
    after a single quote; numbers as they are; resume and rerun (read_rows) get back exactly what was written,
    quotes a text already had included, and the report (load_rows) keeps the quote: what it writes is text."""
    texts = [
        "=1+2",
        "@SUM(A1:A9)",
        "+cmd|' /C calc'!A0",
        "-2+3",
        "\t=1",
        "\r=1",
        "'=already quoted",
        "'plain",
        "plain",
        "a=b",
    ]
    numbers = ["-1.5", "+3", "1e-5", "-inf"]
    path = tmp_path / "runs.csv"
    sink = CsvSink(path, CSV_COLUMNS)
    for i, text in enumerate([*texts, *numbers]):
        sink.write({"run_id": f"r{i}", "status": "error", "error": text, "loss_first": -1.5, "steps": -3})
    with path.open(newline="") as f:
        raw = list(csv.reader(f))[1:]  # the cells as a spreadsheet reads them
    column = CSV_COLUMNS.index("error")
    assert [r[column] for r in raw[: len(texts)]] == [
        "'=1+2",
        "'@SUM(A1:A9)",
        "'+cmd|' /C calc'!A0",
        "'-2+3",
        "'\t=1",
        "'\r=1",
        "''=already quoted",
        "'plain",
        "plain",
        "a=b",
    ]
    assert all(r[CSV_COLUMNS.index("loss_first")] == "-1.5" and r[CSV_COLUMNS.index("steps")] == "-3" for r in raw)
    assert [r[column] for r in raw[len(texts) :]] == numbers  # numbers as typed, no quote
    assert [r["error"] for r in read_rows(path)] == [*texts, *numbers]
    # the report shows each as the spreadsheet does: text, quote first
    assert [r["error"] for r in load_rows([path])] == [r[column] for r in raw]


@pytest.mark.slow
def test_a_formula_like_sweep_id_round_trips_through_resume(tmp_path):
    """As a user types it: sweep_id names the rows; in the CSV it is quoted text, and resume, which reads the rows
    back, finds the trial recorded and skips it."""
    args = ("framework=torch", *FAST, "logger=none", "sweep_id=-1+cmd|calc")
    (first,) = run_here(*args, results=tmp_path)
    assert first["status"] == "ok" and ",'-1+cmd|calc," in (tmp_path / "runs.csv").read_text()
    (row,) = read_rows(tmp_path / "runs.csv")
    assert row["sweep_id"] == "-1+cmd|calc"
    (again,) = run_here(*args, "resume=true", results=tmp_path)
    assert again["status"] == "skipped" and again["run_id"] == first["run_id"]
