"""FLOPs as each framework counts them (bench/<framework>_impl/flops.py) against the model on paper
(bench/measure/flop_model.py), mode by mode, and the matmul probe each framework runs. CPU, fp32, a tiny BERT.

Tolerance: none beyond float rounding (rel 1e-9). Both counts are of matmuls alone, as the model's are: torch's
FlopCounterMode counts matmul-like ops only, and jax_impl reads the dots of XLA's optimized programs at their loops'
trip counts rather than taking XLA's cost_analysis (every op, loop bodies once). Both sides are then sums of the
same integer 2 M N K terms, and predict's `framework` states what each runs beyond the maths (torch's zero
tangents, XLA's hoisted primal). The one exception is JAX's remat, held to an interval (see there).
"""

from __future__ import annotations

import importlib
import math

import jax
import jax.numpy as jnp
import pytest

from bench import data
from bench.config import model_preset
from bench.estimators.jacfwd import JacfwdSettings
from bench.estimators.jvp import JvpSettings
from bench.measure.flop_model import predict
from bench.spec import FRAMEWORKS, StepSpec, implementation
from bench.weights import build_weights

# hidden 64 (4 heads), intermediate 256, 2 layers, B=4, T=32: matmuls are most of the arithmetic (XLA's count of
# every op is 1.19x the dots' at inference), and each JAX program compiles in seconds. Dropout off: it changes no
# matmul, and its random bits double XLA's compile time.
SPEC, _ = model_preset("tiny", hidden_size=64, intermediate_size=256, dropout=0.0)
WEIGHTS = build_weights(SPEC, 0)
B, T = 4, 32
BATCHES = data.make_batches(data.data_spec(num_train=64, num_eval=16), B, T, 0, "train", epochs=4)[:2]
KEYS = {"flops_per_step", "flops_method", "flops_all_ops_per_step", "flops_uncounted"}
METHODS = {"torch": "torch.utils.flop_counter", "jax": "xla.hlo_dots"}

CASES = [
    ("inference", {}),
    ("backprop", {}),
    ("backprop", {"remat": True}),
    ("backprop", {"trainable": "bias"}),  # input gradients through every layer, no weight gradient below the head
    ("jvp", {}),
    (
        "jvp",
        {"settings": JvpSettings(num_tangents=2), "trainable": "bias"},
    ),  # torch's zero tangents; XLA's primal out of the loop
    (
        "jacfwd",
        {"trainable": "classifier", "settings": JacfwdSettings(chunk=64)},
    ),  # 260 directions: 4 chunks and a remainder
    ("jacfwd", {"trainable": "head", "settings": JacfwdSettings(chunk=1024)}),  # 4420 directions
    ("mezo", {"grad_accum": 2}),  # JAX: perturbation and loss programs run 3 and 2 times per micro-batch
]


def flops(framework: str):
    return importlib.import_module(f"bench.{framework}_impl.flops")


def case_id(case) -> str:
    mode, kw = case
    return mode + "".join(f"-{k}={v}" for k, v in kw.items())


@pytest.mark.slow
@pytest.mark.parametrize("case", CASES, ids=case_id)
@pytest.mark.parametrize("framework", FRAMEWORKS)
def test_counted_flops_are_the_models(framework, case):
    mode, kw = case
    s = StepSpec(mode=mode, **kw)
    trainer = implementation(framework, "steps").make_trainer(SPEC, WEIGHTS, s, "cpu")
    counted = flops(framework).count(trainer, trainer.to_device(BATCHES[: s.grad_accum]))
    assert set(counted) == KEYS
    assert counted["flops_method"] == METHODS[framework]
    assert counted["flops_uncounted"] == ""
    expected = predict(SPEC, trainer.spec, B, T, framework=framework).total
    if framework == "jax" and s.remat:
        # XLA:CPU merges the recomputed query, key and value projections with the forward's (same input, same
        # weights): up to 3 x 2 BT H^2 per layer fewer than the model's recomputation (measured: exactly that)
        merged = 3 * 2 * B * T * SPEC.hidden_size**2 * SPEC.num_layers
        assert expected - merged <= counted["flops_per_step"] <= expected
    else:
        assert counted["flops_per_step"] == pytest.approx(expected, rel=1e-9)


