"""The report (bench/report.py, with bench/results.py and bench/plots.py) built from results CSVs these tests write
with the real CsvSink: tables, ratios, the UMass study's table, real PNG plots, failed trials listed and never
plotted, rows that differ in a knob kept apart, and the command line's errors."""

from __future__ import annotations

import hashlib
import itertools
import json
import math
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from bench.config import model_preset
from bench.parallel import expected_comm_bytes
from bench.parallel_report import FLAG, comm_mismatch
from bench.plots import plan_plots
from bench.report import build_report, depth_growth, main
from bench.results import (
    OPTIMIZER_DEFAULTS,
    context_key,
    context_label,
    group_contexts,
    knob,
    load_rows,
    select,
    summary_table,
    variant,
)
from bench.sinks import CSV_COLUMNS, CsvSink, read_rows
from bench.tables import num

REPO = Path(__file__).resolve().parent.parent
PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"
MIB = 2**20

# A value no ok row has: carried by failed and superseded rows, it must never reach a table or a plot.
POISON = 987654.0

_clock = itertools.count()

# What identifies a configuration in these tests (the runner hashes the whole composed config the same way).
IDENTITY = ("framework", "mode", "model", "num_layers", "data", "trainable", "optimizer", "batch_size", "seq_len",
            "steps", "epochs", "seed", "remat", "num_tangents", "jvp_impl", "last_k", "attn_implementation",
            "mezo_eps", "dropout", "lr", "momentum", "weight_decay", "beta1", "beta2", "adam_eps", "parallel",
            "devices", "nodes", "fsdp_reshard_after_forward", "fsdp_offload")  # fmt: skip

MINILM = dict(model="minilm_l6", num_layers=6, hidden_size=384, batch_size=8, seq_len=128, n_params=22_714_756,
              n_trainable=22_714_756)  # fmt: skip


def bert_params(layers: int) -> int:
    # BERT-base: embeddings 23.8M, 7.09M per encoder layer, pooler + classifier 0.59M
    return 23_837_184 + 7_087_872 * layers + 593_668


def trial(framework: str, mode: str, status: str = "ok", **kw) -> dict:
    """One results row as the runner writes it; numbers follow a simple cost model unless given."""
    i = next(_clock)
    r = {
        "run_id": f"20261123-{i:06d}-{framework}-{mode}",
        "started_at": f"2026-11-23T{10 + i // 3600:02d}:{i // 60 % 60:02d}:{i % 60:02d}+00:00",
        "framework": framework, "mode": mode, "data": "synthetic", "trainable": "all", "optimizer": "sgd",
        "steps": 5, "seed": 0, "remat": False, "num_tangents": 1, "device": "cpu", "device_name": "AMD EPYC x2",
        "dtype": "fp32", "jvp_impl": "func", "status": status, "sweep_id": "20261123-000000-abcdef",
        "experiment": "default_bench", "git_sha": "de9bbbd",
        "torch_version": "2.13.0+cpu", "jax_version": "0.10.2", "warmup_steps": 1, "grad_accum": 1, "last_k": 1,
        **MINILM,
    }  # fmt: skip
    r.update(kw)
    r.setdefault("config_hash", hashlib.sha1(json.dumps([r.get(k) for k in IDENTITY]).encode()).hexdigest()[:12])
    if status != "ok":
        r.setdefault("error", f"{status}: something went wrong")
        return r
    n, per_sample = r["n_trainable"], r["num_layers"] * r["batch_size"] * r["seq_len"] / 64  # MiB, made up
    param_mb = n * 4 / MIB
    excess = {"inference": 10 + per_sample / r["num_layers"], "backprop": 10 + per_sample + param_mb,
              "jvp": 10 + 2 * per_sample / r["num_layers"] + 2 * param_mb, "jacfwd": 12 + param_mb,
              "mezo": 10 + per_sample / r["num_layers"]}[mode]  # fmt: skip
    step = {"inference": 0.1, "backprop": 0.3, "jvp": 0.35, "jacfwd": 2e-4 * n, "mezo": 0.2}[mode]
    step *= r["num_layers"] * r["batch_size"] * r["seq_len"] / 6144
    r.setdefault("excess_mem_mb", excess)
    r.setdefault("peak_mem_mb", r["excess_mem_mb"] + 300 + r["n_params"] * 4 / MIB)
    r.setdefault("baseline_mem_mb", r["peak_mem_mb"] - r["excess_mem_mb"])
    r.setdefault("mem_method", "rss_hwm")
    r.setdefault("step_time_median_s", step)
    r.setdefault("step_time_p10_s", r["step_time_median_s"] * 0.9)
    r.setdefault("step_time_p90_s", r["step_time_median_s"] * 1.2)
    r.setdefault("compile_time_s", 1.5 if framework == "torch" else 9.0)
    r.setdefault("samples_per_s", r["batch_size"] / r["step_time_median_s"])
    r.setdefault("loss_first", 1.39)
    r.setdefault("loss_last", 1.38)
    r.setdefault("steps_timed", r["steps"])
    r.setdefault("total_train_time_s", r["step_time_median_s"] * r["steps"])
    return r


def main_context() -> list[dict]:
    """`make bench`'s comparison with a superseded ok row, a failure re-run ok, and a jacfwd that ran out of memory."""
    rows = [trial("torch", "backprop", excess_mem_mb=POISON, peak_mem_mb=POISON + 1)]  # superseded below
    rows.append(trial("torch", "jvp", "oom", error="CUDA out of memory. Tried to allocate 2.00 GiB", device="auto"))
    for fw in ("torch", "jax"):
        rows += [
            trial(fw, "inference", excess_mem_mb=58.0 if fw == "torch" else 73.0),
            trial(fw, "backprop", excess_mem_mb=400.0 if fw == "torch" else 520.0,
                  step_time_median_s=3.2 if fw == "torch" else 2.56),
            trial(fw, "backprop", remat=True, excess_mem_mb=318.0 if fw == "torch" else 500.0),
            trial(fw, "jvp", excess_mem_mb=200.0 if fw == "torch" else 300.0,
                  step_time_median_s=3.2 if fw == "torch" else 2.0),
            trial(fw, "mezo", excess_mem_mb=116.0 if fw == "torch" else 114.0),
        ]  # fmt: skip
    rows.append(trial("torch", "jacfwd", trainable="head", n_trainable=148_996, step_time_median_s=21.0))
    # jax's jacfwd died before it knew its device: the row carries the configured one ("auto") and a poisoned number
    rows.append(trial("jax", "jacfwd", "oom", trainable="head", device="auto", device_name="",
                      peak_mem_mb=POISON, excess_mem_mb=POISON,
                      error="RESOURCE_EXHAUSTED: Out of memory allocating 5368709120 bytes."))  # fmt: skip
    return rows


