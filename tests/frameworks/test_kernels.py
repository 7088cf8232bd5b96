"""The kernels a step launches (bench/<framework>_impl/kernels.py), pinned against the forward passes each estimator
is made of, so that the suite's own work per tensor cannot return unseen; and the counting rules themselves.

The pinned config: the tiny BERT's width at 6 layers, trainable=bias (52 tensors of one dtype), B1 T8, dropout off,
CPU: compute is ~0 and a step is mostly host time per tensor, the issue's host-bound case (docs/time.md). Each
mode's count is held to

    kernels(mode) <= FORWARDS[mode] x kernels(reference) + PER_UNIT x units + PER_STEP

the reference being inference's step, or for torch's jvp its bare forward-mode pass (torch's tangent rules launch
kernels of their own: 6.7 forwards' worth at 2 layers, whatever the suite does). A unit is what one operation can
move at once: in torch a unit of the directions (bench.spec.draw_units: one draw, one foreach operator); in JAX a
parameter buffer (XLA:CPU writes each with a fusion of its own: it fuses no independent outputs side by side, as
XLA:GPU's horizontal fusion does). The trained tensors outnumber the allowance: one kernel more per tensor shows.
"""

from __future__ import annotations

import jax
import pytest
import torch
import torch.nn.functional as F

from bench import data, estimators, plugins
from bench.config import model_preset
from bench.estimators.jacfwd import JacfwdSettings
from bench.jax_impl.kernels import hlo_kernels
from bench.spec import FRAMEWORKS, StepSpec, implementation
from bench.torch_impl.directions import draw_direction
from bench.torch_impl.estimators.jvp import directional_derivative
from bench.torch_impl.kernels import Dispatches
from bench.weights import build_weights

SPEC, _ = model_preset("tiny", dropout=0.0, num_layers=6)
BATCHES = data.make_batches(data.data_spec(num_train=8, num_eval=2), 1, 8, 0, "train", epochs=1)[:3]
# mode -> (its step's settings, the forward passes' worth of kernels it may launch: the issue's bounds)
FORWARDS = {
    "backprop": ({}, 3),  # a forward and a backward, about two forwards' kernels
    "jvp": ({}, 3),  # one forward-mode pass: the primal and its tangent
    "mezo": ({}, 2),  # two forwards, at theta + eps z and theta - eps z
    "hizoo": ({}, 3),  # three: at theta, theta + eps z, theta - eps z
    "lozo": ({}, 2),  # MeZO's two, its directions low-rank
    # the classifier's 132 directions in one chunk: the trunk once, the head's vmapped forward-mode pass
    "jacfwd": ({"trainable": "classifier", "settings": JacfwdSettings(chunk=256)}, 2),
}
# A draw and up to three foreach operations for each of the four passes over the parameters (MeZO's +eps z, -2 eps z,
# +eps z and the update; HiZOO's Hessian estimate's terms; LOZO's factors and their product)
PER_UNIT = 16
PER_STEP = 16  # the step's scalars: the losses, the projected gradient, their copies to the host


def trainer(framework: str, mode: str):
    kw = FORWARDS.get(mode, ({}, 0))[0]
    step = StepSpec(mode=mode, **{"trainable": "bias", **kw})
    t = implementation(framework, "steps").make_trainer(SPEC, build_weights(SPEC, 0), step, "cpu")
    updates = [t.to_device([b]) for b in BATCHES]
    t.compile(updates[0])
    t.sync(t.step(updates[0]))  # the first step: torch's lazy state, JAX's compiled programs run once
    return t, updates


def units(framework: str, t) -> int:
    if framework == "jax":
        return len(jax.tree.leaves(t.params))  # the parameter buffers (with scan_layers, each stacked over layers)
    return len(t.units)


