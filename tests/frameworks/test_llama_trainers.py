"""LLaMA through the registry: the trainers of both frameworks build it from model.family=llama and compute the
same thing from the same weights and batch (CPU, llama_tiny: 4 heads over 2 key-value heads, fp32, dropout off):
- backprop, jvp along a given tangent, MeZO along a given direction and jacfwd over the head give the same loss and
  gradient (or estimate) in torch and JAX;
- a batch padded with LLaMA's pad id reaches the model with its inputs only (no token_type_ids);
- the FLOP model predicts what each framework's counter counts (the memory model's terms: test_memory.py);
- bf16 (mixed and pure) gradients are fp32's within bf16 precision in both frameworks, and each other's;
- a trial of every way of differentiating runs end to end and its row is ok, in fp32 and in bf16;
- SGD steps give one loss curve in both frameworks, on one device and on two (ddp, fsdp).
"""

from __future__ import annotations

import importlib
import json

import numpy as np
import pytest
import torch

from bench import data, models
from bench.config import model_preset
from bench.estimators.jacfwd import JacfwdSettings
from bench.estimators.mezo import MezoSettings
from bench.measure.flop_model import predict as predict_flops
from bench.spec import OptimizerSpec, StepSpec, implementation
from bench.weights import build_weights
from tests.support import FAST, run_here, start_ranks
from tests.support import rows as recorded

FRAMEWORKS = ("torch", "jax")
SPEC, _ = model_preset("llama_tiny")
WEIGHTS = build_weights(SPEC, 0)


pytestmark = pytest.mark.usefixtures("fp32_pinned")  # tests/frameworks/conftest.py


def batches():
    spec = data.data_spec(num_train=64, num_eval=16)
    return data.make_batches(spec, 4, 16, 0, "train", pad_id=SPEC.pad_token_id)[:1]


def make(framework, mode, **kw):
    kw.setdefault("optimizer", OptimizerSpec(name="sgd", lr=1e-2))
    return implementation(framework, "steps").make_trainer(SPEC, WEIGHTS, StepSpec(mode=mode, **kw), "cpu")


def as_hf(framework, trainer, grads) -> dict[str, np.ndarray]:
    if framework == "torch":
        grads = grads if isinstance(grads, dict) else grads.materialize()
        return {n: g.detach().float().numpy().copy() for n, g in grads.items()}
    return trainer.family.to_hf(grads)


def tangent_for(framework, trainer, arrays):
    if framework == "torch":
        return {n: torch.from_numpy(arrays[n].copy()) for n in trainer.params}
    return trainer.family.from_hf(trainer.params, arrays)


def trained(trainer, framework) -> set[str]:
    if framework == "torch":
        return {trainer.family.hf_name(n) for n in trainer.params}
    return set(trainer.family.to_hf(trainer.params))


def gradients_of(fw, mode, given=None, **kw):
    """(loss, gradient by HF name as fp32 numpy) of one gradient of `fw`'s trainer at the start weights."""
    t = make(fw, mode, **kw)
    loss, g = t.gradient(t.to_device(batches()), given)
    return float(loss), {n: np.asarray(x, np.float32) for n, x in as_hf(fw, t, g).items()}


def gradients(mode, tangent=None, **kw) -> dict:
    """{framework: (loss, gradient by HF name)} of one gradient at the start weights, on the same batch; `tangent`:
    a seeded array per trained tensor, given to both frameworks."""
    out = {}
    for fw in FRAMEWORKS:
        t = make(fw, mode, **kw)
        given = None
        if tangent is not None:
            shapes = {n: WEIGHTS[n].shape for n in trained(t, fw)}
            rng = np.random.default_rng(tangent)
            given = [tangent_for(fw, t, {n: rng.standard_normal(shapes[n]).astype(np.float32) for n in sorted(shapes)})]
        loss, g = t.gradient(t.to_device(batches()), given)
        out[fw] = (float(loss), as_hf(fw, t, g))
    return out


