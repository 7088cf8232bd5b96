"""Results that stay trustworthy when things go wrong around them: sweeps started together, damaged or foreign
results files, files and folders that cannot be written, input that a trial would only find bad once running."""

from __future__ import annotations

import subprocess
import sys

import pytest

from bench.sinks import read_rows
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
