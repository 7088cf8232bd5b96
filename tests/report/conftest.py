"""The report's tests share one results folder with every experiment's rows in it (`full`), built once. Rows are
written with the real CsvSink from tests.support.trial, which follows a simple cost model."""

from __future__ import annotations

import itertools
import json
import math
import os
from pathlib import Path

import numpy as np
import pytest

from tests.support import (
    SCALE,
    bert_params,
    build_report,
    main_context,
    parallel_trial,
    trial,
    write_csv,
)


def scaling_rows() -> list[dict]:
    rows = []
    bert = dict(model="bert_base", hidden_size=768, batch_size=4, seq_len=128, steps=2)
    for layers in (1, 2, 4, 8):
        n = bert_params(layers)
        for fw in ("torch", "jax"):
            for mode in ("inference", "backprop", "jvp", "mezo"):
                rows.append(
                    trial(
                        fw,
                        mode,
                        experiment="depth_scaling",
                        **{**bert, "num_layers": layers},
                        n_params=n,
                        n_trainable=n,
                    )
                )
    rows.append(
        trial(
            "torch",
            "backprop",
            "crashed",
            experiment="depth_scaling",
            **{**bert, "num_layers": 12},
            n_params=bert_params(12),
            n_trainable=bert_params(12),
            error="trial process died (signal 9): Killed\nlast line of the log",
        )
    )
    n = bert_params(4)
    for fw in ("torch", "jax"):
        for mode in ("backprop", "jvp", "mezo"):
            for t in (32, 64, 256):  # 128 is the depth sweep's 4-layer row: the same configuration
                rows.append(
                    trial(
                        fw,
                        mode,
                        experiment="seq_scaling",
                        **{**bert, "num_layers": 4, "seq_len": t},
                        n_params=n,
                        n_trainable=n,
                    )
                )
            for b in (1, 2, 8):
                rows.append(
                    trial(
                        fw,
                        mode,
                        experiment="batch_scaling",
                        **{**bert, "num_layers": 4, "batch_size": b},
                        n_params=n,
                        n_trainable=n,
                    )
                )
    rows.append(
        trial(
            "jax",
            "mezo",
            "timeout",
            experiment="batch_scaling",
            **{**bert, "num_layers": 4, "batch_size": 64},
            error="no result within timeout_s=1800",
        )
    )
    return rows


def grad_quality_rows() -> list[dict]:
    rows = []
    tiny = dict(model="tiny", num_layers=2, hidden_size=32, batch_size=4, seq_len=32, steps=2, n_params=70_000)
    for scope, n in (("head", 1188), ("bias", 772)):
        for fw in ("torch", "jax"):
            for k in (1, 4, 16, 64, 256):
                rows.append(
                    trial(
                        fw,
                        "jvp",
                        experiment="grad_quality",
                        trainable=scope,
                        n_trainable=n,
                        num_tangents=k,
                        grad_cosine=math.sqrt(k / (k + n - 1)) * (0.95 if fw == "torch" else 1.05),
                        **tiny,
                    )
                )
            rows.append(
                trial(fw, "mezo", experiment="grad_quality", trainable=scope, n_trainable=n, grad_cosine=0.03, **tiny)
            )
    for scope, n in (("bias", 772), ("head", 1188), ("last_k", 18_276)):
        for fw in ("torch", "jax"):
            for mode in ("backprop", "jvp", "jacfwd"):
                rows.append(
                    trial(
                        fw,
                        mode,
                        experiment="jacfwd_scaling",
                        trainable=scope,
                        n_trainable=n,
                        last_k=2,
                        grad_cosine=1.0 if mode != "jvp" else 0.03,
                        **{**tiny, "steps": 3},
                    )
                )
    rows.append(
        trial(
            "jax",
            "mezo",
            "error",
            experiment="grad_quality",
            trainable="last_k",
            last_k=2,
            n_trainable=18_276,
            error="ValueError: mezo_eps=0: must be > 0",
            **tiny,
        )
    )
    return rows


def study_rows() -> list[dict]:
    study = dict(
        experiment="seed_agnews",
        model="bert_base",
        num_layers=12,
        hidden_size=768,
        optimizer="adamw",
        steps=625,
        epochs=5,
        warmup_steps=2,
        n_params=bert_params(12),
        n_trainable=bert_params(12),
    )
    numbers = {
        ("torch", "backprop"): (2100.0, 1200.0, 310.0, 0.91),
        ("torch", "jvp"): (1500.0, 600.0, 290.0, 0.42),
        ("jax", "backprop"): (2300.0, 1400.0, 250.0, 0.90),
        ("jax", "jvp"): (1700.0, 800.0, 240.0, 0.44),
    }
    return [
        trial(
            fw,
            mode,
            peak_mem_mb=peak,
            excess_mem_mb=excess,
            total_train_time_s=total,
            eval_accuracy=acc,
            eval_loss=0.5,
            **study,
        )
        for (fw, mode), (peak, excess, total, acc) in numbers.items()
    ]


def pathology_rows() -> list[dict]:
    ctx = dict(
        experiment="jvp_pathology",
        model="bert_base",
        num_layers=4,
        hidden_size=768,
        steps=2,
        n_params=bert_params(4),
        n_trainable=bert_params(4),
    )
    return [
        trial("torch", "inference", excess_mem_mb=60.0, **ctx),
        trial("torch", "backprop", excess_mem_mb=900.0, **ctx),
        trial("torch", "jvp", jvp_impl="naive", excess_mem_mb=1800.0, **ctx),
        trial("torch", "jvp", jvp_impl="func", excess_mem_mb=450.0, **ctx),
        trial("torch", "jvp", jvp_impl="dual", excess_mem_mb=470.0, **ctx),
    ]


