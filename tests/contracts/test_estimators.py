"""The ways of differentiating as plug-ins (bench/estimators/): each module is found by its name, declares what the
harness and the models read, and a mode no model has a term for is measured anyway."""

from __future__ import annotations

import pathlib

import pytest

from bench import estimators
from bench.config import model_preset
from bench.estimators.base import Estimator, TrialContext
from bench.estimators.inference import Inference
from bench.estimators.jvp import JvpSettings
from bench.measure import flop_model, memory_model
from bench.scenarios.model.select import variant
from bench.spec import StepSpec
from tests.support import FAST, REPO, rows, run_here

TINY, _ = model_preset("tiny")


def test_every_module_is_an_estimator_found_by_its_name():
    modules = sorted(p.stem for p in (REPO / "bench" / "estimators").glob("*.py") if p.stem not in ("__init__", "base"))
    assert sorted(estimators.names()) == modules
    assert estimators.names()[:5] == ("inference", "backprop", "jvp", "jacfwd", "mezo")  # the reports' order
    for name in modules:
        e = estimators.get(name)
        assert isinstance(e, Estimator) and e.name == name and e.label and e.summary and e.passes, name
    with pytest.raises(ValueError, match=r"^mode=nesterov: accepted inference \| backprop \| jvp"):
        estimators.get("nesterov")


def test_what_each_estimator_declares_is_what_its_trainers_do():
    # autograd records a graph only for a backward pass, or the naive jvp that records one never run
    records = {n: estimators.get(n).records_graph(StepSpec(mode=n)) for n in estimators.names()}
    assert [n for n, graph in records.items() if graph] == ["backprop"]
    assert estimators.get("jvp").records_graph(StepSpec(mode="jvp", settings=JvpSettings(impl="naive")))
    assert [n for n in estimators.names() if estimators.get(n).dropout] == ["backprop", "jvp", "jacfwd"]
    assert [n for n in estimators.names() if not estimators.get(n).updates] == ["inference"]
    refused = {
        (n, fw, p)
        for n in estimators.names()
        for fw in ("torch", "jax")
        for p in ("ddp", "fsdp")
        if estimators.get(n).refuses(TrialContext(StepSpec(mode=n), fw, p, n=1000))
    }
    # jacfwd's torch gradient needs the basis whole on a device; HiZOO's Hessian and LOZO's U V^T are drawn whole;
    # torch's jvp under FSDP2 only with the tangent attached module by module (jvp.impl=lazy)
    whole = {(n, fw, "fsdp") for n in ("hizoo", "lozo") for fw in ("torch", "jax")}
    assert refused == {("jacfwd", "torch", "fsdp"), ("jvp", "torch", "fsdp"), *whole}
    lazy = StepSpec(mode="jvp", settings=JvpSettings(impl="lazy"))
    assert estimators.get("jvp").refuses(TrialContext(lazy, "torch", "fsdp", n=1000)) is None
    # what the remat=, compile= and dtype= checks read; the in-place round trips refuse bf16 parameters
    assert [n for n in estimators.names() if estimators.get(n).remat] == ["backprop"]
    assert [n for n in estimators.names() if not estimators.get(n).compiles] == ["jvp", "jacfwd"]
    pure = {n for n in estimators.names() if estimators.get(n).refuses(pure_bf16(n))}
    assert pure == {"mezo", "hizoo", "lozo"}
    # jacfwd's pass per parameter, refused past jacfwd.max_params
    big = TrialContext(StepSpec(mode="jacfwd"), "torch", "none", n=2_000_001)
    assert "2,000,001 trainable parameters" in estimators.get("jacfwd").refuses(big)


def pure_bf16(mode: str) -> TrialContext:
    return TrialContext(StepSpec(mode=mode, dtype="bf16_pure"), "torch", "none", n=1000)


class Unmodelled(Inference):
    """inference as a newcomer would bring it: measured by the trainers, no term in any model."""

    def memory(self, c):
        return None

    def flops(self, c):
        return None

    def comm(self, c):
        return None


def test_a_mode_without_model_terms_is_measured_and_its_model_cells_are_empty(tmp_path, monkeypatch):
    step = StepSpec(mode="inference")
    assert memory_model.predict(TINY, step, 4, 32, framework="torch") is not None
    monkeypatch.setattr(estimators, "get", lambda name: Unmodelled() if name == "inference" else Inference())
    assert memory_model.predict(TINY, step, 4, 32, framework="torch") is None
    assert flop_model.predict(TINY, step, 4, 32) is None
    run_here("-m", "framework=torch,jax", "mode=inference", *FAST, "logger=none", results=tmp_path)
    found = rows(tmp_path)
    assert len(found) == 2
    for r in found:
        assert r["status"] == "ok", r["error"]
        assert float(r["peak_mem_mb"]) > 0 and float(r["step_time_median_s"]) > 0 and float(r["flops_per_step"]) > 0
        assert r["mem_predicted_mb"] == r["mem_predicted_temp_mb"] == r["flops_predicted"] == ""
        assert r["model_note"] == (
            "mode=inference: no term in the memory and FLOP models; those cells are empty, the measurements stand"
        )
        assert r["comm_bytes_expected"] == "0"  # one device exchanges nothing, with or without a model


def test_the_modelled_modes_leave_no_note(tmp_path):
    run_here("framework=jax", "mode=inference", *FAST, "logger=none", results=tmp_path)
    (r,) = rows(tmp_path)
    assert r["status"] == "ok" and r["model_note"] == "" and float(r["mem_predicted_mb"]) > 0


def test_no_mode_name_is_compared_outside_the_estimators_in_the_models():
    """The models read an estimator's terms; a mode's name in them would be a term kept outside its module."""
    for path in ("bench/measure/memory_model.py", "bench/measure/flop_model.py", "bench/parallel.py"):
        text = pathlib.Path(REPO / path).read_text()
        for name in estimators.names():
            assert f'"{name}"' not in text, (path, name)


def test_a_rows_label_names_the_settings_that_change_its_maths():
    """variant(): jvp's K, impl and kept tangent, MeZO's scale off their defaults; jacfwd's chunk, resolved for the
    device in every row (auto is never recorded), names no variant, as make bench's table has always shown it."""
    assert variant({"mode": "jacfwd", "trainable": "head", "jacfwd_chunk": "256"}) == "jacfwd[head]"
    assert variant({"mode": "jvp", "num_tangents": "4", "jvp_impl": "lazy", "jvp_tangent": "keep"}) == (
        "jvp(K=4, keep)[lazy]"
    )
    assert variant({"mode": "mezo", "mezo_eps": "0.0001", "mezo_q": "1"}) == "mezo(eps=0.0001)"
    assert variant({"mode": "hizoo", "directions": "rademacher"}) == "hizoo(rademacher)"  # it draws directions
