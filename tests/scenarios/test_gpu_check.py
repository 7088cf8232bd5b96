"""`make gpu-lease` and `make gpu-check` cannot rot: one dry lease (tiny shapes on the CPU, streamed into a $OUT of
its own) runs every step of the GPU check or skips it with a reason, and streams the console, the archive and the
summary; what a kill at a chosen second leaves there holds every row written until then and rebuilds the summary;
every row names the commit recorded beside the wheels where git has no answer; every command ends by the deadline,
stopped or not; an archive over the device tool's limit keeps the rows. What the commands are, test_gpu_steps.py."""

from __future__ import annotations

import contextlib
import json
import math
import os
import re
import shlex
import shutil
import signal
import subprocess
import sys
import tarfile
import time
import types
from dataclasses import dataclass
from pathlib import Path

import pytest

from bench.scenarios.gpu import check, steps, stream, wheels
from bench.scenarios.gpu.kept import keep, seed
from bench.store.read import read_rows
from tests.support import REPO, bench_here

RECORDED = "c0ffee123456-dirty"  # what `make gpu-wheels` recorded, as git_sha writes it
OUT_FILES = {stream.CONSOLE_NAME, stream.ARCHIVE_NAME, stream.SUMMARY_NAME}


def run_ids(out: Path) -> set[str]:
    """Every whole row's run_id in a results folder's steps."""
    return {r["run_id"] for f in out.glob("*/runs.csv") for r in read_rows(f)}


def archived_run_ids(archive: Path, into: Path) -> set[str]:
    """Unpack the archive into `into` (it must be a whole .tar.gz) and read its rows."""
    with tarfile.open(archive) as tar:
        tar.extractall(into, filter="data")
    return run_ids(into / "out")


def lease_command(tmp: Path, *args: str) -> list[str]:
    return [
        sys.executable,
        "-m",
        "bench",
        "gpu-check",
        "--lease",
        "--dry-run",
        "--out",
        str(tmp / "out"),
        "--wheels",
        str(tmp / "wheels"),
        *args,
    ]


def lease_env(tmp: Path) -> dict[str, str]:
    """The device tool's $OUT; no git (GIT_DIR names nothing: the tree travels without .git), the commit recorded
    beside the wheels as `make gpu-wheels` does."""
    (tmp / "wheels").mkdir()
    wheels.record_commit(tmp / "wheels", RECORDED)
    return {**os.environ, "OUT": str(tmp / "OUT"), "GIT_DIR": str(tmp / "no_git")}


@dataclass
class Lease:
    proc: subprocess.Popen
    tmp: Path
    seconds: float
    first_row_s: float  # when the first row landed, from the start
    before: set[str]  # the rows on disk then
    killed: Path  # $OUT as a kill POLL_S + 2 s later leaves it (copied while the lease runs on)


def first_row(proc: subprocess.Popen, out: Path, timeout_s: float) -> tuple[float, set[str]]:
    start = time.monotonic()
    while not run_ids(out):
        assert proc.poll() is None and time.monotonic() - start < timeout_s, "no row before the lease ended"
        time.sleep(0.2)
    return time.monotonic() - start, run_ids(out)


def snapshot(folder: Path, into: Path) -> None:
    """Each file of `folder` as it is now; one renamed away meanwhile (a pack's .part) was not there."""
    into.mkdir()
    for file in folder.iterdir():
        with contextlib.suppress(FileNotFoundError):
            shutil.copyfile(file, into / file.name)


@pytest.fixture(scope="module")
def lease(tmp_path_factory) -> Lease:
    """One dry lease of every step, as `make gpu-lease` runs it there (about 75 s on 2 cores). What a kill leaves in
    $OUT is whatever lies there at that second: it is copied POLL_S + 2 s after the first row lands."""
    tmp = tmp_path_factory.mktemp("gpu_lease")
    env = lease_env(tmp)
    start = time.monotonic()
    with open(tmp / "stdout", "w") as stdout, open(tmp / "stderr", "w") as stderr:
        proc = subprocess.Popen(lease_command(tmp), cwd=REPO, env=env, stdout=stdout, stderr=stderr)
        try:
            at, before = first_row(proc, tmp / "out", 300)
            time.sleep(stream.POLL_S + 2)
            snapshot(tmp / "OUT", tmp / "killed")
            proc.wait(timeout=600)
        finally:
            proc.kill()
    return Lease(proc, tmp, time.monotonic() - start, at, before, tmp / "killed")


