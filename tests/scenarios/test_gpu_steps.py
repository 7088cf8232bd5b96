"""What `make gpu-lease` and `make gpu-check` would run on a GPU, checked here without one: every command passes
preflight at the GPU's values; the modes each step compares share one report context (the learning rate
included), and the empty cells of the GPU table come first; every step's cap fits one device call; every row can
name its commit where the tree has no git; the wheels it carries are exactly what the GPU image lacks; the docs
show each step's budget and the call to paste. The dry lease itself is test_gpu_check.py's."""

from __future__ import annotations

import base64
import functools
import hashlib
import re
import subprocess
import zipfile
from pathlib import Path

import numpy as np
import pytest

from bench import estimators
from bench.config import model_preset, resolve, step_spec
from bench.errors import ConfigError
from bench.harness.preflight import compose_trials, preflight
from bench.harness.runner import trial_env
from bench.harness.scenario import config_hash
from bench.measure import system
from bench.scenarios import SCENARIOS
from bench.scenarios.capacity import run as capacity
from bench.scenarios.gpu import check, steps, wheels
from bench.scenarios.gpu.kept import KEPT, readme_table
from bench.scenarios.model.scenario import make_row
from bench.scenarios.model.select import comparison, context_key, variant
from bench.scenarios.model.validate import validate
from bench.store.read import read_rows
from bench.weights import build_weights, load_checkpoint
from tests.support import REPO, composed

NOWHERE = Path("/nonexistent")  # a results folder with no rows: a step's commands before it ran
H200_MIB = 143771  # a capacity search's budget where none is set: the GPU's memory (the H200's, docs/gpu.md)


def test_every_step_fits_one_device_call():
    """A device command is cut at 600 s: the lease's deadline leaves make's wheel install and Python's start before
    it, and install, facts, any one step at its cap, a stop and the archive fit inside it."""
    assert check.LEASE_S <= 600 - 60
    for step in steps.STEPS:
        assert 2 * check.SETUP_BUDGET_S + step.budget_s + check.STOP_S + check.ARCHIVE_S <= check.LEASE_S, step.name


def overrides_of(argv: list[str]) -> list[str]:
    args = argv[2:]
    return capacity.parse(args[1:]).overrides if args[0] == "capacity" else [a for a in args if not a.startswith("-")]


def gpu_commands(root: Path, every: bool = False) -> list[tuple[str, list[str]]]:
    """Every step's commands as the GPU host would run them, in order (two GPUs, so that scale_out is not skipped);
    the ones a step makes from its rows (reruns) are none before it ran. A command that runs its step's earlier
    command's trials again (a ladder's deeper rung: only --max-probes differs) is listed once, unless `every`."""
    found, seen = [], set()
    for s in steps.STEPS:
        ctx = steps.Context(False, root / s.name, 2, None)
        for argv in (s.command(ctx), *s.then(ctx)):
            trials = (s.name, *(overrides_of(argv) if argv[:2] == ["-m", "bench"] else argv))
            if every or trials not in seen:
                found.append((s.name, argv))
            seen.add(trials)
    return found


@functools.cache
def trials_of(argv: tuple[str, ...]) -> list:
    """Every trial of a GPU command, composed as preflight composes it."""
    trials, _ = compose_trials(overrides_of(list(argv)), multirun=True)
    return [resolve(cfg) for _, cfg in trials]


def ladder_trials(argv: tuple[str, ...]) -> list:
    """A capacity ladder's trials at every rung it may probe (start x F^k up to its limit); others' as composed."""
    if argv[2] != "capacity" or not capacity.parse(list(argv[3:])).ladder:
        return trials_of(argv)
    args = capacity.parse(list(argv[3:]))
    rungs = [args.start * args.ladder**k for k in range(args.max_probes)]
    limit = capacity.limit_of(trials_of(argv)[0], args.search)
    batches = ",".join(str(v) for v in rungs if v <= limit)
    trials, _ = compose_trials([*overrides_of(list(argv)), f"{args.search}={batches}"], multirun=True)
    return [resolve(cfg) for _, cfg in trials]


def as_run(cfg) -> dict:
    """The settings a trial records as it ran them (trial.py: jvp.impl=auto resolved for the GPU)."""
    return estimators.step_columns(estimators.get(cfg.mode).resolved(step_spec(cfg), cfg.framework, "cuda"))


def rows_of(argv: tuple[str, ...]) -> list[dict]:
    """Every trial of a GPU command as the row it would record."""
    return [make_row(cfg, as_run(cfg), {}) for cfg in trials_of(argv)]


