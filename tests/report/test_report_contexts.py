"""Which rows the report compares, and how it names them (bench/scenarios/model/select.py): rows that differ in
a knob (attention, learning rate, dropout, the optimizer's hyperparameters, mezo_eps) or in how many devices they
ran on never share a cell, the label says how they differ, a knob at its default (however written, or missing
from an older CSV) leaves the usual label alone; and the sweep's summary table."""

from __future__ import annotations

import pytest

from bench.report.tables import num
from bench.scenarios.model.select import (
    context_key,
    context_label,
    group_contexts,
    knob,
    scope_label,
    select,
    summary_table,
    variant,
)
from bench.spec import LORA_ROLES
from bench.store.read import load_rows, read_rows
from tests.support import (
    DEFAULT_HEADING,
    KNOB_COLUMNS,
    OLD_COLUMNS,
    N,
    build_report,
    context_section,
    planned_plots,
    trial,
    write_csv,
)


def test_rows_that_differ_only_in_attn_implementation_both_appear(tmp_path):
    rows = [
        trial("torch", "backprop", attn_implementation="eager", excess_mem_mb=400.0),
        trial("torch", "backprop", attn_implementation="sdpa", excess_mem_mb=333.0),  # later: it used to win
        trial("jax", "backprop", attn_implementation="eager", excess_mem_mb=520.0),
    ]
    csv_path = write_csv(tmp_path / "runs.csv", rows)
    rep = build_report([csv_path], tmp_path / "out")
    md = rep.path.read_text()
    table = context_section(md, DEFAULT_HEADING)  # one context: attention is part of the mode's name
    assert "| torch | backprop | " in table and "| 400 |" in table
    assert "| torch | backprop(attn=sdpa) | " in table and "| 333 |" in table
    assert "| backprop: jax / torch |" in md  # eager against eager
    bars = next(p for p in planned_plots([csv_path]) if p.name == "excess_memory").grid[0][0]
    assert bars.categories == ["backprop", "backprop(attn=sdpa)"]


def test_rows_that_differ_only_in_learning_rate_both_appear(tmp_path):
    rows = [
        trial("torch", "backprop", lr="1e-3", excess_mem_mb=400.0),  # the default, written another way
        trial("torch", "backprop", lr=0.0001, excess_mem_mb=444.0),
        trial("torch", "jvp", lr=0.001, excess_mem_mb=200.0),
    ]
    md = build_report([write_csv(tmp_path / "runs.csv", rows)], tmp_path / "out").path.read_text()
    default = context_section(md, DEFAULT_HEADING)
    assert "| torch | backprop | " in default and "| 400 |" in default and "| torch | jvp | " in default
    low = context_section(md, DEFAULT_HEADING.replace("· sgd ·", "· sgd (lr 0.0001) ·"))
    assert "| torch | backprop | " in low and "| 444 |" in low and "| jvp |" not in low
    assert "| torch: jvp / backprop | " in md.split("(lr 0.0001)")[0]  # the ratio stays within one learning rate


@pytest.mark.parametrize(
    ("column", "default", "other", "shown"),
    [
        ("attn_implementation", "eager", "sdpa", "backprop(attn=sdpa)"),
        ("mezo_eps", "0.001", "1e-4", "mezo(eps=0.0001)"),
        ("dropout", "0.1", "0", "· fp32 · dropout 0 ·"),
        ("lr", "1e-3", "0.01", "sgd (lr 0.01)"),
        ("momentum", "0", "0.9", "sgd (momentum 0.9)"),
        ("weight_decay", "0.0", "0.01", "sgd (weight decay 0.01)"),
        ("beta1", "0.9", "0.8", "sgd (beta1 0.8)"),
        ("beta2", "0.999", "0.99", "sgd (beta2 0.99)"),
        ("adam_eps", "1e-08", "1e-6", "sgd (eps 1e-06)"),
    ],
)
def test_every_knob_separates_rows_and_names_its_value(column, default, other, shown):
    mode = "mezo" if column == "mezo_eps" else "backprop"
    a, b = trial("torch", mode, **{column: default}), trial("torch", mode, **{column: other})
    contexts = group_contexts(select([a, b]))
    named = [f"{context_label(key)} | {label}" for key, cells in contexts.items() for _, label in cells]
    assert len(named) == 2, named  # two cells: the later row no longer hides the earlier one
    assert named[0] == f"{DEFAULT_HEADING} | {mode}"  # at the default (however written): the usual label
    assert shown in named[1], named
    assert knob(a, column) == knob({"optimizer": "sgd"}, column)


def test_a_csv_without_the_knob_columns_builds_and_meets_a_newer_one(tmp_path):
    old = write_csv(tmp_path / "old" / "runs.csv", [trial("torch", "backprop", excess_mem_mb=400.0)], OLD_COLUMNS)
    assert not set(KNOB_COLUMNS) & set(load_rows([old])[0])
    new = write_csv(
        tmp_path / "new" / "runs.csv",
        [
            trial(
                "jax",
                "backprop",
                excess_mem_mb=520.0,
                attn_implementation="eager",
                lr=0.001,
                dropout=0.1,
                mezo_eps=0.001,
            )
        ],
    )
    md = build_report([old], tmp_path / "out-old").path.read_text()
    assert "| torch | backprop | " in context_section(md, DEFAULT_HEADING)
    md = build_report([old, new], tmp_path / "out").path.read_text()
    table = context_section(md, DEFAULT_HEADING)  # a missing knob reads as its default: one context
    assert "| torch | backprop | " in table and "| jax | backprop | " in table
    assert "| backprop: jax / torch | " in md


# ------------------------------------------------------------------------------------- what sweeps still use


