"""What `make gpu-lease` and `make gpu-check` run on a GPU host, step by step, most valuable first: each step one
or more of the suite's own commands (`python -m bench ...`, `python -m pytest ...`), its time budget, and the tiny
CPU shapes of its dry run. The driver that runs them, with their budgets, logs and summary, is check.py.

A step's overrides are written once, for the GPU; the dry run (`--dry-run`) keeps the same keys and replaces
their values (DRY, and a step's own `dry`: None drops a key), so the dry run on a CPU runs the very commands the
GPU would, at tiny shapes (of the modes steps, the first sweep: the others are the same command, other cases).
"""

from __future__ import annotations

import shutil
import tempfile
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path

from omegaconf import OmegaConf

from bench.config import CONF_DIR
from bench.measure.system import REPO
from bench.store.read import read_rows

# Every GPU trial: the CUDA device; no W&B (not carried to the GPU host: docs/gpu.md); a step run again in the same
# folder (a later call of the lease, the folder carried back) skips the trials it has recorded ok or diverged.
GPU = {"device": "cuda", "logger": "none", "resume": "true"}
# The study's shape: BERT-base, B8, T128 (issue 29; the UMass forward-AD study).
BERT = {"model": "bert_base", "batch_size": "8", "seq_len": "128"}
# The dry run: the tests' FAST shapes (tests/support.py) on the CPU; a trial that hangs ends at 120 s.
DRY = {
    "device": "cpu",
    "model": "tiny",
    "batch_size": "4",
    "seq_len": "32",
    "steps": "2",
    "warmup_steps": "1",
    "data.num_train": "64",
    "data.num_eval": "16",
    "timeout_s": "120",
}
DRY_BUDGET_S = 150  # a dry step's cap: its few tiny trials take 10-40 s on 2 shared cores
# Every mode, in the order of what a lease measures first (the framework inner, so a step cut short still has whole
# pairs of frameworks): the cells the first lease left empty, jvp and MeZO, each beside the mode it is compared with
# (backprop, inference); then remat and jacfwd[head], JAX's (empty) before torch's (measured), each its own sweep.
PAIRED_CASES = "jvp,backprop,mezo,inference"
LATER_CASES = "backprop_remat,jacfwd_head"
# The field's newer zeroth-order estimators (bench/estimators/): at modes_fp32's shape and rate, so that their rows
# sit beside its MeZO and inference in one report context.
ZO_CASES = "mezo_q4,hizoo,lozo"
# Every mode a step compares at one learning rate, so that its rows share one report context and its ratios pair:
# the rate case=jvp|mezo bring (SGD's 1e-3 diverged their estimates on the H100), as conf/experiment/ does since
# a2e6056. Read from the case, so the two cannot drift apart.
PAIRED = {"optimizer.lr": str(OmegaConf.load(CONF_DIR / "case" / "jvp.yaml").optimizer.lr)}
TRIAL_TIMEOUT_S = "360"  # a JAX jvp or mezo trial on bert_base: up to 4 min on an H100, most of it compiling
# A timed trial on bert_base: 20 steps (at most 20 s of them) after 3 warm-up ones
TIMED = {**BERT, "steps": "20", "warmup_steps": "3", "max_timed_s": "20", "timeout_s": TRIAL_TIMEOUT_S, **PAIRED}
# The most a step may take: what a lease's call (check.py's LEASE_S, 540 s) leaves after setup's two budgets (120 s)
# and the margins for a stopped command's end and the last archive (45 s); what the setup leaves unused goes to the
# next step by value
CALL_STEP_S = 375
# The shape sweep, first after the facts: about eight of its 40 ladders' first rungs a lease on the H200 (a torch
# trial 16-26 s, a JAX one 15-60 s, by the kept rows' wall times), leaving the next steps what setup does not use
# and 75 s more; the rest resumes lease after lease
SHAPES_S = 300
# JAX's compile three ways: two cold compiles of bert_base's backprop (25-46 s each on the H200 by the kept rows), a
# read from the cache, three processes' start
COMPILE_S = 180


