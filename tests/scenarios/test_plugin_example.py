"""The example plug-in (examples/bench_plugin_example/): its estimator, `coordinate`, estimates the gradient (on a
quadratic, each draw exactly n times one partial derivative, their mean the gradient), the same coordinate in both
frameworks; and, pip-installed into a throwaway folder, `python -m bench mode=coordinate` runs it end to end in both
frameworks and the contract test checks it, with nothing of bench/ edited."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import torch

from tests.support import FAST, REPO, bench, rows

EXAMPLE = REPO / "examples" / "bench_plugin_example"
N = 6  # the quadratic's parameters: a (2, 2) tensor and a (2,) one, flattened in that order
RNG = np.random.default_rng(0)
M = RNG.standard_normal((N, N))
A = M @ M.T + N * np.eye(N)  # symmetric positive definite
THETA = RNG.standard_normal(N)
BS = [RNG.standard_normal(N) for _ in range(2)]  # two micro-batches: L = mean_k 0.5 x'Ax - b_k'x
GRAD = A @ THETA - np.mean(BS, axis=0)


@pytest.fixture
def example(monkeypatch):
    """The example's modules, imported from its source (no dist-info there: no entry point is declared in-process)."""
    monkeypatch.syspath_prepend(str(EXAMPLE))
    yield
    for name in [m for m in sys.modules if m.startswith("bench_plugin_example")]:
        del sys.modules[name]


def torch_estimates(steps: range) -> list[np.ndarray]:
    from bench_plugin_example.torch_coordinate import coordinate_gradient

    params = {"w": torch.tensor(THETA[:4].reshape(2, 2)), "v": torch.tensor(THETA[4:])}  # float64

    def loss_of(b):
        x = torch.cat([params["w"].view(-1), params["v"]])
        return 0.5 * x @ torch.tensor(A) @ x - torch.tensor(b) @ x

    out = []
    for step in steps:
        _, g = coordinate_gradient(loss_of, params, BS, eps=1e-3, seed=3, step=step)
        out.append(np.concatenate([g["w"].numpy().ravel(), g["v"].numpy()]))
    assert np.array_equal(np.concatenate([params["w"].numpy().ravel(), params["v"].numpy()]), THETA)  # put back
    return out


def jax_estimates(steps: range) -> list[np.ndarray]:
    from bench_plugin_example.jax_coordinate import coordinate_gradient

    params = {"v": jnp.asarray(THETA[4:], jnp.float32), "w": jnp.asarray(THETA[:4].reshape(2, 2), jnp.float32)}

    def loss_of(p, b):
        x = jnp.concatenate([p["w"].ravel(), p["v"]])  # the quadratic's order, not ravel_pytree's (keys sorted)
        return 0.5 * x @ jnp.asarray(A, jnp.float32) @ x - jnp.asarray(b, jnp.float32) @ x

    estimate = jax.jit(lambda step: coordinate_gradient(loss_of, params, BS, eps=1e-2, seed=3, step=step)[1])
    out = []
    for step in steps:
        g = estimate(np.int32(step))
        out.append(np.concatenate([np.asarray(g["v"]), np.asarray(g["w"]).ravel()]))
    return [np.concatenate([g[2:], g[:2]]) for g in out]  # back to the torch order (w, v)


@pytest.mark.slow
def test_each_draw_is_n_times_one_partial_derivative_in_both_frameworks(example):
    from bench_plugin_example.coordinate import coordinate

    steps = range(12)
    for framework, estimates, rtol in (("torch", torch_estimates, 1e-8), ("jax", jax_estimates, 1e-3)):
        for step, g in zip(steps, estimates(steps)):
            (i,) = np.flatnonzero(g)
            # the same coordinate of the flattened parameters in both (jax's order is another: its index maps back)
            expected = coordinate(3, step, N) if framework == "torch" else [4, 5, 0, 1, 2, 3][coordinate(3, step, N)]
            assert i == expected, (framework, step)
            np.testing.assert_allclose(g[i], N * GRAD[i], rtol=rtol, err_msg=f"{framework} step {step}")


def test_the_mean_of_the_draws_is_the_gradient(example):
    """Unbiased: E[n d_i L e_i] = grad L, i uniform; 1000 draws hit each of the 6 coordinates 167 +- 17 times."""
    mean = np.mean(torch_estimates(range(1000)), axis=0)
    assert np.max(np.abs(mean - GRAD)) < 0.15 * np.max(np.abs(GRAD))
    cosine = mean @ GRAD / np.linalg.norm(mean) / np.linalg.norm(GRAD)
    assert cosine > 0.99


@pytest.fixture(scope="module")
def site(tmp_path_factory):
    """The example pip-installed into a throwaway folder, offline (setuptools from this environment), from a copy:
    the build leaves its egg-info beside the sources, which would declare the entry point to this process too."""
    root = tmp_path_factory.mktemp("plugin")
    shutil.copytree(EXAMPLE, root / "src", ignore=shutil.ignore_patterns("build", "*.egg-info", "__pycache__"))
    pip = [sys.executable, "-m", "pip", "install", "--quiet", "--no-deps", "--no-build-isolation", "--no-index"]
    subprocess.run([*pip, "--target", str(root / "site"), str(root / "src")], check=True, timeout=300)
    return root / "site"


@pytest.mark.slow  # two trials, each its own process
def test_the_installed_example_runs_end_to_end_in_both_frameworks(site, tmp_path):
    env = {"PYTHONPATH": f"{site}:{REPO}"}
    # a linear probe: every parameter it trains has a gradient (most of an embedding table's rows have none, and a
    # draw there is 0, whose cosine is not a number)
    args = ("-m", "framework=torch,jax", "mode=coordinate", "coordinate.eps=0.002", "trainable=classifier")
    args += ("measure_grad_cosine=true",)
    bench(*args, *FAST, "logger=none", results=tmp_path, env=env)
    found = rows(tmp_path)
    assert sorted(r["framework"] for r in found) == ["jax", "torch"]
    for r in found:
        assert r["status"] == "ok" and r["mode"] == "coordinate", r["error"]
        assert r["coordinate_eps"] == "0.002"
        assert float(r["step_time_median_s"]) > 0 and float(r["peak_mem_mb"]) > 0
        # the estimate is n d_i L e_i: its cosine with the gradient is |d_i L| / |grad L|, above 0
        assert 0 < float(r["grad_cosine"]) <= 1
        assert r["model_note"].startswith("mode=coordinate: no term in the memory and FLOP models")


@pytest.mark.slow  # a pytest process importing both frameworks
def test_the_contract_test_checks_the_installed_example(site):
    test = "tests/contracts/test_layout.py::test_every_estimator_has_a_module_in_both_frameworks[coordinate]"
    proc = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", test],
        cwd=REPO,
        capture_output=True,
        text=True,
        env={**os.environ, "PYTHONPATH": f"{site}:{REPO}"},
        timeout=600,
    )
    assert proc.returncode == 0 and "1 passed" in proc.stdout, proc.stdout + proc.stderr