def scaling_rows() -> list[dict]:
    rows = []
    bert = dict(model="bert_base", hidden_size=768, batch_size=4, seq_len=128, steps=2)
    for layers in (1, 2, 4, 8):
        n = bert_params(layers)
        for fw in ("torch", "jax"):
            for mode in ("inference", "backprop", "jvp", "mezo"):
                rows.append(trial(fw, mode, experiment="depth_scaling", **{**bert, "num_layers": layers},
                                  n_params=n, n_trainable=n))  # fmt: skip
    rows.append(trial("torch", "backprop", "crashed", experiment="depth_scaling", **{**bert, "num_layers": 12},
                      n_params=bert_params(12), n_trainable=bert_params(12),
                      error="trial process died (signal 9): Killed\nlast line of the log"))  # fmt: skip
    n = bert_params(4)
    for fw in ("torch", "jax"):
        for mode in ("backprop", "jvp", "mezo"):
            for t in (32, 64, 256):  # 128 is the depth sweep's 4-layer row: the same configuration
                rows.append(trial(fw, mode, experiment="seq_scaling", **{**bert, "num_layers": 4, "seq_len": t},
                                  n_params=n, n_trainable=n))  # fmt: skip
            for b in (1, 2, 8):
                rows.append(trial(fw, mode, experiment="batch_scaling", **{**bert, "num_layers": 4, "batch_size": b},
                                  n_params=n, n_trainable=n))  # fmt: skip
    rows.append(trial("jax", "mezo", "timeout", experiment="batch_scaling",
                      **{**bert, "num_layers": 4, "batch_size": 64},
                      error="no result within timeout_s=1800"))  # fmt: skip
    return rows


def grad_quality_rows() -> list[dict]:
    rows = []
    tiny = dict(model="tiny", num_layers=2, hidden_size=32, batch_size=4, seq_len=32, steps=2, n_params=70_000)
    for scope, n in (("head", 1188), ("bias", 772)):
        for fw in ("torch", "jax"):
            for k in (1, 4, 16, 64, 256):
                rows.append(trial(fw, "jvp", experiment="grad_quality", trainable=scope, n_trainable=n, num_tangents=k,
                                  grad_cosine=math.sqrt(k / (k + n - 1)) * (0.95 if fw == "torch" else 1.05),
                                  **tiny))  # fmt: skip
            rows.append(trial(fw, "mezo", experiment="grad_quality", trainable=scope, n_trainable=n, grad_cosine=0.03,
                              **tiny))  # fmt: skip
    for scope, n in (("bias", 772), ("head", 1188), ("last_k", 18_276)):
        for fw in ("torch", "jax"):
            for mode in ("backprop", "jvp", "jacfwd"):
                rows.append(trial(fw, mode, experiment="jacfwd_scaling", trainable=scope, n_trainable=n, last_k=2,
                                  grad_cosine=1.0 if mode != "jvp" else 0.03, **{**tiny, "steps": 3}))  # fmt: skip
    rows.append(trial("jax", "mezo", "error", experiment="grad_quality", trainable="last_k", last_k=2,
                      n_trainable=18_276, error="ValueError: mezo_eps=0: must be > 0", **tiny))  # fmt: skip
    return rows


def study_rows() -> list[dict]:
    study = dict(experiment="seed_agnews", model="bert_base", num_layers=12, hidden_size=768, optimizer="adamw",
                steps=625, epochs=5, warmup_steps=2, n_params=bert_params(12), n_trainable=bert_params(12))  # fmt: skip
    numbers = {("torch", "backprop"): (2100.0, 1200.0, 310.0, 0.91), ("torch", "jvp"): (1500.0, 600.0, 290.0, 0.42),
               ("jax", "backprop"): (2300.0, 1400.0, 250.0, 0.90), ("jax", "jvp"): (1700.0, 800.0, 240.0, 0.44)}
    return [trial(fw, mode, peak_mem_mb=peak, excess_mem_mb=excess, total_train_time_s=total, eval_accuracy=acc,
                  eval_loss=0.5, **study) for (fw, mode), (peak, excess, total, acc) in numbers.items()]  # fmt: skip


def pathology_rows() -> list[dict]:
    ctx = dict(experiment="jvp_pathology", model="bert_base", num_layers=4, hidden_size=768, steps=2,
               n_params=bert_params(4), n_trainable=bert_params(4))  # fmt: skip
    return [trial("torch", "inference", excess_mem_mb=60.0, **ctx),
            trial("torch", "backprop", excess_mem_mb=900.0, **ctx),
            trial("torch", "jvp", jvp_impl="naive", excess_mem_mb=1800.0, **ctx),
            trial("torch", "jvp", jvp_impl="func", excess_mem_mb=450.0, **ctx),
            trial("torch", "jvp", jvp_impl="dual", excess_mem_mb=470.0, **ctx)]  # fmt: skip


# Beyond one device: conf/experiment/scale_out.yaml and strategy_table.yaml's trials, MiniLM at 4 samples per device.
SCALE = dict(model="minilm_l6", num_layers=6, hidden_size=384, optimizer="adamw", batch_size=4, seq_len=128, steps=3)
N = MINILM["n_trainable"]
MINILM_SPEC = model_preset("minilm_l6")[0].to_dict()  # FSDP2's expected gathers pad each tensor's rows
PARAM_MB = N * 4 / MIB  # one fp32 copy of MiniLM's parameters: 86.6 MiB
FSDP_JVP_REFUSED = ("ConfigError: mode=jvp with parallel=fsdp, framework=torch: forward-mode AD through FSDP2's "
                    "sharded (DTensor) parameters is not supported by torch")  # fmt: skip


