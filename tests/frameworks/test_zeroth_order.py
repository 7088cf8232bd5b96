"""The zeroth-order estimators compute what their papers say, in both frameworks (CPU, fp32, dropout off).

- SPSA with q perturbations (bench/estimators/mezo.py; MeZO at q=1): given the same directions, torch and JAX take
  the same projections and the same estimate; its seeded estimate is the mean of q MeZO projections; on a quadratic,
  where the central difference is exact, the mean over many draws is the gradient (tolerance from the sample
  count) and the variance falls as 1/q.
- HiZOO (bench/estimators/hizoo.py): the same in torch and JAX on a given direction; with the true diagonal Hessian
  its mean over draws is the Newton step; its Hessian estimate updates as the paper writes, in the timed step only.
- LOZO (bench/estimators/lozo.py): the same in torch and JAX on a given direction; each matrix's perturbation has
  rank r and keeps V for its interval; the mean over draws is r times the gradient for a matrix, the gradient for
  a vector.
- ZO-SignSGD (optimizer=signsgd): every entry moves by lr against the sign of the estimate.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import torch

from bench.estimators.hizoo import HizooSettings
from bench.estimators.lozo import LozoSettings
from bench.estimators.mezo import MezoSettings
from bench.jax_impl import directions as jdirections
from bench.jax_impl.estimators import hizoo as jhizoo
from bench.jax_impl.estimators import lozo as jlozo
from bench.jax_impl.estimators import mezo as jmezo
from bench.jax_impl.models.bert import to_hf
from bench.spec import OptimizerSpec
from bench.torch_impl import directions as tdirections
from bench.torch_impl.estimators import hizoo as thizoo
from bench.torch_impl.estimators import lozo as tlozo
from bench.torch_impl.estimators import mezo as tmezo
from tests.frameworks.test_steps import (
    BATCH,
    FRAMEWORKS,
    as_hf,
    gradient,
    loss_at,
    make,
    params_hf,
    random_tangent,
    shapes,
    tangent_for,
)

# ---------------------------------------------------------------------------------------------------------------
# SPSA with q perturbations


@pytest.mark.slow
def test_spsa_given_the_same_directions_is_the_same_in_torch_and_jax():
    eps, q = 1e-2, 3
    out = {}
    for fw in FRAMEWORKS:
        t = make(fw, "mezo", settings=MezoSettings(eps=eps, q=q))
        zs = [random_tangent(shapes(fw, t), seed=k + 1) for k in range(q)]
        out[fw] = gradient(fw, t, tangents=[tangent_for(fw, t, z) for z in zs])
    (loss_t, est_t), (loss_j, est_j) = out["torch"], out["jax"]
    assert loss_j == pytest.approx(loss_t, abs=1e-5)
    # the losses agree to ~1e-6 (fp32 parity); over 2 eps that is ~1e-4 of each projection, times |z| <~ 5
    for n in est_t:
        np.testing.assert_allclose(est_j[n], est_t[n], rtol=1e-3, atol=5e-4, err_msg=n)


@pytest.mark.slow
@pytest.mark.parametrize("framework", FRAMEWORKS)
def test_spsa_estimate_is_the_mean_of_q_mezo_projections(framework):
    eps, q = 1e-3, 3
    t = make(framework, "mezo", settings=MezoSettings(eps=eps, q=q))
    theta = params_hf(framework, t)
    if framework == "torch":
        zs = [{n: x.numpy() for n, x in tdirections.sample_tangent(t.params, 0, 0, k).items()} for k in range(q)]
    else:
        zs = [to_hf(jdirections.sample_tangent(t.params, 0, jnp.int32(0), k)) for k in range(q)]
    loss, est = gradient(framework, t)
    projs = []
    for z in zs:
        plus = loss_at(framework, t, {n: theta[n] + eps * z[n] for n in theta})
        minus = loss_at(framework, t, {n: theta[n] - eps * z[n] for n in theta})
        projs.append((plus - minus) / (2 * eps))
    for n in ("classifier.bias", "bert.encoder.layer.0.attention.self.query.weight"):
        want = sum(p * z[n] for p, z in zip(projs, zs)) / q
        # float32 losses: ~1e-7 absolute error each, / 2 eps -> ~1e-4 per projection
        np.testing.assert_allclose(est[n], want, rtol=1e-2, atol=3e-4 * max(np.abs(z[n]).max() for z in zs))


# A quadratic L(w) = 1/2 sum_i a_i (w_i - c_i)^2: its gradient a (w - c) is known, and SPSA's central difference
# is exact on it, so the estimate is (g . z) z / ... with no bias from eps: E[(g . z) z] = g for z ~ N(0, I).
N_PARAMS, DRAWS = 16, 400
RNG = np.random.default_rng(0)
A, C, W = (RNG.uniform(0.5, 2.0, N_PARAMS), RNG.standard_normal(N_PARAMS), RNG.standard_normal(N_PARAMS))
GRAD = A * (W - C)


def quadratic_estimates(framework: str, q: int) -> np.ndarray:
    """(DRAWS, N_PARAMS): SPSA's estimate at W, one seeded draw of q directions per step."""
    eps = 1e-2
    a, c, w = (x.astype(np.float32) for x in (A, C, W))
    if framework == "torch":
        a, c, params = torch.from_numpy(a), torch.from_numpy(c), {"w": torch.from_numpy(w.copy())}
        loss_of = lambda batch: 0.5 * (a * (params["w"] - c) ** 2).sum()  # noqa: E731
        out = []
        for step in range(DRAWS):
            _, est = tmezo.spsa_gradient(loss_of, params, [None], eps=eps, seed=0, step=step, q=q)
            out.append(est.materialize()["w"].numpy().copy())
        return np.stack(out)
    a, c, params = jnp.asarray(a), jnp.asarray(c), {"w": jnp.asarray(w)}
    loss_of = lambda p, batch, key: 0.5 * (a * (p["w"] - c) ** 2).sum()  # noqa: E731
    draw = jax.jit(lambda step: jmezo.spsa_gradient(loss_of, params, [None], None, eps=eps, seed=0, step=step, q=q)[2])
    return np.stack([np.asarray(draw(jnp.int32(step))["w"]) for step in range(DRAWS)])


