"""OPT through the registry: the trainers of both frameworks build it from model.family=opt and compute the same
thing from the same weights and batch (CPU, OPT's architecture at the tiny size, fp32, dropout off):
- backprop, jvp along a given tangent, MeZO along a given direction and jacfwd over the head give the same loss and
  gradient (or estimate) in torch and JAX;
- a batch padded with OPT's pad id reaches the model with its inputs only (no token_type_ids);
- the FLOP model predicts what each framework's counter counts;
- a trial of every way of differentiating runs end to end and its row is ok, with both models' predictions;
- SGD steps give one loss curve in both frameworks, on one device and on two (ddp, fsdp);
- what OPT cannot run yet is refused in one line before anything starts.
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
from bench.store.read import read_rows
from bench.weights import build_weights
from tests.support import FAST, bench, bench_here, run_here, start_ranks
from tests.support import rows as recorded

FRAMEWORKS = ("torch", "jax")
SPEC, _ = model_preset("opt_tiny", dropout=0.0)
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
        return {n: g.detach().numpy().copy() for n, g in grads.items()}
    return trainer.family.to_hf(grads)


def tangent_for(framework, trainer, arrays):
    if framework == "torch":
        return {n: torch.from_numpy(arrays[n].copy()) for n in trainer.params}
    return trainer.family.from_hf(trainer.params, arrays)


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


def trained(trainer, framework) -> set[str]:
    if framework == "torch":
        return {trainer.family.hf_name(n) for n in trainer.params}
    return set(trainer.family.to_hf(trainer.params))


def assert_same(out, rtol=1e-4):
    (lt, gt), (lj, gj) = out["torch"], out["jax"]
    assert lj == pytest.approx(lt, rel=1e-5)
    assert gt.keys() == gj.keys()
    scale = max(float(np.abs(x).max()) for x in gt.values())
    for n in gt:
        np.testing.assert_allclose(gj[n], gt[n], rtol=rtol, atol=rtol * scale, err_msg=n)


def test_the_registry_builds_opt_in_both_frameworks_with_its_own_inputs():
    assert models.of(SPEC).NAME == "opt"
    for fw in FRAMEWORKS:
        t = make(fw, "inference")
        (batch,) = t.to_device(batches())
        assert set(batch) == {"input_ids", "attention_mask", "labels"}  # OPT reads no segments
        assert t.n_params == models.of(SPEC).count_params(SPEC)
        assert t.weights().keys() == WEIGHTS.keys()


@pytest.mark.slow
@pytest.mark.parametrize("trainable", ["all", "bias"])
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
@pytest.mark.parametrize(
    ("mode", "kw"),
    [
        ("inference", {}),
        ("backprop", {}),
        ("backprop", {"trainable": "bias"}),
        ("jvp", {}),
        ("mezo", {}),
        ("jacfwd", {"trainable": "classifier", "settings": JacfwdSettings(chunk=64)}),
    ],
    ids=["inference", "backprop", "backprop-bias", "jvp", "mezo", "jacfwd-classifier"],
)
@pytest.mark.parametrize("framework", FRAMEWORKS)
def test_the_flop_model_predicts_the_counted_flops_of_opt(framework, mode, kw):
    """OPT's matmuls (bench/models/opt.py) as each framework's counter counts them: torch's FlopCounterMode, XLA's
    dots; HF's torch model scores every token, JAX's the one it reads."""
    t = make(framework, mode, **kw)
    (batch,) = batches()
    counted = importlib.import_module(f"bench.{framework}_impl.flops").count(t, t.to_device([batch]))
    expected = predict_flops(SPEC, t.spec, *batch["input_ids"].shape, framework=framework).total
    assert counted["flops_per_step"] == pytest.approx(expected, rel=1e-9)


@pytest.mark.slow
def test_every_way_of_differentiating_runs_on_opt_with_both_models_predictions(tmp_path):
    """Each trial measured and recorded by the runner, in this process (run_here): what is tested is OPT in every
    way of differentiating and its row, not the trial's process (tests/harness/test_runner.py's)."""
    outcomes = run_here(
        "-m",
        "framework=torch,jax",
        "case=inference,backprop,jvp,jacfwd_head,mezo,hizoo,lozo",
        *FAST,
        "model=opt_tiny",  # after FAST's model: the last one given wins
        "logger=none",
        results=tmp_path,
    )
    rows = recorded(tmp_path)
    assert len(outcomes) == len(rows) == 14 and {r["status"] for r in rows} == {"ok"}, [r.get("error") for r in rows]
    for r in rows:
        assert r["model"] == "opt_tiny" and float(r["mem_predicted_mb"]) > 0 and float(r["flops_predicted"]) > 0
        assert not r["model_note"], r["model_note"]


@pytest.mark.slow
def test_bf16_capacity_and_cost_to_target_run_on_opt(tmp_path):
    """OPT as BERT, in what a user runs beside the modes: mixed bf16 in both frameworks (its memory breakdown and the
    model's prediction recorded, the report's memory section over them), a trial priced to a target, and a capacity
    search whose probes are OPT trials in processes of their own."""
    opt = [*FAST, "model=opt_tiny", "logger=none"]  # after FAST's model: the last one given wins
    run_here("-m", "framework=torch,jax", "case=backprop,jvp", "dtype=bf16", *opt, results=tmp_path / "bf16")
    bf16 = recorded(tmp_path / "bf16")
    assert len(bf16) == 4 and {(r["status"], r["dtype"], r["model"]) for r in bf16} == {("ok", "bf16", "opt_tiny")}
    for r in bf16:
        assert float(r["mem_predicted_mb"]) > 0 and r["mem_breakdown_method"], r
    report = bench_here("report", str(tmp_path / "bf16"), "--out", str(tmp_path / "report"))
    assert report.returncode == 0, report.stderr
    memory = (tmp_path / "report" / "report.md").read_text().split("## Memory, explained", 1)[1].split("\n## ", 1)[0]
    assert "opt_tiny" in memory and "| torch | backprop |" in memory and "| jax | jvp |" in memory

    target = ["target.metric=eval_loss", "target.value=100", "target.max_steps=21", "evaluate=true", "eval_every=2"]
    (outcome,) = run_here(*opt, "mode=backprop", *target, results=tmp_path / "cost")
    (row,) = recorded(tmp_path / "cost")
    assert outcome["status"] == "ok" and row["target_status"] == "reached" and row["steps_to_target"] == "3"

    searched = [a for a in opt if not a.startswith("batch_size=")]  # what the search varies
    bench("capacity", "budget_mb=100000", "--max-probes", "3", "framework=torch", "mode=backprop", *searched,
          results=tmp_path / "capacity")  # fmt: skip
    (search,) = read_rows(tmp_path / "capacity" / "capacity.csv")
    assert search["model"] == "opt_tiny" and search["probes"] == "3", search
    assert {r["status"] for r in recorded(tmp_path / "capacity")} == {"ok"}


@pytest.mark.slow
def test_sgd_steps_give_the_same_losses_in_both_frameworks_on_one_device_and_on_two(tmp_path):
    """Three SGD steps from the same weights and batches (dropout off), on one device and split over two (ddp and
    fsdp, batch_size per device): one loss curve for all ten trials. JAX's trials under a strategy run in a process
    of their own that fixes its device count (start_ranks), as do torch's two gloo ranks; the rest in this process
    meanwhile. `python -m bench ... devices=2` itself is tests/frameworks/test_parallel_*.py's."""
    common = ["model=opt_tiny", "model.dropout=0", "mode=backprop", "steps=3"]
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
    assert {r["status"] for rs in rows.values() for r in rs} == {"ok"}
    assert sorted((r["framework"], r["parallel"], r["world_size"]) for rs in rows.values() for r in rs) == sorted(
        [(fw, "none", "1") for fw in FRAMEWORKS]
        + [(fw, p, w) for fw in FRAMEWORKS for p in ("ddp", "fsdp") for w in ("1", "2")]
    )
    history = lambda folder, r: json.loads((folder / "history" / f"{r['run_id']}.json").read_text())["loss"]
    curves = [history(folder, r) for folder, rs in rows.items() for r in rs]
    for curve in curves[1:]:
        np.testing.assert_allclose(curve, curves[0], rtol=2e-6)


def test_an_unknown_family_is_refused_in_one_line(tmp_path):
    args, expected = ["model.family=gpt"], f"model.family=gpt: accepted {' | '.join(models.FAMILIES)}"
    proc = bench_here("model=opt_tiny", *args, results=tmp_path)
    assert proc.returncode == 2 and proc.stderr.count("\n") == 1 and expected in proc.stderr, proc.stderr
    assert not (tmp_path / "runs.csv").exists()
