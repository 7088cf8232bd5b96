"""The training modes compute what they claim, in both frameworks (CPU, tiny BERT, fp32, dropout off).

- jacfwd is the exact gradient (equal to backprop's) on the head and BitFit scopes;
- jvp's directional derivative is grad . v, and a central finite difference along v agrees;
- the forward-gradient estimate is unbiased (averaged over many tangents it points along the gradient);
- MeZO's projection is the finite difference it is defined by, and the perturbation round trip restores theta;
- one optimizer step from the same weights and batch gives the same loss in torch and JAX (backprop; jvp with
  the same tangent), for sgd and adamw;
- frozen parameters are bit-identical after steps of every mode; remat gives plain backprop's gradient;
- 50 backprop steps on the synthetic corpus lower the loss clearly.
"""

from __future__ import annotations

import dataclasses
import functools
import weakref

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import torch

import bench.spec
from bench import data
from bench.config import model_preset
from bench.estimators.jacfwd import JacfwdSettings
from bench.estimators.jvp import JvpSettings, keeps_tangent
from bench.estimators.mezo import MezoSettings
from bench.jax_impl import directions as jdirections
from bench.jax_impl import estimators as jax_estimators
from bench.jax_impl.loss import dropout_key
from bench.jax_impl.models.bert import from_hf, to_hf
from bench.models.bert import is_trainable
from bench.spec import OptimizerSpec, StepSpec, implementation
from bench.torch_impl import directions as tdirections
from bench.torch_impl.estimators.jvp import directional_derivative
from bench.torch_impl.loss import loss_fn
from bench.weights import build_weights
from tests.support import torch_threads

FRAMEWORKS = ("torch", "jax")


pytestmark = pytest.mark.usefixtures("fp32_pinned")  # tests/frameworks/conftest.py

TINY, _ = model_preset("tiny", dropout=0.0)
WEIGHTS = build_weights(TINY, 0)
# A smaller head (n = 16*16 + 16 + 16*4 + 4 = 340) for the statistical test, where K tangents give an expected
# cosine of about sqrt(K / (K + n)).
NARROW = dataclasses.replace(TINY, hidden_size=16, num_heads=2, intermediate_size=32)
NARROW_WEIGHTS = build_weights(NARROW, 0)


def batches(n=1, batch_size=4, seq_len=16, seed=0):
    spec = data.data_spec(num_train=64, num_eval=16)
    return data.make_batches(spec, batch_size, seq_len, seed, "train", epochs=4)[:n]


BATCH = batches(1)


def make(framework, mode="backprop", spec=TINY, weights=WEIGHTS, **kw):
    kw.setdefault("optimizer", OptimizerSpec(name="sgd", lr=1e-2))
    ss = StepSpec(mode=mode, **kw)
    return implementation(framework, "steps").make_trainer(spec, weights, ss, "cpu")


def stepped(trainer, micro_batches) -> list[float]:
    """One step per micro-batch, compiled first as a trial compiles it (jax_impl: its timed programs, once)."""
    trainer.compile(trainer.to_device(micro_batches[:1]))
    return [float(trainer.step(trainer.to_device([b]))) for b in micro_batches]


def as_hf(framework, grads) -> dict[str, np.ndarray]:
    """A gradient or estimate of either framework as {hf_name: numpy, torch layout}."""
    if framework == "torch":
        if not isinstance(grads, dict):  # an estimate drawn tensor by tensor
            grads = grads.materialize()
        return {n: g.detach().numpy().copy() for n, g in grads.items()}
    return to_hf(grads)


def params_hf(framework, trainer) -> dict[str, np.ndarray]:
    if framework == "torch":
        return {n: p.detach().numpy().copy() for n, p in trainer.params.items()}
    return to_hf(trainer.params)


def gradient(framework, trainer, micro=BATCH, tangents=None):
    loss, g = trainer.gradient(trainer.to_device(micro), tangents)
    return float(loss), as_hf(framework, g)


def tangent_for(framework, trainer, arrays):
    """The same tangent (HF names, torch layout) in the framework's own parameter structure."""
    if framework == "torch":
        return {n: torch.from_numpy(arrays[n].copy()) for n in trainer.params}
    return from_hf(trainer.params, arrays)


def random_tangent(names_shapes, seed=1):
    rng = np.random.default_rng(seed)
    return {n: rng.standard_normal(names_shapes[n]).astype(np.float32) for n in sorted(names_shapes)}