def bare_pass(t, batch) -> int:
    """torch: the kernels of jvp's forward-mode pass alone, on a tangent drawn before it (no draw, no update)."""
    tangent = draw_direction(t.units, 0, 0, 0).tensors
    with Dispatches() as seen:
        directional_derivative(t.module, t.params, batch, tangent, t.estimator.settings_of(t.spec).impl)
    return sum(seen.kernels.values())


# slow: seven trainers a framework (JAX's compiles take tens of seconds on a 2-core CPU, torch's builds seconds)
@pytest.fixture(scope="module", params=[pytest.param(fw, marks=pytest.mark.slow) for fw in FRAMEWORKS])
def counted(request) -> dict:
    """{mode: (count, units)} for inference and every estimator with a bound, one trainer each, shared by the
    module's tests."""
    framework = request.param
    kernels = implementation(framework, "kernels")
    out = {}
    for mode in ("inference", *FORWARDS):
        t, updates = trainer(framework, mode)
        out[mode] = (kernels.count(t, updates[1], step_s=1.0), units(framework, t))
        if (framework, mode) == ("torch", "jvp"):
            out["bare jvp pass"] = bare_pass(t, updates[1][0])
    return {"framework": framework, **out}


def test_every_mode_is_counted_with_its_method(counted):
    fw = counted["framework"]
    for mode in ("inference", *FORWARDS):
        c, _ = counted[mode]
        assert c["kernels_per_step"] > 0 and c["kernels_method"] == implementation(fw, "kernels").METHOD
        assert 0.0 <= c["host_share"] <= 1.0, (mode, c)
        assert c["host_share_method"] == {"torch": "torch_dispatch_op_times", "jax": "jax_profiler_step"}[fw]
        # torch dispatches views and metadata beside its kernels; a compiled program dispatches nothing
        assert (c["no_kernel_dispatches_per_step"] is None) == (fw == "jax")


@pytest.mark.parametrize("mode", list(FORWARDS))
def test_each_estimator_launches_its_forwards_and_a_constant_per_unit(counted, mode):
    fw = counted["framework"]
    c, n = counted[mode]
    forwards, reference = FORWARDS[mode][1], counted["inference"][0]["kernels_per_step"]
    if (fw, mode) == ("torch", "jvp"):
        forwards, reference = 1, counted["bare jvp pass"]
    bound = forwards * reference + PER_UNIT * n + PER_STEP
    assert c["kernels_per_step"] <= bound, (
        f"{fw} {mode}: {c['kernels_per_step']} kernels > {bound} ({forwards} x the reference's {reference} "
        f"+ {PER_UNIT} x {n} units + {PER_STEP}); most launched: {c['kernels_top']}"
    )


@pytest.mark.slow
def test_torch_updates_a_group_of_tensors_in_a_constant_number_of_kernels():
    """backprop's update alone (Trainer.apply of the exact gradient): foreach operators, not one per tensor."""
    t, updates = trainer("torch", "backprop")
    _, grads = t.gradient(updates[1])
    with Dispatches() as seen:
        t.apply(grads)
    assert sum(seen.kernels.values()) <= PER_UNIT * units("torch", t), dict(seen.kernels)


# ---------------------------------------------------------------------------------------------------------------
# the counting rules


@pytest.mark.slow  # the first dispatch mode in a process imports torch._dynamo: seconds
def test_torch_counts_a_composite_operator_as_the_operators_it_runs():
    """Under inference_mode a linear layer reaches the mode whole; counted, it is what autograd would have
    decomposed it into: one addmm (a kernel) and a transpose (a view)."""
    x, w, b = torch.randn(2, 4), torch.randn(3, 4), torch.randn(3)
    seen = {}
    for name, context in (("inference_mode", torch.inference_mode), ("autograd", torch.enable_grad)):
        with context(), Dispatches() as d:
            F.linear(x, w.requires_grad_(name == "autograd"), b).sum()
        seen[name] = (dict(d.kernels), dict(d.empty))
    assert seen["inference_mode"] == seen["autograd"] == ({"aten.addmm": 1, "aten.sum": 1}, {"aten.t": 1})


