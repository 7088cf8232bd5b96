"""FLOPs as JAX counts them, and the matmul peak this host reaches. Mirror of torch_impl/flops.py.

    count(trainer, micro_batches)   matmul FLOPs of one optimizer step, read from the compiled programs
    matmul_peak(device, dtype)      FLOP/s of a square matmul: the host's measured peak, for utilisation

XLA's own count, `compiled.cost_analysis()["flops"]`, is not the number to hold against torch's or the model's:
it counts every op (the elementwise ones, the random bits of dropout and of the directions, the optimizer's update)
where torch's FlopCounterMode counts matmuls only, and it counts the body of a while loop once whatever its trip
count (HloCostAnalysis sees no trip counts: a fori_loop of 5 matmuls counts one), so jvp's K tangents (a fori_loop)
and jacfwd's chunks (lax.map) come out K and n / chunk times too small. `count` therefore reads the optimized HLO
itself: every dot (and, on GPUs, every cuBLAS GEMM custom call) at 2 x output elements x contracted size, times the
runs of the computation holding it (a while body: XLA's known_trip_count annotation), times the program's runs per
step (Trainer.programs). XLA's cost_analysis total is returned beside it, for what it is. In a world of several
devices the programs are the partitioned ones: the count is one device's. On XLA:CPU every mode equals
bench.measure.flop_model.predict(framework="jax") but remat (tests/frameworks/test_flops.py); a GPU's forms (cuBLAS
GEMM custom calls, Triton and cuDNN fusions holding a dot) are read by the same rules but not yet checked on one.
"""

from __future__ import annotations

import math
import re

import jax
import jax.numpy as jnp
import numpy as np

from bench.jax_impl.device import resolve_device
from bench.measure.flop_model import PROBE_SIZES, best_matmul_rate

METHOD = "xla.hlo_dots"


def count(trainer, micro_batches) -> dict:
    """Matmul FLOPs of one optimizer step of `trainer` on these device micro-batches, from the programs the step
    runs (compiled here for these shapes if the trainer has not been); nothing is run. Keys:

    flops_per_step          dot FLOPs of one step, loops at their trip counts (what torch's counter counts)
    flops_method            "xla.hlo_dots"
    flops_all_ops_per_step  XLA's cost_analysis "flops" over the same programs: every op, loop bodies once
    flops_uncounted         what the count leaves out: while loops without a known trip count (counted once)
    """
    if not all(isinstance(c, jax.stages.Compiled) for c, _ in trainer.programs()):
        trainer.compile(micro_batches)
    matmul, every, unknown = 0.0, 0.0, 0
    for compiled, runs in trainer.programs():
        flops, loops = hlo_matmul_flops(compiled.as_text())
        matmul, unknown = matmul + runs * flops, unknown + loops
        every += runs * cost_flops(compiled)
    uncounted = f"{unknown} while loops of unknown trip count, counted once" if unknown else ""
    return {
        "flops_per_step": matmul,
        "flops_method": METHOD,
        "flops_all_ops_per_step": every,
        "flops_uncounted": uncounted,
    }


def cost_flops(compiled) -> float:
    """XLA's "flops" of a compiled program (cost_analysis returns a dict, or on older jax a list of one per
    device program)."""
    cost = compiled.cost_analysis()
    costs = cost if isinstance(cost, (list, tuple)) else [cost]
    return float(sum(c.get("flops", 0.0) for c in costs if c))


# ---------------------------------------------------------------------------------------------------------------
# reading the optimized HLO

_COMPUTATION = re.compile(r"^(?:ENTRY )?%?([\w.\-]+) \(.*\{$")  # "%fused_computation.2 (param_0: f32[2]) -> f32[2] {"
_INSTRUCTION = re.compile(r"^\s*(?:ROOT )?%?([\w.\-]+) = (.*)$")  # "  ROOT %dot.3 = f32[4,4]{1,0} dot(%a, %b), ..."
_ARRAY = re.compile(r"\w+\[([\d,]*)\]")
_OPERAND = re.compile(r"(?:(\w+\[[\d,]*\])\S* )?%([\w.\-]+)")  # "%a", or "f32[4,4]{1,0} %a" where shapes are printed
# What an instruction runs: a fusion's or async op's `calls=`, a while's `body=`, a call's `to_apply=` (XLA:GPU's
# command buffers are calls; a reduction's combiner is a to_apply too, holding no matmul), a conditional's branches,
# a custom call's `called_computations={...}`.
_CALLED = re.compile(r"\b(calls|body|to_apply|true_computation|false_computation)=%?([\w.\-]+)")
_BRANCHES = re.compile(r"(?:branch_computations|called_computations)=\{([^}]*)\}")
_TRIP = re.compile(r'"known_trip_count":\{"n":"(\d+)"\}')
_DOT_DIMS = re.compile(r'lhs_contracting_dims=\{([\d,]*)\}|"lhs_contracting_dimensions":\[([^\]]*)\]')
_GEMMS = ('custom_call_target="__cublas$gemm"', 'custom_call_target="__cublas$lt$matmul"')  # XLA:GPU's dots


def _dims(shape: str) -> list[int]:
    m = _ARRAY.match(shape)
    return [int(d) for d in m.group(1).split(",") if d] if m else []


