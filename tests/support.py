"""What the tests share: the repository, the command line as a user runs it, a config composed as a trial gets it,
and results rows written with the real CsvSink (the report's tests build their CSVs from `trial`).

Test files import from here (`from tests.support import ...`, pytest's pythonpath is the repository), never from
each other; fixtures live in conftest.py files.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import gc
import hashlib
import io
import itertools
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import psutil
import pytest
from hydra.core.hydra_config import HydraConfig

from bench import cli
from bench.config import LAUNCH_ID, BenchConfig, resolve, to_dict
from bench.harness import runner
from bench.harness.launch import TRIAL_MODULE, child_env
from bench.harness.preflight import compose_trials, preflight
from bench.harness.runner import record_job, trial_env
from bench.harness.scenario import RUN_ID_ENV
from bench.harness.trial import outcome as trial_outcome
from bench.models import adapter_weights
from bench.parallel import expected_comm_bytes
from bench.report.build import Report, build, results_of
from bench.report.plots import Plot
from bench.scenarios import REPORT_SECTIONS, SCENARIOS
from bench.scenarios.model.columns import COLUMNS as MODEL_COLUMNS
from bench.scenarios.model.report.plots import plan_plots
from bench.scenarios.model.select import group_contexts, select
from bench.store.csv import CsvSink
from bench.store.read import load_rows, read_rows

REPO = Path(__file__).resolve().parent.parent
# Small and fast: the tiny preset, short sequences, a few steps. Every trial still spawns its own process.
FAST = [
    "model=tiny",
    "batch_size=4",
    "seq_len=32",
    "steps=3",
    "warmup_steps=1",
    "data.num_train=64",
    "data.num_eval=16",
]


class FakeClock:
    """Seconds that pass only when the test advances them: a clock under test reads it instead of the host's, so
    a busy host (CI, a full test run beside another) cannot move its readings."""

    def __init__(self, start: float = 1000.0):
        self.now = start

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += seconds


# ---------------------------------------------------------------------------------------------- the command line


@contextlib.contextmanager
def torch_threads(n: int):
    """torch's intra-op threads at n, and the draws' pool (torch_impl/directions.py) sized anew, for a test of what
    the threads do: the test process runs with one (conftest.py)."""
    import torch

    from bench.torch_impl import directions

    before = torch.get_num_threads()
    torch.set_num_threads(n)
    directions._pool.cache_clear()
    try:
        yield
    finally:
        torch.set_num_threads(before)
        directions._pool.cache_clear()


def bench(
    *args: str, results: Path | None = None, env: dict | None = None, check: bool = True
) -> subprocess.CompletedProcess:
    """`python -m bench ARGS [results_dir=RESULTS]` from the repository, as a user runs it."""
    cmd = [sys.executable, "-m", "bench", *args, *([f"results_dir={results}"] if results is not None else [])]
    proc = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, env={**os.environ, **(env or {})}, timeout=600)
    if check and proc.returncode != 0:
        raise AssertionError(f"{' '.join(cmd)} failed ({proc.returncode}):\n{proc.stdout}\n{proc.stderr}")
    return proc


def bench_here(*args: str, results: Path | None = None) -> subprocess.CompletedProcess:
    """`python -m bench ARGS [results_dir=RESULTS]` for a command that ends before any trial starts (a refusal):
    bench.cli.main in this process, with its exit code, stdout and stderr as the command's. The environment and
    sys.argv it changes are put back, and so is Hydra's runtime config (a `--cfg` or a run sets it for the process,
    and a later trial measured here would read its +experiment)."""
    cmd = [*args, *([f"results_dir={results}"] if results is not None else [])]
    out, err = io.StringIO(), io.StringIO()
    saved_env, saved_argv, saved_hydra = dict(os.environ), list(sys.argv), HydraConfig.instance().cfg
    try:
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            try:
                cli.main(cmd)
                code = 0
            except SystemExit as e:
                code = e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
    finally:
        os.environ.clear()
        os.environ.update(saved_env)
        sys.argv[:] = saved_argv
        HydraConfig.instance().cfg = saved_hydra
    return subprocess.CompletedProcess(["python", "-m", "bench", *cmd], code, out.getvalue(), err.getvalue())


def sweep_here(*args: str, results: Path | None = None) -> subprocess.CompletedProcess:
    """`python -m bench -m ARGS results_dir=RESULTS` through Hydra as the command runs it (its sweeper, resume,
    outcomes and exit code, Hydra's basic launcher running the jobs in this process), each trial measured in this
    process (measure_here) instead of its own: for a sweeper's logic, which run_here's plain grid does not run.
    Hydra leaves logging as it is (hydra/*_logging=none): configuring it would close every handler the test's
    process holds, absl's among them, and absl's closes its stream, pytest's captured stderr."""
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(runner, "spawn_trial", measure_here)
        return bench_here(*args, "hydra/job_logging=none", "hydra/hydra_logging=none", results=results)


def run_here(*args: str, results: Path, env: dict | None = None) -> list[dict]:
    """`python -m bench [-m] ARGS results_dir=RESULTS` as the runner records it (preflight, rows, history, saved
    config, W&B run, one sweep id), each trial measured in this process instead of its own: for a test whose subject
    is what a trial measures and records, not the process it runs in (isolation, signals, a fresh process's memory,
    the launchers: those start `bench`). `env` is set for the trials' time. Returns each trial's outcome."""
    multirun = "-m" in args
    overrides = [a for a in args if a != "-m"] + [f"results_dir={results}"]
    preflight(overrides, multirun, SCENARIOS)
    trials, _ = compose_trials(overrides, multirun)
    saved = dict(os.environ)
    outcomes = []
    try:
        os.environ.pop(LAUNCH_ID, None)  # one sweep id for these trials, a new one for the next call
        os.environ.update(env or {})
        for _, composed_cfg in trials:
            cfg = resolve(composed_cfg)
            outcomes.append(record_job(cfg, SCENARIOS[cfg.scenario], run_trial=measure_here))
    finally:
        os.environ.clear()
        os.environ.update(saved)
    return outcomes


# One process per rank (torch: two over gloo; JAX: one, owning both devices) that takes the trials in turn, each as
# its own trial process would (bench.harness.trial.outcome); rank 0 picks each trial's rendezvous port as the
# runner does. A process per rank and trial would start torch or JAX once per trial instead of once.
RANK = """
import gc, json, os, sys, time
from pathlib import Path
from bench.config import from_dict
from bench.harness.launch import adopt, free_port
from bench.harness.trial import outcome, write_result
from bench.scenarios import SCENARIOS

adopt()  # dies with the test
rank = os.environ["RANK"]
for trial in sys.argv[1:]:  # TRIAL.json the payload; each file written whole (write_result: TRIAL.*.tmp, renamed)
    port = Path(f"{trial}.port.json")
    if rank == "0":
        write_result(str(port), free_port())
    deadline = time.monotonic() + 300
    while not port.exists() and time.monotonic() < deadline:
        time.sleep(0.05)
    os.environ["MASTER_PORT"] = port.read_text()
    cfg = from_dict(json.loads(Path(f"{trial}.json").read_text()))
    out = outcome(SCENARIOS[cfg.scenario], cfg, lambda partial: None)
    write_result(f"{trial}.rank{rank}.json", out)
    gc.unfreeze()  # the trial froze this process's objects out of the collector (for its timed steps)
    if out["status"] != "ok":
        sys.exit(1)
"""


def start_ranks(ranks: int, sweeps: dict[Path, list[str]]):
    """Each sweep `python -m bench -m ARGS results_dir=RESULTS` of `sweeps` ({RESULTS: ARGS}) measured in one set of
    `ranks` processes (RANK), started now; returns the call that waits for them and records each trial as the runner
    records one it spawned (rows, history, saved config)."""
    trials = []
    for results, args in sweeps.items():
        overrides = [*args, f"results_dir={results}"]
        preflight(overrides, True, SCENARIOS)
        trials += [resolve(c) for _, c in compose_trials(overrides, True)[0]]
        results.mkdir(parents=True, exist_ok=True)
    stems = [Path(cfg.results_dir) / f"trial{i}" for i, cfg in enumerate(trials)]
    for stem, cfg in zip(stems, trials, strict=True):
        Path(f"{stem}.json").write_text(json.dumps(to_dict(cfg)))
    env = {
        **os.environ,
        **trial_env(trials[0], SCENARIOS["model"]),
        **child_env(),
        "MASTER_ADDR": "127.0.0.1",
        "WORLD_SIZE": str(ranks),
        "LOCAL_WORLD_SIZE": str(ranks),
    }
    logs = [next(iter(sweeps)) / f"rank{r}.log" for r in range(ranks)]
    procs = []
    for r, log in enumerate(logs):
        with log.open("w") as out:
            cmd = [sys.executable, "-c", RANK, *map(str, stems)]
            rank = {"RANK": str(r), "LOCAL_RANK": str(r)}
            procs.append(subprocess.Popen(cmd, cwd=REPO, stdout=out, stderr=subprocess.STDOUT, env={**env, **rank}))

    def finish() -> None:
        deadline = time.monotonic() + 600
        while time.monotonic() < deadline and None in [p.poll() for p in procs]:
            if any(p.poll() not in (None, 0) for p in procs):
                break  # a rank that failed leaves the other waiting in a collective: stop it at once
            time.sleep(0.1)
        for p in procs:
            if p.poll() is None:
                p.kill()
            p.wait()
        assert [p.returncode for p in procs] == [0] * ranks, "\n".join(log.read_text()[-3000:] for log in logs)
        saved = dict(os.environ)
        try:
            for cfg, stem in zip(trials, stems, strict=True):
                out = json.loads(Path(f"{stem}.rank0.json").read_text())
                record_job(cfg, SCENARIOS["model"], run_trial=lambda *_, out=out: out)
        finally:
            os.environ.clear()
            os.environ.update(saved)

    return finish


def measure_here(cfg: BenchConfig, scenario, run_id: str, results_dir: Path, task) -> dict:
    """The runner's spawn_trial, in this process: the trial's outcome as its process would leave it."""
    os.environ.update({**trial_env(cfg, scenario), RUN_ID_ENV: run_id})
    try:
        return trial_outcome(scenario, cfg, lambda partial: None)  # no process to die: nothing to leave behind
    finally:
        gc.unfreeze()  # the trial froze this process's objects out of the collector (for its timed steps)


def rows(results: Path) -> list[dict]:
    """The model trials' rows of a results folder (runs.csv)."""
    return read_rows(results / "runs.csv")


def composed(*overrides: str) -> BenchConfig:
    """The one trial these overrides name, composed by Hydra and resolved into the schema, as a trial gets it."""
    ((_, cfg),), _ = compose_trials(list(overrides), multirun=False)
    return resolve(cfg)


# ------------------------------------------------------------------------------------------------- results rows

PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"
MIB = 2**20
# A value no ok row has: carried by failed and superseded rows, it must never reach a table or a plot.
POISON = 987654.0

_clock = itertools.count()

# What identifies a configuration in these tests (the runner hashes the whole composed config the same way).
IDENTITY = (
    "framework",
    "mode",
    "model",
    "num_layers",
    "data",
    "trainable",
    "optimizer",
    "batch_size",
    "seq_len",
    "steps",
    "epochs",
    "seed",
    "remat",
    "num_tangents",
    "jvp_impl",
    "last_k",
    "attn_implementation",
    "mezo_eps",
    "dropout",
    "lr",
    "momentum",
    "weight_decay",
    "beta1",
    "beta2",
    "adam_eps",
    "parallel",
    "devices",
    "nodes",
    "fsdp_reshard_after_forward",
    "fsdp_offload",
)

MINILM = dict(
    model="minilm_l6",
    num_layers=6,
    hidden_size=384,
    batch_size=8,
    seq_len=128,
    n_params=22_714_756,
    n_trainable=22_714_756,
)

# Knobs the runner records in runs.csv; an older CSV has none of these columns.
KNOB_COLUMNS = (
    "attn_implementation",
    "mezo_eps",
    "dropout",
    "lr",
    "momentum",
    "weight_decay",
    "beta1",
    "beta2",
    "adam_eps",
)
# Beyond one device; an older CSV has none of these either.
PARALLEL_CSV_COLUMNS = (
    "parallel",
    "devices",
    "nodes",
    "world_size",
    "global_batch_size",
    "fsdp_reshard_after_forward",
    "fsdp_offload",
    "comm_bytes_per_step",
    "comm_bytes_expected",
    "mem_params_mb",
    "mem_optimizer_mb",
)
COLUMNS = MODEL_COLUMNS + tuple(c for c in KNOB_COLUMNS if c not in MODEL_COLUMNS)
OLD_COLUMNS = tuple(c for c in MODEL_COLUMNS if c not in KNOB_COLUMNS + PARALLEL_CSV_COLUMNS)


def bert_params(layers: int) -> int:
    # BERT-base: embeddings 23.8M, 7.09M per encoder layer, pooler + classifier 0.59M
    return 23_837_184 + 7_087_872 * layers + 593_668


def trial(framework: str, mode: str, status: str = "ok", **kw) -> dict:
    """One results row as the runner writes it; numbers follow a simple cost model unless given."""
    i = next(_clock)
    r = {
        "run_id": f"20261123-{i:06d}-{framework}-{mode}",
        "started_at": f"2026-11-23T{10 + i // 3600:02d}:{i // 60 % 60:02d}:{i % 60:02d}+00:00",
        "framework": framework,
        "mode": mode,
        "data": "synthetic",
        "trainable": "all",
        "optimizer": "sgd",
        "steps": 5,
        "seed": 0,
        "remat": False,
        "num_tangents": 1,
        "device": "cpu",
        "device_name": "AMD EPYC x2",
        "dtype": "fp32",
        "jvp_impl": "dual" if framework == "torch" else "func",  # jvp.impl=auto as each framework runs it
        "status": status,
        "sweep_id": "20261123-000000-abcdef",
        "experiment": "default_bench",
        "git_sha": "de9bbbd",
        "torch_version": "2.13.0+cpu",
        "jax_version": "0.10.2",
        "warmup_steps": 1,
        "grad_accum": 1,
        "last_k": 1,
        **MINILM,
    }
    r.update(kw)
    r.setdefault("config_hash", hashlib.sha1(json.dumps([r.get(k) for k in IDENTITY]).encode()).hexdigest()[:12])
    if status != "ok":
        r.setdefault("error", f"{status}: something went wrong")
        return r
    n, per_sample = r["n_trainable"], r["num_layers"] * r["batch_size"] * r["seq_len"] / 64  # MiB, made up
    param_mb = n * 4 / MIB
    excess = {
        "inference": 10 + per_sample / r["num_layers"],
        "backprop": 10 + per_sample + param_mb,
        "jvp": 10 + 2 * per_sample / r["num_layers"] + 2 * param_mb,
        "jacfwd": 12 + param_mb,
        "mezo": 10 + per_sample / r["num_layers"],
    }[mode]
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
            trial(
                fw,
                "backprop",
                excess_mem_mb=400.0 if fw == "torch" else 520.0,
                step_time_median_s=3.2 if fw == "torch" else 2.56,
            ),
            trial(fw, "backprop", remat=True, excess_mem_mb=318.0 if fw == "torch" else 500.0),
            trial(
                fw,
                "jvp",
                excess_mem_mb=200.0 if fw == "torch" else 300.0,
                step_time_median_s=3.2 if fw == "torch" else 2.0,
            ),
            trial(fw, "mezo", excess_mem_mb=116.0 if fw == "torch" else 114.0),
        ]
    rows.append(trial("torch", "jacfwd", trainable="head", n_trainable=148_996, step_time_median_s=21.0))
    # jax's jacfwd died before it knew its device: the row carries the configured one ("auto") and a poisoned number
    rows.append(
        trial(
            "jax",
            "jacfwd",
            "oom",
            trainable="head",
            device="auto",
            device_name="",
            peak_mem_mb=POISON,
            excess_mem_mb=POISON,
            error="RESOURCE_EXHAUSTED: Out of memory allocating 5368709120 bytes.",
        )
    )
    return rows


# Beyond one device: conf/experiment/scale_out.yaml and strategy_table.yaml's trials, MiniLM at 4 samples per device.
SCALE = dict(model="minilm_l6", num_layers=6, hidden_size=384, optimizer="adamw", batch_size=4, seq_len=128, steps=3)
N = MINILM["n_trainable"]
PARAM_MB = N * 4 / MIB  # one fp32 copy of MiniLM's parameters: 86.6 MiB


@functools.cache
def _minilm() -> BenchConfig:
    return composed("model=minilm_l6")  # FSDP2's expected gathers pad each tensor's rows: the real MiniLM shapes


def parallel_trial(
    framework: str,
    mode: str,
    parallel: str = "none",
    devices: int = 1,
    reshard: bool = True,
    offload: bool = False,
    status: str = "ok",
    counted: float | None = None,
    **kw,
) -> dict:
    """A row as the runner writes it for a trial on `devices` devices: memory is the largest device's, step time
    the slowest's, samples/s the global batch's; the bytes expected are bench.parallel's formula, the bytes counted
    the same unless given."""
    cfg = dataclasses.replace(
        _minilm(),
        framework=framework,
        parallel=parallel,
        devices=devices,
        nodes=1,
        mode=mode,
        grad_accum=1,
        fsdp_reshard_after_forward=reshard,
        trainable="all",
        last_k=1,
    )
    shards = devices if parallel == "fsdp" else 1
    r = dict(
        SCALE,
        experiment="scale_out",
        parallel=parallel,
        devices=devices,
        nodes=1,
        world_size=devices,
        global_batch_size=4 * devices,
        fsdp_reshard_after_forward=reshard,
        fsdp_offload=offload,
        jvp_impl="lazy" if framework == "torch" else "func",
    )
    if status == "ok":
        params, optimizer = PARAM_MB / shards, 2 * PARAM_MB / shards  # AdamW: two moments per parameter
        excess = {"backprop": 60.0 + params, "jvp": 30.0, "mezo": 20.0}[mode] + (5.0 if parallel == "ddp" else 0.0)
        step = {"backprop": 0.3, "jvp": 0.35, "mezo": 0.2}[mode] * (1.0 + 0.3 * (devices - 1))
        step = kw.pop("step_time_median_s", step)
        r.update(
            excess_mem_mb=excess,
            peak_mem_mb=excess + 250 + params + optimizer,
            mem_params_mb=params,
            mem_optimizer_mb=optimizer,
            step_time_median_s=step,
            samples_per_s=4 * devices / step,
            mem_method="xla_memory_analysis" if framework == "jax" and devices > 1 else "rss_hwm",
        )
        if parallel != "none":
            expected = expected_comm_bytes(cfg, N, N)
            r.update(comm_bytes_expected=expected, comm_bytes_per_step=expected if counted is None else counted)
    r.update(kw)
    return trial(framework, mode, status, **r)


def whole_rows(path: Path, n: int = 3) -> bytes:
    """A runs.csv of n rows whose error cells hold what CSV must quote: commas, quotes, newlines."""
    sink = CsvSink(path, MODEL_COLUMNS)
    for i in range(n):
        sink.write(
            {
                "run_id": f"r{i}",
                "framework": "torch",
                "mode": "backprop",
                "status": "error",
                "error": f'ValueError: "x", y\nline two of {i}',
                "config_hash": f"h{i}",
            }
        )
    return path.read_bytes()


def write_csv(path: Path, rows: list[dict], columns: tuple[str, ...] = COLUMNS) -> Path:
    sink = CsvSink(path, columns)
    for r in rows:
        sink.write(r)
    return path


# -------------------------------------------------------------------------------------------- reading a report


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


def context_section(md: str, heading: str) -> str:
    """The table under the context heading that is exactly `heading`."""
    return "\n".join(first_table(md.split(f"\n### {heading}\n", 1)[1]))


DEFAULT_HEADING = "minilm_l6 (6 layers, hidden 384) · synthetic · B8 T128 · sgd · fp32 · cpu (AMD EPYC x2)"
SCALE_HEADING = "minilm_l6 (6 layers, hidden 384) · synthetic · B4 T128 · adamw · fp32 · cpu (AMD EPYC x2)"


def build_report(csv_paths, out_dir) -> Report:
    """The report of these runs CSVs into out_dir, every section of every scenario (`python -m bench report`)."""
    return build(REPORT_SECTIONS, results_of(csv_paths), out_dir)


def planned_plots(csv_paths) -> list[Plot]:
    """The model's plots as the report plans them from these CSVs' rows (a plot with an empty grid is skipped)."""
    sel = select(load_rows(csv_paths))
    return plan_plots(sel, group_contexts(sel))


def trained_adapters(spec, lora, seed: int = 1) -> dict:
    """Adapters of `spec`'s family as after some training: PEFT's A and a nonzero B, so that every adapter gradient
    is nonzero."""
    out = adapter_weights(spec, lora, seed)
    rng = np.random.default_rng(seed)
    for k in out:
        if ".lora_B." in k:
            out[k] = (0.2 * rng.standard_normal(out[k].shape)).astype(np.float32)
    return out


def cmdline(p: psutil.Process) -> list[str]:
    """A process's command line, or nothing for one that ended (or is a zombie) between listing and reading it."""
    try:
        return p.cmdline()
    except psutil.Error:
        return []


def trials_under(pid: int) -> list[psutil.Process]:
    """Trial processes among this process's descendants (none once it has ended)."""
    try:
        kids = psutil.Process(pid).children(recursive=True)
    except psutil.NoSuchProcess:
        return []
    return [p for p in kids if TRIAL_MODULE in cmdline(p)]  # python -m bench.scenarios PAYLOAD RESULT


def trials_anywhere(launcher_pid: int) -> list[psutil.Process]:
    """Trial processes of this launch, wherever they were reparented: their temp folder names the launcher."""
    mark = f"bench-{launcher_pid}-"
    found = []
    for p in psutil.process_iter(["cmdline"]):
        argv = p.info["cmdline"] or []
        if TRIAL_MODULE in argv and any(mark in part for part in argv):  # python -m bench.scenarios PAYLOAD RESULT
            found.append(p)
    return found