# each command's name in the tests: its step's, and +1, +2 for the ones after its first
COMMAND_IDS = [
    f"{n}+{i}" if i else n
    for k, (n, _) in enumerate(gpu_commands(NOWHERE))
    for i in [sum(m == n for m, _ in gpu_commands(NOWHERE)[:k])]
]


# the commands that compose for over 2 s (the shape sweep's 40 ladders, the curve's scopes, OPT's and what_fits'
# grids): slow; the rest keep a preflight of every kind of command in make test-fast
SLOW_COMMANDS = {"shapes", "curve", "what_fits", "opt"}


@pytest.mark.parametrize(
    "index",
    [pytest.param(i, marks=pytest.mark.slow) if n in SLOW_COMMANDS else i for i, n in enumerate(COMMAND_IDS)],
    ids=COMMAND_IDS,
)
def test_every_gpu_command_passes_preflight(index, tmp_path):
    """The GPU's own values (bert_base, B8 T128, the full sweeps), validated here as any trial would be: only
    device=cuda becomes cpu (this host has no GPU)."""
    argv = gpu_commands(tmp_path)[index][1]
    assert "device=cuda" in argv or argv[:2] == ["-m", "pytest"]
    args = ["device=cpu" if a == "device=cuda" else a for a in argv[2:]]
    if argv[:2] == ["-m", "pytest"]:
        files = [a for a in args if a.startswith("tests/")]
        assert files and all((REPO / f).is_file() for f in files)
    elif args[0] == "capacity":
        parsed = capacity.parse(args[1:])
        if not any(o.startswith("budget_mb=") for o in parsed.overrides):  # the GPU's memory: the H200's here
            parsed.overrides.append(f"budget_mb={H200_MIB}")
        capacity.prepare(parsed)
    else:
        overrides = [a for a in args if not a.startswith("-")]
        assert preflight(overrides, "-m" in args, SCENARIOS) >= 1


# The comparisons the GPU steps record: each is one report context (torch.compile's rows sit beside modes_fp32's
# eager ones; a capacity search varies the batch, the curve's tuning search the learning rate; scale_out compares
# one trial beyond one device and on it).
COMPARISONS = {
    ("shapes",): ("batch_size", "seq_len", "dtype"),
    ("curve",): ("lr",),
    ("modes_fp32", "torch_compile", "zo_family"): (),
    ("opt",): (),
    ("modes_bf16",): (),
    ("study",): (),
    ("pathology",): (),
    ("what_fits",): ("batch_size",),
    ("repro",): (),
}


@pytest.mark.slow
def test_the_modes_each_gpu_step_compares_share_one_report_context():
    """Every trial of every GPU command, composed as preflight composes it and made into its row: the rows of one
    comparison fall into one context (the learning rate included: case=jvp|mezo bring their own), so the report's
    ratios and targets pair them; and no two trials share a cell."""
    rows: dict[str, list[dict]] = {}
    for name, argv in gpu_commands(NOWHERE):
        if argv[:2] != ["-m", "pytest"]:
            rows.setdefault(name, []).extend(rows_of(tuple(argv)))
    assert set(rows) == {n for names in COMPARISONS for n in names} | {"scale_out", "compile"}
    # the compile step runs one configuration twice on purpose (a compile, then its read from the cache: the rows'
    # compile_cache tells them apart; the repeat is listed once), and once with autotuning off, its own cell
    assert len({context_key(r) for r in rows["compile"]}) == 1
    assert [variant(r) for r in rows["compile"]] == ["backprop", "backprop(autotune=0)"]
    for names, drop in COMPARISONS.items():
        compared = [r for n in names for r in rows[n]]
        assert len({context_key(r, drop=drop) for r in compared}) == 1, names
        cells = [(r["framework"], variant(r), r.get("batch_size"), *(r[k] for k in drop)) for r in compared]
        assert len(cells) == len(set(cells)) > 1, names
    assert len({comparison(context_key(r)) for r in rows["scale_out"]}) == 1
    # the shapes sit beside the GPU table's B8 T128 in the report: one context, the shape and dtype aside
    shape = COMPARISONS[("shapes",)]
    beside = [r for n in ("shapes", "modes_fp32", "modes_bf16") for r in rows[n]]
    assert len({context_key(r, drop=shape) for r in beside}) == 1