def parallel_trial(framework: str, mode: str, parallel: str = "none", devices: int = 1, reshard: bool = True,
                   offload: bool = False, status: str = "ok", counted: float | None = None, **kw) -> dict:
    """A row as the runner writes it for a trial on `devices` devices: memory is the largest device's, step time
    the slowest's, samples/s the global batch's; the bytes expected are bench.parallel's formula, the bytes counted
    the same unless given."""
    c = {"framework": framework, "parallel": parallel, "devices": devices, "nodes": 1, "mode": mode,
         "num_tangents": 1, "grad_accum": 1, "fsdp_reshard_after_forward": reshard, "trainable": "all", "last_k": 1,
         "model": MINILM_SPEC}  # fmt: skip
    shards = devices if parallel == "fsdp" else 1
    r = dict(SCALE, experiment="scale_out", parallel=parallel, devices=devices, nodes=1, world_size=devices,
             global_batch_size=4 * devices, fsdp_reshard_after_forward=reshard, fsdp_offload=offload,
             jvp_impl="lazy" if framework == "torch" else "func")  # fmt: skip
    if status == "ok":
        params, optimizer = PARAM_MB / shards, 2 * PARAM_MB / shards  # AdamW: two moments per parameter
        excess = {"backprop": 60.0 + params, "jvp": 30.0, "mezo": 20.0}[mode] + (5.0 if parallel == "ddp" else 0.0)
        step = {"backprop": 0.3, "jvp": 0.35, "mezo": 0.2}[mode] * (1.0 + 0.3 * (devices - 1))
        step = kw.pop("step_time_median_s", step)
        r.update(excess_mem_mb=excess, peak_mem_mb=excess + 250 + params + optimizer, mem_params_mb=params,
                 mem_optimizer_mb=optimizer, step_time_median_s=step, samples_per_s=4 * devices / step,
                 mem_method="xla_memory_analysis" if framework == "jax" and devices > 1 else "rss_hwm")  # fmt: skip
        if parallel != "none":
            expected = expected_comm_bytes(c, N, N)
            r.update(comm_bytes_expected=expected, comm_bytes_per_step=expected if counted is None else counted)
    r.update(kw)
    return trial(framework, mode, status, **r)


def scale_out_rows() -> list[dict]:
    """scale_out (torch and jax, ddp and fsdp, 1 and 2 devices, backprop / jvp / mezo: torch refuses jvp under
    fsdp), then strategy_table (torch on 2 devices: ddp, SHARD_GRAD_OP, FULL_SHARD; its ddp and FULL_SHARD trials
    are scale_out's configurations again, measured later), and the single-device trials of the same work."""
    rows = []
    for fw, parallel, devices, mode in itertools.product(("torch", "jax"), ("ddp", "fsdp"), (1, 2),
                                                         ("backprop", "jvp", "mezo")):  # fmt: skip
        if (fw, parallel, mode) == ("torch", "fsdp", "jvp"):
            rows.append(parallel_trial(fw, mode, parallel, devices, status="error", error=FSDP_JVP_REFUSED))
        else:
            rows.append(parallel_trial(fw, mode, parallel, devices))
    for (parallel, reshard), mode in itertools.product((("ddp", True), ("fsdp", False), ("fsdp", True)),
                                                       ("backprop", "jvp", "mezo")):  # fmt: skip
        if (parallel, mode) == ("fsdp", "jvp"):
            rows.append(parallel_trial("torch", mode, parallel, 2, reshard, status="error", error=FSDP_JVP_REFUSED,
                                       experiment="strategy_table"))  # fmt: skip
        else:
            step = 0.5 if reshard else 0.45  # FULL_SHARD gathers once more than SHARD_GRAD_OP
            rows.append(parallel_trial("torch", mode, parallel, 2, reshard, experiment="strategy_table",
                                       step_time_median_s=step if parallel == "fsdp" else 0.4))  # fmt: skip
    for fw, mode in itertools.product(("torch", "jax"), ("backprop", "jvp", "mezo", "inference")):
        extra = {} if mode != "inference" else {"excess_mem_mb": 9.0, "peak_mem_mb": 600.0}
        rows.append(parallel_trial(fw, mode, experiment="default_bench", **extra) if mode != "inference"
                    else trial(fw, mode, experiment="default_bench", **{**SCALE, **extra}))  # fmt: skip
    return rows


def write_device_histories(results: Path, rows: list[dict], imbalanced: str = "") -> None:
    """Each parallel trial's history JSON with every device's memory (the row holds the largest); in the trial
    whose run_id is `imbalanced`, the second device holds 20% less."""
    (results / "history").mkdir(exist_ok=True)
    for r in rows:
        if r["status"] != "ok" or r.get("parallel", "none") == "none":
            continue
        devices = []
        for rank in range(r["devices"]):
            less = 0.8 if rank == 1 and r["run_id"] == imbalanced else 1.0
            devices.append({"device": f"cpu:{rank}", "rank": rank, "peak_mem_mb": r["peak_mem_mb"] * less,
                            "excess_mem_mb": r["excess_mem_mb"] * less, "baseline_mem_mb": r["peak_mem_mb"] -
                            r["excess_mem_mb"], "mem_method": r["mem_method"], "mem_params_mb": r["mem_params_mb"],
                            "mem_optimizer_mb": r["mem_optimizer_mb"],
                            "step_time_median_s": r["step_time_median_s"]})  # fmt: skip
        history = {"loss": [1.39, 1.38, 1.37], "step_time_s": [r["step_time_median_s"]] * 3, "devices": devices}
        (results / "history" / f"{r['run_id']}.json").write_text(json.dumps(history))


# Knobs the runner records in runs.csv; an older CSV has none of these columns.
KNOB_COLUMNS = ("attn_implementation", "mezo_eps", "dropout", "lr", "momentum", "weight_decay", "beta1", "beta2",
                "adam_eps")  # fmt: skip
# Beyond one device; an older CSV has none of these either.
PARALLEL_CSV_COLUMNS = ("parallel", "devices", "nodes", "world_size", "global_batch_size",
                        "fsdp_reshard_after_forward", "fsdp_offload", "comm_bytes_per_step", "comm_bytes_expected",
                        "mem_params_mb", "mem_optimizer_mb")  # fmt: skip
COLUMNS = CSV_COLUMNS + tuple(c for c in KNOB_COLUMNS if c not in CSV_COLUMNS)
OLD_COLUMNS = tuple(c for c in CSV_COLUMNS if c not in KNOB_COLUMNS + PARALLEL_CSV_COLUMNS)


def write_csv(path: Path, rows: list[dict], columns: tuple[str, ...] = COLUMNS) -> Path:
    sink = CsvSink(path, columns)
    for r in rows:
        sink.write(r)
    return path