def test_summary_table_and_variant_still_work(tmp_path):
    rows = [
        trial("torch", "backprop", excess_mem_mb=400.0, step_time_median_s=0.0125),
        trial("jax", "jvp", num_tangents=4),
        trial("torch", "jvp", jvp_impl="naive"),
        trial("torch", "backprop", remat=True, trainable="head"),
        trial("torch", "mezo", compile=True),
        trial("jax", "mezo", "oom", error="RESOURCE_EXHAUSTED"),
    ]
    read = read_rows(write_csv(tmp_path / "runs.csv", rows))
    text = summary_table(read)
    lines = text.splitlines()
    assert lines[0].split() == [
        "framework",
        "mode",
        "model",
        "status",
        "excess",
        "MiB",
        "peak",
        "MiB",
        "step",
        "ms",
        "compile",
        "s",
        "samples/s",
        "loss",
        "first->last",
    ]
    assert lines[2].split()[:7] == ["torch", "backprop", "minilm_l6", "ok", "400", lines[2].split()[5], "12.5"]
    assert [variant(r) for r in read] == [
        "backprop",
        "jvp(K=4)",
        "jvp[naive]",
        "backprop+remat[head]",
        "mezo+compile",
        "mezo",
    ]
    assert lines[-1].strip().endswith(": oom: RESOURCE_EXHAUSTED")
    assert summary_table([]) == "(no trials recorded)"
    assert num({"x": "nan"}, "x") is None and num({"x": "2.5"}, "x") == 2.5


def test_lora_rows_are_named_by_every_setting_away_from_its_default():
    lora = {
        "mode": "mezo",
        "trainable": "lora",
        "lora_rank": "8",
        "lora_alpha": "16.0",
        "lora_dropout": "0.0",
        "lora_targets": "query+value",
    }
    assert variant(lora) == "mezo[lora(r=8)]"
    assert scope_label({**lora, "lora_rank": "4", "lora_alpha": "8.0"}) == "lora(r=4, alpha=8)"
    every = "+".join(LORA_ROLES)
    assert scope_label({**lora, "lora_targets": every, "lora_dropout": "0.1"}) == "lora(r=8, all_linear, dropout=0.1)"
    assert scope_label({**lora, "lora_targets": "query+key"}) == "lora(r=8, query+key)"
    assert scope_label({"trainable": "last_k", "last_k": "2"}) == "last_k=2" and scope_label({}) == "all"


# ---------------------------------------------------------------------------------------------- beyond one device


def test_a_ddp_and_a_single_device_row_at_one_batch_both_appear_labelled_apart(tmp_path):
    rows = [
        trial("torch", "backprop", excess_mem_mb=400.0),
        trial(
            "torch",
            "backprop",
            excess_mem_mb=410.0,
            parallel="ddp",
            devices=2,
            nodes=1,
            world_size=2,
            global_batch_size=16,
            comm_bytes_per_step=4 * N + 4,
            comm_bytes_expected=4 * N + 4,
        ),
    ]
    md = build_report([write_csv(tmp_path / "runs.csv", rows)], tmp_path / "out").path.read_text()
    single = context_section(md, DEFAULT_HEADING)  # the usual label, unchanged
    assert "| torch | backprop | " in single and "| 400 |" in single and "| 410 |" not in single
    ddp = context_section(md, f"{DEFAULT_HEADING} · ddp × 2 devices")
    assert "| torch | backprop | " in ddp and "| 410 |" in ddp and "| 400 |" not in ddp


@pytest.mark.parametrize(
    ("settings", "shown"),
    [
        ({"parallel": "ddp", "devices": 2}, " · ddp × 2 devices"),
        ({"parallel": "ddp", "devices": 1}, " · ddp × 1 device"),
        ({"parallel": "fsdp", "devices": 2}, " · fsdp FULL_SHARD × 2 devices"),
        ({"parallel": "fsdp", "devices": 2, "fsdp_reshard_after_forward": False}, " · fsdp SHARD_GRAD_OP × 2 devices"),
        ({"parallel": "fsdp", "devices": 2, "fsdp_offload": True}, " · fsdp FULL_SHARD × 2 devices + CPU offload"),
        ({"parallel": "ddp", "devices": 2, "nodes": 2}, " · ddp × 2 nodes × 2 devices"),
        (
            {
                "parallel": "none",
                "devices": 1,
                "nodes": 1,
                "fsdp_reshard_after_forward": "true",
                "fsdp_offload": "False",
            },
            "",
        ),
    ],
)
def test_parallel_settings_separate_rows_and_are_named_last_in_the_label(settings, shown):
    single, spread = trial("torch", "backprop"), trial("torch", "backprop", **settings)
    assert context_label(context_key(spread)) == DEFAULT_HEADING + shown
    contexts = group_contexts(select([single, spread]))
    assert len(contexts) == (2 if shown else 1)  # at the defaults, however written: the same context


def test_summary_table_names_the_strategy_only_when_a_trial_has_one(tmp_path):
    rows = [
        trial("torch", "backprop"),
        trial("torch", "backprop", parallel="ddp", devices=2),
        trial("jax", "mezo", parallel="fsdp", devices=2, fsdp_reshard_after_forward=True),
    ]
    read = read_rows(write_csv(tmp_path / "runs.csv", rows))
    lines = summary_table(read).splitlines()
    assert lines[0].split()[:4] == ["framework", "mode", "parallel", "model"]
    assert [line.split()[:3] for line in lines[2:]] == [
        ["torch", "backprop", "none"],
        ["torch", "backprop", "ddp×2"],
        ["jax", "mezo", "fsdp×2"],
    ]
    assert "parallel" not in summary_table(read[:1]).splitlines()[0]  # single-device sweeps: as before