@pytest.mark.slow
@pytest.mark.parametrize("framework", FRAMEWORKS)
def test_spsa_mean_over_draws_is_the_gradient_and_its_variance_falls_as_one_over_q(framework):
    one, four = quadratic_estimates(framework, 1), quadratic_estimates(framework, 4)
    for q, est in ((1, one), (4, four)):
        # one direction's estimate (g . z) z_i has variance |g|^2 + g_i^2; the mean of DRAWS * q of them
        std = np.sqrt((GRAD @ GRAD + GRAD**2) / (DRAWS * q))
        assert (np.abs(est.mean(0) - GRAD) < 5 * std).all(), q
    ratio = four.var(0).sum() / one.var(0).sum()  # q directions averaged: a quarter of the variance
    assert 0.18 < ratio < 0.35


# ---------------------------------------------------------------------------------------------------------------
# HiZOO


@pytest.mark.slow
def test_hizoo_given_the_same_direction_is_the_same_in_torch_and_jax():
    out = {}
    for fw in FRAMEWORKS:
        t = make(fw, "hizoo", settings=HizooSettings(eps=1e-2, alpha=0.5))
        z = random_tangent(shapes(fw, t), seed=1)
        out[fw] = gradient(fw, t, tangents=[tangent_for(fw, t, z)])
    (loss_t, est_t), (loss_j, est_j) = out["torch"], out["jax"]
    assert loss_j == pytest.approx(loss_t, abs=1e-5)
    for n in est_t:  # proj and the curvature from fp32 losses: ~1e-4 relative apart
        np.testing.assert_allclose(est_j[n], est_t[n], rtol=2e-3, atol=5e-4, err_msg=n)