def write_history(results: Path, row: dict, steps: int, eval_every: int) -> None:
    rng = np.random.default_rng(len(row["run_id"]) + steps)
    loss = (1.4 * np.exp(-np.arange(steps) / (steps / 2 if row["mode"] == "backprop" else steps * 4))
            + 0.05 * rng.standard_normal(steps))  # fmt: skip
    acc = [None] * steps
    for i in range(eval_every - 1, steps, eval_every):
        acc[i] = row["eval_accuracy"] * (i + 1) / steps
    history = {"loss": loss.tolist(), "step_time_s": [0.5] * steps, "eval_accuracy": acc}
    (results / "history").mkdir(exist_ok=True)
    (results / "history" / f"{row['run_id']}.json").write_text(json.dumps(history))


@pytest.fixture(scope="module")
def full(tmp_path_factory):
    """Every experiment's rows in one CSV (failures included), with the UMass study runs' history JSONs, and its
    report."""
    results = tmp_path_factory.mktemp("results")
    scale = scale_out_rows()
    rows = main_context() + scaling_rows() + grad_quality_rows() + study_rows() + pathology_rows() + scale
    csv_path = write_csv(results / "runs.csv", rows)
    for r in rows:
        if r.get("experiment") == "seed_agnews":
            write_history(results, r, 625, 125)
    imbalanced = next(r for r in scale if r["framework"] == "jax" and r.get("parallel") == "ddp"
                      and r["devices"] == 2 and r["mode"] == "backprop")  # fmt: skip
    write_device_histories(results, scale, imbalanced["run_id"])
    (results / "history" / "not-a-run.json").write_text("{broken")  # ignored: no row names it
    before = csv_path.read_bytes(), os.stat(csv_path).st_mtime_ns
    out = results / "report"
    rep = build_report([csv_path], out)
    return {"rows": rows, "csv": csv_path, "before": before, "out": out, "report": rep,
            "md": (out / "report.md").read_text()}  # fmt: skip


def assert_real_png(path: Path) -> None:
    from matplotlib.image import imread

    data = path.read_bytes()
    assert data[:8] == PNG_SIGNATURE, path
    assert len(data) > 10_000, f"{path}: {len(data)} bytes"
    img = imread(path)
    assert img.shape[0] >= 250 and img.shape[1] >= 400, img.shape
    rgb = img[..., :3].reshape(-1, 3)
    assert rgb.std() > 0.05, f"{path}: nearly uniform"
    packed = (rgb * 255).astype(np.uint32) @ np.array([1 << 16, 1 << 8, 1], dtype=np.uint32)  # one int per colour
    assert len(np.unique(packed)) > 30, f"{path}: too few colours to be a plot"


def first_table(text: str) -> list[str]:
    """The lines of the first markdown table in text."""
    lines = text.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith("| "))
    end = next((i for i in range(start, len(lines)) if not lines[i].startswith("|")), len(lines))
    return lines[start:end]


# ------------------------------------------------------------------------------------------------- the report


def test_every_plot_is_drawn_as_a_real_png_and_embedded_with_how_to_read(full):
    plots = {p.name: p for p in full["report"].plots}
    assert set(plots) == {"excess_memory", "step_time", "memory_vs_depth", "memory_vs_seq_len", "memory_vs_batch",
                          "jacfwd_vs_trainable", "grad_quality", "training_curves", "memory_vs_devices",
                          "comm_bytes"}  # fmt: skip
    for name, p in plots.items():
        assert p.drawn, f"{name} skipped: needs {p.needs}"
        assert p.path == full["out"] / "plots" / f"{name}.png"
        assert_real_png(p.path)
        link = f"![{p.title}](plots/{name}.png)"
        assert link in full["md"]
        after = full["md"].split(link, 1)[1].lstrip("\n")
        assert after.startswith(f"*How to read it:* {p.how_to_read}")
    assert "Skipped for lack of data" not in full["md"]


def test_the_csv_is_never_modified(full):
    assert (full["csv"].read_bytes(), os.stat(full["csv"]).st_mtime_ns) == full["before"]


def test_framework_by_mode_table_has_the_latest_ok_row_and_says_so(full):
    md = full["md"]
    lines = first_table(md.split("### minilm_l6 (6 layers, hidden 384) · synthetic · B8 T128 · sgd", 1)[1])
    table = "\n".join(lines)
    assert lines[0].startswith("| framework | mode | peak MiB | excess MiB | compile s | step ms (median) | samples/s")
    assert "| torch | backprop | " in table and "| 400 |" in table  # the later of the two ok backprop rows
    assert str(int(POISON)) not in md
    assert "latest ok row" in md
    # mode order, torch before jax within a mode
    modes = [line.split(" | ")[1] for line in lines[2:]]
    assert modes[:6] == ["inference", "inference", "backprop", "backprop", "backprop+remat", "backprop+remat"]
    assert modes[6:] == ["jvp", "jvp", "jacfwd[head]", "jacfwd[head]", "mezo", "mezo"]  # the scope is in the name


def test_ratios_that_matter(full):
    section = full["md"].split("### minilm_l6", 1)[1].split("\n### ", 1)[0]
    assert "| torch: jvp / backprop | " in section
    row = next(line for line in section.splitlines() if line.startswith("| torch: jvp / backprop |"))
    assert row.split(" | ")[2] == "0.50×"  # excess memory 200 / 400
    assert row.split(" | ")[3] == "1.00×"  # step time 3.2 / 3.2
    row = next(line for line in section.splitlines() if line.startswith("| jvp: jax / torch |"))
    assert row.split(" | ")[2] == "1.50×" and row.split(" | ")[3] == "0.62×"  # 300 / 200, 2.0 / 3.2
    assert "| torch: mezo / inference | " in section and "| jax: mezo / inference | " in section
    assert "jacfwd[head]: jax / torch" not in section  # jax's jacfwd failed: nothing to divide


def test_study_table_in_the_umass_studys_order(full):
    section = full["md"].split("## The UMass forward-AD study's table", 1)[1].split("\n## ", 1)[0]
    lines = [line for line in section.splitlines() if line.startswith("| ")]
    assert lines[0].startswith("|  | Peak memory (MiB) | Excess memory (MiB) | Total training time (s) | Eval accuracy")
    names = [line.split(" | ")[0].strip("| ") for line in lines[1:]]  # [0] is the header; "|:---" the rule
    assert names == ["PyTorch backprop", "PyTorch JVP", "JAX backprop", "JAX JVP"]
    assert lines[2].split(" | ")[1:5] == ["1500", "600", "290", "42.0%"]


