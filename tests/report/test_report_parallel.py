"""The report beyond one device (bench/scenarios/model/report/parallel.py and its plots): per-device memory and
the bytes each device exchanged against their expectation, the HPML lecture's table of DDP against FSDP's
strategies, a count far from its expectation flagged, and a CSV written before the parallel columns existed
reading as before."""

from __future__ import annotations

import pytest

from bench.scenarios.model.report.parallel import FLAG, comm_mismatch
from bench.scenarios.model.report.plots import plan_plots
from bench.scenarios.model.select import group_contexts, select, summary_table
from bench.store.read import load_rows, read_rows
from tests.support import (
    DEFAULT_HEADING,
    OLD_COLUMNS,
    PARALLEL_CSV_COLUMNS,
    PARAM_MB,
    SCALE_HEADING,
    N,
    assert_real_png,
    build_report,
    first_table,
    main_context,
    parallel_trial,
    trial,
    write_csv,
)


def beyond(md: str) -> str:
    return md.split("\n## Beyond one device\n", 1)[1].split("\n## ", 1)[0]


def scale_line(section: str, framework: str, mode: str, strategy: str, devices: int) -> list[str]:
    prefix = f"| {framework} | {mode} | {strategy} | {devices} |"
    found = [line for line in section.splitlines() if line.startswith(prefix)]
    assert len(found) == 1, (prefix, found)
    return [c.strip() for c in found[0].strip("|").split(" | ")]


def test_beyond_one_device_has_per_device_memory_and_bytes_with_units(full):
    section = beyond(full["md"])
    table = "\n".join(first_table(section.split(f"\n{SCALE_HEADING}\n", 1)[1]))
    assert table.splitlines()[0] == (
        "| framework | mode | strategy | devices | peak MiB | excess MiB | params MiB | "
        "optimizer MiB | step ms (slowest) | samples/s (global) | exchanged / step | "
        "expected | counted / expected | memory by |"
    )
    # backprop all-reduces its gradient: 4n + 4 bytes (the loss); jvp and mezo two scalars
    ddp = scale_line(table, "torch", "backprop", "ddp", 2)
    assert ddp[4:] == [
        f"{65 + PARAM_MB + 250 + 3 * PARAM_MB:.0f}",
        f"{65 + PARAM_MB:.0f}",
        "87",
        "173",
        "400",
        "20.0",
        "86.6 MiB",
        "86.6 MiB",
        "1.00×",
        "rss_hwm",
    ]
    assert scale_line(table, "jax", "mezo", "ddp", 2)[10:] == ["8 B", "8 B", "1.00×", "xla_memory_analysis"]
    assert scale_line(table, "torch", "jvp[lazy]", "ddp", 2)[10:12] == ["8 B", "8 B"]
    # FSDP: half the parameters and optimizer state per device; parameters gathered for every forward pass
    full_shard = scale_line(table, "jax", "backprop", "fsdp FULL_SHARD", 2)
    # 8n + 4: XLA gathers once for the forward and keeps the parameters for the backward, then reduces 4n
    assert full_shard[6:8] == ["43", "87"] and full_shard[10:12] == ["173 MiB", "173 MiB"]
    assert scale_line(table, "torch", "backprop", "fsdp SHARD_GRAD_OP", 2)[10] == "173 MiB"  # 8n + 4
    assert scale_line(table, "torch", "jvp[lazy]", "fsdp FULL_SHARD", 2)[4] == "**error**"
    # a world of one exchanges nothing; the single-device rows of the same work are the baseline
    assert scale_line(table, "jax", "jvp", "ddp", 1)[10:13] == ["0 B", "0 B", "-"]
    assert scale_line(table, "torch", "mezo", "none", 1)[10:13] == ["-", "-", "-"]
    assert "| inference |" not in table  # no trial beyond one device to compare it with
    # the second device of jax's ddp backprop holds 20% less: the history says so
    jax = scale_line(table, "jax", "backprop", "ddp", 2)
    assert jax[5] == f"{65 + PARAM_MB:.0f} (min {0.8 * (65 + PARAM_MB):.0f})"
    assert FLAG not in table  # every count is the expectation
    assert "4n bytes" in section and "same seeded direction" in section and "1/N of the parameters" in section
    assert "the expectation is a formula, the count is what happened" in section


def test_the_strategy_table_compares_ddp_and_fsdp_per_mode(full):
    section = beyond(full["md"]).split("### DDP vs FSDP strategies (the HPML lecture's table)\n", 1)[1]
    torch = first_table(section.split(f"PyTorch on 2 devices · {SCALE_HEADING}\n", 1)[1])
    assert torch[0] == (
        "| strategy | backprop peak MiB | backprop ms | jvp[lazy] peak MiB | jvp[lazy] ms | mezo peak MiB | mezo ms |"
    )
    assert [line.split(" | ")[0].strip("| ") for line in torch[2:]] == ["DDP", "FSDP SHARD_GRAD_OP", "FSDP FULL_SHARD"]
    half = f"{250 + 60 + PARAM_MB / 2 + 3 * PARAM_MB / 2:.0f}"
    assert torch[3] == f"| FSDP SHARD_GRAD_OP | {half} | 450 | **error** |  | {250 + 20 + 3 * PARAM_MB / 2:.0f} | 450 |"
    assert torch[4].split(" | ")[2] == "500"  # FULL_SHARD gathers once more
    jax = first_table(section.split(f"JAX on 2 devices · {SCALE_HEADING}\n", 1)[1])
    assert [line.split(" | ")[0].strip("| ") for line in jax[2:]] == ["DDP", "FSDP FULL_SHARD"]


