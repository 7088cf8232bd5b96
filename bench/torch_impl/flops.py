"""FLOPs as PyTorch counts them, and the matmul peak this host reaches. Mirror of jax_impl/flops.py.

    count(trainer, micro_batches)   matmul FLOPs of one optimizer step, counted while one step runs
    matmul_peak(device, dtype)      FLOP/s of a square matmul: the host's measured peak, for utilisation

FlopCounterMode is a dispatch mode: it sits below autograd and torch.func's transforms, so it sees the ops they
emit with the shapes they run at. It counts forward mode (torch.func.jvp, forward_ad's dual tensors, the lazy
duals), vmapped jacfwd (at the chunk's batched shapes) and checkpointing's recomputation as they run, and nothing
is missed there: every mode equals bench.measure.flop_model.predict(framework="torch") (tests/frameworks/
test_flops.py). What it counts beyond the maths is really run: forward mode's zero tangents, materialised by
torch's zero-tensor fallback (mm has no zero-tensor kernel) and multiplied (flop_model's docstring). It counts
matmul-like ops only (mm, addmm, bmm, baddbmm, convolutions, fused attention); embeddings' lookups, their
gradient's scatter and every elementwise op are not counted, as the model does not count them. In a world of
several devices it counts this process's device.
"""

from __future__ import annotations

import torch
from torch.utils.flop_counter import FlopCounterMode

from bench.measure.flop_model import PROBE_SIZES, best_matmul_rate
from bench.torch_impl.device import resolve_device, use_fp32

METHOD = "torch.utils.flop_counter"


def count(trainer, micro_batches) -> dict:
    """Matmul FLOPs of one optimizer step of `trainer` on these device micro-batches, counted by
    torch.utils.flop_counter.FlopCounterMode around one `trainer.step` (one more update: run it after the timed
    window). Keys:

    flops_per_step          matmul FLOPs of the step (FlopCounterMode counts matmul-like ops only)
    flops_method            "torch.utils.flop_counter"
    flops_all_ops_per_step  None: torch counts no elementwise op (XLA's count of every op is jax_impl's)
    flops_uncounted         what the count is known to leave out: "" (nothing)
    """
    with FlopCounterMode(display=False) as counter:
        trainer.step(micro_batches)
        trainer.sync()
    return {
        "flops_per_step": float(counter.get_total_flops()),
        "flops_method": METHOD,
        "flops_all_ops_per_step": None,
        "flops_uncounted": "",
    }


def matmul_peak(device, dtype: str) -> float:
    """FLOP/s of a square matmul on `device` (a torch.device, or cpu | cuda | auto) in `dtype` (fp32: true fp32, no
    TF32, as the suite's fp32; bf16 and bf16_pure: bf16 operands), the best of a few after a warm-up, each waited
    for (bench.measure.flop_model.best_matmul_rate picks the size). Well under a second on a 2-core CPU."""
    device = resolve_device(device)
    use_fp32()
    kind = torch.float32 if dtype == "fp32" else torch.bfloat16

    def make(n: int):
        g = torch.Generator(device=device).manual_seed(0)
        a, b = (torch.randn(n, n, generator=g, device=device, dtype=kind) for _ in range(2))
        return lambda: torch.mm(a, b)

    sync = (lambda _: torch.cuda.synchronize(device)) if device.type == "cuda" else None
    return best_matmul_rate(make, sync, PROBE_SIZES["cuda" if device.type == "cuda" else "cpu"])