@pytest.mark.slow
def test_the_dry_lease_runs_every_step_or_says_why_not(lease):
    out = lease.tmp / "out"
    assert lease.proc.returncode == 0, (lease.tmp / "stdout").read_text()[-4000:] + (lease.tmp / "stderr").read_text()
    summary = json.loads((out / "summary.json").read_text())
    by_name = {s["name"]: s for s in summary["steps"]}
    assert list(by_name) == ["install", "facts", *steps.NAMES, "report"]  # every step, in the table's order
    for name, s in by_name.items():
        assert s["status"] in ("ok", "skipped"), (name, s)
        assert s["status"] == "ok" or s["reason"], name
    # skipped on purpose, each with its reason: no wheels here (the command it would run is shown, and pip is
    # there to run it); ddp and fsdp need more than one GPU
    assert (
        "no wheels in" in by_name["install"]["reason"]
        and "pip install --no-index --no-deps" in by_name["install"]["reason"]
    )
    assert by_name["scale_out"]["status"] == "skipped" and "more than one" in by_name["scale_out"]["reason"]
    tried = (
        "shapes",
        "study",
        "curve",
        "modes_fp32",
        "compile",
        "modes_bf16",
        "torch_compile",
        "pathology",
        "what_fits",
    )
    tried += ("repro",)
    for name in tried:
        assert re.match(r"\d+ trial\(s\): \d+ ok$", by_name[name]["result"].split(";")[0]), by_name[name]
        assert all("device=cpu" in c and "model=tiny" in c for c in by_name[name]["commands"] if "rerun" not in c)
    assert by_name["compile"]["result"] == "3 trial(s): 3 ok"  # cold, from the cache, autotuning off
    assert "synthetic (AG News absent" in by_name["study"]["note"]
    assert "skipped" in by_name["cuda_tests"]["result"]  # no GPU here: every CUDA test skips
    assert "losses identical, bit for bit" in by_name["repro"]["result"]  # the deterministic trial, rerun
    assert "1 search(es)" in by_name["what_fits"]["result"]
    # the shape sweep's two rungs, a command each: the second resumed the first's trial and measured one more
    assert by_name["shapes"]["result"].startswith("2 trial(s): 2 ok; 2 search(es)"), by_name["shapes"]
    assert "torch inference fits at the limit 4" in by_name["shapes"]["result"]
    # a search point, the point above it (a grid's best at its top edge goes on above), then the winner's fresh seed
    assert by_name["curve"]["result"].startswith("3 trial(s): 3 ok")
    print(f"dry lease: {lease.seconds:.0f} s, its first row at {lease.first_row_s:.0f} s")


@pytest.mark.slow
def test_the_dry_lease_streams_the_console_the_archive_and_the_summary(lease, tmp_path):
    out, sent = lease.tmp / "out", lease.tmp / "OUT"
    assert {p.name for p in sent.iterdir()} == OUT_FILES  # three files, at the top: the device tool brings them
    console = (sent / stream.CONSOLE_NAME).read_text()
    assert "gpu-check: [modes_fp32] ok" in console and "| report | ok |" in console and "packed into" in console
    md = (out / "summary.md").read_text()
    assert (sent / stream.SUMMARY_NAME).read_text() == md
    assert "**Dry run**" in md and "torch 2" in md  # the device facts: versions (no GPU here)
    for name in ("install", "facts", *steps.NAMES, "report"):
        assert re.search(rf"^\| {name} \| (ok|skipped) \|", md, flags=re.M), name
    report = (out / "report" / "report.md").read_text()
    assert "The UMass forward-AD study's table" in report and "## What fits" in report
    assert "jvp pathology" in report and "## Framework × mode" in report
    assert list((out / "benchmarks").glob("*.md"))  # the dated copy for benchmarks/
    for name in ("study", "modes_fp32", "repro"):
        assert (out / name / "runs.csv").exists() and "$ python -m bench" in (out / name / "step.log").read_text()
    with tarfile.open(sent / stream.ARCHIVE_NAME) as tar:
        names = tar.getnames()
    assert "out/summary.md" in names and "out/report/report.md" in names and "out/study/runs.csv" in names
    assert archived_run_ids(sent / stream.ARCHIVE_NAME, tmp_path) == run_ids(out)