FSDP_JVP_REFUSED = (
    "ConfigError: mode=jvp with parallel=fsdp, framework=torch: forward-mode AD through FSDP2's "
    "sharded (DTensor) parameters is not supported by torch"
)


def scale_out_rows() -> list[dict]:
    """scale_out (torch and jax, ddp and fsdp, 1 and 2 devices, backprop / jvp / mezo: torch refuses jvp under
    fsdp), then strategy_table (torch on 2 devices: ddp, SHARD_GRAD_OP, FULL_SHARD; its ddp and FULL_SHARD trials
    are scale_out's configurations again, measured later), and the single-device trials of the same work."""
    rows = []
    for fw, parallel, devices, mode in itertools.product(
        ("torch", "jax"), ("ddp", "fsdp"), (1, 2), ("backprop", "jvp", "mezo")
    ):
        if (fw, parallel, mode) == ("torch", "fsdp", "jvp"):
            rows.append(parallel_trial(fw, mode, parallel, devices, status="error", error=FSDP_JVP_REFUSED))
        else:
            rows.append(parallel_trial(fw, mode, parallel, devices))
    for (parallel, reshard), mode in itertools.product(
        (("ddp", True), ("fsdp", False), ("fsdp", True)), ("backprop", "jvp", "mezo")
    ):
        if (parallel, mode) == ("fsdp", "jvp"):
            rows.append(
                parallel_trial(
                    "torch",
                    mode,
                    parallel,
                    2,
                    reshard,
                    status="error",
                    error=FSDP_JVP_REFUSED,
                    experiment="strategy_table",
                )
            )
        else:
            step = 0.5 if reshard else 0.45  # FULL_SHARD gathers once more than SHARD_GRAD_OP
            rows.append(
                parallel_trial(
                    "torch",
                    mode,
                    parallel,
                    2,
                    reshard,
                    experiment="strategy_table",
                    step_time_median_s=step if parallel == "fsdp" else 0.4,
                )
            )
    for fw, mode in itertools.product(("torch", "jax"), ("backprop", "jvp", "mezo", "inference")):
        extra = {} if mode != "inference" else {"excess_mem_mb": 9.0, "peak_mem_mb": 600.0}
        rows.append(
            parallel_trial(fw, mode, experiment="default_bench", **extra)
            if mode != "inference"
            else trial(fw, mode, experiment="default_bench", **{**SCALE, **extra})
        )
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
            devices.append(
                {
                    "device": f"cpu:{rank}",
                    "rank": rank,
                    "peak_mem_mb": r["peak_mem_mb"] * less,
                    "excess_mem_mb": r["excess_mem_mb"] * less,
                    "baseline_mem_mb": r["peak_mem_mb"] - r["excess_mem_mb"],
                    "mem_method": r["mem_method"],
                    "mem_params_mb": r["mem_params_mb"],
                    "mem_optimizer_mb": r["mem_optimizer_mb"],
                    "step_time_median_s": r["step_time_median_s"],
                }
            )
        history = {"loss": [1.39, 1.38, 1.37], "step_time_s": [r["step_time_median_s"]] * 3, "devices": devices}
        (results / "history" / f"{r['run_id']}.json").write_text(json.dumps(history))


def write_history(results: Path, row: dict, steps: int, eval_every: int) -> None:
    rng = np.random.default_rng(len(row["run_id"]) + steps)
    loss = 1.4 * np.exp(
        -np.arange(steps) / (steps / 2 if row["mode"] == "backprop" else steps * 4)
    ) + 0.05 * rng.standard_normal(steps)
    acc = [None] * steps
    for i in range(eval_every - 1, steps, eval_every):
        acc[i] = row["eval_accuracy"] * (i + 1) / steps
    history = {"loss": loss.tolist(), "step_time_s": [0.5] * steps, "eval_accuracy": acc}
    (results / "history").mkdir(exist_ok=True)
    (results / "history" / f"{row['run_id']}.json").write_text(json.dumps(history))


@pytest.fixture(scope="session")
def full(tmp_path_factory):
    """Every experiment's rows in one CSV (failures included), with the UMass study runs' history JSONs, and its
    report; built once for every test that reads it."""
    results = tmp_path_factory.mktemp("results")
    scale = scale_out_rows()
    rows = main_context() + scaling_rows() + grad_quality_rows() + study_rows() + pathology_rows() + scale
    csv_path = write_csv(results / "runs.csv", rows)
    for r in rows:
        if r.get("experiment") == "seed_agnews":
            write_history(results, r, 625, 125)
    imbalanced = next(
        r
        for r in scale
        if r["framework"] == "jax" and r.get("parallel") == "ddp" and r["devices"] == 2 and r["mode"] == "backprop"
    )
    write_device_histories(results, scale, imbalanced["run_id"])
    (results / "history" / "not-a-run.json").write_text("{broken")  # ignored: no row names it
    before = csv_path.read_bytes(), os.stat(csv_path).st_mtime_ns
    out = results / "report"
    rep = build_report([csv_path], out)
    return {
        "rows": rows,
        "csv": csv_path,
        "before": before,
        "out": out,
        "report": rep,
        "md": (out / "report.md").read_text(),
    }