@pytest.mark.slow
def test_the_lease_measures_the_shapes_first_rung_by_rung():
    """The shapes users train at first (issue 71), rung by rung: every cell's first batch before any cell's second,
    T512 before T128, jvp's and backprop's cells first, the frameworks side by side."""
    assert steps.NAMES[0] == "shapes"
    shapes = [argv for name, argv in gpu_commands(NOWHERE, every=True) if name == "shapes"]
    assert [capacity.parse(argv[3:]).max_probes for argv in shapes] == [1, 2, 3]
    assert len({tuple(overrides_of(argv)) for argv in shapes}) == 1
    first = [f"T{r['seq_len']} {r['framework']} {variant(r)} {r['dtype']}" for r in rows_of(tuple(shapes[0]))]
    assert len(first) == 40 and first[:8] == [
        f"T512 {fw} {mode} {dtype}"
        for mode in ("jvp", "backprop")
        for dtype in ("fp32", "bf16")
        for fw in ("torch", "jax")
    ]
    assert first[20].startswith("T128 torch jvp fp32")


def test_the_compile_step_compiles_one_program_cold_from_the_cache_and_without_autotuning(tmp_path):
    """Three trials of one JAX program: into a cache folder emptied as the step begins, from it again, and into
    another with XLA:GPU's autotuning off (its flag in the trial's XLA_FLAGS); none resumed (the second is the
    first's config again)."""
    ctx = steps.Context(dry=False, folder=tmp_path / "compile", gpus=1, ag_news=None)
    tuned, off = steps.compile_folders(ctx)
    (tuned / "stale").mkdir(parents=True)
    (step,) = [s for s in steps.STEPS if s.name == "compile"]
    cold = step.command(ctx)
    assert not tuned.exists() and not step.resumes
    again, no_autotune = step.then(ctx)
    assert cold == again and f"compile_cache_dir={tuned}" in cold and "resume=false" in cold
    assert set(no_autotune) ^ set(cold) == {
        f"compile_cache_dir={tuned}",
        f"compile_cache_dir={off}",
        "xla_autotune_level=0",
    }
    args = [a for a in no_autotune[2:] if a != "device=cuda"]
    cfg, tuned_args = composed(*args), [a for a in args if a != "xla_autotune_level=0"]
    assert "--xla_gpu_autotune_level=0" in trial_env(cfg, SCENARIOS["model"])["XLA_FLAGS"]
    assert make_row(cfg, {}, {})["xla_autotune_level"] == 0
    assert "xla_gpu_autotune_level" not in trial_env(composed(*tuned_args), SCENARIOS["model"]).get("XLA_FLAGS", "")
    with pytest.raises(ConfigError, match=r"xla_autotune_level=7: accepted: 0 \(off\) to 4"):
        validate(composed(*tuned_args, "xla_autotune_level=7"))


@pytest.mark.slow
def test_the_lease_measures_the_empty_cells_first():
    """Then the GPU table's empty cells (issue 42): jvp and MeZO in both frameworks, each beside the mode it is
    compared with, then JAX's remat and jacfwd[head] before torch's; then bf16; then the study's JAX column."""
    assert steps.NAMES[1:5] == ("modes_fp32", "compile", "modes_bf16", "study")
    order = [
        f"{r['framework']} {variant(r)}"
        for name, argv in gpu_commands(NOWHERE)
        if name == "modes_fp32"
        for r in rows_of(tuple(argv))
    ]
    assert order == [
        "torch jvp",
        "jax jvp",
        "torch backprop",
        "jax backprop",
        "torch mezo",
        "jax mezo",
        "torch inference",
        "jax inference",
        "jax backprop+remat",
        "jax jacfwd[head]",
        "torch backprop+remat",
        "torch jacfwd[head]",
    ]
    (study,) = [argv for name, argv in gpu_commands(NOWHERE) if name == "study"]
    assert "framework=jax,torch" in study


def test_git_sha_is_dirty_for_the_code_not_for_results_kept_in_the_repository(tmp_path, monkeypatch):
    """A run resumed in benchmarks/ rewrites its tracked runs.csv: its rows still name the clean commit; an edit
    to the code does not."""
    git = lambda *a: subprocess.run(["git", "-C", str(tmp_path), *a], check=True, capture_output=True)
    (tmp_path / system.RESULTS_TRACKED).mkdir()
    (tmp_path / system.RESULTS_TRACKED / "runs.csv").write_text("a\n")
    (tmp_path / "code.py").write_text("x = 1\n")
    git("init", "-q")
    git("add", ".")
    git("-c", "user.email=t@t", "-c", "user.name=t", "commit", "-qm", "c")
    monkeypatch.setattr(system, "REPO", tmp_path)
    sha = system.git_sha()
    assert len(sha) == 12 and not sha.endswith("-dirty")
    (tmp_path / system.RESULTS_TRACKED / "runs.csv").write_text("a\n1\n")
    assert system.git_sha() == sha
    (tmp_path / "code.py").write_text("x = 2\n")
    assert system.git_sha() == f"{sha}-dirty"


