"""scenario=ops: the analytic derivatives themselves, every op's jvp and vjp in both frameworks against them, the
two frameworks against each other, the ops trial end to end (ops.csv), failures, bad input, and the report."""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from bench.ops_spec import OP_NAMES, OPS, broadcast_to, make_problem, relative_error, tolerance
from bench.sinks import OPS_CSV_COLUMNS, CsvSink, read_rows
from bench.spec import implementation

REPO = Path(__file__).resolve().parent.parent
SHAPE = (3, 5)  # not square: a derivative that mixes up rows and cols (transpose, matmul, broadcast) fails here
EXACT = 1e-12  # float64 and a handful of roundings (sizes <= 5): anything above is a wrong derivative


def impl_of(framework: str):
    return implementation(framework, "ops")


def device_of(framework: str):
    return implementation(framework, "device")


@contextlib.contextmanager
def precision(framework: str, dtype: str):
    """fp64 in JAX needs x64; as a context, so the rest of the test session keeps JAX's 32-bit default."""
    if framework == "jax" and dtype == "fp64":
        import jax

        with jax.enable_x64(True):
            yield
    else:
        yield


def run_op(framework: str, name: str, shape, dtype: str, compile: bool = False, device: str = "cpu"):  # noqa: A002
    """(problem, {primal, jvp: (out, tangent), vjp: (out, cotangents), backward}) as float64 numpy."""
    impl = impl_of(framework)
    device = device_of(framework).resolve_device(device)
    p = make_problem(name, shape, dtype)
    with precision(framework, dtype):
        x, t = impl.to_device(p.primals, dtype, device), impl.to_device(p.tangents, dtype, device)
        (ct,) = impl.to_device((p.cotangent,), dtype, device)
        fns = impl.build(name, shape, compile=compile)
        got = {
            "primal": impl.to_numpy(fns.primal(x)),
            "jvp": impl.to_numpy(fns.jvp(x, t)),
            "vjp": impl.to_numpy(fns.vjp(x, ct)),
        }
        if fns.backward is not None:
            got["backward"] = impl.to_numpy(fns.backward(fns.forward(x)[1], ct))
    return p, got


# ---------------------------------------------------------------------------------------------------------------
# the analytic derivatives in bench/ops_spec.py, against finite differences


@pytest.mark.parametrize("name", OP_NAMES)
def test_analytic_jvp_and_vjp_match_finite_differences(name):
    op, shape = OPS[name], SHAPE
    p = make_problem(name, shape, "fp64")
    f = op.primal if name != "broadcast" else broadcast_to(shape)
    want = p.want()
    h = 1e-6  # central differences in float64: error ~ h^2 f''' + eps / h, about 1e-9 here
    plus = f(*(x + h * t for x, t in zip(p.primals, p.tangents)))
    minus = f(*(x - h * t for x, t in zip(p.primals, p.tangents)))
    fd = (plus - minus) / (2 * h)
    assert relative_error(want["jvp"], fd) < 1e-7
    # vjp is the adjoint of jvp: <ct, J t> = <J^T ct, t> for every t
    lhs = float(np.sum(p.cotangent * want["jvp"]))
    rhs = sum(float(np.sum(c * t)) for c, t in zip(want["vjp"], p.tangents))
    assert lhs == pytest.approx(rhs, rel=1e-12, abs=1e-12)


def test_inputs_are_seeded_and_bf16_values_are_exact():
    a, b = make_problem("power", (8, 8), "fp32"), make_problem("power", (8, 8), "fp32")
    assert all(np.array_equal(x, y) for x, y in zip(a.primals + a.tangents, b.primals + b.tangents))
    assert a.primals[0].min() >= 0.5  # power's base is positive: d/dy = log(x) x^y
    x = make_problem("exp", (8, 8), "bf16").primals[0]
    assert np.array_equal(x.view(np.uint32) & 0xFFFF, np.zeros_like(x, np.uint32))  # bf16 = float32's top 16 bits


# ---------------------------------------------------------------------------------------------------------------
# each framework against the analytic derivative, and the two frameworks against each other