def hizoo_on_quadratic(framework: str, hessian: np.ndarray, alpha: float, step: int, z=None):
    """(estimate of w, the updated H) of one HiZOO draw on the quadratic at W with the Hessian estimate `hessian`."""
    eps = 1e-2
    a, c, w = (x.astype(np.float32) for x in (A, C, W))
    if framework == "torch":
        a, c, params = torch.from_numpy(a), torch.from_numpy(c), {"w": torch.from_numpy(w.copy())}
        h = {"w": torch.from_numpy(hessian.astype(np.float32))}
        loss_of = lambda batch: 0.5 * (a * (params["w"] - c) ** 2).sum()  # noqa: E731
        tangents = None if z is None else [{"w": torch.from_numpy(z)}]
        _, est = thizoo.hizoo_gradient(
            loss_of, params, h, [None], eps=eps, alpha=alpha, seed=0, step=step, commit=True, tangents=tangents
        )
        g = est.materialize()["w"].numpy().copy()
        return g, h["w"].numpy()
    g, h = hizoo_on_quadratic_jax(hessian, alpha, jnp.int32(step), None if z is None else jnp.asarray(z))
    return np.asarray(g), np.asarray(h)


def hizoo_on_quadratic_jax(hessian, alpha: float, step, z=None):
    """hizoo_on_quadratic's JAX draw as arrays (traceable: a test jits it over the step)."""
    a, c, params = jnp.asarray(A, jnp.float32), jnp.asarray(C, jnp.float32), {"w": jnp.asarray(W, jnp.float32)}
    loss_of = lambda p, batch, key: 0.5 * (a * (p["w"] - c) ** 2).sum()  # noqa: E731
    tangents = None if z is None else [{"w": z}]
    hessian = {"w": jnp.asarray(hessian, jnp.float32)}
    _, _, g, h = jhizoo.hizoo_gradient(
        loss_of, params, hessian, [None], None, eps=1e-2, alpha=alpha, seed=0, step=step, tangents=tangents
    )
    return g["w"], h["w"]


@pytest.mark.slow
@pytest.mark.parametrize("framework", FRAMEWORKS)
def test_hizoo_with_the_true_hessian_estimates_the_newton_step(framework):
    """With H the quadratic's own diagonal Hessian A and alpha = 0 (H kept), the estimate's mean over draws is
    A^-1 g = W - C, the diagonal Newton step the paper's preconditioning aims at (tolerance from the sample count:
    with u = A^-1/2 g, entry i of one draw has variance (|u|^2 + u_i^2) / a_i)."""
    if framework == "jax":
        draw = jax.jit(lambda step: hizoo_on_quadratic_jax(A, 0.0, step)[0])  # traced: one compile
        est = np.stack([np.asarray(draw(jnp.int32(step))) for step in range(DRAWS)])
    else:
        est = np.stack([hizoo_on_quadratic("torch", A, 0.0, step)[0] for step in range(DRAWS)])
    u = GRAD / np.sqrt(A)
    std = np.sqrt((u @ u + u**2) / A / DRAWS)
    assert (np.abs(est.mean(0) - (W - C)) < 5 * std).all()


@pytest.mark.slow
@pytest.mark.parametrize("framework", FRAMEWORKS)
def test_hizoo_updates_its_hessian_estimate_as_the_paper_writes(framework):
    """One step's H' = (1 - alpha) H + alpha |L+ + L- - 2 L0| / (2 eps^2) H z^2: on the quadratic the second
    difference along z / sqrt(H) is exactly eps^2 sum_i a_i z_i^2 / h_i."""
    alpha, z = 0.5, np.random.default_rng(3).standard_normal(N_PARAMS).astype(np.float32)
    h = np.random.default_rng(4).uniform(0.5, 2.0, N_PARAMS).astype(np.float32)
    g, updated = hizoo_on_quadratic(framework, h, alpha, 0, z)
    curvature = (A * z**2 / h).sum() / 2
    want = (1 - alpha) * h + alpha * curvature * h * z**2
    np.testing.assert_allclose(updated, want, rtol=2e-3)
    proj = GRAD @ (z / np.sqrt(h))
    np.testing.assert_allclose(g, proj * z / np.sqrt(want), rtol=2e-3, atol=1e-5)