def test_git_sha_falls_back_to_the_recorded_commit(tmp_path, monkeypatch):
    monkeypatch.setattr(system, "REPO", tmp_path)  # no .git there
    monkeypatch.delenv(system.GIT_SHA_ENV, raising=False)
    assert system.git_sha() == ""
    monkeypatch.setenv(system.GIT_SHA_ENV, "c0ffee123456-dirty")
    assert system.git_sha() == "c0ffee123456-dirty"
    monkeypatch.setattr(system, "REPO", REPO)  # a .git whose HEAD is another: the recorded commit still wins
    assert system.git_sha() == "c0ffee123456-dirty"
    assert system.git_sha({system.GIT_SHA_ENV: "abc123def456"}) == "abc123def456"  # a child's environment (facts)
    monkeypatch.undo()
    assert wheels.this_commit() == system.git_sha()  # what `make gpu-wheels` records: bench's own answer
    assert wheels.record_commit(tmp_path, "abc123def456").startswith("commit abc123def456 recorded in")
    assert wheels.recorded_commit(tmp_path) == "abc123def456"
    assert "no commit recorded" in wheels.record_commit(tmp_path, "")  # an old record is not left behind
    assert wheels.recorded_commit(tmp_path) == ""


def test_the_carried_wheels_are_what_the_gpu_image_lacks():
    """Every dependency in pyproject.toml is on the GPU image, carried, or left behind with a reason."""
    tomllib = pytest.importorskip("tomllib")  # Python 3.11+
    deps = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["dependencies"]
    names = {re.split(r"[<>=!~\[ ;]", d, maxsplit=1)[0].lower() for d in deps}
    classified = set(wheels.IMAGE) | set(wheels.CARRIED) | set(wheels.NOT_CARRIED)
    assert names <= classified, names - classified
    assert not set(wheels.IMAGE) & set(wheels.CARRIED)


@pytest.mark.slow
def test_minilm_travels_in_float16_and_the_curve_step_trains_from_it(tmp_path):
    """`make gpu-wheels` writes MiniLM's real weights in float16 beside the wheels (the float32 file is over what a
    call carries): half the bytes, each weight within float16's rounding of the real one once read back as a run
    reads a checkpoint. On a GPU without that file the curve step is skipped with its reason; with it, the step's
    command trains from it, and every one of its trials passes preflight."""
    carried = wheels.minilm_fp16(tmp_path)
    spec, package = model_preset("minilm_l6")
    real = load_checkpoint(package, spec)
    assert carried.stat().st_size <= sum(v.nbytes for v in real.values()) / 2 + 2**20
    weights, exact = build_weights(spec, 0, str(carried)), build_weights(spec, 0, package)
    assert weights.keys() == exact.keys()
    for name, w in weights.items():  # float16: 11 significant bits; below its normal range, 2^-24 apart
        np.testing.assert_allclose(w, exact[name], rtol=2**-11, atol=2**-24, err_msg=name)
        assert w.dtype == np.float32

    (step,) = [s for s in steps.STEPS if s.name == "curve"]
    assert "not among the carried wheels" in step.skip(steps.Context(False, tmp_path / "curve", 1, None))
    ctx = steps.Context(False, tmp_path / "curve", 1, None, carried)
    assert step.skip(ctx) is None
    argv = ["device=cpu" if a == "device=cuda" else a for a in step.command(ctx)]
    assert f"model.checkpoint={carried}" in argv
    trials = [resolve(cfg) for _, cfg in compose_trials([a for a in argv[3:] if not a.startswith("-")], True)[0]]
    assert len(trials) == 72 and {cfg.model.checkpoint for cfg in trials} == {str(carried)}
    assert {cfg.trainable for cfg in trials} == {"classifier", "lora", "bias"}  # lora at ranks 1 and 8