@pytest.mark.parametrize("framework", ["torch", "jax"])
@pytest.mark.parametrize("name", OP_NAMES)
def test_jvp_and_vjp_match_the_analytic_derivative(framework, name):
    p, got = run_op(framework, name, SHAPE, "fp64")
    want = p.want()
    assert relative_error(got["primal"], want["primal"]) < EXACT
    assert relative_error(got["jvp"][0], want["primal"]) < EXACT
    assert relative_error(got["jvp"][1], want["jvp"]) < EXACT, "jvp"
    assert relative_error(got["vjp"][0], want["primal"]) < EXACT
    assert relative_error(got["vjp"][1], want["vjp"]) < EXACT, "vjp"
    assert relative_error(got["backward"], want["vjp"]) < EXACT, "backward"


@pytest.mark.parametrize("name", OP_NAMES)
def test_torch_and_jax_agree(name):
    shape = (16, 24)
    p, torch_got = run_op("torch", name, shape, "fp32")
    _, jax_got = run_op("jax", name, shape, "fp32")
    tol = tolerance(name, shape, "fp32")
    for key in ("primal", "jvp", "vjp"):
        a, b = torch_got[key], jax_got[key]
        pairs = [(a, b)] if key == "primal" else [(a[0], b[0]), (a[1], b[1])]
        for x, y in pairs:
            assert relative_error(x, y) <= tol, f"{name} {key}"


def test_max_splits_the_derivative_at_ties_in_both_frameworks():
    x = np.array([[1.0, 2.0], [3.0, 3.0]])
    want = OPS["max"].vjp((x, x.T.copy()), np.ones_like(x))
    for framework in ("torch", "jax"):
        impl = impl_of(framework)
        cpu = device_of(framework).resolve_device("cpu")
        args = impl.to_device((x, x.T.copy()), "fp32", cpu)
        (ct,) = impl.to_device((np.ones_like(x),), "fp32", cpu)
        _, cts = impl.to_numpy(impl.build("max", (2, 2)).vjp(args, ct))
        assert relative_error(cts, want) == 0, framework  # 1/2 each on the diagonal


@pytest.mark.slow
@pytest.mark.parametrize("name", ["matmul", "relu"])
def test_torch_compile_matches_the_analytic_derivative(name):
    p, got = run_op("torch", name, SHAPE, "fp64", compile=True)
    want = p.want()
    assert "backward" not in got  # torch.compile cannot compile the pullback closure on its own
    assert relative_error(got["jvp"][1], want["jvp"]) < EXACT
    assert relative_error(got["vjp"][1], want["vjp"]) < EXACT


@pytest.mark.cuda
@pytest.mark.parametrize("framework", ["torch", "jax"])
def test_cuda_jvp_and_vjp_match_the_analytic_derivative(framework):
    try:
        device_of(framework).resolve_device("cuda")
    except RuntimeError as e:  # a CPU build of torch or jaxlib on a GPU host
        pytest.skip(str(e))
    for name in ("matmul", "exp", "sum"):
        p, got = run_op(framework, name, (64, 96), "fp32", device="cuda")
        want, tol = p.want(), tolerance(name, (64, 96), "fp32")
        assert relative_error(got["jvp"][1], want["jvp"]) <= tol, name
        assert relative_error(got["vjp"][1], want["vjp"]) <= tol, name


def test_time_calls_samples_enough_calls_per_sample():
    import time

    from bench.timing import time_calls

    calls = []

    def fn():
        calls.append(1)
        time.sleep(0.001)
        return len(calls)

    r = time_calls(fn, warmup=2, repeats=3, min_sample_s=0.01)
    per_sample = (len(calls) - 3) // 3  # 2 warm-up calls and 1 sizing call first
    assert 3 <= per_sample <= 11 and len(calls) == 3 + 3 * per_sample
    assert r.out == len(calls) and r.stats.n == 3 and r.stats.median_s >= 0.001
    assert 0 <= r.cpu_s < r.wall_s  # sleeping costs no CPU


# ---------------------------------------------------------------------------------------------------------------
# the trial, as a user runs it