def shapes(framework, trainer):
    return {n: a.shape for n, a in params_hf(framework, trainer).items()}


@functools.cache
def exact(framework, trainable="all", narrow=False):
    """(loss, gradient) of plain backprop at the start weights: the reference several tests read, computed once."""
    spec, weights = (NARROW, NARROW_WEIGHTS) if narrow else (TINY, WEIGHTS)
    return gradient(framework, make(framework, "backprop", spec, weights, trainable=trainable))


def loss_at(framework, trainer, params_np, micro=BATCH):
    """The mean loss at the given trainable parameters (HF names, torch layout), the trainer's own model."""
    if framework == "torch":
        p = {n: torch.from_numpy(params_np[n].copy()) for n in trainer.params}
        with torch.no_grad():
            return float(sum(loss_fn(trainer.model, b, p) for b in trainer.to_device(micro)) / len(micro))
    p = from_hf(trainer.params, params_np)
    key = dropout_key(0, 0)
    return float(sum(trainer.loss_of(p, b, key) for b in trainer.to_device(micro)) / len(micro))


def assert_grads_close(a, b, rtol):
    assert a.keys() == b.keys()
    scale = max(float(np.abs(x).max()) for x in b.values())
    for n in a:
        np.testing.assert_allclose(a[n], b[n], rtol=rtol, atol=rtol * scale, err_msg=n)


# ---------------------------------------------------------------------------------------------------------------
# jacfwd: exact


@pytest.mark.slow
@pytest.mark.parametrize("trainable", ["head", "bias"])
@pytest.mark.parametrize("framework", FRAMEWORKS)
def test_jacfwd_equals_backprop(framework, trainable):
    loss_b, backprop = exact(framework, trainable)
    loss_j, jac = gradient(
        framework, make(framework, "jacfwd", trainable=trainable, settings=JacfwdSettings(chunk=100))
    )
    assert loss_j == pytest.approx(loss_b, rel=1e-6)
    assert_grads_close(jac, backprop, rtol=1e-5)


# ---------------------------------------------------------------------------------------------------------------
# jvp: directional derivative, forward gradient


@pytest.mark.slow
@pytest.mark.parametrize("framework", FRAMEWORKS)
def test_jvp_directional_derivative_is_grad_dot_v_and_a_finite_difference(framework):
    _, g = exact(framework)
    t = make(framework, "jvp")
    v = random_tangent(shapes(framework, t))
    grad_dot_v = sum(float(np.vdot(g[n].astype(np.float64), v[n])) for n in v)
    # K = 1 with a supplied tangent: the estimate is d * v, so d is read off any nonzero entry
    loss, est = gradient(framework, t, tangents=[tangent_for(framework, t, v)])
    d = float(
        np.vdot(est["classifier.bias"], v["classifier.bias"]) / np.vdot(v["classifier.bias"], v["classifier.bias"])
    )
    assert d == pytest.approx(grad_dot_v, rel=1e-4)
    for n in v:  # the estimate is exactly d v, tensor by tensor
        np.testing.assert_allclose(est[n], d * v[n], rtol=1e-5, atol=1e-7 * abs(d))
    theta = params_hf(framework, t)
    h = 1e-3  # |v| ~ 600: h |v| ~ 0.6; truncation ~h^2, float32 rounding ~1e-7 / h, both < 1e-3 relative
    fd = (
        loss_at(framework, t, {n: theta[n] + h * v[n] for n in v})
        - loss_at(framework, t, {n: theta[n] - h * v[n] for n in v})
    ) / (2 * h)
    assert d == pytest.approx(fd, rel=1e-2)
    assert loss == pytest.approx(loss_at(framework, t, theta), rel=1e-6)


@pytest.mark.slow
def test_torch_jvp_impls_agree():
    """func, lazy (duals made per module), dual (forward_ad) and naive (params requiring grad) compute the same
    loss and d; lazy leaves the module's own parameters in place."""
    v = None
    results = {}
    for impl in ("func", "lazy", "dual", "naive"):
        t = make("torch", "jvp", settings=JvpSettings(impl=impl))
        v = v or random_tangent(shapes("torch", t))
        tangent = tangent_for("torch", t, v)
        b = t.to_device(BATCH)[0]
        before = dict(t.model.named_parameters())
        loss, d = directional_derivative(t.model, t.params, b, tangent, impl)
        results[impl] = (float(loss), float(d))
        assert t.params["classifier.bias"].requires_grad == (impl == "naive")
        after = dict(t.model.named_parameters())
        assert after.keys() == before.keys() and all(after[n] is p for n, p in before.items())
    for impl in ("lazy", "dual", "naive"):
        assert results[impl] == pytest.approx(results["func"], rel=1e-5), impl