def split_shape(rest: str) -> tuple[str, str]:
    """'f32[4,4]{1,0} dot(...)' or '(s32[], f32[2]) while(...)' -> (shape, 'opcode(...), attributes')."""
    depth = 0
    for i, ch in enumerate(rest):
        depth += {"(": 1, ")": -1}.get(ch, 0)
        if depth == 0 and ch == " ":
            return rest[:i], rest[i + 1 :]
    return rest, ""


def _operands(tail: str) -> list[tuple[str, str]]:
    """(name, shape printed beside it or "") of each operand of 'opcode(%a, %b), attributes'."""
    start = end = tail.index("(")
    depth = 1
    while depth and end + 1 < len(tail):
        end += 1
        depth += {"(": 1, ")": -1}.get(tail[end], 0)
    return [(name, shape or "") for shape, name in _OPERAND.findall(tail[start:end])]


def _matmul_flops(shape: str, tail: str, shapes: dict[str, str]) -> float:
    """2 x the result's elements x the lhs operand's contracted size, for a dot or a cuBLAS GEMM custom call (whose
    result is a tuple (result, workspace))."""
    result = split_shape(shape[1:])[0].rstrip(",") if shape.startswith("(") else shape
    (lhs, printed), *_ = _operands(tail)
    lhs_dims = _dims(shapes.get(lhs) or printed)
    m = _DOT_DIMS.search(tail)
    contracting = [int(d) for d in re.findall(r"\d+", (m.group(1) or m.group(2)) if m else "")]
    return 2.0 * math.prod(_dims(result)) * math.prod(lhs_dims[d] for d in contracting)


def parse_computations(text: str) -> tuple[dict[str, list[tuple[str, str, str]]], str | None]:
    """({computation: [(instruction, shape, "opcode(...), attributes")]}, the entry computation's name) of an
    optimized HLO module's text."""
    computations: dict[str, list[tuple[str, str, str]]] = {}
    entry, current = None, None
    for line in text.splitlines():
        if m := _COMPUTATION.match(line):
            current = computations.setdefault(m.group(1), [])
            entry = m.group(1) if line.startswith("ENTRY") else entry
        elif line.startswith("}"):
            current = None
        elif current is not None and (m := _INSTRUCTION.match(line)):
            current.append((m.group(1), *split_shape(m.group(2))))
    return computations, entry


def trip_count(tail: str) -> int | None:
    """A while instruction's known_trip_count (XLA's annotation in its backend_config), or None."""
    m = _TRIP.search(tail)
    return int(m.group(1)) if m else None


def called(tail: str) -> list[tuple[str, str]]:
    """(how, computation) of each computation an instruction runs, from its "opcode(...), attributes": how is
    calls, body, to_apply, true_computation, false_computation, or branch (a conditional's branches, a custom
    call's called computations); a while's condition is left out."""
    found = _CALLED.findall(tail)
    return found + [("branch", c.strip().lstrip("%")) for b in _BRANCHES.findall(tail) for c in b.split(",")]


def hlo_matmul_flops(text: str) -> tuple[float, int]:
    """(matmul FLOPs of one run of the optimized HLO module `text`, while loops whose trip count it lacks).

    Each dot counts 2 x its result's elements x its lhs contracting dimensions' product; each computation as
    often as it runs: the entry once, a while body its known_trip_count times (once where XLA did not annotate
    one), a fusion's, call's, custom call's or branch's computation as often as the instruction that calls it."""
    computations, entry = parse_computations(text)
    unknown = 0

    def flops_of(name: str) -> float:
        nonlocal unknown
        body = computations.get(name, [])
        shapes = {n: shape for n, shape, _ in body}
        total = 0.0
        for _, shape, tail in body:
            opcode = tail.split("(", 1)[0]
            if opcode == "dot" or (opcode == "custom-call" and any(g in tail for g in _GEMMS)):
                total += _matmul_flops(shape, tail, shapes)
            for kind, computation in called(tail):  # a loop's condition holds no matmul
                runs = 1
                if kind == "body":
                    trip = trip_count(tail)
                    runs, unknown = (1 if trip is None else trip), unknown + (trip is None)
                total += runs * flops_of(computation)
        return total

    return (flops_of(entry) if entry else 0.0), unknown


# ---------------------------------------------------------------------------------------------------------------
# the host's matmul peak


def matmul_peak(device, dtype: str) -> float:
    """FLOP/s of a square matmul on `device` (a jax.Device, or cpu | cuda | auto) in `dtype` (fp32: "highest"
    precision, no TF32, as the suite's fp32; bf16 and bf16_pure: bf16 operands), the best of a few after a warm-up
    (the compile), each waited for (bench.measure.flop_model.best_matmul_rate picks the size). Well under a second
    on a 2-core CPU."""
    device = resolve_device(device)
    kind = jnp.float32 if dtype == "fp32" else jnp.bfloat16
    precision = jax.lax.Precision.HIGHEST if dtype == "fp32" else None
    matmul = jax.jit(lambda x, y: jnp.matmul(x, y, precision=precision))

    def make(n: int):
        rng = np.random.default_rng(0)  # drawn by numpy: a jax.random draw would compile per size
        a, b = (jax.device_put(rng.standard_normal((n, n), np.float32).astype(kind), device) for _ in range(2))
        return lambda: matmul(a, b)

    return best_matmul_rate(make, jax.block_until_ready, PROBE_SIZES["cuda" if device.platform == "gpu" else "cpu"])