def bench(*args: str, env: dict | None = None, check: bool = True) -> subprocess.CompletedProcess:
    cmd = [sys.executable, "-m", "bench", *args]
    proc = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, env={**os.environ, **(env or {})}, timeout=600)
    if check and proc.returncode != 0:
        raise AssertionError(f"{' '.join(cmd)} failed ({proc.returncode}):\n{proc.stdout}\n{proc.stderr}")
    return proc


# tiny and quick: one size, two samples of single calls
QUICK = ["scenario=ops", "ops.sizes=[8]", "ops.shapes=[[2,3]]", "ops.repeats=2", "ops.min_sample_s=0", "logger=none"]


@pytest.mark.slow
def test_ops_sweep_writes_ok_rows_for_every_op_and_framework(tmp_path):
    out = bench("-m", "framework=torch,jax", "threads=1", *QUICK, f"results_dir={tmp_path}")
    rows = read_rows(tmp_path / "ops.csv")
    assert len(rows) == 2 * len(OP_NAMES) * 2
    assert {(r["framework"], r["execution"]) for r in rows} == {("torch", "eager"), ("jax", "jit")}
    for r in rows:
        assert r["status"] == "ok", (r["op"], r["error"])
        assert r["threads"] == "1" and r["num_threads"] == "1" and r["device"] == "cpu" and r["dtype"] == "fp32"
        assert float(r["jvp_err"]) <= float(r["tolerance"]) and float(r["vjp_err"]) <= float(r["tolerance"])
        for col in ("primal_s", "jvp_s", "vjp_s", "vjp_backward_s"):
            assert 0 < float(r[col]) < 1, col
        assert float(r["jvp_over_primal"]) == pytest.approx(float(r["jvp_s"]) / float(r["primal_s"]))
        assert r["git_sha"] and r["config_hash"] and r["run_id"]
    assert {r["shape"] for r in rows} == {"8x8", "2x3"}
    assert not (tmp_path / "runs.csv").exists()  # the model scenario's file is untouched
    assert "[2/2]" in out.stdout and "vjp/primal" in out.stdout  # progress, and the summary at the sweep's end


@pytest.mark.slow
@pytest.mark.cuda
def test_ops_trial_on_cuda(tmp_path):
    bench("-m", "framework=torch,jax", "device=cuda", *QUICK, "ops.names=[matmul,exp]", f"results_dir={tmp_path}")
    rows = read_rows(tmp_path / "ops.csv")
    assert len(rows) == 8 and all(r["status"] == "ok" and r["device"] == "cuda" for r in rows), rows


@pytest.mark.slow
def test_a_crash_keeps_the_finished_rows(tmp_path):
    proc = bench("framework=torch", *QUICK, "ops.names=[add,matmul,sum]", "ops.shapes=[]", f"results_dir={tmp_path}",
                 env={"BENCH_INJECT_FAULT": "op=matmul:segv"}, check=False)  # fmt: skip
    assert proc.returncode == 1  # a crashed trial fails the command
    add, matmul, total = read_rows(tmp_path / "ops.csv")
    assert add["op"] == "add" and add["status"] == "ok"
    assert matmul["status"] == "crashed" and "SIGSEGV" in matmul["error"]
    assert total["status"] == "crashed" and total["error"] == "not reached: the trial ended in matmul 8x8 (crashed)"


@pytest.mark.parametrize(
    "args,expected",
    [
        (["scenario=ops", "ops.names=[add,nope]"], "ops.names=nope: unknown op; accepted: add, broadcast, copy,"),
        (["scenario=ops", "threads=4"], "threads=4: accepted 1 | all"),
        (["scenario=ops", "dtype=fp16"], "dtype=fp16: accepted fp32 | fp64 | bf16"),
        (["scenario=ops", "ops.sizes=[0]"], "ops.sizes=0: accepted integers >= 1"),
        (["scenario=ops", "ops.shapes=[64,4096]"], "ops.shapes=[64, 4096]: accepted a list of [rows, cols] pairs"),
        (["scenario=ops", "ops.warmup=0"], "ops.warmup=0: must be a number >= 1"),
        (["scenario=ops", "ops=nope"], "ops=nope: unknown option; accepted: default, large"),
        (["scenario=bench"], "scenario=bench: accepted model | ops"),
        (["threads=1"], "threads=1: applies to scenario=ops only"),
    ],
)
def test_bad_ops_config_is_one_line_and_nothing_runs(tmp_path, args, expected):
    proc = bench(*args, f"results_dir={tmp_path}", check=False)
    assert proc.returncode == 2
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("bench: error: ") and expected in lines[0], proc.stderr
    assert not (tmp_path / "ops.csv").exists() and not (tmp_path / "hydra").exists()


