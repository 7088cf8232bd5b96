"""trainable=lora: the same adapters in both frameworks (HF PEFT in torch, Flax's nnx.LoRA in JAX).

- the adapters load and export exactly, under the shared names, in both frameworks; drawn adapters (B = 0)
  leave the model exactly its base;
- with B != 0 the two frameworks compute the same logits, loss and adapter gradients (tiny BERT, fp32,
  dropout off), for the LoRA paper's targets and for all six linear layers;
- jacfwd is backprop's gradient over the adapters, remat is backprop; every mode's step changes the adapters and
  the classifier and nothing else;
- the memory and FLOP models count the adapters.
"""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from bench.config import model_preset
from bench.jax_impl.models import bert as jax_bert
from bench.jax_impl.models.bert import build_model as jax_build_model
from bench.measure import flop_model, memory_model
from bench.models import adapter_weights
from bench.models.bert import LORA_TARGETS, count_params, is_trainable, lora_shapes, param_shapes
from bench.spec import FRAMEWORKS, LoraSpec, OptimizerSpec, StepSpec, implementation
from bench.torch_impl.models import bert as torch_bert
from bench.weights import build_weights
from tests.frameworks.test_steps import BATCH, as_hf, params_hf
from tests.support import FAST, rows, run_here, start_ranks, trained_adapters

SPEC, _ = model_preset("tiny", dropout=0.0)
BASE = build_weights(SPEC, 0)
QV = LoraSpec(rank=4, alpha=8.0)  # the LoRA paper's targets, query and value
ALL = LoraSpec(rank=2, alpha=3.0, targets=LORA_TARGETS)
ALL_2 = LoraSpec(rank=2, targets=LORA_TARGETS)  # as lora.rank=2 lora.targets=all_linear name it


pytestmark = pytest.mark.usefixtures("fp32_pinned")  # tests/frameworks/conftest.py


def make(framework, mode="backprop", lora=QV, weights=None, **kw):
    kw.setdefault("optimizer", OptimizerSpec(name="sgd", lr=1e-2))
    step = StepSpec(mode=mode, trainable="lora", lora=lora, **kw)
    weights = {**BASE, **trained_adapters(SPEC, lora)} if weights is None else weights
    return implementation(framework, "steps").make_trainer(SPEC, weights, step, "cpu")


def test_adapter_names_shapes_and_counts():
    shapes = lora_shapes(SPEC, QV)
    H, L, r = SPEC.hidden_size, SPEC.num_layers, QV.rank
    assert len(shapes) == 2 * 2 * L  # A and B of query and value in every layer
    assert shapes["bert.encoder.layer.0.attention.self.query.lora_A.weight"] == (r, H)
    assert shapes[f"bert.encoder.layer.{L - 1}.attention.self.value.lora_B.weight"] == (H, r)
    every = lora_shapes(SPEC, ALL)
    assert every["bert.encoder.layer.0.intermediate.dense.lora_B.weight"] == (SPEC.intermediate_size, ALL.rank)
    assert every["bert.encoder.layer.0.output.dense.lora_A.weight"] == (ALL.rank, SPEC.intermediate_size)
    classifier = SPEC.num_labels * (H + 1)
    assert count_params(SPEC, "lora", lora=QV) == 2 * L * (r * H + H * r) + classifier
    # under lora: every adapter, and of the model's own parameters the classifier alone
    assert all(is_trainable(n, "lora", L) for n in shapes)
    assert [n for n in param_shapes(SPEC) if is_trainable(n, "lora", L)] == ["classifier.weight", "classifier.bias"]


@pytest.mark.parametrize("lora", [QV, ALL], ids=["query_value", "all_linear"])
def test_adapters_load_and_export_exactly_in_both_frameworks(lora):
    weights = {**BASE, **trained_adapters(SPEC, lora)}
    tm = torch_bert.build_model(SPEC, weights, lora=lora)
    jm = jax_build_model(SPEC, weights, lora=lora)
    for exported in (torch_bert.export_weights(tm), jax_bert.export_weights(jm)):
        assert sorted(exported) == sorted(param_shapes(SPEC, lora))
        for k, v in weights.items():
            assert exported[k].tobytes() == v.tobytes(), k
    # torch's own names are PEFT's; hf_name reads them
    names = [n for n, _ in tm.named_parameters()]
    assert "bert.encoder.layer.0.attention.self.query.lora_A.default.weight" in names
    assert "bert.encoder.layer.0.attention.self.query.base_layer.weight" in names
    assert sorted(torch_bert.hf_name(n) for n in names) == sorted(param_shapes(SPEC, lora))


