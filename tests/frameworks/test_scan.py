"""scan_layers: the JAX encoder as a lax.scan over stacked layers computes what the unrolled one computes.

The parity and exactness tests run the default (scanned) model against HF; these hold the two JAX layouts against
each other (logits, every hidden state, every gradient, remat and its dropout masks, the FLOP count), the weights'
round trip through stacked parameters, the structure that makes compile time independent of depth, and the
directions drawn layer by layer that keep a forward gradient's memory flat in depth.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from flax import nnx

from bench.config import model_preset
from bench.jax_impl import directions, flops
from bench.jax_impl import estimators as jax_estimators
from bench.jax_impl.models.bert import build_model, export_weights, from_hf, is_trained, layer_names, to_hf
from bench.jax_impl.models.common import layer_stacks
from bench.jax_impl.steps import make_optimizer, make_trainer
from bench.models.bert import count_params, param_shapes
from bench.spec import LoraSpec, OptimizerSpec, StepSpec
from bench.weights import build_weights

# scan vs unrolled: the same ops, fused and ordered differently by XLA, so float32 sums differ in the last bits
# (measured on tiny: logits 4e-9, hidden states 5e-7, gradients 2e-7 absolute). A layer applied twice, skipped or
# given another layer's weights changes them by O(1).
ATOL = 2e-6


def _spec(num_layers=3, dropout=0.0):
    spec, _ = model_preset("tiny", dropout=dropout, num_layers=num_layers)
    return spec


def _args(spec, seed=0):
    rng = np.random.default_rng(seed)
    ids = rng.integers(1000, spec.vocab_size, (3, 16)).astype(np.int32)
    mask = np.ones_like(ids)
    mask[1, 9:] = 0  # a padded row
    return ids, np.zeros_like(ids), mask


LABELS = np.array([0, 1, 2], np.int32)


def _grads(model, args, key=None, labels=LABELS):
    graphdef, params = nnx.split(model, nnx.Param)

    def loss(p, key):  # the key an argument, not a constant: one program for every key
        logits = nnx.merge(graphdef, p)(
            *args, deterministic=key is None, rngs=None if key is None else nnx.Rngs(dropout=key)
        )
        return -jax.nn.log_softmax(logits)[np.arange(3), labels].mean()

    return to_hf(jax.jit(jax.grad(loss))(params, key))


@functools.cache
def _unrolled():
    """The unrolled model's hidden states, logits and gradients on _args: the reference every layout is held to."""
    spec = _spec()
    weights = build_weights(spec, 0)
    model, args = build_model(spec, weights, scan_layers=False), _args(spec)
    return spec, weights, model(*args, output_hidden_states=True), _grads(model, args)


@pytest.mark.slow
@pytest.mark.parametrize("stacks", [(3,), (2, 1), (1, 1, 1)])
def test_scanned_model_computes_the_unrolled_one(stacks):
    spec, weights, a, ga = _unrolled()
    scanned = build_model(spec, weights, stacks=stacks)
    args = _args(spec)
    b = scanned(*args, output_hidden_states=True)
    assert len(b.hidden_states) == spec.num_layers + 1
    for i, (x, y) in enumerate(zip(a.hidden_states, b.hidden_states, strict=True)):
        np.testing.assert_allclose(y, x, rtol=0, atol=ATOL, err_msg=f"hidden state {i}")
    np.testing.assert_allclose(b.logits, a.logits, rtol=0, atol=ATOL)
    gb = _grads(scanned, args)
    assert set(gb) == set(ga) == set(param_shapes(spec))  # every layer's gradient, under its own HF name
    for name in ga:
        np.testing.assert_allclose(gb[name], ga[name], rtol=1e-5, atol=ATOL, err_msg=name)


def test_weights_round_trip_through_stacked_parameters():
    spec = _spec()
    lora = LoraSpec(rank=2, targets=("query", "value", "intermediate.dense"))
    weights = build_weights(spec, 0)
    model = build_model(spec, weights, lora=lora, stacks=(2, 1), seed=5)
    out = export_weights(model)
    assert list(out) == list(param_shapes(spec, lora))
    for name, w in weights.items():
        np.testing.assert_array_equal(out[name], w, err_msg=name)
    # slice i of a stack is layer S + i, transformed as that layer alone (a kernel is its weight transposed)
    kernel = model.bert.encoder.stacks["2"].intermediate.dense.kernel[...]
    assert kernel.shape == (1, spec.hidden_size, spec.intermediate_size)
    np.testing.assert_array_equal(kernel[0], weights["bert.encoder.layer.2.intermediate.dense.weight"].T)
    _, params = nnx.split(model, nnx.Param)
    assert to_hf(params).keys() == out.keys()
    again = from_hf(params, out)
    for x, y in zip(jax.tree.leaves(params), jax.tree.leaves(again), strict=True):
        np.testing.assert_array_equal(x, y)
    path = ("bert", "encoder", "stacks", "0", "attention", "self", "query", "lora", "lora_a")
    assert layer_names(path, 2) == [f"bert.encoder.layer.{i}.attention.self.query.lora_A.weight" for i in (0, 1)]


