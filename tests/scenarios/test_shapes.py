"""Shapes users train at: the report's section puts each ladder's rungs (capacity --ladder) as rate, HFU and MFU
against batch x sequence, per framework, mode and dtype, beside the other rows of their context (the GPU table's
B8 T128), and says where each ladder ended; rows of another context, a failed rung and a bisecting search stay out.
The ladders themselves: test_capacity.py; the lease's shape step: test_gpu_steps.py and test_gpu_check.py."""

from __future__ import annotations

from bench.report.section import Results
from bench.scenarios.capacity.columns import COLUMNS as CAPACITY_COLUMNS
from bench.scenarios.capacity.shapes import ShapesSection
from bench.store.read import read_rows
from tests.support import assert_real_png, trial, write_csv

PEAK = 24e9  # the host's matmul probe (FLOP/s); every rung's FLOPs are made to give round shares of it
FORWARD = 1e9  # the model's one forward pass at B1 T32, FLOPs; a step's counted FLOPs are the mode's multiple
COUNTED = {"inference": 1, "backprop": 3, "mezo": 2}  # forward passes' worth a step of each mode counts


def rung(framework: str, mode: str, batch: int, seq: int = 32, **kw) -> dict:
    """A rung whose step takes 0.25 s per forward pass's worth at B1 T32 and scales with the tokens: the rate is
    COUNTED x FORWARD x tokens / step, HFU that over PEAK, MFU 3 forward passes (1 for inference) over PEAK."""
    tokens = batch * seq / 32
    step = 0.25 * COUNTED[mode] * (1 + tokens) / 2  # a cost a step pays whatever its size: larger batches share it
    flops = COUNTED[mode] * FORWARD * tokens
    return trial(
        framework,
        mode,
        batch_size=batch,
        seq_len=seq,
        step_time_median_s=step,
        flops_per_step=flops,
        flops_forward=FORWARD * tokens,
        flops_per_s=flops / step,
        lr=1e-5,
        # a capacity probe's experiment is empty (it runs outside a Hydra app)
        **{"experiment": "", "matmul_peak_flops_per_s": PEAK, **kw},
    )


def ladder(rows: list[dict], verdict: str, values: str, **kw) -> dict:
    r = rows[0]
    return {
        "capacity_id": "20261202-000000-abcdef",
        "framework": r["framework"],
        "mode": r["mode"],
        "model": r["model"],
        "num_layers": r["num_layers"],
        "search": "batch_size",
        "seq_len": r["seq_len"],
        "dtype": r["dtype"],
        "remat": False,
        "jvp_impl": "func",
        "device": "cpu",
        "verdict": verdict,
        "probes": len(rows),
        "probe_values": values,
        "probe_run_ids": " ".join(r["run_id"] for r in rows),
        "ladder": 8,
        **kw,
    }


def test_the_section_puts_each_rung_against_batch_and_sequence(tmp_path):
    runs, searches = [], []
    for fw in ("torch", "jax"):
        for mode in COUNTED:
            rungs = [rung(fw, mode, 1), rung(fw, mode, 8)]
            if mode == "backprop":  # the next rung ran out of memory
                rungs.append(trial(fw, mode, "oom", batch_size=64, seq_len=32, lr=1e-5, experiment=""))
                searches.append(ladder(rungs, "largest rung", "1:ok 8:ok 64:oom"))
            else:
                searches.append(ladder(rungs, "fits at the limit", "1:ok 8:ok"))
            runs += rungs
    half = [rung("torch", "backprop", b, dtype="bf16", matmul_peak_flops_per_s=2 * PEAK) for b in (1, 8)]
    searches.append(ladder(half, "fits at the limit", "1:ok 8:ok"))
    runs += half
    beside = rung("torch", "backprop", 8, seq=128, experiment="modes_fp32")  # the same context, another shape
    elsewhere = rung("jax", "inference", 4, model="tiny", num_layers=2, hidden_size=32)  # another context
    runs += [beside, elsewhere]
    write_csv(tmp_path / "runs.csv", runs)
    write_csv(tmp_path / "capacity.csv", searches, CAPACITY_COLUMNS)
    assert len(read_rows(tmp_path / "capacity.csv")) == 7

    lines = ShapesSection().render(Results([tmp_path / "runs.csv"]), tmp_path / "plots")
    md = "\n".join(lines)
    assert lines[0] == "## Shapes" and md.count("\n### ") == 1  # one context: the tiny model's row is not in it
    t32 = md[md.index("T32: GFLOP/s · HFU · MFU") : md.index("T128:")]
    assert "| framework | mode | dtype | B1 (32 tokens) | B8 (256 tokens) | ladder ended at |" in t32
    assert "B4" not in t32 and "oom" not in t32  # neither the other context's row nor the rung out of memory
    # backprop at B8: 3 x 8 GFLOP in 0.25 x 3 x 4.5 s = 7.11 GFLOP/s, HFU 29.6 %, MFU the same (3 forward passes)
    assert "| PyTorch | backprop | fp32 | 4.00 · 16.7 % · 16.7 % | 7.11 · 29.6 % · 29.6 % | B64 out of memory |" in t32
    # bf16 below fp32, against bf16's own peak (its probe's, twice fp32's here)
    bf16 = "| PyTorch | backprop | bf16 | 4.00 · 8.33 % · 8.33 % | 7.11 · 14.8 % · 14.8 % | the limit |"
    assert bf16 in t32 and t32.index("| PyTorch | backprop | fp32 |") < t32.index(bf16)
    # MeZO counts 2 forward passes and is credited 3: its MFU is 1.5x its HFU; inference is credited 1
    assert "| JAX | mezo | fp32 | 4.00 · 16.7 % · 25.0 % | 7.11 · 29.6 % · 44.4 % | the limit |" in t32
    assert "| JAX | inference | fp32 | 4.00 · 16.7 % · 16.7 % | 7.11 · 29.6 % · 29.6 % | the limit |" in t32
    # B8 T128 of another experiment sits beside the ladders, in its own sequence's table, with no ladder of its own
    t128 = md[md.index("T128:") :]
    assert "| PyTorch | backprop | fp32 | 7.76 · 32.3 % · 32.3 % | - |" in t128
    assert_real_png(tmp_path / "plots" / "shapes.png")


def test_no_ladder_no_section(tmp_path):
    row = rung("torch", "backprop", 8)
    write_csv(tmp_path / "runs.csv", [row])
    write_csv(tmp_path / "capacity.csv", [{**ladder([row], "fits", "8:ok"), "ladder": None}], CAPACITY_COLUMNS)
    assert ShapesSection().render(Results([tmp_path / "runs.csv"]), tmp_path / "plots") == []