def assert_same(out, rtol=1e-4):
    (lt, gt), (lj, gj) = out["torch"], out["jax"]
    assert lj == pytest.approx(lt, rel=1e-5)
    assert gt.keys() == gj.keys()
    scale = max(float(np.abs(x).max()) for x in gt.values())
    for n in gt:
        np.testing.assert_allclose(gj[n], gt[n], rtol=rtol, atol=rtol * scale, err_msg=n)


@pytest.mark.slow
def test_the_registry_builds_llama_in_both_frameworks_with_its_own_inputs():
    assert models.of(SPEC).NAME == "llama"
    for fw in FRAMEWORKS:
        t = make(fw, "inference")
        (batch,) = t.to_device(batches())
        assert set(batch) == {"input_ids", "attention_mask", "labels"}  # LLaMA reads no segments
        assert t.n_params == models.of(SPEC).count_params(SPEC)
        assert t.weights().keys() == WEIGHTS.keys()


@pytest.mark.slow
@pytest.mark.parametrize("trainable", ["all", "last_k"])
def test_backprop_gives_the_same_loss_and_gradient_in_torch_and_jax(trainable):
    assert_same(gradients("backprop", trainable=trainable))


@pytest.mark.slow
def test_jvp_along_the_same_tangent_gives_the_same_estimate():
    assert_same(gradients("jvp", tangent=3))


@pytest.mark.slow
def test_mezo_along_the_same_direction_gives_the_same_estimate():
    assert_same(gradients("mezo", tangent=4, settings=MezoSettings(eps=1e-2)), rtol=1e-3)


@pytest.mark.slow
@pytest.mark.parametrize("trainable", ["head", "classifier"])
def test_jacfwd_over_the_head_is_backprop_in_both_frameworks(trainable):
    jac = gradients("jacfwd", trainable=trainable, settings=JacfwdSettings(chunk=64))
    exact = gradients("backprop", trainable=trainable)
    assert_same(jac)
    for fw in FRAMEWORKS:
        for n, g in exact[fw][1].items():
            np.testing.assert_allclose(jac[fw][1][n], g, rtol=1e-5, atol=1e-7, err_msg=(fw, n))


@pytest.mark.slow
@pytest.mark.parametrize("dtype", ["bf16", "bf16_pure"])
def test_bf16_gradients_are_fp32s_within_bf16_precision_in_both_frameworks(dtype):
    """As test_bf16.py's for BERT: torch.autocast's recipe (bf16) and bf16 parameters (bf16_pure) in torch, their
    mirror in our NNX LLaMA (RMSNorm and softmax in fp32): each gradient is fp32's to within eight bf16 roundings
    (2^-5) yet not fp32's (2^-12), and the frameworks are within two such budgets of each other."""
    bf16_error, fp32_error = 2**-5, 2**-12  # tests/frameworks/test_bf16.py's bounds

    def flat(fw, dt):
        loss, g = gradients_of(fw, "backprop", dtype=dt)
        return np.concatenate([np.asarray(g[n], np.float32).ravel() for n in sorted(g)])

    rel = lambda a, b: float(np.linalg.norm(a - b) / np.linalg.norm(b))
    exact = flat("torch", "fp32")
    ours = {fw: flat(fw, dtype) for fw in FRAMEWORKS}
    for fw, g in ours.items():
        assert fp32_error < rel(g, exact) < bf16_error, fw
    assert rel(ours["jax"], ours["torch"]) < 2 * bf16_error