@pytest.mark.parametrize("scope", ["all", "bias", "head", "last_k", "lora"])
def test_a_scope_trains_whole_stacks_of_layers(scope):
    """The trainer's filter (is_trained) on the stacks layer_stacks builds: exactly count_params(scope)
    parameters trained, and under last_k the frozen layers and the trained ones in two stacks."""
    spec = _spec()
    last_k = 2
    stacks = layer_stacks(spec.num_layers, scope, last_k)
    assert stacks == ((1, 2) if scope == "last_k" else (3,))
    s = StepSpec(trainable=scope, last_k=last_k)
    trainer = make_trainer(spec, build_weights(spec, 0), s, "cpu")
    assert trainer.n_trainable == count_params(spec, scope, last_k, s.lora)
    # one stack over a scope that splits the layers is refused, not silently trained or frozen whole
    model = build_model(spec, build_weights(spec, 0), stacks=(3,))
    with pytest.raises(ValueError, match="layer_stacks"):
        nnx.split(model, lambda path, x: isinstance(x, nnx.Param) and is_trained(path, x, "last_k", 3, 2), ...)


@pytest.mark.slow
def test_remat_in_the_scan_replays_the_layers_dropout():
    """remat=true checkpoints the scan's body: the backward pass recomputes each layer with the same dropout masks
    (gradients equal to the scanned model without remat under one key, different under another)."""
    spec = _spec(dropout=0.1)
    weights = build_weights(spec, 0)
    plain, remat = build_model(spec, weights), build_model(spec, weights, remat=True)
    args = _args(spec)
    key = lambda seed: jax.random.key(seed, impl="rbg")  # rbg: compiles fast on XLA:CPU (test_parity's reason)
    g_plain, g_remat, g_other = _grads(plain, args, key(3)), _grads(remat, args, key(3)), _grads(remat, args, key(4))
    for name in g_plain:
        np.testing.assert_allclose(g_remat[name], g_plain[name], rtol=1e-5, atol=1e-8, err_msg=name)
    assert not np.allclose(g_other["classifier.weight"], g_plain["classifier.weight"], rtol=1e-5)
    # one checkpointed body, inside the scan
    graphdef, params = nnx.split(remat, nnx.Param)
    jaxpr = jax.make_jaxpr(jax.grad(lambda p: nnx.merge(graphdef, p)(*args).sum()))(params)
    scans = [e for e in jaxpr.jaxpr.eqns if e.primitive.name == "scan"]
    body = [e.primitive.name for s in scans for e in s.params["jaxpr"].jaxpr.eqns]
    assert scans and sum(n in ("checkpoint", "remat", "remat2") for n in body) == 1


def _compiled(mode, layers, scan=True, **model):
    """A trainer of `layers` layers (tiny, with these `model` fields) with its step compiled for one (2, 16)
    micro-batch, and that micro-batch."""
    spec, _ = model_preset("tiny", num_layers=layers, **model)
    t = make_trainer(spec, build_weights(spec, 0), StepSpec(mode=mode, scan_layers=scan), "cpu")
    rng = np.random.default_rng(0)
    batch = {
        "input_ids": rng.integers(1000, 5000, (2, 16)),
        "token_type_ids": np.zeros((2, 16)),
        "attention_mask": np.ones((2, 16)),
        "labels": np.array([0, 1]),
    }
    mb = t.to_device([batch])
    t.compile(mb)
    return t, mb


@pytest.mark.slow
@pytest.mark.parametrize("mode", ["backprop", "jvp"])
def test_the_program_holds_one_layer_whatever_the_depth(mode):
    """Why compile time stops growing with depth: the compiled step of 2 and of 3 layers has the same number of
    dot instructions (the layer is a loop body), while the FLOPs counted at the loop's trip count grow with the
    encoder (bench.jax_impl.flops reads XLA's known_trip_count), as the unrolled program's do."""
    dots, counted = {}, {}
    for layers in (2, 3):  # any two depths show it; the unrolled program's compile grows with each layer
        for scan in (True, False):
            t, mb = _compiled(mode, layers, scan, dropout=0.0)  # no draws: the program is its matmuls and the rest
            text = "\n".join(c.as_text() for c, _ in t.programs())
            dots[layers, scan] = text.count(" dot(")
            counted[layers, scan] = flops.count(t, mb)["flops_per_step"]
    assert dots[2, True] == dots[3, True] < dots[3, False]
    for layers in (2, 3):
        assert counted[layers, True] == counted[layers, False], layers


# ---------------------------------------------------------------------------------------------------------------
# directions (bench/jax_impl/directions.py): a stack's direction drawn layer by layer, the same in every program


def _stacked_params(scope="all"):
    spec = _spec()
    stacks = layer_stacks(spec.num_layers, scope, 1)
    model = build_model(spec, build_weights(spec, 0), stacks=stacks)
    _, params, frozen = nnx.split(model, lambda p, x: isinstance(x, nnx.Param) and is_trained(p, x, scope, 3, 1), ...)
    return model, params, frozen


