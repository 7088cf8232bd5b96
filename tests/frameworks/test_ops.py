"""The ops of scenario=ops in each framework (bench/<framework>_impl/ops.py): the analytic derivatives themselves
(bench/ops_spec.py), every op's jvp and vjp in both frameworks against them, and the two frameworks against each
other. The ops trial end to end, its failures, bad input and its report: tests/scenarios/test_ops_scenario.py."""

from __future__ import annotations

import contextlib

import numpy as np
import pytest

from bench.ops_spec import OP_NAMES, OPS, broadcast_to, make_problem, relative_error, tolerance
from bench.spec import implementation

SHAPE = (3, 5)  # not square: a derivative that mixes up rows and cols (transpose, matmul, broadcast) fails here
EXACT = 1e-12  # float64 and a handful of roundings (sizes <= 5): anything above is a wrong derivative


def impl_of(framework: str):
    return implementation(framework, "ops")


def device_of(framework: str):
    return implementation(framework, "device")


@contextlib.contextmanager
def precision(framework: str, dtype: str):
    """The numerics the ops trial sets (impl.setup), as a context so the rest of the test session keeps JAX's
    defaults: fp64 needs x64, and fp32 means "highest" matmul precision (XLA's default on a GPU is TF32, which
    missed the analytic matmul jvp by 3e-4 on an H100)."""
    if framework != "jax":
        yield
        return
    import jax

    with jax.default_matmul_precision("highest"), jax.enable_x64(dtype == "fp64"):
        yield


def run_op(framework: str, name: str, shape, dtype: str, device: str = "cpu"):
    """(problem, {primal, jvp: (out, tangent), vjp: (out, cotangents), backward}) as float64 numpy."""
    impl = impl_of(framework)
    device = device_of(framework).resolve_device(device)
    p = make_problem(name, shape, dtype)
    with precision(framework, dtype):
        x, t = impl.to_device(p.primals, dtype, device), impl.to_device(p.tangents, dtype, device)
        (ct,) = impl.to_device((p.cotangent,), dtype, device)
        fns = impl.build(name, shape)
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
    """The compiled jvp and vjp (inductor compiles a function at its first call: the primal, not held here, is
    never compiled)."""
    impl, cpu, p = impl_of("torch"), device_of("torch").resolve_device("cpu"), make_problem(name, SHAPE, "fp64")
    fns = impl.build(name, SHAPE, compile=True)
    assert fns.backward is None  # torch.compile cannot compile the pullback closure on its own
    x, t = impl.to_device(p.primals, "fp64", cpu), impl.to_device(p.tangents, "fp64", cpu)
    (ct,) = impl.to_device((p.cotangent,), "fp64", cpu)
    want = p.want()
    assert relative_error(impl.to_numpy(fns.jvp(x, t))[1], want["jvp"]) < EXACT
    assert relative_error(impl.to_numpy(fns.vjp(x, ct))[1], want["vjp"]) < EXACT


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