@pytest.mark.slow
@pytest.mark.parametrize(
    ("mode", "kw"),
    [
        ("inference", {}),
        ("backprop", {}),
        ("backprop", {"trainable": "last_k"}),
        ("jvp", {}),
        ("mezo", {}),
        ("jacfwd", {"trainable": "classifier", "settings": JacfwdSettings(chunk=64)}),
    ],
    ids=["inference", "backprop", "backprop-last_k", "jvp", "mezo", "jacfwd-classifier"],
)
@pytest.mark.parametrize("framework", FRAMEWORKS)
def test_the_flop_model_predicts_the_counted_flops_of_llama(framework, mode, kw):
    """LLaMA's matmuls (bench/models/llama.py) as each framework's counter counts them: torch's FlopCounterMode,
    XLA's dots; HF's torch model scores every token, JAX's the one it reads."""
    t = make(framework, mode, **kw)
    (batch,) = batches()
    counted = importlib.import_module(f"bench.{framework}_impl.flops").count(t, t.to_device([batch]))
    expected = predict_flops(SPEC, t.spec, *batch["input_ids"].shape, framework=framework).total
    assert counted["flops_per_step"] == pytest.approx(expected, rel=1e-9)


@pytest.mark.slow
def test_every_way_of_differentiating_runs_on_llama_in_fp32_and_bf16(tmp_path):
    """Each trial measured and recorded by the runner, in this process (run_here): LLaMA in every way of
    differentiating, its row ok with both models' predictions."""
    llama = [*FAST, "model=llama_tiny", "logger=none"]  # after FAST's model: the last one given wins
    cases = "case=inference,backprop,jvp,jacfwd_head,mezo,hizoo,lozo"
    outcomes = run_here("-m", "framework=torch,jax", cases, *llama, results=tmp_path / "fp32")
    run_here("-m", "framework=torch,jax", "case=backprop,jvp", "dtype=bf16", *llama, results=tmp_path / "bf16")
    rows, bf16 = recorded(tmp_path / "fp32"), recorded(tmp_path / "bf16")
    assert len(outcomes) == len(rows) == 14 and len(bf16) == 4
    assert {r["status"] for r in rows + bf16} == {"ok"}, [r.get("error") for r in rows + bf16]
    for r in rows + bf16:
        assert r["model"] == "llama_tiny" and float(r["mem_predicted_mb"]) > 0 and float(r["flops_predicted"]) > 0
        assert not r["model_note"], r["model_note"]
    assert {r["dtype"] for r in bf16} == {"bf16"}


@pytest.mark.slow
def test_sgd_steps_give_the_same_losses_in_both_frameworks_on_one_device_and_on_two(tmp_path):
    """Three SGD steps from the same weights and batches, on one device and split over two (ddp and fsdp,
    batch_size per device): one loss curve for all ten trials (as test_opt_trainers.py's for OPT)."""
    common = ["model=llama_tiny", "mode=backprop", "steps=3"]
    common += ["warmup_steps=1", "seq_len=32", "logger=none", "device=cpu"]
    one, two = ["batch_size=8"], ["parallel=ddp,fsdp", "devices=2", "batch_size=4"]
    folders = {name: tmp_path / name for name in ("here", "torch_two", "jax_one", "jax_two")}
    finish = [
        start_ranks(2, {folders["torch_two"]: [*common, "framework=torch", *two]}),
        start_ranks(1, {folders["jax_one"]: [*common, "framework=jax", "parallel=ddp,fsdp", *one]}),
        start_ranks(1, {folders["jax_two"]: [*common, "framework=jax", *two]}),
    ]
    try:
        run_here("-m", *common, "framework=torch,jax", "parallel=none", *one, results=folders["here"])
        run_here("-m", *common, "framework=torch", "parallel=ddp,fsdp", *one, results=folders["here"])
    finally:
        for f in finish:
            f()
    rows = {folder: recorded(folder) for folder in folders.values()}
    assert [len(r) for r in rows.values()] == [4, 2, 2, 2]
    assert {r["status"] for rs in rows.values() for r in rs} == {"ok"}, [
        r.get("error") for rs in rows.values() for r in rs
    ]
    history = lambda folder, r: json.loads((folder / "history" / f"{r['run_id']}.json").read_text())["loss"]
    curves = [history(folder, r) for folder, rs in rows.items() for r in rs]
    assert len(curves[0]) == 3 and len(set(curves[0])) > 1  # three steps that move the loss
    for curve in curves[1:]:
        np.testing.assert_allclose(curve, curves[0], rtol=2e-6)
