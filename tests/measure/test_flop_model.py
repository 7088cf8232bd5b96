"""The FLOP model on paper (bench/measure/flop_model.py): counts worked out by hand on a small BERT, the ratios
between the modes, what each framework runs beyond the maths, the published peaks, and the matmul probe's choice
of size. The frameworks' own counts against it: tests/frameworks/test_flops.py."""

from __future__ import annotations

import pytest

from bench.estimators.jacfwd import JacfwdSettings
from bench.estimators.jvp import JvpSettings
from bench.measure import flop_model
from bench.measure.flop_model import matmuls, predict, published_peak, useful_flops
from bench.models.bert import BertSpec, count_params
from bench.spec import StepSpec
from tests.support import FakeClock

# B=2, T=4 (8 tokens), H=8, I=16, 2 layers, C=3: small enough to count by hand
SPEC = BertSpec(
    vocab_size=100,
    hidden_size=8,
    num_layers=2,
    num_heads=2,
    intermediate_size=16,
    max_position_embeddings=16,
    num_labels=3,
)
B, T = 2, 4
PROJ = 2 * 8 * 8 * 8  # one of query, key, value, output: 2 BT H H = 1024
FFN = 2 * 8 * 8 * 16  # one feed-forward matmul: 2 BT H I = 2048
ATT = 2 * 2 * 4 * 4 * 8  # scores or context: 2 B T T H = 512
LAYER = 4 * PROJ + 2 * FFN + 2 * ATT  # 9216
POOLER, CLASSIFIER = 2 * 2 * 8 * 8, 2 * 2 * 8 * 3  # 256, 96
F = 2 * LAYER + POOLER + CLASSIFIER  # 18784


def total(**kw) -> float:
    if "chunk" in kw:
        kw["settings"] = JacfwdSettings(chunk=kw.pop("chunk"))
    if "num_tangents" in kw:
        kw["settings"] = JvpSettings(num_tangents=kw.pop("num_tangents"))
    framework = kw.pop("framework", None)
    return predict(SPEC, StepSpec(**kw), B, T, framework=framework).total


def test_forward_by_hand():
    mm = matmuls(SPEC, "all", B, T)
    assert len(mm) == 2 * 8 + 2  # per layer: q, k, v, scores, context, output, up, down; pooler; classifier
    assert sum(m.flops for m in mm) == F
    assert total(mode="inference") == F
    assert total(mode="mezo") == 2 * F  # two forward passes; the perturbations are elementwise


@pytest.mark.parametrize(
    "trainable, derivative",
    [
        ("all", 2 * F),  # every operand carries, the embeddings' output included
        # BitFit, per layer: every linear carries through its input only (1x), attention's operands both (2x);
        # the pooler 1x, the classifier's weight trains (2x)
        ("bias", 2 * (4 * PROJ + 2 * FFN + 2 * 2 * ATT) + POOLER + 2 * CLASSIFIER),
        # last layer: q, k, v see a frozen input (1x), the rest 2x; layer 0 nothing
        ("last_k", 3 * PROJ + 2 * (2 * ATT + PROJ + 2 * FFN) + 2 * (POOLER + CLASSIFIER)),
        ("head", POOLER + 2 * CLASSIFIER),  # the pooler's input carries nothing
        ("classifier", CLASSIFIER),
    ],
)
def test_backward_by_hand(trainable, derivative):
    assert total(mode="backprop", trainable=trainable) == F + derivative
    # a linear layer's jvp adds the same matmuls as its backward: one tangent costs a backprop step
    assert total(mode="jvp", trainable=trainable) == F + derivative


def test_mode_ratios():
    assert total(mode="backprop") == 3 * F
    assert total(mode="backprop", remat=True) == 3 * F + 2 * LAYER  # one more forward of the encoder layers
    # remat recomputes only layers with a backward: with last_k=1, layer 1 alone
    assert total(mode="backprop", remat=True, trainable="last_k") == total(mode="backprop", trainable="last_k") + LAYER
    assert total(mode="backprop", remat=True, trainable="head") == total(mode="backprop", trainable="head")
    K = [total(mode="jvp", num_tangents=k) for k in (1, 2, 3)]
    assert K[1] - K[0] == K[2] - K[1] == 3 * F  # linear in K: a primal and its tangent per tangent
    assert total(mode="backprop", grad_accum=2) == 2 * total(mode="backprop")
    for scope in ("head", "classifier"):  # the trunk's forward is all they pay for
        assert total(mode="backprop", trainable=scope) < 1.05 * F < total(mode="backprop", trainable="bias")


def test_jacfwd_by_hand():
    n = count_params(SPEC, "classifier")
    assert n == 8 * 3 + 3
    # chunk 10: 3 chunks; the trunk once, the head's primal per chunk, the classifier's 1x per direction
    head = POOLER + CLASSIFIER
    assert total(mode="jacfwd", trainable="classifier", chunk=10) == 2 * LAYER + 3 * head + n * CLASSIFIER
    n = count_params(SPEC, "bias")
    bias_d = total(mode="backprop", trainable="bias") - F
    assert total(mode="jacfwd", trainable="bias", chunk=n) == F + n * bias_d  # one chunk: the primal once
    with pytest.raises(ValueError, match="jacfwd.chunk"):
        total(mode="jacfwd", trainable="head")  # "auto" is the trainer's to resolve


