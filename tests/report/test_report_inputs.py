"""The report from partial, small and old CSVs (one framework, only failures, an older schema, a file given
twice), and `python -m bench report` as a user runs it: defaults, one-line errors, nothing written on a bad
input. Reading rows never imports matplotlib."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from bench.measure.system import cuda_gpu_names, host_slug
from bench.report.build import main
from bench.scenarios import REPORT_SECTIONS
from bench.scenarios.model.columns import REQUIRED_COLUMNS
from bench.store.read import load_rows
from tests.support import POISON, REPO, assert_real_png, build_report, planned_plots, trial, write_csv


def test_single_framework_csv_builds_and_names_the_skipped_plots(tmp_path):
    rows = [trial("torch", mode) for mode in ("inference", "backprop", "jvp", "mezo")]
    rows.append(trial("torch", "jvp", "oom", jvp_impl="naive", peak_mem_mb=POISON))
    csv_path = write_csv(tmp_path / "runs.csv", rows)
    out = tmp_path / "out"
    (out / "plots").mkdir(parents=True)
    (out / "plots" / "memory_vs_depth.png").write_bytes(b"stale")  # from an earlier report into the same folder
    rep = build_report([csv_path], out)
    md = (out / "report.md").read_text()
    plots = planned_plots([csv_path])
    drawn = {p.name for p in plots if p.drawn}
    assert drawn == {"excess_memory", "step_time"} == {p.stem for p in rep.plots}
    assert sorted(f.name for f in (out / "plots").iterdir()) == ["excess_memory.png", "step_time.png"]
    for name in drawn:
        assert_real_png(out / "plots" / f"{name}.png")
    skipped = md.split("Skipped for lack of data:", 1)[1].split("\n## ", 1)[0]
    for p in plots:
        if not p.drawn:
            assert f"- **{p.title}**: needs {p.needs}." in skipped
    assert "jax / torch" not in md and "| torch: jvp / backprop |" in md
    assert "| torch | jvp[naive] | **oom** |" in md and str(int(POISON)) not in md
    assert "No rows of experiment `seed_agnews`" in md
    assert "## The UMass study's jvp pathology" in md  # a naive row, even a failed one, gets the explanation
    assert md.count("\n| 2026") == 1  # the one failed row in the failed-trials table


def test_csv_with_only_failures_and_an_older_schema(tmp_path):
    # an older schema: the required columns only, no config_hash (rows are then told apart by their fields)
    path = tmp_path / "old.csv"
    path.write_text(",".join(REQUIRED_COLUMNS) + "\n")  # CsvSink appends under an existing header
    rows = [trial("jax", "backprop", "crashed")]
    rows = [{k: v for k, v in r.items() if k in REQUIRED_COLUMNS} for r in rows]
    write_csv(path, rows)
    rep = build_report([path], tmp_path / "out")
    md = rep.path.read_text()
    assert not rep.plots and not any(p.drawn for p in planned_plots([path]))
    assert "| jax | backprop | **crashed** |" in md
    assert "(no plot: no ok rows with the data any plot needs)" in md
    assert "1 row, 0 ok, 1 not ok (crashed 1)" in md


def test_the_same_csv_twice_counts_each_row_once(tmp_path):
    csv_path = write_csv(tmp_path / "runs.csv", [trial("torch", "backprop"), trial("jax", "backprop")])
    assert len(load_rows([csv_path, csv_path])) == 2


# ---------------------------------------------------------------------------------------------- command line


def run_cli(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    return subprocess.run(
        [sys.executable, "-m", "bench", "report", *args], cwd=cwd, env=env, capture_output=True, text=True, timeout=120
    )


def test_cli_defaults_read_results_runs_csv_and_write_results_report(tmp_path):
    write_csv(tmp_path / "results" / "runs.csv", [trial("torch", "backprop"), trial("jax", "backprop")])
    proc = run_cli(cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert (tmp_path / "results" / "report.md").exists()
    assert_real_png(tmp_path / "results" / "plots" / "excess_memory.png")
    assert "results/report.md" in proc.stdout


def test_cli_missing_csv_is_one_line_and_nonzero(tmp_path):
    proc = run_cli(str(tmp_path / "nope.csv"), "--out", str(tmp_path / "out"), cwd=tmp_path)
    assert proc.returncode != 0
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1, proc.stderr
    assert lines[0].startswith("bench report: error: csv=") and "nope.csv: no such file" in lines[0]
    assert "accepted" in lines[0]
    assert not (tmp_path / "out").exists()


def test_cli_wrong_schema_is_one_line_and_leaves_the_file_alone(tmp_path):
    path = tmp_path / "other.csv"
    path.write_text("name,score\nalice,3\n")
    before = path.read_bytes()
    proc = run_cli(str(path), "--out", str(tmp_path / "out"), cwd=tmp_path)
    assert proc.returncode != 0
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and "not a bench results CSV" in lines[0] and "run_id" in lines[0], proc.stderr
    assert path.read_bytes() == before
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize(
    ("args", "expected"),
    [(["--bogus"], "unrecognized arguments: --bogus"), (["--out"], "--out: expected one argument")],
)
def test_cli_bad_options_are_one_line(args, expected, capsys):
    with pytest.raises(SystemExit) as e:
        main(args, REPORT_SECTIONS)
    assert e.value.code != 0
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and expected in err[0] and "usage: python -m bench report" in err[0]


def test_out_that_is_a_file_is_refused(tmp_path, capsys):
    csv_path = write_csv(tmp_path / "runs.csv", [trial("torch", "backprop")])
    (tmp_path / "afile").write_text("x")
    assert main([str(csv_path), "--out", str(tmp_path / "afile")], REPORT_SECTIONS) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "--out=" in err[0] and "is a file" in err[0]


def test_reading_rows_needs_no_matplotlib():
    # the sweep process (bench.cli) prints select.summary_table and `python -m bench targets` reads rows: neither
    # draws; the report's modules import matplotlib only to draw
    code = (
        "import sys, bench.cli, bench.scenarios.model.select, bench.scenarios.model.report.targets, "
        "bench.report.build; print('matplotlib' in sys.modules)"
    )
    proc = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "False"


def test_a_kept_benchmark_names_where_when_and_at_which_commits_its_rows_were_measured(tmp_path):
    """`--benchmarks DIR` keeps report.md as DIR/<date>_<host>_<sha>.md; the rows may have been measured at other
    commits than the one the report is written at, and the header names those."""
    rows = [
        trial("torch", "backprop", git_sha="aaaa11112222"),
        trial("jax", "backprop", git_sha="bbbb33334444"),
        trial("jax", "jvp", git_sha="aaaa11112222"),
    ]
    csv_path = write_csv(tmp_path / "runs.csv", rows)
    assert (
        main([str(csv_path), "--out", str(tmp_path / "out"), "--benchmarks", str(tmp_path / "b")], REPORT_SECTIONS) == 0
    )
    (kept,) = (tmp_path / "b").glob("*.md")
    text = kept.read_text()
    assert text.startswith("# Measured ") and "- the rows were measured at git aaaa11112222, bbbb33334444\n" in text
    assert "`python -m bench report " in text and "## " in text  # the command that wrote it, then the report


@pytest.mark.skipif(bool(cuda_gpu_names()), reason="a GPU host reports its own rows under its own name")
def test_a_kept_benchmark_of_a_gpus_rows_is_named_by_that_gpu(tmp_path):
    """A lease's rows come back and are reported here, on a host without a GPU: the file and its header name the
    card, the commit the lease ran at (its newest row's) and the versions the rows ran with, and say where the
    report was written."""
    gpu = {"device": "cuda", "device_name": "NVIDIA H200", "devices": 1, "torch_version": "2.11.0"}
    earlier = {"started_at": "2026-11-27T15:00:00+00:00", "git_sha": "aaaa11112222", "jax_version": "0.10.0"}
    lease = {"started_at": "2026-11-27T18:00:00+00:00", "git_sha": "bbbb33334444", "jax_version": "0.11.2"}
    rows = [trial("torch", "backprop", **gpu, **earlier), trial("jax", "backprop", **gpu, **lease)]
    csv_path = write_csv(tmp_path / "runs.csv", rows)
    assert (
        main([str(csv_path), "--out", str(tmp_path / "out"), "--benchmarks", str(tmp_path / "b")], REPORT_SECTIONS) == 0
    )
    (kept,) = (tmp_path / "b").glob("*.md")
    assert kept.name.endswith("_1gpu-h200_bbbb33334444.md"), kept.name
    text = kept.read_text()
    assert text.splitlines()[2].startswith("- host: NVIDIA H200; ") and "torch 2.11.0," in text.splitlines()[2]
    assert "jax 0.11.2," in text.splitlines()[2]  # the lease's versions, not a kept row's
    assert f"- the report was written on {host_slug()} from the rows the device brought back" in text
