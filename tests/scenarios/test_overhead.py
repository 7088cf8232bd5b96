"""`python -m bench overhead` (bench/scenarios/overhead/): the suite's trial against a plain training loop of the
same model, interleaved; bad options refused in one line before anything runs."""

from __future__ import annotations

import pytest

from bench.scenarios.overhead import plain, run
from bench.store.read import read_rows


@pytest.mark.parametrize(
    "args,expected",
    [
        (["--framework", "mxnet"], "--framework=mxnet: accepted torch, jax or torch,jax"),
        (["--rounds", "0"], "--rounds=0: accepted an integer in [1, 100]"),
        # every count bounded: a typo must not run until killed
        (["--rounds", "1000000000"], "--rounds=1000000000: accepted an integer in [1, 100]"),
        (["--steps", "1000000000"], "--steps=1000000000: accepted an integer in [1, 10,000]"),
        (["--warmup", "1000000"], "--warmup=1000000: accepted an integer in [1, 1,000]"),
        (["--seq-len", "100000"], "--seq-len=100000: accepted an integer in [1, 8,192]"),
        (["--model", "gpt2"], "--model=gpt2: accepted bert_base"),
    ],
)
def test_overhead_refuses_bad_input_in_one_line(tmp_path, args, expected, capsys):
    assert run.main([*args, "--out", str(tmp_path / "o.csv")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and expected in err[0]
    assert not (tmp_path / "o.csv").exists()


@pytest.mark.slow
@pytest.mark.parametrize("framework", ["torch", "jax"])
def test_plain_loops_train_the_same_model_and_time_each_step(framework):
    times = plain.main(framework, "tiny", 2, 16, steps=2, warmup=1, lr=1e-3, seed=0)
    assert len(times) == 2 and all(0 < t < 30 for t in times)


@pytest.mark.slow
def test_overhead_runs_both_sides_interleaved_and_appends_a_row(tmp_path):
    out = tmp_path / "overhead.csv"
    assert (
        run.main(
            [
                "--framework",
                "torch",
                "--model",
                "tiny",
                "--batch-size",
                "2",
                "--seq-len",
                "16",
                "--steps",
                "2",
                "--warmup",
                "1",
                "--rounds",
                "1",
                "--out",
                str(out),
            ]
        )
        == 0
    )
    (r,) = read_rows(out)
    assert r["framework"] == "torch" and float(r["suite_step_s"]) > 0 and float(r["plain_step_s"]) > 0
    assert r["device"] == "cpu" and r["device_name"]  # where the suite's trial ran
    assert float(r["ratio"]) == pytest.approx(float(r["suite_step_s"]) / float(r["plain_step_s"]))


def test_overhead_refuses_a_results_file_of_another_schema_and_leaves_it_alone(tmp_path, capsys):
    out = tmp_path / "o.csv"
    out.write_text("run_id,status\nabc,ok\n")
    before = out.read_bytes()
    assert run.main(["--out", str(out)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "its header is not bench's o.csv schema" in err[0]
    assert out.read_bytes() == before
