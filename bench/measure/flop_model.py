"""What each way of differentiating should cost in arithmetic, on paper: the matmul FLOPs of one optimizer step.

One framework-neutral model from the shapes, the counterpart of memory_model.py for time. The frameworks' own counts
(bench/<framework>_impl/flops.py: torch's FlopCounterMode, the dots of XLA's compiled programs) are held against it
in tests/frameworks/test_flops.py; MFU divides it by the step time and a peak (`published_peak`, or the host's
measured `matmul_peak`), as torchtitan does.

Only matmuls are counted, 2 M N K each (a multiply and an add per term); everything else (LayerNorm, softmax, GELU,
dropout, the optimizer's update, MeZO's perturbation) is elementwise, O(tokens x H) against the matmuls'
O(tokens x H^2), and embeddings are lookups: 0. Shapes: B x T tokens per micro-batch, H hidden, I intermediate, L
layers, C labels.

    per encoder layer   query, key, value, output projections   4 x 2 BT H H
                        feed-forward, up and down                2 x 2 BT H I
                        attention scores Q K^T and probs @ V     2 x 2 B T T H   (A heads of H/A: the same total)
    pooler              2 B H H     (the [CLS] row only)
    classifier          2 B H C
    forward  F = L (8 BT H^2 + 4 BT H I + 4 B T^2 H) + 2 B H^2 + 2 B H C

Derivatives. A matmul Y = X W (or Q K^T, P V) has two operands; an operand *carries* a derivative when it is a
trainable weight, or an activation computed from one (anything downstream of the lowest trainable parameter). Then

    backward  the cotangent of each carrying operand, dY W^T or X^T dY: one matmul of Y's size each
    tangent   dY = dX W + X dW, one term per carrying operand: the same count

so a matmul whose two operands carry costs 2x its forward in either direction, one with one carrying operand 1x
(a frozen weight above a trainable layer: dX W^T alone; the lowest trainable layer, whose input carries nothing:
X^T dY alone), and nothing below the lowest trainable parameter. D = sum over matmuls of forward x carrying
operands. Per scope: all: D = 2F (everything carries, the embeddings included); bias (BitFit): every activation
carries (the embeddings' LayerNorm bias is trainable) but only the classifier's weight does, so D is about F; last_k:
2x the last k layers and the head, 1x the lowest trained layer's query, key and value, 0 below; head: the pooler 1x
(its input carries nothing), the classifier 2x; classifier: the classifier 1x. A linear layer's jvp thus adds two
matmuls to the primal one, as backprop's backward adds two: a forward gradient costs about a backprop step.
Attention's two matmuls carry on both operands wherever anything below them trains: their jvp is 3x their primal in
FLOPs (the softmax between them adds elementwise work only).

The modes, per micro-batch (m micro-batches per optimizer step multiply everything; `Flops.total` is per step):

    inference   F
    backprop    F + D;  remat: + F_r, each checkpointed encoder layer that has a backward run forward again
                (layers below the lowest trainable parameter have none, and neither framework recomputes them)
    jvp         K (F + D): K tangents, each its own jvp of the whole loss, primal included (both frameworks loop
                over the tangents and re-run the primal: forward_gradient_coeffs; the head scopes too, jvp does
                not split the trunk off)
    jacfwd      n basis directions in ceil(n / c) chunks of c, each chunk one vmapped jvp whose primal is not
                batched: ceil(n / c) F + n D. The head scopes (HEAD_ONLY) run the trunk once, untangented, and
                push only the head forward: F_trunk + ceil(n / c) F_head + n D
    mezo        2 F: two forward passes (the perturbations are elementwise)

What the frameworks run (predict's `framework`), measured with their own counters on a tiny BERT on the CPU
(tests/frameworks/test_flops.py holds each within the tolerance it states):

    torch   forward mode multiplies zero tangents. Where one operand of a matmul carries a tangent and the other
            does not (a frozen weight under a carrying input, the lowest trained layer's input), autograd's
            forward formula (dX W + X dW) stands in a zero tensor for the missing tangent, and mm has no zero-tensor
            kernel: the zeros are materialised and multiplied, as fast as any matmul (a 2048^2 linear with only
            its input's tangent runs 3 matmuls in 3x one's time). So jvp pays 2x forward for every matmul that
            carries anything: +1x per frozen weight under BitFit. Under jacfwd's vmap the zero tangent is not
            batched: its matmul runs once per chunk. And jacfwd's trunk for the head scopes (features: model.bert)
            runs the pooler too, which the head then runs again.
    jax     XLA's loop-invariant code motion hoists the primal, which depends on no tangent, out of jvp's
            fori_loop over the tangents and jacfwd's lax.map over the chunks: F + K D and F + n D per
            micro-batch. Symbolic zeros: no zero tangent is ever multiplied. With scan_layers (the default)
            nothing with a matmul is hoisted: the jvp of a scan is one scan computing primal and tangent
            together, which XLA does not split, and the pooler and classifier take its primal output, so the
            primal runs once per tangent (or chunk) as in torch: K (F + D) (K = 1, the default: the same). The
            head scopes' jacfwd still runs its head's primal once (the scanned trunk is outside the loop).
            remat on XLA:CPU: the recomputed layer's query, key and value projections (same input, same weights)
            are merged with the forward's, so 3 x 2 BT H^2 per recomputed layer less than F_r is run (not
            modelled: a compiler's choice, held as the test's tolerance).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from typing import Any

from bench import estimators, models
from bench.estimators.base import FlopContext
from bench.measure.timing import Now, timed
from bench.models import Matmul
from bench.spec import (
    FRAMEWORKS,
    LoraSpec,
    StepSpec,
)

TFLOPS = 1e12
# Dense (no structured sparsity) peak FLOP/s by device name and dtype, in TFLOP/s, from NVIDIA's datasheets:
# H100 Tensor Core GPU datasheet (SXM and PCIe columns; the datasheet's tensor figures are with sparsity, the dense
# ones are half), H200 Tensor Core GPU datasheet (the H100 SXM figures), A100 Tensor Core GPU datasheet. fp32 is the
# CUDA cores' rate (the suite's fp32 turns TF32 off); tf32 and bf16 the tensor cores'. A device name matches the
# first entry whose key it contains (case-insensitive): "H100 PCIe" comes before the SXM part's names.
PUBLISHED_PEAK_TFLOPS: dict[tuple[str, str], float] = {
    ("H100 PCIe", "bf16"): 756.0,
    ("H100 PCIe", "fp32"): 51.2,
    ("H100 SXM", "bf16"): 989.4,
    ("H100 SXM", "tf32"): 494.7,
    ("H100 SXM", "fp32"): 66.9,
    ("H100 80GB HBM3", "bf16"): 989.4,  # the SXM part as CUDA names it ("NVIDIA H100 80GB HBM3")
    ("H100 80GB HBM3", "tf32"): 494.7,
    ("H100 80GB HBM3", "fp32"): 66.9,
    ("H200", "bf16"): 989.4,
    ("H200", "tf32"): 494.7,
    ("H200", "fp32"): 66.9,
    ("A100", "bf16"): 312.0,
    ("A100", "tf32"): 156.0,
    ("A100", "fp32"): 19.5,
}
PEAK_DTYPES = {"fp32": "fp32", "tf32": "tf32", "bf16": "bf16", "bf16_pure": "bf16"}  # the suite's dtypes -> a column


def published_peak(device_name: str, dtype: str) -> float | None:
    """The device's dense peak in FLOP/s for `dtype` (fp32 | bf16 | bf16_pure, or tf32) from PUBLISHED_PEAK_TFLOPS;
    None for a device the table does not know (every CPU among them)."""
    column = PEAK_DTYPES.get(dtype)
    name = device_name.lower()
    keys = dict.fromkeys(key for key, _ in PUBLISHED_PEAK_TFLOPS)  # in the table's order
    for key in keys:
        if key.lower() in name:
            peak = PUBLISHED_PEAK_TFLOPS.get((key, column))
            return None if peak is None else peak * TFLOPS
    return None


def matmuls(
    spec, trainable: str, batch_size: int, seq_len: int, last_k: int = 1, lora: LoraSpec | None = None, framework=None
) -> list[Matmul]:
    """Every matmul of one forward pass of `spec`'s family, in the order the pass runs them (its module's)."""
    return models.of(spec).matmuls(spec, trainable, batch_size, seq_len, last_k, lora, framework)


@dataclass(frozen=True)
class Flops:
    """Matmul FLOPs of one optimizer step (every micro-batch), by kind of work, and their total."""

    forward: float  # primal forward passes (jvp: one per tangent, jacfwd: one per chunk, XLA: one; mezo: two)
    backward: float  # reverse mode's cotangent matmuls
    recompute: float  # remat: the checkpointed layers' forward, again in the backward
    tangent: float  # forward mode's tangent matmuls (jvp: every tangent; jacfwd: every basis direction)
    total: float

    def to_dict(self) -> dict[str, float]:
        return asdict(self)


def predict(
    spec,
    step: StepSpec,
    batch_size: int,
    seq_len: int,
    *,
    framework: str | None = None,
) -> Flops | None:
    """The model's matmul FLOPs of one optimizer step of `step` on `step.grad_accum` micro-batches of
    `batch_size` x `seq_len` (the module docstring has the formulas). A setting the device decides
    (jacfwd.chunk=auto) must be resolved first: the trainer's `spec` is (Estimator.resolved).

    `framework` None: the maths as bench/*/steps.py write it, the same for both. "torch" or "jax": what that
    framework's program does beyond it in the forward modes (the module docstring's "What the frameworks run");
    inference, backprop and MeZO come out the same in all three (XLA:CPU's remat runs a little less: not
    modelled). The mode's terms are its estimator's (bench/estimators/); None where it has none."""
    if framework is not None and framework not in FRAMEWORKS:
        raise ValueError(f"framework={framework!r}: accepted None, {', '.join(FRAMEWORKS)}")
    family = models.of(spec)
    if "flops" not in family.MODELLED:  # a family whose matmuls are not listed: its cells stay empty
        return None
    mm = matmuls(spec, step.trainable, batch_size, seq_len, step.last_k, step.adapters, framework)
    every = sum(m.flops for m in mm)
    derivative = sum(m.flops * m.carrying for m in mm)
    # torch's forward mode: where one operand carries a tangent, the other's zero tangent is multiplied as well
    zero_terms = sum(m.flops for m in mm if m.carrying == 1) if framework == "torch" else 0
    trunk = sum(m.flops for m in mm if m.layer is not None)
    pooler = sum(m.flops for m in mm if m.name == family.POOLER)  # OPT has none
    hoists = framework == "jax" and not step.scan_layers  # XLA hoists the primal out of the tangents' loop
    with_backward = {m.layer for m in mm if m.carrying and m.layer is not None}  # remat recomputes these layers
    context = FlopContext(
        step=step,
        framework=framework,
        every=every,
        derivative=derivative,
        zero_terms=zero_terms,
        trunk=trunk,
        pooler=pooler,
        recompute=sum(m.flops for m in mm if m.layer in with_backward),
        hoists=hoists,
        n=family.count_params(spec, step.trainable, step.last_k, step.lora),
    )
    terms = estimators.get(step.mode).flops(context)
    if terms is None:
        return None
    forward, backward, recompute, tangent = terms.forward, terms.backward, terms.recompute, terms.tangent
    m = step.grad_accum
    parts = [m * x for x in (forward, backward, recompute, tangent)]
    return Flops(*parts, total=sum(parts))


# ---------------------------------------------------------------------------------------------------------------
# the host's measured matmul peak (each framework's flops.matmul_peak runs this with its own matmul)

# Square matmul sizes, smallest first: a GPU reaches its peak at 8192 (~1 ms on an H100 in bf16); a CPU is probed
# at the largest size whose matmul takes at most PROBE_MATMUL_S (fp32 on a 2-core CPU: 1024, ~15 ms; torch's bf16
# CPU matmul runs at ~1.4 GFLOP/s there, so 256), so the whole probe stays well under a second.
PROBE_SIZES = {"cpu": (256, 512, 1024), "cuda": (8192,)}
PROBE_MATMUL_S = 0.05
PROBE_REPEATS = 5  # timed matmuls at the chosen size; the fastest is the peak (the others met a busy host)


def useful_flops(forward: float | None, mode: str) -> float | None:
    """The model's FLOPs a step of `mode` is credited with, from one forward pass's (`forward`): 3 forward passes
    for every training mode, as backprop's forward and backward (MFU as PaLM and torchtitan define it: MeZO's two
    forwards count as three, a forward-mode pass's zero tangents not at all), 1 for inference."""
    trains = mode not in estimators.names() or estimators.get(mode).updates
    return None if forward is None else forward * (3 if trains else 1)


def best_matmul_rate(
    make: Callable[[int], Callable[[], Any]],
    sync: Callable[[Any], Any] | None,
    sizes: tuple[int, ...],
    clock: Now = time.perf_counter,
) -> float:
    """FLOP/s of the fastest of PROBE_REPEATS n x n matmuls, `make(n)` returning the matmul to call and `sync`
    waiting for its result; n is the largest of `sizes` that the smallest one's rate says takes at most
    PROBE_MATMUL_S. Each size is called once untimed first (allocation, compilation, library warm-up)."""
    run = make(sizes[0])
    timed(run, sync=sync, clock=clock)
    _, elapsed = timed(run, sync=sync, clock=clock)
    n = max([s for s in sizes if elapsed * (s / sizes[0]) ** 3 <= PROBE_MATMUL_S], default=sizes[0])
    if n != sizes[0]:
        run = make(n)
        timed(run, sync=sync, clock=clock)
    return 2 * n**3 / min(timed(run, sync=sync, clock=clock)[1] for _ in range(PROBE_REPEATS))
