"""The ways of differentiating as plug-ins (bench/estimators/): each module is found by its name, declares what the
harness and the models read, and a mode no model has a term for is measured anyway."""

from __future__ import annotations

import pathlib
import re

import pytest

from bench import estimators, plugins
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
    assert sorted(builtin()) == modules
    roles = (estimators.BASELINE, estimators.EXACT, estimators.FORWARD_GRADIENT, estimators.EXACT_FORWARD)
    assert estimators.names()[:5] == (*roles, estimators.ZEROTH_ORDER)  # the reports' order: by rank
    ranks = [estimators.get(n).rank for n in estimators.names() if estimators.get(n).rank is not None]
    assert ranks == sorted(set(ranks))  # no two share a rank: the order is each module's, never a tie's
    for name in estimators.names():
        e = estimators.get(name)
        assert isinstance(e, Estimator) and e.name == name and e.label and e.summary and e.passes, name
        assert e.compared_with in (None, *estimators.names()), name
    with pytest.raises(ValueError, match="^mode=nesterov: accepted " + re.escape(" | ".join(roles))):
        estimators.get("nesterov")


def builtin() -> list[str]:
    """The estimators this package holds itself (an installed plug-in's are checked by the contracts, not pinned)."""
    return [n for n in estimators.names() if estimators.found()[n].package == plugins.BUILTIN]


def test_what_each_estimator_declares_is_what_its_trainers_do():
    # autograd records a graph for a backward pass only (the naive jvp records one it never runs); remat is a
    # backward pass's; only what takes no optimizer step is the baseline
    for n in estimators.names():
        e = estimators.get(n)
        assert e.records_graph(StepSpec(mode=n)) == e.backward and (e.backward or not e.remat), n
    assert estimators.get("jvp").records_graph(StepSpec(mode="jvp", settings=JvpSettings(impl="naive")))
    assert [n for n in builtin() if estimators.get(n).backward] == [estimators.EXACT]
    assert [n for n in builtin() if estimators.get(n).remat] == [estimators.EXACT]
    assert [n for n in builtin() if not estimators.get(n).updates] == [estimators.BASELINE]
    exact_and_forward = [estimators.EXACT, estimators.FORWARD_GRADIENT, estimators.EXACT_FORWARD]
    assert [n for n in builtin() if estimators.get(n).dropout] == exact_and_forward
    assert [n for n in builtin() if not estimators.get(n).compiles] == exact_and_forward[1:]  # torch.func's
    refused = {
        (n, fw, p)
        for n in builtin()
        for fw in ("torch", "jax")
        for p in ("ddp", "fsdp")
        if estimators.get(n).refuses(TrialContext(StepSpec(mode=n), fw, p, n=1000))
    }
    # jacfwd's torch gradient needs the basis whole on a device; HiZOO's Hessian and LOZO's U V^T are drawn whole;
    # torch's jvp under FSDP2 only with the tangent attached module by module (jvp.impl=lazy)
    whole = {(n, fw, "fsdp") for n in ("hizoo", "lozo") for fw in ("torch", "jax")}
    assert refused == {
        (estimators.EXACT_FORWARD, "torch", "fsdp"),
        (estimators.FORWARD_GRADIENT, "torch", "fsdp"),
        *whole,
    }
    lazy = StepSpec(mode="jvp", settings=JvpSettings(impl="lazy"))
    assert estimators.get("jvp").refuses(TrialContext(lazy, "torch", "fsdp", n=1000)) is None
    # the in-place round trips refuse bf16 parameters: the zeroth-order family's, read against the forward passes
    pure = {n for n in builtin() if estimators.get(n).refuses(pure_bf16(n))}
    assert pure == {n for n in builtin() if estimators.get(n).compared_with == estimators.BASELINE}
    assert estimators.ZEROTH_ORDER in pure
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


@pytest.mark.slow
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