@pytest.mark.slow
def test_xla_counts_every_op_and_each_loop_once():
    """XLA's own number beside the dots': above them where no loop hides work (the elementwise ops of unrolled
    layers), and below the step's dots where a loop repeats them (scanned layers, jvp's two tangents: a loop's body
    counted once)."""
    jf = flops("jax")
    make = implementation("jax", "steps").make_trainer
    scanned = make(SPEC, WEIGHTS, StepSpec(mode="inference"), "cpu")
    trainer = make(SPEC, WEIGHTS, StepSpec(mode="inference", scan_layers=False), "cpu")
    batches = trainer.to_device(BATCHES[:1])
    counted = jf.count(trainer, batches)
    assert 1.0 < counted["flops_all_ops_per_step"] / counted["flops_per_step"] < 1.5  # measured 1.19
    in_scan = jf.count(scanned, batches)
    assert in_scan["flops_per_step"] == counted["flops_per_step"]  # the scan's body at its trip count
    assert in_scan["flops_all_ops_per_step"] < in_scan["flops_per_step"]  # XLA's: the body once (measured 0.60)
    assert jf.count(trainer, batches) == counted  # the programs compiled once are read again, nothing rerun
    text = "\n".join(c.as_text() for c, _ in trainer.programs())
    assert jf.hlo_matmul_flops(text) == (counted["flops_per_step"], 0)


def test_loops_count_at_their_trip_counts():
    jf = flops("jax")
    x = jnp.ones((64, 64))
    loop = jax.jit(lambda x: jax.lax.fori_loop(0, 5, lambda i, c: c @ x, x)).lower(x).compile()
    assert jf.hlo_matmul_flops(loop.as_text()) == (5 * 2 * 64**3, 0)
    assert jf.cost_flops(loop) < 2 * 2 * 64**3  # XLA's cost_analysis: the body once


# XLA:GPU wraps a step's kernels into command buffers: a `call` whose computation holds the cuBLAS GEMMs (and a
# reduction's combiner is a to_apply too, holding no matmul). Hand-written, as a CPU compile never makes one.
COMMAND_BUFFER_HLO = """\
HloModule step

%add (a: f32[], b: f32[]) -> f32[] {
  %a = f32[] parameter(0)
  %b = f32[] parameter(1)
  ROOT %sum = f32[] add(f32[] %a, f32[] %b)
}

%command_buffer (p0: f32[8,16], p1: f32[16,4]) -> f32[8,4] {
  %p0 = f32[8,16]{1,0} parameter(0)
  %p1 = f32[16,4]{1,0} parameter(1)
  ROOT %dot.1 = f32[8,4]{1,0} dot(f32[8,16] %p0, f32[16,4] %p1), lhs_contracting_dims={1}, rhs_contracting_dims={0}
}

ENTRY %main (x: f32[8,16], w: f32[16,4]) -> f32[] {
  %x = f32[8,16]{1,0} parameter(0)
  %w = f32[16,4]{1,0} parameter(1)
  %call = f32[8,4]{1,0} call(f32[8,16]{1,0} %x, f32[16,4]{1,0} %w), to_apply=%command_buffer
  %zero = f32[] constant(0)
  ROOT %total = f32[] reduce(f32[8,4]{1,0} %call, f32[] %zero), dimensions={0,1}, to_apply=%add
}
"""


def test_matmuls_inside_a_command_buffer_count():
    assert flops("jax").hlo_matmul_flops(COMMAND_BUFFER_HLO) == (2 * 8 * 4 * 16, 0)


@pytest.mark.parametrize("dtype", ["fp32", "bf16"])
@pytest.mark.parametrize("framework", FRAMEWORKS)
def test_matmul_peak(framework, dtype):
    peak = flops(framework).matmul_peak("cpu", dtype)
    # between 0.1 GFLOP/s (torch's bf16 matmul on a 2-core CPU without bf16 units: ~1.4) and 100 TFLOP/s (no CPU)
    assert math.isfinite(peak) and 1e8 < peak < 1e14