@dataclass(frozen=True)
class Context:
    """What a step's commands depend on: the dry run or not, its folder, this host's GPUs, AG News if present."""

    dry: bool
    folder: Path  # the step's results folder: runs.csv, logs/, history/, step.log, step.json
    gpus: int  # by `nvidia-smi -L`
    ag_news: Path | None  # a folder with AG News' train.csv and test.csv, or None: synthetic data
    minilm: Path | None = None  # MiniLM's weights carried in float16 (wheels.MINILM_FP16), or None: not carried


@dataclass(frozen=True)
class Step:
    name: str
    what: str  # one line: what it measures (the summary's and docs/gpu.md's words)
    budget_s: int  # its wall-clock cap on the GPU host, seconds; one device call's at most (CALL_STEP_S)
    command: Callable[[Context], list[str]]  # argv after `python`: the step's first command
    then: Callable[[Context], Iterable[list[str]]] = lambda ctx: ()  # more commands, made once the first has run
    skip: Callable[[Context], str | None] = lambda ctx: None  # a reason not to run it here, or None
    note: Callable[[Context], str] = lambda ctx: ""  # one line for the summary beyond the rows counted
    # The least time in which it records its first row on the GPU: a lease with less left skips it for a later step
    # that fits, rather than stopping it before it has recorded anything (the dry run: check.MIN_STEP_S).
    least_s: int = 60
    # Whether a later lease may skip the trials this one finished (check.py keeps its rows and seeds the next
    # lease with them). Not what_fits (no resume: a probe skipped as recorded would fail its search), nor repro
    # (it reruns what this lease recorded: another machine's row would make it a comparison across machines).
    resumes: bool = True

    def budget(self, dry: bool) -> int:
        return min(self.budget_s, DRY_BUDGET_S) if dry else self.budget_s


def overrides(
    ctx: Context, gpu: dict[str, str], dry: dict[str, str | None] | None = None, base: dict[str, str] | None = None
) -> list[str]:
    """key=value overrides: GPU, then the step's own; in the dry run DRY, then the step's dry values (None drops
    the key). results_dir is the step's folder. Keys starting with '+' (an experiment) come first."""
    merged: dict[str, str | None] = {**(GPU if base is None else base), **gpu}
    if ctx.dry:
        merged |= {**DRY, **(dry or {})}
    merged["results_dir"] = str(ctx.folder)
    pairs = [f"{k}={v}" for k, v in merged.items() if v is not None]
    return sorted(pairs, key=lambda p: not p.startswith("+"))


def bench(*args: str) -> list[str]:
    return ["-m", "bench", *args]


# ------------------------------------------------------------------------------------------------------ the steps


def study(ctx: Context) -> list[str]:
    # JAX's column first: torch's was measured by the first lease (docs/gpu.md); a trial may take the whole step
    data = {"data": "ag_news", "data.path": str(ctx.ag_news)} if ctx.ag_news else {}
    return bench(
        "-m",
        *overrides(
            ctx,
            {"+experiment": "seed_agnews", "framework": "jax,torch", **data, "timeout_s": str(CALL_STEP_S)},
            dry={"epochs": "1", "data.num_train": "16", "data.num_eval": "8", "eval_every": "2", "mode": "backprop"},
        ),
    )


def study_data(ctx: Context) -> str:
    if ctx.ag_news:
        return f"data: AG News from {ctx.ag_news}"
    return (
        "data: synthetic (AG News absent: no --ag-news folder with train.csv and test.csv), same sizes as the "
        "study's 1000 training and 100 held-out samples"
    )