# directions.WHOLE: tiny's stacks are small enough to be drawn whole; at 0 every stack is drawn layer by layer, as a
# wide model's are
BY_LAYER, WHOLE = 0, directions.WHOLE


@pytest.mark.slow
@pytest.mark.parametrize("whole", [BY_LAYER, WHOLE])
@pytest.mark.parametrize("scope", ["all", "last_k"])
def test_a_pass_along_the_seeded_direction_is_the_jvp_along_the_whole_tangent(scope, whole, monkeypatch):
    """displaced(): each stacked layer's tangent drawn inside the scan (or a small stack's drawn whole) gives
    jax.jvp's derivative along the whole tangent sample_tangent draws (the update's and jvp.tangent=keep's), to
    fp32 rounding."""
    monkeypatch.setattr(directions, "WHOLE", whole)
    model, params, frozen = _stacked_params(scope)
    graphdef = nnx.graphdef(model)
    args = _args(model.spec)

    def loss(p, hook=None):
        logits = nnx.merge(graphdef, p, frozen)(*args, layer_hook=hook)
        return -jax.nn.log_softmax(logits)[np.arange(3), LABELS].mean()

    def along(t):
        moved, hook = directions.displaced(params, t, 7, 3, 1)
        return loss(moved, hook)

    l0, d0 = jax.jit(lambda: jax.jvp(along, (np.float32(0),), (np.float32(1),)))()
    z = directions.sample_tangent(params, 7, 3, 1)
    l1, d1 = jax.jit(lambda z: jax.jvp(loss, (params,), (z,)))(z)
    assert float(l0) == pytest.approx(float(l1), abs=1e-7)
    assert float(d0) == pytest.approx(float(d1), rel=1e-5)
    assert float(d0) != 0.0


@pytest.mark.slow
@pytest.mark.parametrize("optimizer", ["sgd", "adamw"])
def test_the_layer_by_layer_update_is_the_whole_one(optimizer, monkeypatch):
    """seeded_update (a stack's g one layer at a time, the optimizer applied part by part) equals the optimizer's
    update with g whole (seeded_gradient), parameters and state, for K = 2 directions, with momentum, weight decay
    and AdamW's moments and step count, over two steps; perturb equals theta + scale z whole."""
    monkeypatch.setattr(directions, "WHOLE", BY_LAYER)
    _, params, _ = _stacked_params("last_k")  # two stacks: the frozen one carries nothing
    spec = OptimizerSpec(name=optimizer, lr=0.1, momentum=0.9 if optimizer == "sgd" else 0.0, weight_decay=0.01)
    opt = make_optimizer(spec)
    coeffs = jnp.array([0.5, -2.0], jnp.float32)
    a = b = jax.device_put((params, opt.init(params)), jax.devices()[0])  # placed as the program's results are
    update = jax.jit(lambda p, s, st: directions.seeded_update(opt, p, s, coeffs, 5, st))  # one program, two steps
    for step in (0, 1):
        a = update(*a, step)
        g = directions.seeded_gradient(b[0], coeffs, 5, step)
        updates, state = opt.update(g, b[1], b[0])
        b = (optax.apply_updates(b[0], updates), state)
    # the same sums, fused and ordered apart: float32 rounding of entries up to ~5 (a wrong draw is O(1) off)
    for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b), strict=True):
        np.testing.assert_allclose(x, y, rtol=1e-6, atol=2e-6)
    moved = jax.jit(lambda p: directions.perturb(p, 0.25, 5, 1))(params)
    z = directions.sample_tangent(params, 5, 1, 0)
    for x, p, zz in zip(jax.tree.leaves(moved), jax.tree.leaves(params), jax.tree.leaves(z), strict=True):
        np.testing.assert_allclose(x, p + 0.25 * zz, rtol=1e-6, atol=2e-6)


@pytest.mark.slow
def test_a_forward_gradient_and_mezo_hold_no_more_with_more_layers(monkeypatch):
    """What XLA's buffer assignment gives each program of a jvp and a MeZO step (compiled.memory_analysis) does not
    grow with depth: a stack's direction exists one layer at a time in every program. (Handed to jax.jvp whole, a
    stacked tangent would add a layer's tangent, 0.8 MB here, per layer: the scan's inputs exist before it runs.)"""
    monkeypatch.setattr(directions, "WHOLE", BY_LAYER)  # a wide model's stacks (these would be drawn whole)
    monkeypatch.setattr(jax_estimators, "ONE_PROGRAM_BELOW", 0)  # and its MeZO step, three programs
    temps = {}
    for layers in (2, 6):  # a whole tangent would add 4 x 0.8 MB at 6 layers
        for mode in ("jvp", "mezo"):
            t, _ = _compiled(mode, layers, hidden_size=128, intermediate_size=512)
            temps[layers, mode] = [c.memory_analysis().temp_size_in_bytes for c, _ in t.programs()]
    # no more, program by program: XLA's buffer assignment is not a function of the depth alone (within one test
    # session the 2-layer update's has come out 1 MB above the 6-layer one's, alone equal to it)
    for mode in ("jvp", "mezo"):
        assert all(deep <= shallow for deep, shallow in zip(temps[6, mode], temps[2, mode], strict=True)), temps