@pytest.mark.slow
def test_drawn_adapters_leave_the_model_its_base():
    """PEFT's initialisation, drawn once for both: B = 0, so the logits are the base model's, bit for bit."""
    batch = {k: v for k, v in BATCH[0].items() if k != "labels"}
    t_in = {k: torch.tensor(v, dtype=torch.long) for k, v in batch.items()}
    base_t = torch_bert.build_model(SPEC, BASE).eval()(**t_in).logits
    lora_t = torch_bert.build_model(SPEC, BASE, lora=QV, seed=3).eval()(**t_in).logits
    assert torch.equal(base_t, lora_t)
    base_j = jax_build_model(SPEC, BASE)(**batch)
    lora_j = jax_build_model(SPEC, BASE, lora=QV, seed=3)(**batch)
    np.testing.assert_array_equal(np.asarray(base_j), np.asarray(lora_j))
    a = adapter_weights(SPEC, QV, 3)["bert.encoder.layer.0.attention.self.query.lora_A.weight"]
    assert 0 < np.abs(a).max() <= 1 / np.sqrt(SPEC.hidden_size)  # kaiming_uniform(a=sqrt(5)): U(+-1/sqrt(in))


@pytest.mark.slow
@pytest.mark.parametrize("lora", [QV, ALL], ids=["query_value", "all_linear"])
def test_same_loss_and_adapter_gradients_in_torch_and_jax(lora):
    results = {}
    for fw in FRAMEWORKS:
        t = make(fw, lora=lora)
        assert t.n_trainable == count_params(SPEC, "lora", lora=lora)
        loss, grads = t.gradient(t.to_device(BATCH))
        results[fw] = float(loss), {torch_bert.hf_name(k): v for k, v in as_hf(fw, grads).items()}
    (lt, gt), (lj, gj) = results["torch"], results["jax"]
    assert abs(lt - lj) < 1e-6
    assert sorted(gt) == sorted(gj) == sorted(n for n in param_shapes(SPEC, lora) if is_trainable(n, "lora", 2))
    for k in gt:
        assert np.abs(gt[k]).max() > 0, f"{k}: zero gradient (B != 0 makes every adapter gradient nonzero)"
        np.testing.assert_allclose(gt[k], gj[k], atol=1e-6, rtol=1e-4, err_msg=k)


@pytest.mark.slow
@pytest.mark.parametrize("framework", FRAMEWORKS)
def test_jacfwd_and_remat_give_backprop_gradient_on_the_adapters(framework):
    small = LoraSpec(rank=1, alpha=2.0, targets=("query", "output.dense"))  # an attention and an FFN adapter

    def grads(mode, **kw):
        t = make(framework, mode, lora=small, **kw)
        return as_hf(framework, t.gradient(t.to_device(BATCH))[1])

    exact = grads("backprop")
    for other in (grads("jacfwd"), grads("backprop", remat=True)):
        assert sorted(other) == sorted(exact)
        for k in exact:
            np.testing.assert_allclose(other[k], exact[k], atol=1e-6, rtol=1e-4, err_msg=k)


@pytest.mark.slow
@pytest.mark.parametrize("framework", FRAMEWORKS)
@pytest.mark.parametrize("mode", ["backprop", "jvp", "mezo"])
def test_steps_train_the_adapters_and_classifier_only(framework, mode):
    t = make(framework, mode)
    before = t.weights()
    trained_before = params_hf(framework, t)
    for _ in range(2):
        t.step(t.to_device(BATCH))
    after = t.weights()
    assert sorted(after) == sorted(before)
    changed = {k for k in before if not np.array_equal(before[k], after[k])}
    trainable = {k for k in before if is_trainable(k, "lora", SPEC.num_layers)}
    assert changed and changed <= trainable, sorted(changed - trainable)
    assert len(trained_before) == len(trainable)