@pytest.mark.slow
@pytest.mark.parametrize("framework", FRAMEWORKS)
def test_hizoo_perturbs_along_z_over_the_square_root_of_h_on_its_seeded_path(framework):
    """The seeded draw (the timed step's path, JAX's perturbation program included), checked against the paper's
    formula as the given-z test is: the second difference along z / sqrt(H) fixes H' and g exactly on the
    quadratic, and a perturbation along z / H (or z) would give another H' (h spread over [0.25, 4])."""
    alpha, step = 0.5, 3
    h = np.random.default_rng(4).uniform(0.25, 4.0, N_PARAMS).astype(np.float32)
    if framework == "torch":
        unit = tdirections.units_of({"w": torch.zeros(N_PARAMS)})[0]
        z = thizoo.unit_direction(unit, seed=0, step=step, kind="gaussian")[0].numpy()
    else:
        z = np.asarray(jdirections.sample_tangent({"w": jnp.zeros(N_PARAMS)}, 0, step, 0)["w"])
    g, updated = hizoo_on_quadratic(framework, h, alpha, step)
    want = (1 - alpha) * h + alpha * ((A * z**2 / h).sum() / 2) * h * z**2
    # the second difference of fp32 losses at eps = 1e-2: ~0.5 % off; along z / H, H' is 30 % off and more
    np.testing.assert_allclose(updated, want, rtol=2e-2)
    np.testing.assert_allclose(g, (GRAD @ (z / np.sqrt(h))) * z / np.sqrt(want), rtol=2e-2, atol=1e-4)


@pytest.mark.slow
@pytest.mark.parametrize("framework", FRAMEWORKS)
def test_hizoo_steps_keep_their_hessian_estimate_and_gradient_leaves_it(framework):
    """The timed step updates H (the trainer's state) as it applies g; gradient() computes the estimate without
    touching H, so it can be checked at any time."""
    t = make(framework, "hizoo", settings=HizooSettings(alpha=0.5))
    micro = t.to_device(BATCH)
    t.compile(micro)
    t.gradient(micro)
    assert all((h == 1).all() for h in state_leaves(framework, t.state))
    for _ in range(2):
        assert np.isfinite(float(t.step(micro)))
    assert any((h != 1).any() for h in state_leaves(framework, t.state))


def state_leaves(framework, state) -> list[np.ndarray]:
    if framework == "torch":
        return [v.numpy() for v in state.values()]
    return [np.asarray(x) for x in jax.tree.leaves(state)]


# ---------------------------------------------------------------------------------------------------------------
# ZO-SignSGD: an optimizer, usable with any estimator


@pytest.mark.slow
@pytest.mark.parametrize("framework", FRAMEWORKS)
def test_signsgd_moves_every_entry_by_lr_against_the_estimate_sign(framework):
    lr = 1e-3
    t = make(framework, "mezo", optimizer=OptimizerSpec(name="signsgd", lr=lr))
    before = params_hf(framework, t)
    _, est = t.gradient(t.to_device(BATCH))
    sign = {n: np.sign(g) for n, g in as_hf(framework, est).items()}
    t.apply(est)
    after = params_hf(framework, t)
    for n in before:
        np.testing.assert_allclose(after[n], before[n] - lr * sign[n], atol=1e-6, err_msg=n)


# ---------------------------------------------------------------------------------------------------------------
# LOZO


@pytest.mark.slow
def test_lozo_given_the_same_direction_is_the_same_in_torch_and_jax():
    out = {}
    for fw in FRAMEWORKS:
        t = make(fw, "lozo", settings=LozoSettings(eps=1e-2))
        z = random_tangent(shapes(fw, t), seed=1)
        out[fw] = gradient(fw, t, tangents=[tangent_for(fw, t, z)])
    (loss_t, est_t), (loss_j, est_j) = out["torch"], out["jax"]
    assert loss_j == pytest.approx(loss_t, abs=1e-5)
    for n in est_t:
        np.testing.assert_allclose(est_j[n], est_t[n], rtol=1e-3, atol=5e-4, err_msg=n)


