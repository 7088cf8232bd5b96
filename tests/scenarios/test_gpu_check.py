"""`make gpu-check` cannot rot: its dry run (tiny shapes on the CPU) runs every step of the GPU check or skips it
with a reason, and writes the summary, the report and the archive; every command it would run on a GPU passes
preflight here; a step past its budget is stopped; the wheels it carries are exactly what the GPU image lacks."""

from __future__ import annotations

import base64
import hashlib
import json
import re
import subprocess
import sys
import tarfile
import time
import zipfile
from pathlib import Path

import pytest

from bench.harness.preflight import preflight
from bench.scenarios import SCENARIOS
from bench.scenarios.capacity import run as capacity
from bench.scenarios.gpu import check, steps, wheels
from tests.support import REPO


@pytest.fixture(scope="module")
def dry_run(tmp_path_factory) -> tuple[subprocess.CompletedProcess, Path, float]:
    """One dry run of the whole check, shared by the tests that read it (about 100 s on 2 cores)."""
    tmp = tmp_path_factory.mktemp("gpu_check")
    start = time.monotonic()
    proc = subprocess.run([sys.executable, "-m", "bench", "gpu-check", "--dry-run", "--out", str(tmp / "out"),
                           "--wheels", str(tmp / "no_wheels"), "--archive", str(tmp / "gpu_check.tar.gz")],
                          cwd=REPO, capture_output=True, text=True, timeout=600)  # fmt: skip
    return proc, tmp, time.monotonic() - start


def test_the_dry_run_runs_every_step_or_says_why_not(dry_run):
    proc, tmp, seconds = dry_run
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-2000:]
    summary = json.loads((tmp / "out" / "summary.json").read_text())
    by_name = {s["name"]: s for s in summary["steps"]}
    assert list(by_name) == ["install", "facts", *steps.NAMES, "report"]  # every step, in the table's order
    for name, s in by_name.items():
        assert s["status"] in ("ok", "skipped"), (name, s)
        assert s["status"] == "ok" or s["reason"], name
    # skipped on purpose, each with its reason: no wheels here (the command it would run is shown, and pip is
    # there to run it); ddp and fsdp need more than one GPU
    assert "no wheels in" in by_name["install"]["reason"] and "pip install --no-index --no-deps" in \
        by_name["install"]["reason"]  # fmt: skip
    assert by_name["scale_out"]["status"] == "skipped" and "more than one" in by_name["scale_out"]["reason"]
    for name in ("study", "modes_fp32", "modes_bf16", "torch_compile", "pathology", "what_fits", "repro"):
        assert re.match(r"\d+ trial\(s\): \d+ ok$", by_name[name]["result"].split(";")[0]), by_name[name]
        assert all("device=cpu" in c and "model=tiny" in c for c in by_name[name]["commands"] if "rerun" not in c)
    assert "synthetic (AG News absent" in by_name["study"]["note"]
    assert "skipped" in by_name["cuda_tests"]["result"]  # no GPU here: every CUDA test skips
    assert "losses identical, bit for bit" in by_name["repro"]["result"]  # the deterministic trial, rerun
    assert "1 search(es)" in by_name["what_fits"]["result"]
    print(f"dry run: {seconds:.0f} s")


def test_the_dry_run_leaves_the_summary_the_report_and_the_archive(dry_run):
    _, tmp, _ = dry_run
    out = tmp / "out"
    md = (out / "summary.md").read_text()
    assert "**Dry run**" in md and "torch 2" in md  # the device facts: versions (no GPU here)
    for name in ("install", "facts", *steps.NAMES, "report"):
        assert re.search(rf"^\| {name} \| (ok|skipped) \|", md, flags=re.M), name
    report = (out / "report" / "report.md").read_text()
    assert "The UMass forward-AD study's table" in report and "## What fits" in report
    assert "jvp pathology" in report and "## Framework × mode" in report
    assert list((out / "benchmarks").glob("*.md"))  # the dated copy for benchmarks/
    for name in ("study", "modes_fp32", "repro"):
        assert (out / name / "runs.csv").exists() and "$ python -m bench" in (out / name / "step.log").read_text()
    with tarfile.open(tmp / "gpu_check.tar.gz") as tar:
        names = tar.getnames()
    assert "out/summary.md" in names and "out/report/report.md" in names and "out/study/runs.csv" in names
    # the archives of several calls unpacked into one folder: the report and the summary again, from every step
    (out / "summary.md").unlink()
    (out / "report" / "report.md").unlink()
    assert check.main(["--summarize", "--out", str(out)]) == 0
    assert (out / "report" / "report.md").exists() and "| what_fits | ok |" in (out / "summary.md").read_text()