def test_failed_rows_are_listed_with_status_and_error(full):
    md = full["md"]
    failed = [r for r in full["rows"] if r["status"] != "ok"]
    assert {r["status"] for r in failed} == {"oom", "crashed", "error", "timeout"}
    section = md.split("## Trials that did not finish", 1)[1]
    for r in failed:
        line = next(ln for ln in section.splitlines() if ln.startswith(f"| {r['run_id']} |"))
        assert f"| {r['status']} |" in line
        assert r["error"].splitlines()[0][:40] in line
    oom_first = next(ln for ln in section.splitlines() if "CUDA out of memory" in ln)
    assert "| yes |" in oom_first  # torch jvp failed first, then ran ok
    # in its cell: jax's jacfwd never ran ok, so the table shows its status instead of numbers
    assert "| jax | jacfwd[head] | **oom** |" in md
    assert "| jax | mezo[last_k] | **error** |" in md


def test_failed_rows_are_never_plotted(full):
    rows = load_rows([full["csv"]])
    sel = select(rows)
    plots = plan_plots(sel, group_contexts(sel))
    values = [y for p in plots for row in p.grid for panel in row for s in panel.series for y in s.ys]
    assert values and POISON not in values and POISON + 1 not in values
    excess = next(p for p in plots if p.name == "excess_memory").grid[0][0]
    assert "minilm_l6" in excess.title
    jax = next(s for s in excess.series if s.framework == "jax")
    assert "jacfwd[head]" not in [excess.categories[int(x)] for x in jax.xs]
    torch = next(s for s in excess.series if s.framework == "torch")
    assert "jacfwd[head]" in [excess.categories[int(x)] for x in torch.xs]
    # the crashed 12-layer backprop is not a point of the depth plot
    depth = next(p for p in plots if p.name == "memory_vs_depth").grid[0][0]
    assert all(s.xs == [1.0, 2.0, 4.0, 8.0] for s in depth.series)


def test_depth_growth_is_the_slope_per_layer_against_a_layers_parameters(full):
    sel = select(load_rows([full["csv"]]))
    (key, body), = depth_growth(sel.ok)
    table = {(r[0], r[1]): r for r in body}
    layer_mb = 7_087_872 * 4 / MIB  # the cost model: backprop keeps 8 MiB of activations per layer and a gradient
    assert table["torch", "backprop"][2] == "1 → 8"  # the crashed 12-layer row is not a point
    assert float(table["torch", "backprop"][4]) == pytest.approx(8 + layer_mb, abs=0.05)
    assert table["torch", "backprop"][5] == f"{layer_mb:.1f}"
    assert table["jax", "jvp"][6] == f"{2 * layer_mb / layer_mb:.2f}×"  # two parameter-sized buffers per layer
    assert table["jax", "mezo"][4] == "0.0" and table["jax", "mezo"][6] == "0.00×"  # flat in depth
    assert "## Memory growth with depth" in full["md"] and "| torch | jvp | 1 → 8 |" in full["md"]


def test_scaling_plots_show_what_the_sweeps_varied(full):
    rows = load_rows([full["csv"]])
    sel = select(rows)
    plots = {p.name: p for p in plan_plots(sel, group_contexts(sel))}
    memory = plots["memory_vs_depth"].grid[0][0]
    lines = {s.label: s for s in memory.series}
    depth_rows = {r["num_layers"]: r["excess_mem_mb"] for r in full["rows"] if r.get("experiment") == "depth_scaling"
                  and r["framework"] == "torch" and r["mode"] == "backprop" and r["status"] == "ok"}  # fmt: skip
    assert lines["torch backprop"].xs == [1, 2, 4, 8]
    assert lines["torch backprop"].ys == pytest.approx([depth_rows[n] for n in (1, 2, 4, 8)])
    guide = next(s for s in memory.series if s.guide)
    assert guide.ys[0] == pytest.approx(bert_params(1) * 4 / MIB)
    assert [s.xs for s in plots["memory_vs_seq_len"].grid[0][0].series if s.label == "jax mezo"] == [[32, 64, 128, 256]]
    assert [s.xs for s in plots["memory_vs_batch"].grid[0][0].series if s.label == "jax mezo"] == [[1, 2, 4, 8]]
    jacfwd = plots["jacfwd_vs_trainable"].grid[0][0]
    assert [s.xs for s in jacfwd.series if s.label == "torch jacfwd"] == [[772, 1188, 18276]]
    quality = plots["grad_quality"].grid
    assert len(quality) == 2  # head and bias
    q = quality[0][0]
    assert [s.xs for s in q.series if s.label == "torch jvp"] == [[1, 4, 16, 64, 256]]
    assert any(s.mode == "mezo" for s in q.series) and any(s.guide.startswith("expected") for s in q.series)
    curves = plots["training_curves"].grid[0]
    assert [p.ylabel for p in curves] == ["training loss", "held-out accuracy"]
    assert len(curves[0].series) == 4 and all(len(s.xs) == 625 for s in curves[0].series)
    assert all(s.xs == [125, 250, 375, 500, 625] for s in curves[1].series)


def test_pathology_is_explained_where_naive_jvp_rows_exist(full):
    section = full["md"].split("## The UMass study's jvp pathology", 1)[1].split("\n## ", 1)[0]
    assert "require" in section and "detach" in section
    assert "| jvp[naive] | ok | " in section and "| 2.00× |" in section  # 1800 / 900


# ------------------------------------------------------------------------------------- partial and small CSVs