# The curve's sweep on the GPU: the experiment's own (conf/experiment/cost_to_target_curve.yaml) but last_k=1's
# 1.9 M parameters, where a one-direction estimate would need about 10^5 steps (its steps grow as d; backprop's point
# there is the CPU run's), and JAX's trials first.
CURVE_SWEEP = OmegaConf.load(CONF_DIR / "experiment" / "cost_to_target_curve.yaml").hydra.sweeper
SCOPES = "+experiment/cost_to_target_curve"
CURVE_SCOPES = ",".join(s for s in CURVE_SWEEP.params[SCOPES].split(",") if s != "last_k1")
CURVE = f"{{framework:'jax,torch',{SCOPES}:'{CURVE_SCOPES}',case:'{CURVE_SWEEP.params.case}'}}"
# The dry run's one search point per case (every case's grid must have as many), in each grid's own form
_POINT = "[{optimizer.lr:0.01}]"
CURVE_DRY_SPACE = (
    "{"
    + ",".join(
        f"{case}:{_POINT}" if OmegaConf.is_list(grid) else f"{case}:{{points:{_POINT}}}"
        for case, grid in CURVE_SWEEP.space.items()
    )
    + "}"
)


def no_minilm(ctx: Context) -> str | None:
    if ctx.dry or ctx.minilm:
        return None
    return "MiniLM's weights are not among the carried wheels (`make gpu-wheels` writes them beside the wheels)"


def curve(ctx: Context) -> list[str]:
    """Steps to the target against trained parameters (issue 45): the curve experiment on MiniLM (its real weights,
    carried in float16, read back as float32) at the experiment's sizes, with the step cap its larger scopes need
    (at steps ~ d, rank-8 LoRA's 75,268 parameters take about 50 times the probe's steps). Eight trials at a time
    share the GPU (joblib): MiniLM's kernels leave it idle between launches, and the curve's answer is steps, not
    seconds, so the winners are chosen by steps to the target. Resumed call after call, and lease after lease,
    until its search and fresh seeds are all recorded."""
    return bench(
        "-m",
        *overrides(
            ctx,
            {
                "+experiment": "cost_to_target_curve",
                **({"model.checkpoint": str(ctx.minilm)} if ctx.minilm else {}),
                "hydra.sweeper.params": CURVE,
                "hydra.sweeper.objective": "steps_to_target",
                "target.max_steps": "10001",
                "hydra/launcher": "joblib",
                "hydra.launcher.n_jobs": "8",
                "timeout_s": "300",
            },
            dry={
                "model.checkpoint": None,  # the tiny model: seeded
                "hydra.sweeper.params": "{framework:jax,+experiment/cost_to_target_curve:classifier,case:backprop}",
                "hydra.sweeper.space": CURVE_DRY_SPACE,
                "hydra.sweeper.repeats": "[1]",
                "target.metric": "eval_loss",  # met at the first evaluation: the fresh seed runs too
                "target.value": "100",
                "target.max_steps": "3",
                "target.hold": "1",  # three evaluations in a row would not fit under the dry cap of 3
                "eval_every": "1",
                "hydra.launcher.n_jobs": "2",
            },
        ),
    )


def modes(dtype: str) -> tuple[Callable[[Context], list[str]], Callable[[Context], list[list[str]]]]:
    """Every mode in `dtype`, both frameworks: the paired modes first (one sweep), then remat and jacfwd[head],
    JAX's then torch's (a sweep each). The dry run runs the first sweep alone, narrowed to one trial: the others
    are the same command with other cases, and pass preflight at the GPU's values in the tests."""

    def sweep(ctx: Context, case: str, framework: str) -> list[str]:
        return bench(
            "-m",
            *overrides(
                ctx,
                {"case": case, "framework": framework, **TIMED, "dtype": dtype},
                # one framework each: the study's dry run has both
                dry={"case": "inference", "framework": "jax"}
                if dtype == "fp32"
                else {"case": "backprop", "framework": "torch"},
            ),
        )

    def first(ctx: Context) -> list[str]:
        return sweep(ctx, PAIRED_CASES, "torch,jax")

    def then(ctx: Context) -> list[list[str]]:
        return [] if ctx.dry else [sweep(ctx, LATER_CASES, "jax"), sweep(ctx, LATER_CASES, "torch")]

    return first, then