# A module by hand in XLA's text form: a fusion and a copy in a loop of 3, a loop without a trip count, a small call
# (XLA:CPU's loop in one kernel), a conditional, and the instructions that launch nothing.
HLO = """HloModule m

%fused (p0: f32[4]) -> f32[4] {
  %p0 = f32[4]{0} parameter(0)
  ROOT %add.1 = f32[4]{0} add(%p0, %p0)
}

%body (p: (s32[], f32[4])) -> (s32[], f32[4]) {
  %p = (s32[], f32[4]{0}) parameter(0)
  %i = s32[] get-tuple-element(%p), index=0
  %x = f32[4]{0} get-tuple-element(%p), index=1
  %f = f32[4]{0} fusion(%x), kind=kLoop, calls=%fused
  %c = f32[4]{0} copy(%f)
  ROOT %t = (s32[], f32[4]{0}) tuple(%i, %c)
}

%cond (p.1: (s32[], f32[4])) -> pred[] {
  %p.1 = (s32[], f32[4]{0}) parameter(0)
  %j = s32[] get-tuple-element(%p.1), index=0
  %n = s32[] constant(3)
  ROOT %lt = pred[] compare(%j, %n), direction=LT
}

%small (q: f32[4]) -> f32[4] {
  %q = f32[4]{0} parameter(0)
  ROOT %f.2 = f32[4]{0} fusion(%q), kind=kLoop, calls=%fused
}

%one (r: f32[4]) -> f32[4] {
  %r = f32[4]{0} parameter(0)
  ROOT %f.3 = f32[4]{0} fusion(%r), kind=kLoop, calls=%fused
}

%two (s: f32[4]) -> f32[4] {
  %s = f32[4]{0} parameter(0)
  %f.4 = f32[4]{0} fusion(%s), kind=kLoop, calls=%fused
  ROOT %c.4 = f32[4]{0} copy(%f.4)
}

ENTRY %main (a: f32[4], k: s32[]) -> f32[4] {
  %a = f32[4]{0} parameter(0)
  %k = s32[] parameter(1)
  %zero = s32[] constant(0)
  %t.1 = (s32[], f32[4]{0}) tuple(%zero, %a)
  %w = (s32[], f32[4]{0}) while(%t.1), condition=%cond, body=%body, backend_config={"known_trip_count":{"n":"3"}}
  %w.2 = (s32[], f32[4]{0}) while(%w), condition=%cond, body=%body
  %x.1 = f32[4]{0} get-tuple-element(%w.2), index=1
  %b = f32[4]{0} bitcast(%x.1)
  %s.1 = f32[4]{0} call(%b), to_apply=%small, frontend_attributes={xla_cpu_small_call="true"}
  %ar = f32[4]{0} all-reduce-start(%s.1), to_apply=%fused
  %ard = f32[4]{0} all-reduce-done(%ar)
  ROOT %br = f32[4]{0} conditional(%k, %ard, %ard), branch_computations={%one, %two}
}
"""


def test_jax_counts_each_loop_at_its_trip_count_and_nothing_that_launches_nothing():
    found, unknown = hlo_kernels(HLO)
    # loops: 3 x (fusion, copy) and once more for the loop XLA gave no trip count; one small call; the all-reduce
    # once (its done waits); the conditional's larger branch (fusion, copy)
    assert dict(found) == {"fusion": 3 + 1 + 1, "copy": 3 + 1 + 1, "call": 1, "all-reduce": 1}
    assert unknown == 1


def test_every_estimator_has_a_kernel_bound():
    """A new estimator of this package is pinned too: FORWARDS names every mode but inference, the baseline (an
    installed plug-in's bound is its package's to pin)."""
    builtin = {n for n, p in estimators.found().items() if p.package == plugins.BUILTIN}
    assert set(FORWARDS) == builtin - {estimators.BASELINE}