def test_a_count_more_than_ten_percent_off_its_expectation_is_flagged(tmp_path):
    ddp = dict(parallel="ddp", devices=2)
    rows = [
        parallel_trial("torch", "backprop", counted=1.05 * (4 * N + 4), **ddp),  # within 10%: agrees
        parallel_trial("jax", "backprop", counted=1.2 * (4 * N + 4), **ddp),
        parallel_trial("torch", "mezo", counted=1536, **ddp),  # 1.5 KiB where two losses were expected
        parallel_trial("jax", "mezo", counted=8, **ddp),
        parallel_trial("jax", "jvp", "ddp", 1, counted=4),
    ]  # a world of one should exchange nothing
    assert [comm_mismatch(r) for r in rows] == [False, True, True, False, True]
    assert comm_mismatch(trial("torch", "backprop")) is None
    md = build_report([write_csv(tmp_path / "runs.csv", rows)], tmp_path / "out").path.read_text()
    section = beyond(md)
    assert scale_line(section, "torch", "backprop", "ddp", 2)[10:13] == ["91.0 MiB", "86.6 MiB", "1.05×"]
    assert scale_line(section, "jax", "backprop", "ddp", 2)[12] == f"**1.20× {FLAG}**"
    assert scale_line(section, "torch", "mezo", "ddp", 2)[10:13] == ["1.50 KiB", "8 B", f"**192.00× {FLAG}**"]
    assert scale_line(section, "jax", "mezo", "ddp", 2)[12] == "1.00×"
    assert scale_line(section, "jax", "jvp", "ddp", 1)[10:13] == ["4 B", "0 B", f"**expected none {FLAG}**"]
    assert "No two strategies at one device count yet" in section


def test_the_scale_out_plots_show_devices_and_bytes_per_strategy(full):
    sel = select(load_rows([full["csv"]]))
    plots = {p.name: p for p in plan_plots(sel, group_contexts(sel))}
    ok = [r for r in full["rows"] if r["status"] == "ok" and r.get("parallel", "none") != "none"]
    grid = plots["memory_vs_devices"].grid
    assert [row[0].title for row in grid] == [f"{SCALE_HEADING} · ddp", f"{SCALE_HEADING} · fsdp FULL_SHARD"]
    memory, time = grid[0]
    assert memory.ylabel == "excess memory per device (MiB)" and "slowest device" in time.ylabel
    assert {s.label for s in memory.series} == {
        "torch backprop",
        "torch jvp[lazy]",
        "torch mezo",
        "jax backprop",
        "jax jvp",
        "jax mezo",
    }
    assert {s.label for s in grid[1][0].series} == {
        "torch backprop",
        "torch mezo",
        "jax backprop",
        "jax jvp",
        "jax mezo",
    }  # torch refuses jvp under fsdp
    latest = {
        (r["framework"], r["mode"], r["devices"]): r for r in ok if r["parallel"] == "ddp"
    }  # rows are oldest first: the later strategy_table rows win
    line = next(s for s in time.series if s.label == "torch backprop")
    assert line.xs == [1, 2]
    assert line.ys == pytest.approx([latest["torch", "backprop", d]["step_time_median_s"] * 1e3 for d in (1, 2)])
    bars = [row[0] for row in plots["comm_bytes"].grid]
    assert [p.title.rsplit(" · ", 1)[1] for p in bars] == [
        "ddp × 2 devices",
        "fsdp SHARD_GRAD_OP × 2 devices",
        "fsdp FULL_SHARD × 2 devices",
    ]
    ddp = bars[0]
    assert ddp.categories == ["backprop", "jvp", "mezo"] and ddp.logy and ddp.units == "bytes"
    counted = {s.framework: s.ys for s in ddp.series if not s.guide}
    assert counted == {"torch": [4 * N + 4, 8, 8], "jax": [4 * N + 4, 8, 8]}
    assert [(s.framework, s.ys) for s in ddp.series if s.guide] == [
        ("torch", [4 * N + 4, 8, 8]),
        ("jax", [4 * N + 4, 8, 8]),
    ]
    assert bars[1].categories == ["backprop", "mezo"]  # torch only; its jvp was refused
    for name in ("memory_vs_devices", "comm_bytes"):
        assert_real_png(full["out"] / "plots" / f"{name}.png")


def test_a_csv_without_the_parallel_columns_builds_the_same_report(tmp_path):
    rows = main_context()
    old = write_csv(tmp_path / "old" / "runs.csv", rows, OLD_COLUMNS)
    assert not set(PARALLEL_CSV_COLUMNS) & set(load_rows([old])[0])
    defaults = dict(
        parallel="none",
        devices=1,
        nodes=1,
        world_size=1,
        global_batch_size=8,
        fsdp_reshard_after_forward=True,
        fsdp_offload=False,
    )
    new = write_csv(tmp_path / "new" / "runs.csv", [{**r, **defaults} for r in rows])
    texts = []
    for path in (old, new):
        md = build_report([path], path.parent / "out").path.read_text()
        texts.append(md.replace(str(path), "runs.csv"))
    assert texts[0] == texts[1]
    assert f"\n### {DEFAULT_HEADING}\n" in texts[0] and " device" not in beyond(texts[0]).split("`", 1)[0]
    assert "No rows with `parallel=ddp|fsdp`: `python -m bench -m +experiment=scale_out`" in beyond(texts[0])
    assert "- **Bytes exchanged per step per device**: needs an ok row with parallel=ddp|fsdp" in texts[0]
    assert "parallel" not in summary_table(read_rows(old)).splitlines()[0]