def test_model_trials_keep_their_identity():
    """The ops keys are not part of a model trial's identity: resume=true still finds rows recorded before."""
    from bench.preflight import compose_trials
    from bench.scenarios import config_hash, trial_identity

    def composed(*overrides):
        trials, _ = compose_trials(list(overrides), multirun=False)
        return trials[0][1]

    model, ops = composed("scenario=model"), composed("scenario=ops")
    assert not {"scenario", "threads", "ops"} & set(trial_identity(model))
    assert set(trial_identity(ops)) == {"scenario", "framework", "device", "dtype", "threads", "seed", "ops"}
    assert config_hash(composed("ops.sizes=[3]")) == config_hash(model)


# ---------------------------------------------------------------------------------------------------------------
# the report


def fake_rows() -> list[dict]:
    rows = []
    for framework, execution, speed in (("torch", "eager", 1.0), ("jax", "jit", 0.8)):
        for threads, par in (("all", 2.0), ("1", 1.0)):
            for op in ("add", "matmul"):
                for n in (64, 256):
                    primal = speed * (n / 64) ** (3 if op == "matmul" else 2) * 1e-5 / par
                    rows.append({"run_id": f"{framework}-{threads}", "framework": framework, "execution": execution,
                                 "op": op, "shape": f"{n}x{n}", "rows": n, "cols": n, "dtype": "fp32",
                                 "threads": threads, "num_threads": 2 if threads == "all" else 1, "device": "cpu",
                                 "primal_s": primal, "jvp_s": 3 * primal, "vjp_s": 3 * primal,
                                 "vjp_backward_s": 2 * primal, "jvp_over_primal": 3.0, "vjp_over_primal": 3.0,
                                 "status": "ok"})  # fmt: skip
    rows.append({**rows[0], "shape": "64x4096", "rows": 64, "cols": 4096})
    rows.append({**rows[0], "op": "exp", "status": "oom", "error": "MemoryError: injected", "primal_s": None})
    return rows


def test_ops_report_draws_every_plot(tmp_path):
    from bench.ops_report import ops_report, summary_table

    csv = tmp_path / "ops.csv"
    sink = CsvSink(csv, OPS_CSV_COLUMNS)
    for r in fake_rows():
        sink.write(r)
    text = ops_report(csv, tmp_path / "out")
    plots = sorted(p.name for p in (tmp_path / "out" / "plots").glob("*.png"))
    assert plots == ["ops_ratios_cpu_fp32_threads-1.png", "ops_ratios_cpu_fp32_threads-all.png",
                     "ops_threads_cpu_fp32.png", "ops_time_cpu_fp32_threads-1.png",
                     "ops_time_cpu_fp32_threads-all.png"]  # fmt: skip
    for name in plots:
        assert f"(plots/{name})" in text
    assert "| matmul | 256 |" in text and "3.00×" in text and "64x4096" in text
    assert "MemoryError: injected" in text  # the failed op is listed, never plotted
    table = summary_table(read_rows(csv))
    assert "jax jit" in table and "matmul" in table and "oom" in table


def test_ops_report_cli(tmp_path):
    run = lambda *a: subprocess.run([sys.executable, "-m", "bench.ops_report", *a], cwd=REPO, capture_output=True,
                                    text=True, timeout=120)  # fmt: skip
    missing = run(str(tmp_path / "none.csv"))
    assert missing.returncode == 2 and missing.stderr.count("\n") == 1 and "no such file" in missing.stderr
    csv = tmp_path / "ops.csv"
    CsvSink(csv, OPS_CSV_COLUMNS).write(fake_rows()[0])
    ok = run(str(csv), "--out", str(tmp_path / "out"))
    assert ok.returncode == 0, ok.stderr
    assert (tmp_path / "out" / "ops_report.md").read_text().startswith("## Op-level AD micro-benchmarks")