def test_single_framework_csv_builds_and_names_the_skipped_plots(tmp_path):
    rows = [trial("torch", mode) for mode in ("inference", "backprop", "jvp", "mezo")]
    rows.append(trial("torch", "jvp", "oom", jvp_impl="naive", peak_mem_mb=POISON))
    csv_path = write_csv(tmp_path / "runs.csv", rows)
    out = tmp_path / "out"
    (out / "plots").mkdir(parents=True)
    (out / "plots" / "memory_vs_depth.png").write_bytes(b"stale")  # from an earlier report into the same folder
    rep = build_report([csv_path], out)
    md = (out / "report.md").read_text()
    drawn = {p.name for p in rep.plots if p.drawn}
    assert drawn == {"excess_memory", "step_time"}
    assert sorted(f.name for f in (out / "plots").iterdir()) == ["excess_memory.png", "step_time.png"]
    for name in drawn:
        assert_real_png(out / "plots" / f"{name}.png")
    skipped = md.split("Skipped for lack of data:", 1)[1].split("\n## ", 1)[0]
    for p in rep.plots:
        if not p.drawn:
            assert f"- **{p.title}**: needs {p.needs}." in skipped
    assert "jax / torch" not in md and "| torch: jvp / backprop |" in md
    assert "| torch | jvp[naive] | **oom** |" in md and str(int(POISON)) not in md
    assert "No rows of experiment `seed_agnews`" in md
    assert "## The UMass study's jvp pathology" in md  # a naive row, even a failed one, gets the explanation
    assert md.count("\n| 2026") == 1  # the one failed row in the failed-trials table


def test_csv_with_only_failures_and_an_older_schema(tmp_path):
    # an older schema: the required columns only, no config_hash (rows are then told apart by their fields)
    from bench.sinks import REQUIRED_COLUMNS

    path = tmp_path / "old.csv"
    path.write_text(",".join(REQUIRED_COLUMNS) + "\n")  # CsvSink appends under an existing header
    rows = [trial("jax", "backprop", "crashed")]
    rows = [{k: v for k, v in r.items() if k in REQUIRED_COLUMNS} for r in rows]
    write_csv(path, rows)
    rep = build_report([path], tmp_path / "out")
    md = rep.path.read_text()
    assert not any(p.drawn for p in rep.plots)
    assert "| jax | backprop | **crashed** |" in md
    assert "(no plot: no ok rows with the data any plot needs)" in md
    assert "1 row, 0 ok, 1 not ok (crashed 1)" in md


def test_the_same_csv_twice_counts_each_row_once(tmp_path):
    csv_path = write_csv(tmp_path / "runs.csv", [trial("torch", "backprop"), trial("jax", "backprop")])
    assert len(load_rows([csv_path, csv_path])) == 2


# ---------------------------------------------------------------------------------------------- command line


