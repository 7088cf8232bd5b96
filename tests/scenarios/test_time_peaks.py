"""The "Time, explained" table's utilisations on made-up rows: one peak per host (the highest of its trials'
probes, or a GPU's published peak), HFU from the counted FLOPs and MFU from the model's useful FLOPs (3 forward
passes per training step, whatever the mode), each named; and the kernels per step and the host's share beside the
categories."""

from __future__ import annotations

from bench.scenarios.model.report.time_explained import host_peaks, peaks_line, time_table
from tests.support import first_table, trial

G = 1e9


def traced(mode, counted, probe, **kw) -> dict:
    """A traced row of a 1 s step whose forward pass is 10 GFLOP, its counted FLOPs and its own probe given."""
    return trial(
        "torch",
        mode,
        hostname=kw.pop("hostname", "epyc-1"),
        step_time_median_s=1.0,
        profile_step_ms=1000.0,
        time_overhead_ms=0.0,
        flops_forward=10 * G,
        flops_per_step=counted * G,
        flops_per_s=counted * G,
        matmul_peak_flops_per_s=probe * G,
        **kw,
    )


def cells_of(*rows) -> dict:
    return {(r["framework"], r["mode"]): r for r in rows}


def utilisation(table: str, mode: str) -> list[str]:
    line = next(x for x in first_table(table) if x.startswith(f"| torch | {mode} |"))
    return [c.strip() for c in line.split("|")[-3:-1]]  # HFU, MFU


def test_one_peak_per_host_and_mfu_from_the_models_flops():
    """backprop's probe met a busy host (100 GFLOP/s), MeZO's did not (200): both divide by 200. torch's jvp counts
    40 GFLOP (zero tangents' products included) where the model credits 30; MeZO runs 20 and is credited 30."""
    cells = cells_of(
        traced("backprop", 30, 100),
        traced("jvp", 40, 150),
        traced("mezo", 20, 200),
        traced("inference", 10, 200),
    )
    table = time_table(cells)
    assert "HFU (counted FLOPs)" in table and "MFU (model FLOPs, 3× forward)" in table
    assert utilisation(table, "backprop") == ["15.0%", "15.0%"]  # 30 / 200, not 30 / its own 100
    assert utilisation(table, "jvp") == ["20.0%", "15.0%"]
    assert utilisation(table, "mezo") == ["10.0%", "15.0%"]
    assert utilisation(table, "inference") == ["5.0%", "5.0%"]  # inference is credited its one forward
    assert peaks_line(cells, host_peaks(cells.values())) == (
        "Peak: epyc-1: 200 GFLOP/s, the highest of its trials' matmul probes."
    )


def test_two_hosts_keep_their_own_peaks_and_a_gpu_its_published_one():
    a = traced("backprop", 30, 100)
    b = traced("mezo", 20, 400, hostname="epyc-2")
    gpu = traced("jvp", 40, 150, hostname="gpu-1", peak_flops_per_s=1000 * G)
    table = time_table(cells_of(a, b, gpu))
    assert utilisation(table, "backprop") == ["30.0%", "30.0%"] and utilisation(table, "mezo") == ["5.0%", "7.5%"]
    assert utilisation(table, "jvp") == ["4.0%", "3.0%"]  # over the published peak, not the probe


def test_rows_without_the_forward_column_show_no_mfu():
    old = {k: v for k, v in traced("backprop", 30, 100).items() if k != "flops_forward"}
    assert utilisation(time_table(cells_of(old)), "backprop") == ["30.0%", "-"]


def column(table: str, mode: str, heading: str, framework: str = "torch") -> str:
    lines = first_table(table)
    at = [c.strip() for c in lines[0].split("|")].index(heading)
    line = next(x for x in lines if x.startswith(f"| {framework} | {mode} |"))
    return line.split("|")[at].strip()


def test_kernels_and_the_hosts_share_stand_beside_the_categories():
    """torch's dispatches that launch nothing beside its kernels, JAX's kernels alone; a row from before the
    columns existed shows none."""
    mezo = traced("mezo", 20, 200, kernels_per_step=263, no_kernel_dispatches_per_step=197, host_share=0.42)
    jax = {**traced("backprop", 30, 200, kernels_per_step=2150, host_share=0.125), "framework": "jax"}
    old = traced("jvp", 40, 200)
    table = time_table(cells_of(mezo, jax, old))
    assert column(table, "mezo", "kernels / step") == "263 (+197 none)"
    assert column(table, "mezo", "host share") == "42.0%"
    assert column(table, "backprop", "kernels / step", "jax") == "2,150"
    assert column(table, "backprop", "host share", "jax") == "12.5%"
    assert column(table, "jvp", "kernels / step") == column(table, "jvp", "host share") == "-"