@pytest.mark.slow
@pytest.mark.parametrize("framework", FRAMEWORKS)
def test_bf16_lora_step_runs_close_to_fp32(framework):
    losses = {}
    for dtype in ("fp32", "bf16"):
        t = make(framework, "backprop", dtype=dtype)
        losses[dtype] = float(t.step(t.to_device(BATCH)))
    assert abs(losses["bf16"] - losses["fp32"]) < 0.05 * abs(losses["fp32"])


def test_memory_and_flop_models_count_the_adapters():
    kw = dict(batch_size=8, seq_len=128, framework="torch")
    full = memory_model.predict(SPEC, StepSpec(mode="backprop"), **kw)
    lora = memory_model.predict(SPEC, StepSpec(mode="backprop", trainable="lora", lora=QV), **kw)
    n = count_params(SPEC, "lora", lora=QV)
    assert lora.grads == 4 * n  # fp32 gradients of the adapters and the classifier, nothing else
    assert lora.params == 4 * (count_params(SPEC) + sum(np.prod(s) for s in lora_shapes(SPEC, QV).values()))
    assert 0 < lora.saved < full.saved  # frozen weights' inputs are not saved; the adapters' are
    f_full = flop_model.predict(SPEC, StepSpec(mode="backprop"), 8, 128)
    f_lora = flop_model.predict(SPEC, StepSpec(mode="backprop", trainable="lora", lora=QV), 8, 128)
    f_inf = flop_model.predict(SPEC, StepSpec(mode="inference", trainable="lora", lora=QV), 8, 128)
    base_inf = flop_model.predict(SPEC, StepSpec(mode="inference"), 8, 128)
    assert f_inf.forward > base_inf.forward  # the adapters' own matmuls
    assert f_inf.forward < f_lora.total < f_full.total  # no weight gradients of the frozen matmuls


@pytest.mark.slow
@pytest.mark.parametrize("framework", FRAMEWORKS)
def test_two_devices_train_the_adapters_as_one_device_with_the_global_batch(tmp_path, framework):
    """trainable=lora under fsdp (torch.distributed's FSDP2 over gloo; a JAX mesh of two CPU devices, parameters
    sharded) takes one device's steps on the global batch: the same losses, step by step. The two-device trials run
    in processes of their own (start_ranks: JAX fixes its device count when it starts, torch's ranks are processes);
    `python -m bench ... parallel=fsdp devices=2` itself is tests/frameworks/test_parallel_*.py's."""
    common = [
        *FAST,
        f"framework={framework}",
        "device=cpu",
        "model.dropout=0",
        "optimizer=adamw",
        "optimizer.lr=1e-3",
        "trainable=lora",
        "lora.rank=2",
        "lora.targets=all_linear",
        "logger=none",
    ]
    common += ["jvp.impl=lazy"] if framework == "torch" else []  # FSDP2's jvp: the tangent module by module
    ranks = 2 if framework == "torch" else 1
    finish = start_ranks(ranks, {tmp_path / "two": ["mode=backprop,jvp,mezo", *common, "parallel=fsdp", "devices=2"]})
    try:  # meanwhile the one-device reference in this process: what is compared is its losses, not its process
        run_here("-m", "mode=backprop,jvp,mezo", *common, "batch_size=8", results=tmp_path / "one")
    finally:
        finish()
    curve = lambda folder, r: json.loads((folder / "history" / f"{r['run_id']}.json").read_text())["loss"]
    one = {r["mode"]: curve(tmp_path / "one", r) for r in rows(tmp_path / "one")}
    two = rows(tmp_path / "two")
    assert len(two) == 3 and all(r["status"] == "ok" for r in two), [(r["mode"], r["error"]) for r in two]
    for r in two:
        assert r["lora_rank"] == "2" and int(r["n_trainable"]) == count_params(SPEC, "lora", lora=ALL_2)
        assert curve(tmp_path / "two", r) == pytest.approx(one[r["mode"]], rel=1e-5), (r["parallel"], r["mode"])