@pytest.mark.slow
def test_every_row_names_the_commit_recorded_beside_the_wheels(lease):
    """The tree had no git: the rows, the device facts and the dated copy name what `make gpu-wheels` recorded."""
    rows = [r for f in (lease.tmp / "out").glob("*/runs.csv") for r in read_rows(f)]
    assert rows and {r["git_sha"] for r in rows} == {RECORDED}
    (facts,) = (lease.tmp / "out" / "facts").glob("device-*.json")
    assert json.loads(facts.read_text())["git_sha"] == RECORDED
    assert [p.name for p in (lease.tmp / "out" / "benchmarks").glob("*.md")][0].endswith(f"_{RECORDED}.md")


@pytest.mark.slow
def test_a_fresh_machine_measures_only_what_no_lease_kept(lease, tmp_path):
    """The lease's rows kept (as `--summarize` keeps a GPU's), then a bare machine's lease seeded with them: its
    step runs every command again and measures nothing; the record says the rows are earlier leases'."""
    kept = tmp_path / "kept"
    said = keep(lease.tmp / "out", kept, device="cpu")
    assert any("[modes_fp32]" in line for line in said) and keep(lease.tmp / "out", kept, device="cpu") == []
    before = read_rows(kept / "modes_fp32.csv")
    assert before and {r["status"] for r in before} == {"ok"}
    out = tmp_path / "out"
    seed(out, ["modes_fp32"], kept)
    code = subprocess.run(
        lease_command(tmp_path, "--steps", "modes_fp32"),
        cwd=REPO,
        env=lease_env(tmp_path),
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert code.returncode == 0, code.stdout[-3000:] + code.stderr[-3000:]
    assert [r["run_id"] for r in read_rows(out / "modes_fp32" / "runs.csv")] == [r["run_id"] for r in before]
    record = json.loads((out / "modes_fp32" / "step.json").read_text())
    assert f"{len(before)} of them kept from earlier leases" in record["result"]
    assert "skipped" in (out / "modes_fp32" / "step.log").read_text()


def test_a_lease_seeds_only_a_resuming_step_with_no_rows_yet(tmp_path):
    """A warm machine's second call finds the first call's runs.csv and keeps it as it is."""
    kept, out = tmp_path / "kept", tmp_path / "out"
    kept.mkdir()
    (kept / "modes_fp32.csv").write_text("run_id,status\nold,ok\n")
    (kept / "study.csv").write_text("run_id,status\nold,ok\n")
    (kept / "repro.csv").write_text("run_id,status\nold,ok\n")
    (out / "study").mkdir(parents=True)
    (out / "study" / "runs.csv").write_text("run_id,status\nthis_lease,ok\n")
    seed(out, ["modes_fp32", "study", "opt", "repro"], kept)
    assert [r["run_id"] for r in read_rows(out / "modes_fp32" / "runs.csv")] == ["old"]
    assert [r["run_id"] for r in read_rows(out / "study" / "runs.csv")] == ["this_lease"]
    assert not (out / "opt").exists()
    # repro reruns what this lease recorded, what_fits searches afresh, compile compiles afresh: none is seeded
    assert not (out / "repro").exists()
    assert {s.name for s in steps.STEPS if not s.resumes} == {"what_fits", "repro", "compile"}
    (out / "repro").mkdir()
    (out / "repro" / "runs.csv").write_text("run_id,status,device\nnew,ok,cuda\n")
    assert keep(out, kept) == [] and [r["run_id"] for r in read_rows(kept / "repro.csv")] == ["old"]


@pytest.mark.slow
def test_a_kill_at_a_chosen_second_leaves_every_row_written_so_far(lease, tmp_path):
    """$OUT as a kill POLL_S + 2 s after the first row would leave it: a whole archive with every row on disk at
    that row's landing, from which `--summarize` makes the summary and the report here."""
    assert lease.first_row_s < 60, lease.first_row_s
    names = {p.name for p in lease.killed.iterdir()}
    assert stream.ARCHIVE_NAME in names and names <= OUT_FILES | {stream.ARCHIVE_NAME + ".part"}
    assert archived_run_ids(lease.killed / stream.ARCHIVE_NAME, tmp_path) >= lease.before
    assert check.main(["--summarize", "--out", str(tmp_path / "out")]) == 0
    # the steps that had ended (the first, shapes, runs two commands: it had not), and the first row's table
    assert re.search(r"^\| facts \| ok \|", (tmp_path / "out" / "summary.md").read_text(), flags=re.M)
    assert "## Framework × mode" in (tmp_path / "out" / "report" / "report.md").read_text()


@pytest.mark.slow
def test_a_lease_killed_for_real_leaves_its_rows_and_no_process(tmp_path):
    """SIGKILL to the lease's process group, as the device tool's timeout does, in the study after the first row:
    the rows so far come back, and the steps' own process groups end with the check (they die with their parent)."""
    env = lease_env(tmp_path)
    proc = subprocess.Popen(
        lease_command(tmp_path, "--steps", "modes_fp32,study"),
        cwd=REPO,
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
    try:
        _, before = first_row(proc, tmp_path / "out", 300)
        time.sleep(stream.POLL_S + 2)
        assert proc.poll() is None, "the lease ended before the kill: kill it sooner"
    finally:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
    assert archived_run_ids(tmp_path / "OUT" / stream.ARCHIVE_NAME, tmp_path / "unpacked") >= before
    assert (tmp_path / "OUT" / stream.CONSOLE_NAME).read_text().startswith("gpu-check: dry run")
    deadline = time.monotonic() + 20
    while left := [p for p in Path("/proc").glob("[0-9]*") if str(tmp_path).encode() in read_cmdline(p)]:
        assert time.monotonic() < deadline, [read_cmdline(p) for p in left]
        time.sleep(0.2)


def read_cmdline(proc: Path) -> bytes:
    try:
        return (proc / "cmdline").read_bytes()
    except OSError:
        return b""


def test_a_lease_ends_by_its_deadline_when_every_command_is_stopped(tmp_path, monkeypatch):
    """The worst case on a clock of our own: every command runs until it is stopped at its budget and its stop
    takes the whole STOP_S. The last one still ends ARCHIVE_S before the deadline; later steps are skipped."""
    clock = types.SimpleNamespace(now=0.0)
    monkeypatch.setattr(check, "time", types.SimpleNamespace(monotonic=lambda: clock.now))
    monkeypatch.setattr(check, "install", lambda *a: None)
    monkeypatch.setattr(check, "facts", lambda *a: clock.__setattr__("now", 2 * check.SETUP_BUDGET_S))

    class StoppedAtItsBudget:  # a Runner whose every command records a row, then runs until it is stopped
        env: dict = {}

        def __call__(self, argv, log, timeout_s):
            (log.parent / "runs.csv").write_text("run_id,status\nr1,ok\n")
            clock.now += timeout_s + check.STOP_S
            return None

    stopped_at_its_budget = StoppedAtItsBudget()
    args = types.SimpleNamespace(dry_run=False)
    check.run_steps(args, list(steps.NAMES), tmp_path, stopped_at_its_budget, check.LEASE_S, None, lambda: None)
    check.report(tmp_path, stopped_at_its_budget, check.time_left(check.LEASE_S))
    assert clock.now <= check.LEASE_S - check.ARCHIVE_S
    records = {p.parent.name: json.loads(p.read_text()) for p in tmp_path.glob("*/step.json")}
    assert records["shapes"]["status"] == "timeout"  # the first step, at its cap: what it leaves is too little
    assert all("left before --deadline-s" in records[name]["reason"] for name in ("modes_fp32", "study"))
    assert "--summarize" in records["report"]["reason"]


def test_a_later_call_without_time_for_a_step_keeps_what_an_earlier_call_recorded(tmp_path, monkeypatch):
    """A lease split into calls: the second, shorter call skips the steps the first one ran (its deadline leaves
    them no time), and their records, with their rows, stay as the first call left them."""
    clock = types.SimpleNamespace(now=0.0)
    monkeypatch.setattr(check, "time", types.SimpleNamespace(monotonic=lambda: clock.now))
    monkeypatch.setattr(check, "install", lambda *a: None)
    monkeypatch.setattr(check, "facts", lambda *a: None)

    class OneRowThenStopped:
        env: dict = {}

        def __call__(self, argv, log, timeout_s):
            (log.parent / "runs.csv").write_text("run_id,status\nr1,ok\n")
            clock.now += timeout_s
            return None

    args, names = types.SimpleNamespace(dry_run=False), ["modes_fp32", "modes_bf16"]
    check.run_steps(args, names, tmp_path, OneRowThenStopped(), check.LEASE_S, None, lambda: None)
    first = {p.parent.name: json.loads(p.read_text()) for p in tmp_path.glob("*/step.json")}
    assert first["modes_fp32"]["status"] == first["modes_bf16"]["status"] == "timeout"
    check.run_steps(args, names, tmp_path, OneRowThenStopped(), clock.now + 10, None, lambda: None)
    assert {p.parent.name: json.loads(p.read_text()) for p in tmp_path.glob("*/step.json")} == first
    assert re.search(r"^\| modes_bf16 \| timeout \| .* 1 trial\(s\): 1 ok", check.summarize(tmp_path), flags=re.M)


def test_a_step_with_less_time_left_than_its_first_row_gives_way_to_a_later_one(tmp_path, monkeypatch):
    """70 s left: the study (its first row takes 90) is skipped, not started and stopped with nothing recorded,
    and the next step, whose first row takes 60, runs in them."""
    clock = types.SimpleNamespace(now=0.0)
    monkeypatch.setattr(check, "time", types.SimpleNamespace(monotonic=lambda: clock.now))
    monkeypatch.setattr(check, "install", lambda *a: None)
    monkeypatch.setattr(check, "facts", lambda *a: None)
    ran = []

    class OneRowInFiveSeconds:
        env: dict = {}

        def __call__(self, argv, log, timeout_s):
            ran.append(log.parent.name)
            (log.parent / "runs.csv").write_text("run_id,status\nr1,ok\n")
            clock.now += 5
            return 0

    by_name = {s.name: s for s in steps.STEPS}
    assert by_name["study"].least_s == 90 and by_name["zo_family"].least_s == 60
    deadline = 70 + check.STOP_S + check.ARCHIVE_S
    args = types.SimpleNamespace(dry_run=False)
    check.run_steps(args, ["study", "zo_family"], tmp_path, OneRowInFiveSeconds(), deadline, None, lambda: None)
    records = {p.parent.name: json.loads(p.read_text()) for p in tmp_path.glob("*/step.json")}
    assert records["study"]["status"] == "skipped"
    assert records["study"]["reason"] == "70 s left before --deadline-s, less than its first row takes (90 s)"
    assert records["zo_family"]["status"] == "ok" and ran == ["zo_family"]


def test_every_step_can_record_its_first_row_within_its_budget():
    wrong = [s.name for s in steps.STEPS if not check.MIN_STEP_S <= s.least_s <= s.budget_s]
    assert not wrong, wrong


@pytest.mark.slow
def test_a_step_past_its_budget_is_stopped(tmp_path):
    """Its whole process group: the command and what it started (a trial runs in a process of its own)."""
    pid_file = tmp_path / "pid"
    child = (
        f"import subprocess, time; p = subprocess.Popen(['sleep', '60']); open({str(pid_file)!r}, 'w')"
        ".write(str(p.pid)); time.sleep(60)"
    )
    start = time.monotonic()
    code = check.Runner({"PATH": "/usr/bin:/bin"})(["-c", child], tmp_path / "step.log", timeout_s=3)
    assert code is None and time.monotonic() - start < 15
    assert "stopped after 3 s, the step's budget" in (tmp_path / "step.log").read_text()
    stat = Path(f"/proc/{pid_file.read_text()}/stat")
    assert not stat.exists() or stat.read_text().split()[2] == "Z"  # gone, or dead and not yet reaped


def test_an_unknown_step_is_one_line(tmp_path, capsys):
    assert check.main(["--steps", "study,nope", "--out", str(tmp_path)]) == 2
    assert (
        capsys.readouterr().err.strip()
        == "bench gpu-check: error: --steps=nope: no such step; accepted: " + ",".join(steps.NAMES)
    )


def test_a_lease_without_out_is_one_line(tmp_path, capsys, monkeypatch):
    monkeypatch.delenv("OUT", raising=False)
    assert check.main(["--lease", "--out", str(tmp_path)]) == 2
    assert (
        capsys.readouterr().err.strip() == "bench gpu-check: error: --lease: $OUT is not set, so there is no "
        "folder to stream into; accepted: --stream DIR, or OUT=DIR (the device tool sets it)"
    )


def test_an_archive_over_the_limit_keeps_the_rows(tmp_path, monkeypatch):
    """The device tool brings back no file over ARCHIVE_LIMIT_MB: the archive is packed again with the rows, the
    records and each step's log, without the trials' own logs and histories."""
    out = tmp_path / "out"
    (out / "modes_fp32" / "logs").mkdir(parents=True)
    (out / "modes_fp32" / "runs.csv").write_text("run_id,status\nr1,ok\nr2,o")  # r2 still being written
    (out / "modes_fp32" / "step.log").write_text("$ python -m bench ...\n")
    (out / "modes_fp32" / "logs" / "r1.log").write_bytes(os.urandom(300_000))
    monkeypatch.setattr(stream, "ARCHIVE_LIMIT_MB", 0.1)
    said = stream.archive(out, tmp_path / "OUT" / "a.tar.gz")
    assert "without the trials' logs" in said and "still over" not in said
    with tarfile.open(tmp_path / "OUT" / "a.tar.gz") as tar:
        assert sorted(tar.getnames()) == ["out/modes_fp32/runs.csv", "out/modes_fp32/step.log"]
        assert tar.extractfile("out/modes_fp32/runs.csv").read() == b"run_id,status\nr1,ok\n"
    assert [p.name for p in (tmp_path / "OUT").iterdir()] == ["a.tar.gz"]


@pytest.mark.parametrize("name", ["gpu=1", "it's", "a[0]", "a,b", "${oops}"])
def test_an_out_folder_hydra_cannot_carry_is_one_line_before_anything_runs(tmp_path, name):
    """Every step's trials get results_dir=<out>/<step>: a folder Hydra reads as something else is refused before
    the install, the facts and the CUDA tests run, not by every trial step after them."""
    out = tmp_path / name
    proc = bench_here("gpu-check", "--dry-run", "--out", str(out))
    lines = proc.stderr.strip().splitlines()
    assert proc.returncode == 2 and len(lines) == 1, proc.stderr
    assert lines[0].startswith(f"bench gpu-check: error: --out={out}: Hydra cannot read it back from results_dir=")
    assert "accepted: a path of ASCII letters, digits" in lines[0]
    assert not out.exists() and "gpu-check: [" not in proc.stdout


def test_printed_commands_are_quoted_as_a_shell_reads_them(tmp_path, monkeypatch):
    """A folder whose name a shell would run (Hydra reads it as one value): each step's recorded commands and its
    log's `$ ...` line split back into the argv that ran, the name whole."""
    out = tmp_path / "gpu run | touch $PWNED"
    monkeypatch.setattr(check, "install", lambda *a: None)
    monkeypatch.setattr(check, "facts", lambda *a: None)
    ran = []

    class Records:  # a Runner that records each command, ok, without running it
        env: dict = {}

        def __call__(self, argv, log, timeout_s):
            ran.append(["python", *argv])
            return 0

    check.run_steps(
        types.SimpleNamespace(dry_run=True), list(steps.NAMES), out, Records(), math.inf, None, lambda: None
    )
    recorded = [shlex.split(c) for p in out.glob("*/step.json") for c in json.loads(p.read_text())["commands"]]
    assert ran and all(argv in recorded for argv in ran)
    assert any(f"results_dir={out / 'modes_fp32'}" in argv for argv in ran)
    log = tmp_path / "step.log"
    assert check.Runner({"PATH": "/usr/bin:/bin"})(["-c", "pass", str(out)], log, timeout_s=30) == 0
    (line,) = [ln for ln in log.read_text().splitlines() if ln.startswith("$ ")]
    assert shlex.split(line[2:]) == ["python", "-c", "pass", str(out)]


def test_an_ag_news_folder_hydra_cannot_carry_is_one_line(tmp_path):
    ag_news = tmp_path / "ag=news"  # the study's trials get data.path=<it>
    ag_news.mkdir()
    for name in ("train.csv", "test.csv"):
        (ag_news / name).write_text('"1","title","text"\n')
    proc = bench_here("gpu-check", "--dry-run", "--out", str(tmp_path / "out"), "--ag-news", str(ag_news))
    assert proc.returncode == 2 and not (tmp_path / "out").exists(), proc.stderr
    assert proc.stderr.strip() == (
        f"bench gpu-check: error: --ag-news={ag_news}: Hydra cannot read it back from "
        "data.path=PATH; accepted: a path of ASCII letters, digits, spaces and / . _ - : "
        "(not = , ' \" [ ] ( ) { } ${ ; or &)"
    )