@pytest.mark.parametrize("affine", [True, False])
def test_torch_layer_norm_rule_is_torchs_own_in_both_modes(affine):
    """The dual passes' LayerNormJvp gives torch's own layer norm, tangent (x, weight and bias moving at once) and
    gradient: the reverse passes the same model still runs (a run's gradient cosine) go through it too."""
    from bench.torch_impl.estimators.jvp import LayerNormJvp

    g = torch.Generator().manual_seed(0)
    x, dx, grad = (torch.randn(2, 3, 8, generator=g, dtype=torch.float64) for _ in range(3))
    w, b, dw, db = (torch.randn(8, generator=g, dtype=torch.float64) if affine else None for _ in range(4))
    primals, tangents = [t for t in (x, w, b) if t is not None], [t for t in (dx, dw, db) if t is not None]

    def rule(x, w=None, b=None):
        return LayerNormJvp.apply(x, w, b, (8,), 1e-5)

    def own(x, w=None, b=None):
        return torch.nn.functional.layer_norm(x, (8,), w, b, 1e-5)

    out, tangent = torch.func.jvp(rule, tuple(primals), tuple(tangents))
    ref_out, ref_tangent = torch.func.jvp(own, tuple(primals), tuple(tangents))
    torch.testing.assert_close(out, ref_out)
    torch.testing.assert_close(tangent, ref_tangent)
    leaves = [t.clone().requires_grad_() for t in primals]
    got = torch.autograd.grad(rule(*leaves), leaves, grad)
    want = torch.autograd.grad(own(*leaves), leaves, grad)
    for a, e in zip(got, want, strict=True):
        torch.testing.assert_close(a, e)


