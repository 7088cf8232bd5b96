"""Results that stay trustworthy when things go wrong around them: sweeps started together, damaged or foreign
results files, files and folders that cannot be written, input that a trial would only find bad once running."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from bench.sinks import CsvSink, read_rows
from tests.test_runner import FAST, REPO


@pytest.mark.slow
def test_two_sweeps_started_together_keep_apart(tmp_path):
    """Started in the same second into one results_dir: two sweep ids, two Hydra folders, and each sweep's summary
    shows its own trial only."""
    cmd = lambda mode: [sys.executable, "-m", "bench", "-m", "framework=torch", f"mode={mode}", *FAST, "logger=none",
                        f"results_dir={tmp_path}"]  # fmt: skip
    procs = {m: subprocess.Popen(cmd(m), cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
             for m in ("inference", "backprop")}  # fmt: skip
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
# the results file: damaged, foreign, unreadable, unwritable


def whole_rows(path: Path, n: int = 3) -> bytes:
    """A runs.csv of n rows whose error cells hold what CSV must quote: commas, quotes, newlines."""
    sink = CsvSink(path)
    for i in range(n):
        sink.write({"run_id": f"r{i}", "framework": "torch", "mode": "backprop", "status": "error",
                    "error": f'ValueError: "x", y\nline two of {i}', "config_hash": f"h{i}"})  # fmt: skip
    return path.read_bytes()


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
        CsvSink(path).write({"run_id": "r3", "framework": "jax", "status": "ok", "config_hash": "h3"})
    assert [r["run_id"] for r in read_rows(path)] == ["r0", "r1", "r3"]
    (side,) = tmp_path.glob("runs.csv.damaged-*")
    assert side.read_bytes() == data[data.rstrip(b"\n").rfind(b"\nr2,") + 1 : cuts(data)[where]]
    CsvSink(path).write({"run_id": "r4", "status": "ok"})  # a whole file again: nothing more is set aside
    assert [r["run_id"] for r in read_rows(path)] == ["r0", "r1", "r3", "r4"]


def test_rows_swallowed_by_an_old_cut_are_found_again(tmp_path):
    """Before this check existed, a row appended after a cut inside a quoted cell became part of that cell: the
    scan costs the cut row only, and the row written after it is whole again."""
    path = tmp_path / "runs.csv"
    data = whole_rows(path)
    path.write_bytes(data[: cuts(data)["quoted cell"]] + b"\n" + data.split(b"\n", 1)[1][: data.index(b"\nr1,")])
    assert [r["run_id"] for r in read_rows(path)][:3] == ["r0", "r1", "r0"]


def test_the_report_lists_a_damaged_row_as_such(tmp_path):
    from bench.report import build_report

    path = tmp_path / "runs.csv"
    data = whole_rows(path)
    path.write_bytes(data[: cuts(data)["quoted cell"]])
    md = build_report([path], tmp_path / "out").path.read_text()
    failures = md.split("## Trials that did not finish")[1]
    assert "| damaged |" in failures and "runs.csv line " in failures and "row not whole" in failures


def preflight_refuses(tmp_path: Path, *args: str, results: Path | None = None, as_user: bool = False) -> str:
    """Run `python -m bench` on a tiny trial; it must refuse before anything runs: exit 2, one line."""
    cmd = [sys.executable, "-m", "bench", "framework=torch", *FAST, "logger=none", *args,
           f"results_dir={results or tmp_path}"]  # fmt: skip
    if as_user and os.geteuid() == 0:  # root writes anything: drop the capability that lets it (as CI runs)
        caps = "-dac_override,-dac_read_search"
        cmd = ["setpriv", f"--inh-caps={caps}", f"--bounding-set={caps}", *cmd]
    proc = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=300)
    lines = proc.stderr.strip().splitlines()
    assert proc.returncode == 2 and len(lines) == 1 and lines[0].startswith("bench: error: "), proc.stderr
    return lines[0]


def test_a_foreign_or_binary_results_file_is_refused_before_anything_runs(tmp_path):
    path = tmp_path / "runs.csv"
    path.write_text("name,score\nalice,3\n")
    assert "its header is not bench's runs.csv schema (differs at name, score)" in preflight_refuses(tmp_path)
    assert path.read_text() == "name,score\nalice,3\n" and not (tmp_path / "logs").exists()
    path.write_bytes(b"\x89PNG\r\n\x1a\n\xff\xfe")
    assert "not UTF-8 text (byte 0)" in preflight_refuses(tmp_path, "resume=true")
    assert path.read_bytes() == b"\x89PNG\r\n\x1a\n\xff\xfe"


def test_a_results_dir_that_is_a_file_is_refused(tmp_path):
    (tmp_path / "file").write_text("x")
    assert "is a file; accepted: a folder" in preflight_refuses(tmp_path, results=tmp_path / "file")


@pytest.mark.skipif(os.geteuid() == 0 and shutil.which("setpriv") is None, reason="root without setpriv")
def test_unwritable_results_are_refused_before_anything_runs(tmp_path):
    path = tmp_path / "runs.csv"
    data = whole_rows(path, 1)
    path.chmod(0o444)
    assert "runs.csv: cannot be written" in preflight_refuses(tmp_path, as_user=True)
    assert path.read_bytes() == data
    folder = tmp_path / "locked"
    folder.mkdir()
    folder.chmod(0o555)
    try:
        assert "cannot be written" in preflight_refuses(tmp_path, results=folder / "results", as_user=True)
    finally:
        folder.chmod(0o755)


# ---------------------------------------------------------------------------------------------------------------
# input a trial would only find bad once running: refused up front


@pytest.mark.parametrize(
    "args, expected",
    [
        (["seed=-1"], "seed=-1: accepted an integer in [0, 2^63)"),
        (["seed=9223372036854775808"], "seed=9223372036854775808: accepted an integer in [0, 2^63)"),
        (["data.seed=-3"], "data.seed=-3: accepted: an integer in [0, 2^63)"),
        (["optimizer.momentum=1"], "optimizer.momentum=1.0: accepted a number in [0, 1)"),
        (["optimizer.eps=0"], "optimizer.eps=0.0: accepted a number > 0"),
        (["model.layer_norm_eps=-1"], "model.layer_norm_eps=-1.0: accepted a number > 0"),
        (["jacfwd_max_params=0"], "jacfwd_max_params=0: must be a number >= 1"),
        (["last_k=0"], "last_k=0: must be a number >= 1"),  # checked although trainable=all does not read it
    ],
)
def test_numeric_options_are_checked_up_front(tmp_path, args, expected):
    assert expected in preflight_refuses(tmp_path, *args)


@pytest.mark.skipif(bool(shutil.which("nvidia-smi")), reason="this host may have a GPU")
def test_device_cuda_on_a_host_without_one_is_refused(tmp_path):
    assert "device=cuda: this host has no CUDA GPU" in preflight_refuses(tmp_path, "device=cuda")


def test_a_malformed_ag_news_file_is_refused_naming_its_line(tmp_path):
    data = tmp_path / "ag"
    data.mkdir()
    rows = "".join(f'"{1 + i % 4}","title {i}","body {i}"\n' for i in range(40))
    (data / "train.csv").write_text(rows + '"2","unterminated title,body\n')
    line = preflight_refuses(tmp_path, "data=ag_news", f"data.path={data}", "data.num_train=16", "data.num_eval=8",
                             results=tmp_path / "results")  # fmt: skip
    assert f"data.path={data / 'train.csv'}: line 41: " in line and "accepted: 3 columns" in line


def test_a_checkpoint_without_safetensors_or_of_another_shape_is_refused(tmp_path):
    import numpy as np
    from safetensors.numpy import save_file

    folder = tmp_path / "ckpt"
    folder.mkdir()
    (folder / "pytorch_model.bin").write_bytes(b"pickle")
    line = preflight_refuses(tmp_path, f"model.checkpoint={folder}", results=tmp_path / "results")
    assert "no *.safetensors in this directory (found: pytorch_model.bin)" in line
    save_file({"bert.embeddings.word_embeddings.weight": np.zeros((3, 2), np.float32)}, str(folder / "m.safetensors"))
    line = preflight_refuses(tmp_path, f"model.checkpoint={folder}", results=tmp_path / "results")
    assert "weights do not fit the model: missing" in line and "shape mismatch 1" in line