# One JAX program compiled three ways (issue 74): cold into an empty persistent cache, then read back from it, then
# cold with XLA:GPU's autotuning off; its rows' compile_time_s and compile_cache say what each way costs, and the
# first against the third is autotuning's share. Not resumed: the second trial is the first's config again.
COMPILE = {**BERT, "framework": "jax", "case": "backprop", "steps": "3", "warmup_steps": "1", "resume": "false"}
COMPILE |= {"timeout_s": TRIAL_TIMEOUT_S, **PAIRED}


def compile_folders(ctx: Context) -> tuple[Path, Path]:
    """The two caches of the compile step, outside its results folder (nothing of them comes back)."""
    base = Path(tempfile.gettempdir()) / f"bench-compile-{ctx.folder.name}"
    return base / "autotuned", base / "autotune_off"


def compile_cold(ctx: Context) -> list[str]:
    """The first compile, into a cache folder emptied as the step begins."""
    tuned, off = compile_folders(ctx)
    for folder in (tuned, off):
        shutil.rmtree(folder, ignore_errors=True)
    return bench(*overrides(ctx, {**COMPILE, "compile_cache_dir": str(tuned)}))


def compile_again(ctx: Context) -> list[list[str]]:
    """The same program read back from the cache the first filled, then compiled cold with autotuning off."""
    tuned, off = compile_folders(ctx)
    return [
        bench(*overrides(ctx, {**COMPILE, "compile_cache_dir": str(tuned)})),
        bench(*overrides(ctx, {**COMPILE, "compile_cache_dir": str(off), "xla_autotune_level": "0"})),
    ]


def zo_family(ctx: Context) -> list[str]:
    return bench(
        "-m",
        *overrides(
            ctx, {"case": ZO_CASES, "framework": "torch,jax", **TIMED}, dry={"case": "hizoo", "framework": "torch"}
        ),
    )


def opt(ctx: Context) -> list[str]:
    """The decoder family at BERT-base's widths (OPT-125m, bench/models/opt.py), every paired mode, both frameworks:
    what docs/models.md measured on the CPU at 4 layers, at 12 on the GPU."""
    return bench(
        "-m",
        *overrides(
            ctx,
            {"case": PAIRED_CASES, "framework": "torch,jax", **TIMED, "model": "opt_125m"},
            dry={"model": "opt_tiny", "case": "inference", "framework": "jax"},
        ),
    )


def torch_compile(ctx: Context) -> list[str]:
    """compile=true against modes_fp32's eager rows: what inductor buys where eager kernel launches dominate."""
    return bench(
        "-m",
        *overrides(
            ctx,
            {"framework": "torch", "case": "inference,backprop,mezo", "compile": "true", **TIMED},
            dry={"case": "inference"},
        ),
    )


def cuda_test_files() -> list[str]:
    """The test files that hold a test marked cuda (collecting only those keeps the step to seconds)."""
    return sorted(
        str(p.relative_to(REPO)) for p in (REPO / "tests").rglob("test_*.py") if "pytest.mark.cuda" in p.read_text()
    )


def cuda_tests(ctx: Context) -> list[str]:
    return [
        "-m",
        "pytest",
        "-m",
        "cuda",
        "-q",
        "-p",
        "no:cacheprovider",
        f"--junitxml={ctx.folder / 'junit.xml'}",
        *cuda_test_files(),
    ]


def pathology(ctx: Context) -> list[str]:
    return bench(
        "-m",
        *overrides(
            ctx,
            {"+experiment": "jvp_pathology", "model.num_layers": "12", "timeout_s": "120"},
            # the experiment sweeps its arms: the dry run replaces its list by one arm
            dry={"model.num_layers": None, "hydra.sweeper.params": "{+experiment/jvp_pathology:naive}"},
        ),
    )


# The shape sweep's ladder on the GPU (conf/experiment/shapes_gpu.yaml): batches 32, 128, 512 (its data.num_train),
# each 4x the last; the dry run's 1 and 4 (tiny, B4 T32's neighbours)
LADDER, LADDER_START, LADDER_DRY_START = "4", "32", "1"
SHAPE_RUNGS = 3