@pytest.mark.parametrize("kind", ["gaussian", "rademacher"])
def test_torch_draws_a_big_unit_in_fixed_chunks_whatever_the_threads(kind):
    """On the CPU a unit of more than CHUNK entries is drawn in chunks of CHUNK, chunk c from its own generator
    (chunk 0 from the unit's seed, so a unit of at most CHUNK entries draws as one generator did before), filled by
    a pool of threads: the values are the chunks', with any number of threads, under a dispatch mode (the kernel
    count draws in its own thread) and in inference mode."""
    from torch.utils._python_dispatch import TorchDispatchMode

    chunk = tdirections.CHUNK
    small, big = tdirections.Units({"a": torch.zeros(1000), "b": torch.zeros(2 * chunk + 5)})
    words = (3, 7, 1)

    def one_generator(numel, *seed_words):
        g = torch.Generator()
        g.manual_seed(tdirections.direction_seed(*seed_words))
        return tdirections.random((numel,), g, "cpu", torch.float32, kind)

    assert torch.equal(tdirections.draw(small, *words, kind), one_generator(1000, *words, small.index, 0))
    with torch_threads(3):  # a thread per chunk
        z = tdirections.draw(big, *words, kind)
    expected = [one_generator(chunk, *words, big.index, 0), one_generator(chunk, *words, big.index, 0, 1)]
    expected.append(one_generator(5, *words, big.index, 0, 2))
    assert torch.equal(z, torch.cat(expected))
    assert not torch.equal(expected[0], expected[1])  # each chunk its own stream

    class Counting(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            return func(*args, **(kwargs or {}))

    with torch_threads(1):
        assert torch.equal(tdirections.draw(big, *words, kind), z)
    with Counting():
        assert torch.equal(tdirections.draw(big, *words, kind), z)
    with torch.inference_mode():
        assert torch.equal(tdirections.draw(big, *words, kind), z)


def test_torch_lazy_jvp_takes_the_same_step_and_never_holds_the_tangent_whole(monkeypatch):
    """jvp.impl=lazy draws a unit of the tangent when the first module it feeds runs: the same seeded directions as
    func, so the same step, with one unit alive at a time (func: every unit). Units here as small as the largest
    tensor allows (the word embeddings, one unit; the rest, another)."""
    monkeypatch.setattr(bench.spec, "UNIT_FLOOR", 1)
    alive, most = [0], {}
    draw = tdirections.draw

    def counted(unit, *args, **kw):
        z = draw(unit, *args, **kw)
        n = z.numel()
        alive[0] += n
        weakref.finalize(z, lambda: alive.__setitem__(0, alive[0] - n))
        return z

    monkeypatch.setattr(tdirections, "draw", counted)  # what draw_direction and SeededTangent call
    trainers = {impl: make("torch", "jvp", settings=JvpSettings(impl=impl)) for impl in ("func", "lazy")}
    units = trainers["func"].units
    assert len(units) == 2
    for impl, t in trainers.items():
        alive[0], most[impl] = 0, 0
        hooks = [
            m.register_forward_hook(lambda *_, i=impl: most.__setitem__(i, max(most[i], alive[0])))
            for m in t.model.modules()
        ]
        grads = t.gradient(t.to_device(BATCH))[1]
        for h in hooks:
            h.remove()
        t.apply(grads)
    assert most["func"] == sum(u.numel for u in units)
    assert most["lazy"] == max(u.numel for u in units)
    for n, p in trainers["func"].params.items():
        np.testing.assert_allclose(
            trainers["lazy"].params[n].detach().numpy(), p.detach().numpy(), rtol=1e-6, atol=1e-7, err_msg=n
        )


@pytest.mark.slow
@pytest.mark.parametrize("directions", ["gaussian", "rademacher"])
@pytest.mark.parametrize("framework", FRAMEWORKS)
def test_forward_gradient_is_unbiased(framework, directions):
    """Averaged over K seeded tangents, the estimate's cosine with the true gradient is > 0.8 (n = 340 head
    parameters, K = 1024: expected ~sqrt(K / (K + n)) = 0.87, a biased estimate would stay near its bias's
    cosine), for N(0, I) and for +-1 (Rademacher) tangents alike: both have E[v v^T] = I."""
    K = 1024
    _, g = exact(framework, "head", narrow=True)
    t = make(
        framework,
        "jvp",
        NARROW,
        NARROW_WEIGHTS,
        trainable="head",
        settings=JvpSettings(num_tangents=K),
        directions=directions,
    )
    _, est = gradient(framework, t)
    a = np.concatenate([est[n].ravel() for n in g]).astype(np.float64)
    b = np.concatenate([g[n].ravel() for n in g]).astype(np.float64)
    cos = a @ b / np.linalg.norm(a) / np.linalg.norm(b)
    assert cos > 0.8, cos
    # one tangent is an unbiased but noisy estimate: far from the gradient's direction
    _, one = gradient(
        framework, make(framework, "jvp", NARROW, NARROW_WEIGHTS, trainable="head", directions=directions)
    )
    c1 = np.concatenate([one[n].ravel() for n in g]) @ b / np.linalg.norm(b)
    assert abs(c1) / np.linalg.norm(np.concatenate([one[n].ravel() for n in g])) < 0.5


@pytest.mark.slow
@pytest.mark.parametrize("framework", FRAMEWORKS)
def test_forward_gradient_over_k_seeded_tangents_is_their_mean(framework):
    """With K = 3 seeded tangents v_k the estimate is 1/K sum_k (g . v_k) v_k, g backprop's gradient: the mean, not
    the sum (a cosine cannot tell them apart)."""
    K = 3
    _, g = exact(framework, "head")
    t = make(framework, "jvp", trainable="head", settings=JvpSettings(num_tangents=K))
    _, est = gradient(framework, t)
    if framework == "torch":
        vs = [{n: x.numpy() for n, x in tdirections.sample_tangent(t.params, 0, 0, k).items()} for k in range(K)]
    else:
        vs = [to_hf(jdirections.sample_tangent(t.params, 0, jnp.int32(0), k)) for k in range(K)]
    ds = [sum(float((g[n] * v[n]).sum()) for n in g) for v in vs]
    for n in g:
        want = sum(d * v[n] for d, v in zip(ds, vs)) / K
        np.testing.assert_allclose(est[n], want, rtol=1e-4, atol=1e-6, err_msg=n)


@pytest.mark.slow
@pytest.mark.parametrize("framework", FRAMEWORKS)
def test_jvp_keeps_or_redraws_its_tangent_and_takes_the_same_steps(framework):
    """jvp.tangent=keep hands the pass's tangent to the update (drawn once per step); redraw draws it again from
    its seed: the same direction, so the same steps, in the timed step's own programs."""
    after = {}
    for how in ("keep", "redraw"):
        t = make(framework, "jvp", settings=JvpSettings(tangent=how))
        assert keeps_tangent(t.spec, framework) == (how == "keep")
        stepped(t, batches(2))
        after[how] = params_hf(framework, t)
    moved = max(float(np.abs(after["keep"][n] - WEIGHTS[n]).max()) for n in after["keep"])
    assert moved > 1e-4  # the steps did something
    for n in after["keep"]:
        np.testing.assert_allclose(after["keep"][n], after["redraw"][n], rtol=1e-6, atol=1e-7, err_msg=n)
    # auto: kept where the pass holds the tangent whole anyway (torch's func), redrawn where it never does
    assert keeps_tangent(StepSpec(mode="jvp"), "torch") and not keeps_tangent(StepSpec(mode="jvp"), "jax")
    assert not keeps_tangent(StepSpec(mode="jvp", settings=JvpSettings(impl="lazy")), "torch")
    assert not keeps_tangent(StepSpec(mode="jvp", settings=JvpSettings(num_tangents=2, tangent="keep")), framework)


# ---------------------------------------------------------------------------------------------------------------
# MeZO


@pytest.mark.slow
@pytest.mark.parametrize("directions", ["gaussian", "rademacher"])
@pytest.mark.parametrize("framework", FRAMEWORKS)
def test_mezo_projection_is_its_finite_difference_and_theta_is_restored(framework, directions):
    eps = 1e-3
    t = make(framework, "mezo", settings=MezoSettings(eps=eps), directions=directions)
    theta = params_hf(framework, t)
    if framework == "torch":
        z = {n: x.numpy() for n, x in tdirections.sample_tangent(t.params, 0, 0, 0, directions).items()}
    else:
        z = to_hf(jdirections.sample_tangent(t.params, 0, jnp.int32(0), 0, directions))
    if directions == "rademacher":
        assert all(set(np.unique(v)) == {-1.0, 1.0} for v in z.values() if v.size > 8)  # +-1 entries, both
    loss, est = gradient(framework, t)  # the step's perturbation round trip, on the trainer's own parameters
    restored = params_hf(framework, t)
    for n in theta:  # +eps z, -2 eps z, +eps z in float32: back to theta up to the rounding of each addition
        tol = 3 * np.spacing(np.abs(theta[n]) + eps * np.abs(z[n]))
        assert (np.abs(restored[n] - theta[n]) <= tol).all(), n
    l_plus = loss_at(framework, t, {n: theta[n] + eps * z[n] for n in theta})
    l_minus = loss_at(framework, t, {n: theta[n] - eps * z[n] for n in theta})
    proj = (l_plus - l_minus) / (2 * eps)
    assert loss == pytest.approx((l_plus + l_minus) / 2, rel=1e-5)
    # float32 losses: the difference of two ~1.4 values carries ~1e-7 absolute error, / 2 eps -> ~1e-4
    for n in ("classifier.bias", "bert.encoder.layer.0.attention.self.query.weight"):
        np.testing.assert_allclose(est[n], proj * z[n], rtol=1e-2, atol=2e-4 * np.abs(z[n]).max())


@pytest.mark.slow
@pytest.mark.parametrize(("framework", "programs"), [("torch", None), ("jax", 1), ("jax", 3)])
def test_mezo_step_restores_theta_inside_its_update(framework, programs, monkeypatch):
    """The timed MeZO step leaves its last +eps z to the update, which draws z anyway (one draw fewer); over two
    micro-batches and two steps with momentum it takes the steps of gradient() (theta restored) then apply(). JAX:
    the tiny model's state runs it as one program, a large one's as three (ONE_PROGRAM_BELOW lowered to say so)."""
    if programs == 3:
        monkeypatch.setattr(jax_estimators, "ONE_PROGRAM_BELOW", 0)
    opt = OptimizerSpec(name="sgd", lr=1e-2, momentum=0.9, weight_decay=0.01)
    fused, apart = (make(framework, "mezo", optimizer=opt, grad_accum=2) for _ in range(2))
    micro = fused.to_device(BATCH * 2)
    fused.compile(micro)  # the timed programs, as a trial compiles them
    if programs:
        assert len(fused.programs()) == programs
    for _ in range(2):
        loss = float(fused.step(micro))
        ref, g = apart.gradient(micro)
        apart.apply(g)
        assert loss == pytest.approx(float(ref), rel=1e-6)
    a, b = params_hf(framework, fused), params_hf(framework, apart)
    for n in a:  # theta - eps z + eps z then the update, in one expression or two: float32 rounding apart
        np.testing.assert_allclose(a[n], b[n], rtol=1e-6, atol=1e-7, err_msg=n)


@pytest.mark.slow
@pytest.mark.parametrize("mode", ["hizoo", "lozo"])
def test_a_small_state_runs_hizoos_and_lozos_programs_as_one_taking_the_same_steps(mode, monkeypatch):
    """As MeZO's: the tiny model's state runs the split step's bodies as one program, a large one's as several
    (ONE_PROGRAM_BELOW lowered to say so); over two micro-batches and two steps with momentum both take the same
    steps and keep the same state (HiZOO's Hessian estimate)."""
    opt = OptimizerSpec(name="sgd", lr=1e-2, momentum=0.9, weight_decay=0.01)
    one = make("jax", mode, optimizer=opt, grad_accum=2)
    monkeypatch.setattr(jax_estimators, "ONE_PROGRAM_BELOW", 0)
    split = make("jax", mode, optimizer=opt, grad_accum=2)
    micro = one.to_device(BATCH * 2)
    for t in (one, split):
        t.compile(micro)
    assert len(one.programs()) == 1 and len(split.programs()) == {"hizoo": 4, "lozo": 3}[mode]
    for _ in range(2):
        assert float(one.step(micro)) == pytest.approx(float(split.step(micro)), rel=1e-6)
    a, b = params_hf("jax", one), params_hf("jax", split)
    for n in a:
        np.testing.assert_allclose(a[n], b[n], rtol=1e-6, atol=1e-7, err_msg=n)
    for x, y in zip(jax.tree.leaves(one.state or ()), jax.tree.leaves(split.state or ()), strict=True):
        np.testing.assert_allclose(x, y, rtol=1e-6, err_msg=mode)
    assert (one.state is None) == (mode == "lozo")


# ---------------------------------------------------------------------------------------------------------------
# one step, torch vs JAX


@pytest.mark.slow
@pytest.mark.parametrize("optimizer", ["sgd", "adamw"])
@pytest.mark.parametrize("mode", ["backprop", "jvp"])
def test_one_step_gives_the_same_loss_in_torch_and_jax(mode, optimizer):
    opt = OptimizerSpec(name=optimizer, lr=1e-2 if optimizer == "sgd" else 1e-3, weight_decay=0.01)
    after = {}
    for fw in FRAMEWORKS:
        t = make(fw, mode, optimizer=opt)
        micro = t.to_device(BATCH)
        if mode == "jvp":
            v = random_tangent(shapes(fw, t))
            loss, grads = t.gradient(micro, [tangent_for(fw, t, v)])
        else:
            loss, grads = t.gradient(micro)
        t.apply(grads)
        after[fw] = (float(loss), loss_at(fw, t, params_hf(fw, t)))
    before_t, after_t = after["torch"]
    before_j, after_j = after["jax"]
    assert before_j == pytest.approx(before_t, abs=1e-5)
    assert after_j == pytest.approx(after_t, abs=1e-5)
    assert abs(after_t - before_t) > 1e-4  # the step did something


@pytest.mark.slow
def test_momentum_sgd_takes_the_same_steps_in_torch_and_jax():
    """Backprop with momentum SGD (the tuning sweep's backprop: optimizer.momentum), coupled weight decay: three
    steps, the same parameters after each in both frameworks. Momentum shows from the second step on (the first
    is plain SGD's in both: torch seeds its buffer with the gradient, optax's trace starts at zero)."""
    opt = OptimizerSpec(name="sgd", lr=5e-2, momentum=0.9, weight_decay=0.01)
    micro = batches(3)
    after = {}
    for fw in FRAMEWORKS:
        t = make(fw, "backprop", optimizer=opt)
        after[fw] = []
        for b in micro:
            _, grads = t.gradient(t.to_device([b]))
            t.apply(grads)
            after[fw].append(params_hf(fw, t))
    plain = make("torch", "backprop", optimizer=OptimizerSpec(name="sgd", lr=5e-2, weight_decay=0.01))
    for b in micro:
        _, grads = plain.gradient(plain.to_device([b]))
        plain.apply(grads)
    for step_t, step_j in zip(after["torch"], after["jax"]):
        assert_grads_close(step_j, step_t, rtol=1e-4)
    moved = max(float(np.abs(after["torch"][-1][n] - p).max()) for n, p in params_hf("torch", plain).items())
    assert moved > 1e-4  # momentum changed the steps: the test sees it


@pytest.mark.slow
@pytest.mark.parametrize("mode", ["backprop", "jvp", "jacfwd", "mezo"])
@pytest.mark.parametrize("framework", FRAMEWORKS)
def test_frozen_parameters_are_bit_identical_after_steps(framework, mode):
    t = make(
        framework,
        mode,
        trainable="bias",
        settings=JacfwdSettings(chunk=128) if mode == "jacfwd" else None,
        optimizer=OptimizerSpec(name="adamw", lr=1e-2, weight_decay=0.1),
    )
    stepped(t, batches(2))
    after = t.weights()
    for name, w in WEIGHTS.items():
        if is_trainable(name, "bias", TINY.num_layers):
            assert not np.array_equal(after[name], w), f"{name} was trained"
        else:
            assert np.array_equal(after[name], w), f"{name} is frozen but changed"


@pytest.mark.slow
@pytest.mark.parametrize("trainable", ["all", "bias", "head"])  # frozen parameters: nnx.remat once failed on them
@pytest.mark.parametrize("framework", FRAMEWORKS)
def test_remat_gives_the_same_gradient_as_plain_backprop(framework, trainable):
    loss_p, plain = exact(framework, trainable)
    trainer = make(framework, "backprop", remat=True, trainable=trainable)
    if framework == "torch":  # the HF model really checkpoints its layers (JAX: test_parity counts the regions)
        model = trainer.model
        assert getattr(model, "is_activation_checkpointing", None) or model.is_gradient_checkpointing
    loss_r, remat = gradient(framework, trainer)
    assert loss_r == pytest.approx(loss_p, rel=1e-6)
    assert_grads_close(remat, plain, rtol=1e-5)


@pytest.mark.slow
@pytest.mark.parametrize("mode", ["backprop", "mezo"])
def test_torch_compile_takes_eager_steps(mode):
    """compile=true: inductor's graph, in place of the module's eager call, takes the same steps (fp32 sums may
    be reassociated); ~30 s of compiling on 2 cores. MeZO's step is (L+ - L-) / (2 eps) along z: a loss difference
    of ~1e-4 divided, so the reassociation's ~1e-7 in a loss moves the step by a small fraction of itself (well
    under the 1 % allowed), and the steps are compared as such (a wrong z or sign is off by about the step)."""
    eager, compiled = make("torch", mode), make("torch", mode, compile=True)
    before = eager.weights()
    for b in batches(2):
        loss_e, loss_c = float(eager.step(eager.to_device([b]))), float(compiled.step(compiled.to_device([b])))
        assert loss_c == pytest.approx(loss_e, rel=1e-5)
    after_e, after_c = eager.weights(), compiled.weights()
    for name in after_e:
        if mode == "backprop":
            np.testing.assert_allclose(after_c[name], after_e[name], rtol=1e-4, atol=1e-6, err_msg=name)
            continue
        step_e, step_c = after_e[name] - before[name], after_c[name] - before[name]
        assert np.linalg.norm(step_c - step_e) <= 1e-2 * np.linalg.norm(step_e), name
    assert compiled.model._compiled_call_impl is not None and eager.model._compiled_call_impl is None


@pytest.mark.slow
@pytest.mark.parametrize("framework", FRAMEWORKS)
def test_fifty_backprop_steps_lower_the_loss(framework):
    # BERT from a random init sits on the ln(4) plateau for ~35 steps before the topic words take hold.
    t = make(framework, "backprop", optimizer=OptimizerSpec(name="adamw", lr=3e-3))
    spec = data.data_spec(num_train=64, num_eval=16)
    losses = stepped(t, data.make_batches(spec, 8, 32, 0, "train", epochs=7)[:50])
    first, last = np.mean(losses[:5]), np.mean(losses[-5:])
    assert first == pytest.approx(np.log(4), abs=0.05)
    assert last < first - 0.1, (first, last)