def lozo_draws(framework: str, step: int, rank: int, interval: int) -> dict[str, np.ndarray]:
    """One draw of LOZO's directions over a Linear layer of 8 inputs and 6 outputs, in torch's layout (out, in)
    whatever the framework's (JAX's kernel is (in, out)), and a vector."""
    draw = dict(rank=rank, interval=interval, seed=0, step=step, kind="gaussian")
    if framework == "torch":
        params = {"dense.weight": torch.zeros(6, 8), "dense.bias": torch.zeros(6)}
        z = {n: z.numpy() for n, z in tlozo.low_rank_directions(params, **draw).items()}
        return {"w": z["dense.weight"], "b": z["dense.bias"]}
    params = {"dense": {"bias": jnp.zeros(6), "kernel": jnp.zeros((8, 6))}}
    z = jlozo.low_rank_directions(params, **draw)["dense"]
    return {"w": np.asarray(z["kernel"]).T, "b": np.asarray(z["bias"])}


@pytest.mark.slow
@pytest.mark.parametrize("framework", FRAMEWORKS)
def test_lozo_perturbs_a_matrix_by_rank_r_and_keeps_v_on_its_input_side(framework):
    """A Linear's perturbation U V^T has rank r, and V, kept for `interval` steps, runs along its input, as the
    authors keep it: across the steps it is kept, the perturbations span r input directions while U, drawn every
    step, spans more output ones. In JAX, whose kernel is the transpose of torch's weight, a V drawn along the
    kernel's first axis by the torch rule would span r output directions instead."""
    rank, interval = 2, 3
    z = [lozo_draws(framework, step, rank, interval) for step in range(4)]
    assert np.linalg.matrix_rank(z[0]["w"]) == rank and np.linalg.matrix_rank(z[0]["b"][None]) == 1
    block = [z[0]["w"], z[1]["w"], z[2]["w"]]  # steps 0..2 share V
    assert np.linalg.matrix_rank(np.concatenate(block, axis=0)) == rank  # their rows: r input directions
    assert np.linalg.matrix_rank(np.concatenate(block, axis=1)) == 6  # their columns: every output direction
    assert np.linalg.matrix_rank(np.concatenate([z[2]["w"], z[3]["w"]], axis=0)) == 2 * rank  # step 3: a new V


@pytest.mark.slow
@pytest.mark.parametrize("framework", FRAMEWORKS)
def test_lozo_mean_over_draws_is_the_gradient_times_the_rank(framework):
    """On L = 1/2 |W - C|^2 + 1/2 |b - d|^2 (central differences exact), with V drawn every step: the estimate's mean
    is r G for the matrix and G for the vector (tolerance: five standard errors of the draws' own spread)."""
    rank, eps, draws = 2, 1e-2, 600
    rng = np.random.default_rng(5)
    cw, cb = rng.standard_normal((8, 6)).astype(np.float32), rng.standard_normal(6).astype(np.float32)
    if framework == "torch":
        params = {"w": torch.zeros(8, 6), "b": torch.zeros(6)}
        tw, tb = torch.from_numpy(cw), torch.from_numpy(cb)
        loss_of = lambda batch: 0.5 * ((params["w"] - tw) ** 2).sum() + 0.5 * ((params["b"] - tb) ** 2).sum()  # noqa: E731
        est = []
        for step in range(draws):
            _, g = tlozo.lozo_gradient(loss_of, params, [None], eps=eps, rank=rank, interval=1, seed=0, step=step)
            est.append({n: v.numpy().copy() for n, v in g.materialize().items()})
    else:
        params = {"w": jnp.zeros((8, 6)), "b": jnp.zeros(6)}
        jw, jb = jnp.asarray(cw), jnp.asarray(cb)
        loss_of = lambda p, batch, key: 0.5 * ((p["w"] - jw) ** 2).sum() + 0.5 * ((p["b"] - jb) ** 2).sum()  # noqa: E731
        draw = jax.jit(
            lambda step: jlozo.lozo_gradient(
                loss_of, params, [None], None, eps=eps, rank=rank, interval=1, seed=0, step=step
            )[2]
        )
        est = [{n: np.asarray(v) for n, v in draw(jnp.int32(step)).items()} for step in range(draws)]
    for name, want in (("w", rank * -cw), ("b", -cb)):  # G = theta - C at theta = 0
        x = np.stack([e[name] for e in est])
        assert (np.abs(x.mean(0) - want) < 5 * x.std(0) / np.sqrt(draws)).all(), name