def shapes(rungs: int) -> Callable[[Context], list[str]]:
    """The shape sweep's ladders with at most `rungs` probes each: every cell's batch 32 before any cell's 128. Each
    command deepens every ladder by a rung, the rungs before it resumed as recorded (a probe recorded out of memory
    too: bench/scenarios/capacity/run.py), so a lease stopped anywhere leaves whole rungs, and the next one resumes
    at the first cell still empty. The budget is the GPU's memory (budget_mb unset)."""

    def command(ctx: Context) -> list[str]:
        return bench(
            "capacity",
            "--ladder",
            LADDER,
            "--start",
            LADDER_DRY_START if ctx.dry else LADDER_START,
            "--max-probes",
            str(rungs),
            *overrides(
                ctx,
                {"+experiment": "shapes_gpu", "timeout_s": "240"},
                # the experiment sweeps the cells: the dry run names one; a ladder 1, 4 in 1024 MiB of RSS
                dry={
                    "framework": "torch",
                    "case": "inference",
                    "dtype": "fp32",
                    "budget_mb": "1024",
                    "batch_size": None,
                    "data.num_train": "4",
                },
            ),
        )

    return command


def shape_rungs(ctx: Context) -> list[list[str]]:
    """The deeper rungs, one command each (the dry run: a second rung, which resumes the first)."""
    return [shapes(k)(ctx) for k in range(2, 3 if ctx.dry else SHAPE_RUNGS + 1)]


def what_fits(ctx: Context) -> list[str]:
    # the study's 12 GiB GPU at T128 (the batch is what the search varies); a batch of at most 256 (data.num_train)
    # and 6 probes keep each search short; torch's searches run first (Hydra's product order), and each search's
    # answer is written as it ends. No resume: each lease searches afresh, on its own card.
    return bench(
        "capacity",
        "--max-probes",
        "3" if ctx.dry else "6",
        *overrides(
            ctx,
            {
                "+experiment": "what_fits",
                "framework": "torch,jax",
                "case": "backprop,jvp,mezo",
                "model": "bert_base",
                "seq_len": "128",
                "budget_mb": "12288",
                "data.num_train": "256",
                "timeout_s": "240",
            },
            dry={
                "framework": "torch",
                "case": "backprop",
                "budget_mb": "1024",
                "batch_size": None,
                "data.num_train": "1",
            },
            base={"device": "cuda", "logger": "none"},
        ),
    )


def repro(ctx: Context) -> list[str]:
    return bench(
        "-m",
        *overrides(
            ctx,
            {
                "framework": "torch,jax",
                "case": "backprop",
                **BERT,
                "deterministic": "true",
                "steps": "10",
                "warmup_steps": "2",
                "timeout_s": "240",
            },
            dry={"framework": "torch"},
        ),
    )


def reruns(ctx: Context) -> list[list[str]]:
    """`python -m bench rerun RUN_ID` for each framework's first deterministic trial recorded ok."""
    first: dict[str, str] = {}
    for row in read_rows(ctx.folder / "runs.csv"):
        if row.get("status") == "ok" and row.get("deterministic") in ("True", "true"):
            first.setdefault(row["framework"], row["run_id"])
    return [bench("rerun", run_id, "--results", str(ctx.folder)) for run_id in first.values()]


def scale_out(ctx: Context) -> list[str]:
    return bench(
        "-m",
        *overrides(
            ctx, {"+experiment": "scale_out", "model": "bert_base", "devices": f"1,{ctx.gpus}", "timeout_s": "300"}
        ),
    )


def one_gpu(ctx: Context) -> str | None:
    if ctx.gpus > 1:
        return None
    return f"{ctx.gpus} GPU(s) by nvidia-smi -L: ddp and fsdp need more than one (docs/scale-out.md)"