def test_a_slimmed_wheel_is_whole_and_says_so(tmp_path):
    src = tmp_path / "pkg-1.0-py3-none-any.whl"
    with zipfile.ZipFile(src, "w") as z:
        z.writestr("pkg/__init__.py", "x = 1\n")
        z.writestr("pkg/model/weights.bin", b"\0" * 1000)
        z.writestr("pkg/model/vocab.txt", "[PAD]\n")
        z.writestr("pkg-1.0.dist-info/METADATA", "Metadata-Version: 2.1\nName: pkg\nVersion: 1.0\n")
        z.writestr("pkg-1.0.dist-info/RECORD", "stale\n")
    out = wheels.slim(src, ("weights.bin",), tmp_path)
    assert out.name == "pkg-1.0+vocab-py3-none-any.whl"
    with zipfile.ZipFile(out) as z:
        files = set(z.namelist())
        assert files == {
            "pkg/__init__.py",
            "pkg/model/vocab.txt",
            "pkg-1.0+vocab.dist-info/METADATA",
            "pkg-1.0+vocab.dist-info/RECORD",
        }
        assert "Version: 1.0+vocab" in z.read("pkg-1.0+vocab.dist-info/METADATA").decode()
        for line in z.read("pkg-1.0+vocab.dist-info/RECORD").decode().splitlines():
            path, digest, size = line.split(",")
            if digest:  # RECORD lists itself without a hash
                data = z.read(path)
                want = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
                assert digest == f"sha256={want}" and int(size) == len(data)


def test_the_docs_list_every_step_with_its_budget():
    text = (REPO / "docs" / "gpu.md").read_text()
    budgets = {
        "install": check.SETUP_BUDGET_S,
        "facts": check.SETUP_BUDGET_S,
        "report": steps.REPORT_BUDGET_S,
        **{s.name: s.budget_s for s in steps.STEPS},
    }
    for name, budget in budgets.items():
        assert re.search(rf"^\| {name} \| {budget} \|", text, flags=re.M), name
    assert '{"command": "make gpu-lease", "carry": [".whl"], "timeout_s": 600}' in text  # the call to paste


@pytest.mark.slow
def test_a_kept_rung_is_what_the_shape_step_would_run_again():
    """The shape step's kept rows (none yet) hash as its ladders' rungs: B32, B128, B512 of every cell, each once."""
    (*_, deepest) = [argv for name, argv in gpu_commands(NOWHERE, every=True) if name == "shapes"]
    rungs = ladder_trials(tuple(deepest))
    assert len(rungs) == 120 and {cfg.batch_size for cfg in rungs} == {32, 128, 512}
    assert len({config_hash(SCENARIOS["model"], cfg) for cfg in rungs}) == 120


# Kept rows a change made another configuration on purpose: 77542d5 runs torch's jvp in its dual pass by default
# (jvp.impl=auto), so the next lease measures it beside the func rows kept before, which stay as the record
SUPERSEDED = {("torch", "jvp", "func")}


# the shape sweep's kept rows hash against its 40 ladders' every rung: 12 s of composing, slow (OPT's, under 1 s, not)
@pytest.mark.parametrize(
    "kept",
    [pytest.param(p, marks=pytest.mark.slow) if p.stem == "shapes" else p for p in sorted(KEPT.glob("*.csv"))],
    ids=lambda p: p.stem,
)
def test_the_rows_earlier_leases_kept_are_what_the_step_would_run_again(kept):
    """A lease skips a cell only while the step's command still hashes to its kept row: a key added with no
    ADDED_KEYS default, a changed override, and the next lease measures every kept cell again unnoticed."""
    commands = [argv for name, argv in gpu_commands(NOWHERE, every=True) if name == kept.stem]
    hashes = {config_hash(SCENARIOS["model"], cfg) for argv in commands for cfg in ladder_trials(tuple(argv))}
    rows = read_rows(kept)
    assert commands and rows
    orphans = [r for r in rows if r["config_hash"] not in hashes]
    assert [r["run_id"] for r in orphans if (r["framework"], r["mode"], r["jvp_impl"]) not in SUPERSEDED] == []


def test_readme_shows_the_gpu_table_the_kept_rows_make():
    """README's "measured on a GPU" table is `python -m bench gpu-check --table`'s, from benchmarks/gpu_rows/: every
    number in it is a kept row's, and a lease whose rows are kept without README following fails here."""
    table = readme_table()
    assert table.count("\n|") >= 3 and "NVIDIA" in table and "git " in table
    assert table in (REPO / "README.md").read_text()
