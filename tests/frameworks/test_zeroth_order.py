"""The zeroth-order estimators compute what their papers say, in both frameworks (CPU, fp32, dropout off).

- SPSA with q perturbations (bench/estimators/mezo.py; MeZO at q=1): given the same directions, torch and JAX take
  the same projections and the same estimate; its seeded estimate is the mean of q MeZO projections; on a quadratic,
  where the central difference is exact, the mean over many draws is the gradient (tolerance from the sample
  count) and the variance falls as 1/q.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import torch

from bench.estimators.mezo import MezoSettings
from bench.jax_impl import directions as jdirections
from bench.jax_impl.estimators import mezo as jmezo
from bench.jax_impl.params import to_hf
from bench.torch_impl import directions as tdirections
from bench.torch_impl.estimators import mezo as tmezo
from tests.frameworks.test_steps import (
    FRAMEWORKS,
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