def run_cli(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    return subprocess.run([sys.executable, "-m", "bench.report", *args], cwd=cwd, env=env, capture_output=True,
                          text=True, timeout=120)  # fmt: skip


def test_cli_defaults_read_results_runs_csv_and_write_results_report(tmp_path):
    write_csv(tmp_path / "results" / "runs.csv", [trial("torch", "backprop"), trial("jax", "backprop")])
    proc = run_cli(cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert (tmp_path / "results" / "report.md").exists()
    assert_real_png(tmp_path / "results" / "plots" / "excess_memory.png")
    assert "results/report.md" in proc.stdout


def test_cli_missing_csv_is_one_line_and_nonzero(tmp_path):
    proc = run_cli(str(tmp_path / "nope.csv"), "--out", str(tmp_path / "out"), cwd=tmp_path)
    assert proc.returncode != 0
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1, proc.stderr
    assert lines[0].startswith("bench.report: error: csv=") and "nope.csv: no such file" in lines[0]
    assert "accepted" in lines[0]
    assert not (tmp_path / "out").exists()


def test_cli_wrong_schema_is_one_line_and_leaves_the_file_alone(tmp_path):
    path = tmp_path / "other.csv"
    path.write_text("name,score\nalice,3\n")
    before = path.read_bytes()
    proc = run_cli(str(path), "--out", str(tmp_path / "out"), cwd=tmp_path)
    assert proc.returncode != 0
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and "not a bench results CSV" in lines[0] and "run_id" in lines[0], proc.stderr
    assert path.read_bytes() == before
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize(
    ("args", "expected"),
    [(["--bogus"], "unrecognized arguments: --bogus"), (["--out"], "--out: expected one argument")],
)
def test_cli_bad_options_are_one_line(args, expected, capsys):
    with pytest.raises(SystemExit) as e:
        main(args)
    assert e.value.code != 0
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and expected in err[0] and "usage: python -m bench.report" in err[0]


def test_out_that_is_a_file_is_refused(tmp_path, capsys):
    csv_path = write_csv(tmp_path / "runs.csv", [trial("torch", "backprop")])
    (tmp_path / "afile").write_text("x")
    assert main([str(csv_path), "--out", str(tmp_path / "afile")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "--out=" in err[0] and "is a file" in err[0]


# ------------------------------------------------------------------------------------- knobs keep rows apart


def context_section(md: str, heading: str) -> str:
    """The table under the context heading that is exactly `heading`."""
    return "\n".join(first_table(md.split(f"\n### {heading}\n", 1)[1]))


DEFAULT_HEADING = "minilm_l6 (6 layers, hidden 384) · synthetic · B8 T128 · sgd · fp32 · cpu (AMD EPYC x2)"


def test_rows_that_differ_only_in_attn_implementation_both_appear(tmp_path):
    rows = [trial("torch", "backprop", attn_implementation="eager", excess_mem_mb=400.0),
            trial("torch", "backprop", attn_implementation="sdpa", excess_mem_mb=333.0),  # later: it used to win
            trial("jax", "backprop", attn_implementation="eager", excess_mem_mb=520.0)]  # fmt: skip
    rep = build_report([write_csv(tmp_path / "runs.csv", rows)], tmp_path / "out")
    md = rep.path.read_text()
    table = context_section(md, DEFAULT_HEADING)  # one context: attention is part of the mode's name
    assert "| torch | backprop | " in table and "| 400 |" in table
    assert "| torch | backprop(attn=sdpa) | " in table and "| 333 |" in table
    assert "| backprop: jax / torch |" in md  # eager against eager
    bars = next(p for p in rep.plots if p.name == "excess_memory").grid[0][0]
    assert bars.categories == ["backprop", "backprop(attn=sdpa)"]


def test_rows_that_differ_only_in_learning_rate_both_appear(tmp_path):
    rows = [trial("torch", "backprop", lr="1e-3", excess_mem_mb=400.0),  # the default, written another way
            trial("torch", "backprop", lr=0.0001, excess_mem_mb=444.0),
            trial("torch", "jvp", lr=0.001, excess_mem_mb=200.0)]  # fmt: skip
    md = build_report([write_csv(tmp_path / "runs.csv", rows)], tmp_path / "out").path.read_text()
    default = context_section(md, DEFAULT_HEADING)
    assert "| torch | backprop | " in default and "| 400 |" in default and "| torch | jvp | " in default
    low = context_section(md, DEFAULT_HEADING.replace("· sgd ·", "· sgd (lr 0.0001) ·"))
    assert "| torch | backprop | " in low and "| 444 |" in low and "| jvp |" not in low
    assert "| torch: jvp / backprop | " in md.split("(lr 0.0001)")[0]  # the ratio stays within one learning rate


@pytest.mark.parametrize(
    ("column", "default", "other", "shown"),
    [("attn_implementation", "eager", "sdpa", "backprop(attn=sdpa)"),
     ("mezo_eps", "0.001", "1e-4", "mezo(eps=0.0001)"),
     ("dropout", "0.1", "0", "· fp32 · dropout 0 ·"),
     ("lr", "1e-3", "0.01", "sgd (lr 0.01)"),
     ("momentum", "0", "0.9", "sgd (momentum 0.9)"),
     ("weight_decay", "0.0", "0.01", "sgd (weight decay 0.01)"),
     ("beta1", "0.9", "0.8", "sgd (beta1 0.8)"),
     ("beta2", "0.999", "0.99", "sgd (beta2 0.99)"),
     ("adam_eps", "1e-08", "1e-6", "sgd (eps 1e-06)")],
)  # fmt: skip
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
    new = write_csv(tmp_path / "new" / "runs.csv",
                    [trial("jax", "backprop", excess_mem_mb=520.0, attn_implementation="eager", lr=0.001,
                           dropout=0.1, mezo_eps=0.001)])  # fmt: skip
    md = build_report([old], tmp_path / "out-old").path.read_text()
    assert "| torch | backprop | " in context_section(md, DEFAULT_HEADING)
    md = build_report([old, new], tmp_path / "out").path.read_text()
    table = context_section(md, DEFAULT_HEADING)  # a missing knob reads as its default: one context
    assert "| torch | backprop | " in table and "| jax | backprop | " in table
    assert "| backprop: jax / torch | " in md


def test_optimizer_defaults_are_the_presets_in_conf():
    import yaml

    for name, defaults in OPTIMIZER_DEFAULTS.items():
        preset = yaml.safe_load((REPO / "conf" / "optimizer" / f"{name}.yaml").read_text())
        for key, value in preset.items():
            column = {"eps": "adam_eps"}.get(key, key)
            if column in defaults:
                assert defaults[column] == pytest.approx(float(value)), (name, key)
    rows = [trial("jax", "backprop", optimizer="adamw", lr=5e-5, weight_decay=0.01),
            trial("jax", "backprop", optimizer="adamw")]  # the preset's values, and an older row without them
    assert context_key(rows[0]) == context_key(rows[1])


def test_reading_rows_needs_no_matplotlib():
    # the sweep process prints results.summary_table and `python -m bench.targets` reads rows: neither draws
    code = "import sys, bench.results, bench.targets, bench.report; print('matplotlib' in sys.modules)"
    proc = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "False"


# ------------------------------------------------------------------------------------- what sweeps still use


def test_summary_table_and_variant_still_work(tmp_path):
    rows = [trial("torch", "backprop", excess_mem_mb=400.0, step_time_median_s=0.0125),
            trial("jax", "jvp", num_tangents=4), trial("torch", "jvp", jvp_impl="naive"),
            trial("torch", "backprop", remat=True, trainable="head"),
            trial("jax", "mezo", "oom", error="RESOURCE_EXHAUSTED")]  # fmt: skip
    read = read_rows(write_csv(tmp_path / "runs.csv", rows))
    text = summary_table(read)
    lines = text.splitlines()
    assert lines[0].split() == ["framework", "mode", "model", "status", "excess", "MiB", "peak", "MiB", "step", "ms",
                                "compile", "s", "samples/s", "loss", "first->last"]  # fmt: skip
    assert lines[2].split()[:7] == ["torch", "backprop", "minilm_l6", "ok", "400", lines[2].split()[5], "12.5"]
    assert [variant(r) for r in read] == ["backprop", "jvp(K=4)", "jvp[naive]", "backprop+remat[head]", "mezo"]
    assert lines[-1].strip().endswith(": oom: RESOURCE_EXHAUSTED")
    assert summary_table([]) == "(no trials recorded)"
    assert num({"x": "nan"}, "x") is None and num({"x": "2.5"}, "x") == 2.5


# ---------------------------------------------------------------------------------------------- beyond one device

SCALE_HEADING = "minilm_l6 (6 layers, hidden 384) · synthetic · B4 T128 · adamw · fp32 · cpu (AMD EPYC x2)"


def test_a_ddp_and_a_single_device_row_at_one_batch_both_appear_labelled_apart(tmp_path):
    rows = [trial("torch", "backprop", excess_mem_mb=400.0),
            trial("torch", "backprop", excess_mem_mb=410.0, parallel="ddp", devices=2, nodes=1, world_size=2,
                  global_batch_size=16, comm_bytes_per_step=4 * N + 4, comm_bytes_expected=4 * N + 4)]  # fmt: skip
    md = build_report([write_csv(tmp_path / "runs.csv", rows)], tmp_path / "out").path.read_text()
    single = context_section(md, DEFAULT_HEADING)  # the usual label, unchanged
    assert "| torch | backprop | " in single and "| 400 |" in single and "| 410 |" not in single
    ddp = context_section(md, f"{DEFAULT_HEADING} · ddp × 2 devices")
    assert "| torch | backprop | " in ddp and "| 410 |" in ddp and "| 400 |" not in ddp


@pytest.mark.parametrize(
    ("settings", "shown"),
    [({"parallel": "ddp", "devices": 2}, " · ddp × 2 devices"),
     ({"parallel": "ddp", "devices": 1}, " · ddp × 1 device"),
     ({"parallel": "fsdp", "devices": 2}, " · fsdp FULL_SHARD × 2 devices"),
     ({"parallel": "fsdp", "devices": 2, "fsdp_reshard_after_forward": False}, " · fsdp SHARD_GRAD_OP × 2 devices"),
     ({"parallel": "fsdp", "devices": 2, "fsdp_offload": True}, " · fsdp FULL_SHARD × 2 devices + CPU offload"),
     ({"parallel": "ddp", "devices": 2, "nodes": 2}, " · ddp × 2 nodes × 2 devices"),
     ({"parallel": "none", "devices": 1, "nodes": 1, "fsdp_reshard_after_forward": "true",
       "fsdp_offload": "False"}, "")],
)  # fmt: skip
def test_parallel_settings_separate_rows_and_are_named_last_in_the_label(settings, shown):
    single, spread = trial("torch", "backprop"), trial("torch", "backprop", **settings)
    assert context_label(context_key(spread)) == DEFAULT_HEADING + shown
    contexts = group_contexts(select([single, spread]))
    assert len(contexts) == (2 if shown else 1)  # at the defaults, however written: the same context


def test_summary_table_names_the_strategy_only_when_a_trial_has_one(tmp_path):
    rows = [trial("torch", "backprop"), trial("torch", "backprop", parallel="ddp", devices=2),
            trial("jax", "mezo", parallel="fsdp", devices=2, fsdp_reshard_after_forward=True)]  # fmt: skip
    read = read_rows(write_csv(tmp_path / "runs.csv", rows))
    lines = summary_table(read).splitlines()
    assert lines[0].split()[:4] == ["framework", "mode", "parallel", "model"]
    assert [line.split()[:3] for line in lines[2:]] == [["torch", "backprop", "none"], ["torch", "backprop", "ddp×2"],
                                                        ["jax", "mezo", "fsdp×2"]]  # fmt: skip
    assert "parallel" not in summary_table(read[:1]).splitlines()[0]  # single-device sweeps: as before


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
    assert table.splitlines()[0] == ("| framework | mode | strategy | devices | peak MiB | excess MiB | params MiB | "
                                     "optimizer MiB | step ms (slowest) | samples/s (global) | exchanged / step | "
                                     "expected | counted / expected | memory by |")  # fmt: skip
    # backprop all-reduces its gradient: 4n + 4 bytes (the loss); jvp and mezo two scalars
    ddp = scale_line(table, "torch", "backprop", "ddp", 2)
    assert ddp[4:] == [f"{65 + PARAM_MB + 250 + 3 * PARAM_MB:.0f}", f"{65 + PARAM_MB:.0f}", "87", "173", "400",
                       "20.0", "86.6 MiB", "86.6 MiB", "1.00×", "rss_hwm"]  # fmt: skip
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
    assert torch[0] == ("| strategy | backprop peak MiB | backprop ms | jvp[lazy] peak MiB | jvp[lazy] ms | "
                        "mezo peak MiB | mezo ms |")  # fmt: skip
    assert [line.split(" | ")[0].strip("| ") for line in torch[2:]] == ["DDP", "FSDP SHARD_GRAD_OP", "FSDP FULL_SHARD"]
    half = f"{250 + 60 + PARAM_MB / 2 + 3 * PARAM_MB / 2:.0f}"
    assert torch[3] == f"| FSDP SHARD_GRAD_OP | {half} | 450 | **error** |  | {250 + 20 + 3 * PARAM_MB / 2:.0f} | 450 |"
    assert torch[4].split(" | ")[2] == "500"  # FULL_SHARD gathers once more
    jax = first_table(section.split(f"JAX on 2 devices · {SCALE_HEADING}\n", 1)[1])
    assert [line.split(" | ")[0].strip("| ") for line in jax[2:]] == ["DDP", "FSDP FULL_SHARD"]


def test_a_count_more_than_ten_percent_off_its_expectation_is_flagged(tmp_path):
    ddp = dict(parallel="ddp", devices=2)
    rows = [parallel_trial("torch", "backprop", counted=1.05 * (4 * N + 4), **ddp),  # within 10%: agrees
            parallel_trial("jax", "backprop", counted=1.2 * (4 * N + 4), **ddp),
            parallel_trial("torch", "mezo", counted=1536, **ddp),  # 1.5 KiB where two losses were expected
            parallel_trial("jax", "mezo", counted=8, **ddp),
            parallel_trial("jax", "jvp", "ddp", 1, counted=4)]  # a world of one should exchange nothing
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
    assert {s.label for s in memory.series} == {"torch backprop", "torch jvp[lazy]", "torch mezo", "jax backprop",
                                                "jax jvp", "jax mezo"}  # fmt: skip
    assert {s.label for s in grid[1][0].series} == {"torch backprop", "torch mezo", "jax backprop", "jax jvp",
                                                    "jax mezo"}  # torch refuses jvp under fsdp  # fmt: skip
    latest = {(r["framework"], r["mode"], r["devices"]): r for r in ok
              if r["parallel"] == "ddp"}  # rows are oldest first: the later strategy_table rows win  # fmt: skip
    line = next(s for s in time.series if s.label == "torch backprop")
    assert line.xs == [1, 2]
    assert line.ys == pytest.approx([latest["torch", "backprop", d]["step_time_median_s"] * 1e3 for d in (1, 2)])
    bars = [row[0] for row in plots["comm_bytes"].grid]
    assert [p.title.rsplit(" · ", 1)[1] for p in bars] == ["ddp × 2 devices", "fsdp SHARD_GRAD_OP × 2 devices",
                                                           "fsdp FULL_SHARD × 2 devices"]  # fmt: skip
    ddp = bars[0]
    assert ddp.categories == ["backprop", "jvp", "mezo"] and ddp.logy and ddp.units == "bytes"
    counted = {s.framework: s.ys for s in ddp.series if not s.guide}
    assert counted == {"torch": [4 * N + 4, 8, 8], "jax": [4 * N + 4, 8, 8]}
    assert [(s.framework, s.ys) for s in ddp.series if s.guide] == [("torch", [4 * N + 4, 8, 8]),
                                                                    ("jax", [4 * N + 4, 8, 8])]  # fmt: skip
    assert bars[1].categories == ["backprop", "mezo"]  # torch only; its jvp was refused
    for name in ("memory_vs_devices", "comm_bytes"):
        assert_real_png(full["out"] / "plots" / f"{name}.png")


def test_a_csv_without_the_parallel_columns_builds_the_same_report(tmp_path):
    rows = main_context()
    old = write_csv(tmp_path / "old" / "runs.csv", rows, OLD_COLUMNS)
    assert not set(PARALLEL_CSV_COLUMNS) & set(load_rows([old])[0])
    defaults = dict(parallel="none", devices=1, nodes=1, world_size=1, global_batch_size=8,
                    fsdp_reshard_after_forward=True, fsdp_offload=False)  # fmt: skip
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