def gpu_commands(tmp_path: Path) -> list[tuple[str, list[str]]]:
    """Every step's first command as the GPU host would run it (two GPUs, so that scale_out is not skipped)."""
    return [(s.name, s.command(steps.Context(False, tmp_path / s.name, 2, None))) for s in steps.STEPS]


@pytest.mark.parametrize("name", [s.name for s in steps.STEPS])
def test_every_gpu_command_passes_preflight(name, tmp_path):
    """The GPU's own values (bert_base, B8 T128, the full sweeps), validated here as any trial would be: only
    device=cuda becomes cpu (this host has no GPU)."""
    argv = dict(gpu_commands(tmp_path))[name]
    assert "device=cuda" in argv or argv[:2] == ["-m", "pytest"]
    args = ["device=cpu" if a == "device=cuda" else a for a in argv[2:]]
    if argv[:2] == ["-m", "pytest"]:
        files = [a for a in args if a.startswith("tests/")]
        assert files and all((REPO / f).is_file() for f in files)
    elif args[0] == "capacity":
        capacity.prepare(capacity.parse(args[1:]))
    else:
        overrides = [a for a in args if not a.startswith("-")]
        assert preflight(overrides, "-m" in args, SCENARIOS) >= 1


def test_every_step_fits_one_device_call():
    """A device command is cut at 10 minutes: install, facts, any one step and the report fit in one, so a call
    that names one step gives it its whole budget. The whole check does not fit a lease (measured on an H100: JAX
    compiles for minutes), so a call resumes what the last one left (docs/gpu.md)."""
    for step in steps.STEPS:
        assert 2 * check.SETUP_BUDGET_S + step.budget_s + steps.REPORT_BUDGET_S <= 600, step.name


def test_a_step_past_its_budget_is_stopped(tmp_path):
    """Its whole process group: the command and what it started (a trial runs in a process of its own)."""
    pid_file = tmp_path / "pid"
    child = (f"import subprocess, time; p = subprocess.Popen(['sleep', '60']); open({str(pid_file)!r}, 'w')"
             ".write(str(p.pid)); time.sleep(60)")  # fmt: skip
    start = time.monotonic()
    code = check.Runner({"PATH": "/usr/bin:/bin"})(["-c", child], tmp_path / "step.log", timeout_s=3)
    assert code is None and time.monotonic() - start < 15
    assert "stopped after 3 s, the step's budget" in (tmp_path / "step.log").read_text()
    stat = Path(f"/proc/{pid_file.read_text()}/stat")
    assert not stat.exists() or stat.read_text().split()[2] == "Z"  # gone, or dead and not yet reaped


def test_an_unknown_step_is_one_line(tmp_path, capsys):
    assert check.main(["--steps", "study,nope", "--out", str(tmp_path)]) == 2
    assert capsys.readouterr().err.strip() == "bench gpu-check: error: --steps=nope: no such step; accepted: " \
        + ",".join(steps.NAMES)  # fmt: skip


def test_the_carried_wheels_are_what_the_gpu_image_lacks():
    """Every dependency in pyproject.toml is on the GPU image, carried, or left behind with a reason."""
    tomllib = pytest.importorskip("tomllib")  # Python 3.11+
    deps = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["dependencies"]
    names = {re.split(r"[<>=!~\[ ;]", d, maxsplit=1)[0].lower() for d in deps}
    classified = set(wheels.IMAGE) | set(wheels.CARRIED) | set(wheels.NOT_CARRIED)
    assert names <= classified, names - classified
    assert not set(wheels.IMAGE) & set(wheels.CARRIED)


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
        assert files == {"pkg/__init__.py", "pkg/model/vocab.txt", "pkg-1.0+vocab.dist-info/METADATA",
                         "pkg-1.0+vocab.dist-info/RECORD"}  # fmt: skip
        assert "Version: 1.0+vocab" in z.read("pkg-1.0+vocab.dist-info/METADATA").decode()
        for line in z.read("pkg-1.0+vocab.dist-info/RECORD").decode().splitlines():
            path, digest, size = line.split(",")
            if digest:  # RECORD lists itself without a hash
                data = z.read(path)
                want = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
                assert digest == f"sha256={want}" and int(size) == len(data)


def test_the_docs_list_every_step_with_its_budget():
    text = (REPO / "docs" / "gpu.md").read_text()
    budgets = {"install": check.SETUP_BUDGET_S, "facts": check.SETUP_BUDGET_S, "report": steps.REPORT_BUDGET_S,
               **{s.name: s.budget_s for s in steps.STEPS}}  # fmt: skip
    for name, budget in budgets.items():
        assert re.search(rf"^\| {name} \| {budget} \|", text, flags=re.M), name