# Budgets from the first H100 run (2026-11-25, benchmarks/2026-11-25_1gpu-h100_e8d831ad0470.md): a torch trial
# takes 20-60 s (jacfwd[head] 2 min), a JAX trial 50 s (inference) to 4 min (jvp, mezo: compiling is 30-230 s on
# XLA:GPU, before the encoder was a scan), so no step but cuda_tests ends within one 10-minute call: each takes
# what a call can give it, and the next call (or lease) carries results_gpu/ and resumes it.
# A step's first row (least_s): a JAX trial's on the H200 is its process, a compile of 4-40 s and its steps, 20-60 s
# (OPT's jvp 58 s, the third H200 lease); the study's first, JAX's backprop, compiles and runs 625 AdamW steps; the
# CUDA tests write their rows at their end; torch's short trials (pathology, repro) 20-30 s.
# The order is the value of what each step measures to the suite (issues 42, 71, 74): the shapes users train at
# (every GPU cell so far is B8 T128, where torch's step is its host's), then every mode at B8 T128 again (torch's
# MeZO and jvp against the kept rows, after its host overhead came out), JAX's compile three ways, then bf16, the
# study's JAX column, the newer estimators and the decoder family (none measured on a GPU yet), then the rest.
FP32, BF16 = modes("fp32"), modes("bf16")
STEPS: tuple[Step, ...] = (
    Step(
        "shapes",
        "shapes users train at (+experiment=shapes_gpu): every mode, both frameworks, fp32 and bf16, on bert_base at "
        "T512 and T128, the batch a ladder 32, 128, 512 up to what fits, a rung a command",
        SHAPES_S,
        shapes(1),
        then=shape_rungs,
    ),
    Step("modes_fp32", "every mode on bert_base B8 T128 in fp32, both frameworks", CALL_STEP_S, FP32[0], then=FP32[1]),
    Step(
        "compile",
        "one JAX program (bert_base backprop, B8 T128) compiled cold, read back from the persistent cache, and "
        "compiled cold with XLA:GPU's autotuning off",
        COMPILE_S,
        compile_cold,
        then=compile_again,
        resumes=False,
    ),
    Step(
        "modes_bf16",
        "every mode on bert_base B8 T128 in mixed bf16, both frameworks",
        CALL_STEP_S,
        BF16[0],
        then=BF16[1],
    ),
    Step(
        "study",
        "the UMass study's table (+experiment=seed_agnews): BERT-base B8, 1000 samples, 5 epochs, "
        "backprop vs jvp, both frameworks (JAX first)",
        CALL_STEP_S,
        study,
        note=study_data,
        least_s=90,
    ),
    Step(
        "curve",
        "steps to the target against trained parameters (+experiment=cost_to_target_curve): backprop, jvp and MeZO "
        "at four scopes of MiniLM, both frameworks, eight trials at a time",
        CALL_STEP_S,
        curve,
        skip=no_minilm,
    ),
    Step(
        "zo_family",
        "the newer zeroth-order estimators (SPSA q=4, HiZOO, LOZO) on bert_base B8 T128, fp32, both frameworks",
        300,
        zo_family,
    ),
    Step("opt", "OPT-125m, every paired mode at B8 T128, fp32, both frameworks", CALL_STEP_S, opt),
    Step("cuda_tests", "the CUDA-marked tests (pytest -m cuda): trackers, ops on cuda", 90, cuda_tests, least_s=90),
    Step(
        "torch_compile",
        "torch.compile (compile=true) of inference, backprop and MeZO on bert_base B8 T128, fp32",
        300,
        torch_compile,
    ),
    Step(
        "pathology",
        "+experiment=jvp_pathology at 12 layers: torch jvp naive vs func vs dual vs lazy vs backprop",
        300,
        pathology,
        least_s=30,
    ),
    Step(
        "what_fits",
        "the what-fits table: largest batch in 12 GiB at T128 (backprop, jvp, mezo)",
        300,
        what_fits,
        resumes=False,
    ),
    Step(
        "repro",
        "deterministic=true trials, each run again by `python -m bench rerun`: bit-identical?",
        300,
        repro,
        then=reruns,
        resumes=False,
        least_s=30,
    ),
    Step(
        "scale_out", "ddp and fsdp on 1 and every GPU (+experiment=scale_out, bert_base)", 240, scale_out, skip=one_gpu
    ),
)
REPORT_BUDGET_S = 60  # python -m bench report over every step's folder, with its plots
NAMES = tuple(s.name for s in STEPS)
