"""`python -m bench gpu-check --summarize` on a folder a lease left damaged (a step.json or a device's facts cut
off or edited, a results CSV in another encoding or with a repeated column): one line naming the file, exit 2,
before anything is kept or remade."""

from __future__ import annotations

import json

import pytest

from bench.scenarios.gpu import check

STEP = {"name": "modes_fp32", "what": "w", "budget_s": 60, "status": "ok", "seconds": 12.0, "exit_code": 0}
FACTS = {"time": "2026-11-27T18:00:00+00:00", "host": "h", "python": "3.11.7", "gpus": [], "dry_run": True}


@pytest.fixture
def out(tmp_path):
    """A lease's folder as gpu-check leaves it: a step's record and the device's facts."""
    folder = tmp_path / "out"
    (folder / "modes_fp32").mkdir(parents=True)
    (folder / "facts").mkdir()
    (folder / "modes_fp32" / "step.json").write_text(json.dumps(STEP))
    (folder / "facts" / "device-1.json").write_text(json.dumps(FACTS))
    return folder


def test_a_whole_folder_is_summarized(out):
    text = check.summarize(out)
    assert "| modes_fp32 | ok | 12 | 60 | 0 |  |" in text and "on h (git ?, Python 3.11.7)" in text
    assert json.loads((out / "summary.json").read_text())["steps"] == [STEP]


@pytest.mark.parametrize(
    ("name", "data", "said"),
    [
        ("modes_fp32/step.json", b'{"name": "modes_fp32", "status": "ok"', "not JSON"),
        ("modes_fp32/step.json", b"[1, 2]", "not a gpu-check record"),
        ("modes_fp32/step.json", json.dumps({**STEP, "seconds": "abc"}).encode(), "not a gpu-check record"),
        ("modes_fp32/step.json", json.dumps({**STEP, "name": ["x"]}).encode(), "not a gpu-check record"),
        ("modes_fp32/step.json", json.dumps({"name": "x", "status": "ok"}).encode(), "lacks 'budget_s'"),
        ("facts/device-1.json", b"\xff{", "not JSON"),
        ("facts/device-1.json", json.dumps({**FACTS, "gpus": [1]}).encode(), "not a gpu-check record"),
        ("modes_fp32/runs.csv", b"run_id,status\n\xff\xfe,ok\n", "not UTF-8"),
        ("modes_fp32/runs.csv", b"run_id,status,status\nr,ok,ok\n", "repeats the column(s) status"),
        ("modes_fp32/runs.csv", b"a,b\n1,2\n", "lacks run_id, status"),
    ],
)
def test_damaged_input_ends_in_one_line(out, capsys, name, data, said):
    (out / name).write_bytes(data)
    assert check.main(["--summarize", "--out", str(out)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("bench gpu-check: error: ") and said in err[0], err
    assert str(out / name) in err[0] and "accepted" in err[0]
    assert not (out / "report").exists() and not (out / "summary.md").exists()


def test_a_damaged_summary_is_remade(out):
    """summary.json is only written: a damaged one is replaced whole."""
    (out / "summary.json").write_bytes(b'{"facts": [')
    check.summarize(out)
    assert json.loads((out / "summary.json").read_text())["facts"] == [FACTS]


def test_formula_like_text_in_a_steps_result_is_shown_as_text(out):
    (out / "modes_fp32" / "step.json").write_text(json.dumps({**STEP, "result": "=HYPERLINK(1)", "status": "@x"}))
    text = check.summarize(out)
    assert "| modes_fp32 | '@x | 12 | 60 | 0 | '=HYPERLINK(1) |" in text