def test_what_each_framework_runs():
    # torch multiplies the zero tangent of a matmul's other operand: every linear of BitFit (and the pooler)
    zero_terms = 2 * (4 * PROJ + 2 * FFN) + POOLER
    assert total(mode="jvp", trainable="bias", framework="torch") == total(mode="jvp", trainable="bias") + zero_terms
    assert total(mode="jvp", framework="torch") == total(mode="jvp")  # nothing frozen, no zero tangent
    # under vmap the zero tangent is unbatched (once per chunk), and the head scopes' trunk runs the pooler too
    probe = {"mode": "jacfwd", "trainable": "classifier", "chunk": 10}
    assert total(**probe, framework="torch") == total(**probe) + POOLER + 3 * CLASSIFIER
    # XLA hoists the primal out of the tangents' and the chunks' loops, unless the layers are a scan (the default)
    assert total(mode="jvp", num_tangents=3, framework="jax", scan_layers=False) == F + 3 * 2 * F
    assert total(mode="jvp", num_tangents=3, framework="jax") == 3 * F + 3 * 2 * F
    n = count_params(SPEC, "classifier")
    assert total(mode="jacfwd", trainable="classifier", chunk=10, framework="jax") == F + n * CLASSIFIER
    for kw in ({"mode": "backprop"}, {"mode": "backprop", "trainable": "bias"}, {"mode": "mezo"}):
        assert total(**kw, framework="torch") == total(**kw, framework="jax") == total(**kw)
    with pytest.raises(ValueError, match="framework"):
        total(mode="jvp", framework="tensorflow")
    with pytest.raises(ValueError, match="mode"):
        total(mode="newton")


def test_published_peak():
    """Each peak against the vendor's datasheet figure, written here with its source (not the code's table): the
    datasheets give tensor rates with sparsity (dense is half) and round to whole TFLOPS, hence 1 %."""
    tera, near = 1e12, lambda tflops: pytest.approx(tflops * 1e12, rel=0.01)
    # NVIDIA H100 Tensor Core GPU datasheet, H100 SXM: BF16 Tensor Core 1,979 TFLOPS (sparse), FP32 67 TFLOPS
    assert published_peak("NVIDIA H100 80GB HBM3", "bf16") == near(1979 / 2)  # the SXM part as CUDA names it
    assert published_peak("NVIDIA H100 80GB HBM3", "fp32") == near(67)
    # the same datasheet, H100 PCIe: BF16 Tensor Core 1,513 TFLOPS (sparse), FP32 51 TFLOPS
    assert published_peak("NVIDIA H100 PCIe", "bf16_pure") == near(1513 / 2)  # not the SXM figure
    assert published_peak("NVIDIA H100 PCIe", "fp32") == near(51)
    # NVIDIA H200 Tensor Core GPU datasheet, H200 SXM: BF16 Tensor Core 1,979 TFLOPS (sparse), as the H100 SXM's
    assert published_peak("NVIDIA H200", "bf16") == near(1979 / 2)
    # NVIDIA A100 Tensor Core GPU datasheet: FP32 19.5 TFLOPS, TF32 Tensor Core 312 TFLOPS (sparse)
    assert published_peak("NVIDIA A100-SXM4-80GB", "fp32") == near(19.5)
    assert published_peak("NVIDIA A100-PCIE-40GB", "tf32") == near(312 / 2)
    assert published_peak("NVIDIA H100 PCIe", "tf32") is None  # not in the table: no guess
    assert published_peak("AMD EPYC 7763 64-Core Processor", "fp32") is None
    assert published_peak("NVIDIA H100 80GB HBM3", "fp8") is None
    assert published_peak("NVIDIA H100 80GB HBM3", "bf16") > 10 * tera  # in FLOP/s, not TFLOP/s


def test_probe_picks_the_largest_size_in_its_time(monkeypatch):
    """A fake matmul whose time on a fake clock grows as n^3 (1 ms at 256): 512 takes 8 ms, within
    PROBE_MATMUL_S; 1024 (64 ms) does not. The rate is that of the size probed."""
    monkeypatch.setattr(flop_model, "PROBE_MATMUL_S", 0.05)
    now, made = FakeClock(), []

    def make(n):
        made.append(n)
        return lambda: now.advance(1e-3 * (n / 256) ** 3)

    rate = flop_model.best_matmul_rate(make, None, (256, 512, 1024), clock=now)
    assert made == [256, 512]
    assert rate == pytest.approx(2 * 512**3 / 8e-3)


def test_a_step_is_credited_three_forward_passes_when_it_trains_and_one_when_it_does_not():
    """MFU's useful FLOPs (PaLM's and torchtitan's): backprop's forward and backward for every training mode, MeZO's
    two forwards and a forward-mode pass included; inference one pass."""
    assert useful_flops(10.0, "inference") == 10.0
    assert [useful_flops(10.0, m) for m in ("backprop", "jvp", "mezo")] == [30.0] * 3
    assert useful_flops(None, "mezo") is None
