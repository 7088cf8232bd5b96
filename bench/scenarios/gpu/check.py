"""`make gpu-check`: everything a GPU can tell the suite, in one command, on a host that reaches no network.

    python -m bench gpu-check [--out DIR] [--steps a,b] [--deadline-s S] [--archive FILE] [--ag-news DIR]
    python -m bench gpu-check --lease              one device call (`make gpu-lease`): within LEASE_S, streamed
                                                   into $OUT (stream.py), into results_gpu/lease
    python -m bench gpu-check --dry-run            (or GPU_CHECK_DRY=1): every step, tiny, on the CPU
    python -m bench gpu-check --summarize --out DIR   the report and summary again, from DIR's steps; DIR's new
                                                   GPU rows kept in benchmarks/gpu_rows/ (the next lease skips them)
    python -m bench gpu-check --table              README's GPU table, from the rows kept there (kept.py)

1. install: the wheels carried in .whl/ (`make gpu-wheels`) into a folder put on PYTHONPATH for every step;
2. facts: nvidia-smi's GPU, driver and CUDA; torch's and jax's versions, what each sees -> facts/device-<time>.json;
3. the steps (steps.py), most valuable first, each the suite's own commands in their own process group under the
   step's time budget (past it the step is stopped; the rows it recorded stay), its output in <step>/step.log;
4. report: `python -m bench report` over every step's folder -> report/report.md, report/plots/, and a dated copy
   in benchmarks/; under a deadline, only with the time the steps left (`--summarize` makes it from the rows);
5. summary.md and summary.json: the device facts, and each step's status, duration, budget, exit code and rows,
   written again as each step ends.

With a deadline, every command is stopped early enough that its stop (STOP_S) and the last summary and archive
(ARCHIVE_S) still end by it. With --stream (--lease: $OUT), the console, the archive and the summary are written
into that folder as the check goes (stream.py), so a call killed at any second brings back every row recorded
until then.

Everything lands in one folder, default results_gpu/<date>_<host>/. A step that fails or runs out of time never
stops the next one. Each step writes <step>/step.json and the summary is made from those, so the archives of
several calls (one lease split into commands of at most 10 minutes) unpack into one folder and `--summarize`
puts them together. How to run it on a lent machine and read its numbers: docs/gpu.md.
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import platform
import re
import shlex
import signal
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Callable
from datetime import datetime, timezone
from pathlib import Path

from bench.errors import ConfigError
from bench.harness.command import OneLineParser, run
from bench.harness.launch import child_env
from bench.harness.preflight import check_path_value
from bench.measure.system import GIT_SHA_ENV, REPO, cpu_name, cuda_device_count, git_sha, host_slug, nvidia_smi
from bench.scenarios.gpu import wheels
from bench.scenarios.gpu.kept import EARLIER, KEPT, keep, readme_table, seed
from bench.scenarios.gpu.steps import NAMES, REPORT_BUDGET_S, STEPS, Context, Step, bench
from bench.scenarios.gpu.stream import Stream, archive
from bench.store.csv import escaped
from bench.store.read import load_rows, read_rows

SETUP_BUDGET_S = 60  # install (a few small wheels); facts (two Python processes that import a framework, 30 s each)
STOP_GRACE_S = 30  # SIGTERM to a step's process group, then SIGKILL: `python -m bench` stops its trial in seconds
STOP_S = STOP_GRACE_S + 5  # the most a stopped command takes to end: the grace, then Runner.stop's SIGKILL loop
ARCHIVE_S = 10  # after the last command: the summary and the last archive (a pack of a few MiB takes a second)
MIN_STEP_S = 20  # a step given less than this by --deadline-s is skipped: no trial finishes in it (Step.least_s)
# --lease's deadline, from the check's start. The device tool kills a command at its timeout_s, at most 600 s;
# before the check starts, make installs the carried wheels and Python imports bench (seconds: 7 small wheels,
# no index). 600 - 540 = 60 s: up to 15 s for those, the rest for what no one foresaw (a slow disk, a stop that
# takes longer). What runs inside the deadline ends by it by construction (STOP_S, ARCHIVE_S).
LEASE_S = 540
LEASE_OUT = "results_gpu/lease"  # one name for every lease: carried back, the next lease resumes it
TORCH_PROBE = (
    "import json, torch; c = torch.cuda.is_available(); print(json.dumps({'torch': torch.__version__, "
    "'torch_cuda': torch.version.cuda, 'cudnn': torch.backends.cudnn.version() if c else None, "
    "'torch_sees': [torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())]}))"
)
JAX_PROBE = (
    "import json, jax; from importlib import metadata as m; print(json.dumps({'jax': jax.__version__, "
    "'jaxlib': m.version('jaxlib'), 'jax_plugins': sorted(f\"{d.metadata['Name']} {d.version}\" for d in "
    "m.distributions() if (d.metadata['Name'] or '').lower().startswith('jax-cuda')), "
    "'jax_backend': jax.default_backend(), 'jax_sees': [d.device_kind for d in jax.devices()]}))"
)


def parse(argv: list[str] | None):
    p = OneLineParser(
        "gpu-check",
        "python -m bench gpu-check [--lease] [--dry-run] [--out DIR] [--steps a,b] "
        "[--deadline-s S] [--stream DIR] [--archive FILE] [--ag-news DIR] [--summarize] [--fresh]",
        description=(__doc__ or "").splitlines()[0],
    )
    p.add_argument(
        "--dry-run",
        action="store_true",
        default=os.environ.get("GPU_CHECK_DRY", "") not in ("", "0"),
        help="every step at tiny shapes on the CPU, so the check cannot rot (also GPU_CHECK_DRY=1)",
    )
    p.add_argument("--out", help="the output folder (default results_gpu/<date>_<host>, _dry for a dry run)")
    p.add_argument(
        "--steps",
        default=",".join(NAMES),
        help=f"which steps, in this order: {','.join(NAMES)} (default all); install, facts and the report always run",
    )
    p.add_argument(
        "--deadline-s",
        type=float,
        help="stop every step early enough that the whole check ends within "
        f"this many seconds; the report only with the time they leave (--lease: {LEASE_S})",
    )
    p.add_argument("--archive", help="also pack the output folder into this .tar.gz at the end")
    p.add_argument(
        "--stream",
        metavar="DIR",
        help="write console.log, the archive and summary.md into DIR as the "
        "check goes: the archive whenever a row lands, at least every minute (stream.py)",
    )
    p.add_argument(
        "--lease",
        action="store_true",
        help=f"one device call: --deadline-s {LEASE_S} unless given, "
        f"--out {LEASE_OUT} unless given, --stream $OUT (the device tool's folder) unless given",
    )
    p.add_argument("--ag-news", help="a folder with AG News' train.csv and test.csv for the study (else synthetic)")
    p.add_argument("--wheels", default=".whl", help="the carried wheels (default .whl, from `make gpu-wheels`)")
    p.add_argument("--site", default="/tmp/bench-gpu-site", help="where the wheels are installed (default %(default)s)")
    p.add_argument("--summarize", action="store_true", help="only the report and summary again, from --out's steps")
    p.add_argument("--table", action="store_true", help=f"print README's GPU table from {KEPT.relative_to(REPO)}/")
    p.add_argument(
        "--fresh",
        action="store_true",
        help=f"measure every cell again (by default --lease skips the cells kept in {KEPT.relative_to(REPO)}/)",
    )
    return p.parse_args(argv)


class Runner:
    """Runs a step's commands, each in its own process group, within the time left to the step; remembers the one
    running so that an interrupt of the check stops it."""

    def __init__(self, env: dict[str, str]):
        self.env, self.proc = env, None

    def __call__(self, argv: list[str], log: Path, timeout_s: float) -> int | None:
        """The command's exit code, or None when it ran out of time (its process group is stopped)."""
        with open(log, "a") as out:
            out.write(f"\n$ {shlex.join(['python', *argv])}\n")
            out.flush()
            self.proc = subprocess.Popen(
                [sys.executable, *argv],
                cwd=REPO,
                env=self.env,
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
            try:
                return self.proc.wait(timeout=max(timeout_s, 1))
            except subprocess.TimeoutExpired:
                self.stop()
                out.write(f"\ngpu-check: stopped after {timeout_s:.0f} s, the step's budget\n")
                return None
            finally:
                self.proc = None

    def stop(self) -> None:
        """SIGTERM to the running command's group (`python -m bench` stops its trial and exits); after the grace,
        SIGKILL to what is left of the group, the command or what it started, until the group is gone (up to 5 s:
        a loaded host takes a moment to end a process that was running)."""
        proc = self.proc
        if proc is None or proc.poll() is not None:
            return
        with contextlib.suppress(ProcessLookupError, subprocess.TimeoutExpired):
            os.killpg(proc.pid, signal.SIGTERM)
            proc.wait(timeout=STOP_GRACE_S)
        deadline = time.monotonic() + 5
        while time.monotonic() < deadline:
            try:
                os.killpg(proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                return
            proc.poll()  # reap the command: the group lasts while any member is left, a dead unreaped one too
            time.sleep(0.05)


def rows_note(folder: Path) -> str:
    """What a step recorded: its trials by status, capacity's searches by verdict, pytest's and rerun's last word."""
    parts = []
    trials = read_rows(folder / "runs.csv")
    if trials:
        counts = Counter(r.get("status") or "?" for r in trials)
        parts.append(f"{len(trials)} trial(s): " + ", ".join(f"{n} {s}" for s, n in counts.most_common()))
    searches = read_rows(folder / "capacity.csv")
    if searches:
        parts.append(
            f"{len(searches)} search(es): "
            + ", ".join(
                f"{r['framework']} {r['mode']}{' remat' if r.get('remat') == 'True' else ''} {r['verdict']} "
                f"{r.get('max_value') or '-'}"
                for r in searches
            )
        )
    earlier = read_rows(folder / EARLIER)
    if earlier:
        parts.append(f"{len(earlier)} of them kept from earlier leases, not run again")
    log = folder / "step.log"
    text = log.read_text(errors="replace") if log.exists() else ""
    parts += [ln.split(": ", 2)[-1] for ln in text.splitlines() if ln.startswith(("bench rerun: ", "bench report: "))]
    pytest = [ln.strip("= ") for ln in text.splitlines() if re.search(r"\d+ (passed|failed|skipped|errors?)\b", ln)]
    parts += pytest[-1:]
    return "; ".join(parts)


def record(folder: Path, **fields) -> dict:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "step.json").write_text(json.dumps(fields, indent=1))
    shown = f"{fields['status']}" + (f" in {fields['seconds']:.0f} s" if fields.get("seconds") is not None else "")
    if fields.get("exit_code") is not None:
        shown += f" (exit {fields['exit_code']})"
    print(f"gpu-check: [{fields['name']}] {shown}: {fields.get('result') or fields.get('reason') or ''}", flush=True)
    if fields["status"] in ("failed", "timeout") and (folder / "step.log").exists():
        for line in (folder / "step.log").read_text(errors="replace").splitlines()[-15:]:
            print(f"    {line}", flush=True)
    return fields


def run_step(step: Step, ctx: Context, runner: Runner, time_left: float) -> dict:
    folder, budget = ctx.folder, min(step.budget(ctx.dry), time_left)
    base = {"name": step.name, "what": step.what, "budget_s": step.budget(ctx.dry), "note": step.note(ctx)}
    reason = step.skip(ctx)
    need = MIN_STEP_S if ctx.dry else step.least_s  # never under MIN_STEP_S (test_gpu_check)
    if reason is None and budget < need:
        reason = f"{max(time_left, 0):.0f} s left before --deadline-s, less than its first row takes ({need} s)"
    if reason is not None:
        earlier = read_record(folder / "step.json", step_line) if (folder / "step.json").exists() else {}
        if earlier.get("status", "skipped") != "skipped":
            # a lease's later call that has no time for a step keeps what an earlier call's run of it recorded
            print(f"gpu-check: [{step.name}] skipped: {reason}; kept the earlier call's record", flush=True)
            return {**earlier, "result": rows_note(folder)}
        shown = shlex.join(["python", *step.command(ctx)])
        return record(folder, **base, status="skipped", reason=reason, commands=[shown])
    folder.mkdir(parents=True, exist_ok=True)
    start, commands, code = time.monotonic(), [], 0
    for argv in commands_of(step, ctx):
        commands.append(shlex.join(["python", *argv]))
        ended = runner(argv, folder / "step.log", budget - (time.monotonic() - start))
        code = ended if ended is None or code == 0 else code  # the first failure's code, or None past the budget
        if ended is None:
            break
    status = "timeout" if code is None else "ok" if code == 0 else "failed"
    return record(
        folder,
        **base,
        status=status,
        seconds=time.monotonic() - start,
        exit_code=code,
        commands=commands,
        result=rows_note(folder),
    )


def commands_of(step: Step, ctx: Context):
    """The step's first command, then the ones it makes once that has run (a rerun of what it recorded)."""
    yield step.command(ctx)
    yield from step.then(ctx)


# ---------------------------------------------------------------------------------------------- install and facts


WHEELS = Path(__file__).with_name("wheels.py")  # run by its path: it installs what importing bench needs


def install(args, out: Path, runner: Runner) -> dict:
    """The carried wheels into --site (wheels.py install), on PYTHONPATH for every step from here on. `make
    gpu-check` has run the same before this module could import (hydra is among them); run again, it reinstalls
    the same in seconds and records what this check ran with. Without wheels (a host that has the suite's
    dependencies, the dry run here) nothing is installed, but pip must be there to run the command it shows."""
    folder, found = out / "install", sorted(Path(args.wheels).glob("*.whl"))
    folder.mkdir(parents=True, exist_ok=True)
    start, argv = time.monotonic(), [str(WHEELS), "install", "--wheels", args.wheels, "--site", args.site]
    code = runner(argv, folder / "step.log", SETUP_BUDGET_S)
    if code == 0 and found:
        runner.env["PYTHONPATH"] = os.pathsep.join([args.site, runner.env["PYTHONPATH"]])
    status = "timeout" if code is None else "failed" if code else "ok" if found else "skipped"
    said = [ln for ln in (folder / "step.log").read_text().splitlines() if ln.startswith("gpu-wheels: ")]
    said = (said or [""])[-1].removeprefix("gpu-wheels: ")
    return record(
        folder,
        name="install",
        what=f"the wheels carried in {args.wheels} -> {args.site}",
        budget_s=SETUP_BUDGET_S,
        status=status,
        seconds=time.monotonic() - start,
        exit_code=code,
        commands=[shlex.join(["python", *argv])],
        **{"reason" if status == "skipped" else "result": said},
    )


def probe(code: str, env: dict[str, str]) -> dict:
    try:
        out = subprocess.run(
            [sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=SETUP_BUDGET_S / 2
        )
    except subprocess.TimeoutExpired:
        return {"error": f"no answer in {SETUP_BUDGET_S / 2:.0f} s"}
    if out.returncode != 0:
        return {"error": ((out.stderr.strip().splitlines() or ["?"])[-1])[:300]}
    return json.loads(out.stdout.strip().splitlines()[-1])


def facts(out: Path, dry: bool, env: dict[str, str]) -> dict:
    """The device and the software that measured on it -> facts/device-<time>.json; a step record of its own."""
    start = time.monotonic()
    query = nvidia_smi("--query-gpu=name,driver_version,memory.total", "--format=csv,noheader,nounits")
    gpus = [
        dict(zip(("name", "driver", "memory_mib"), (v.strip() for v in line.split(","))))
        for line in query.strip().splitlines()
    ]
    cuda = re.search(r"CUDA Version:\s*([\d.]+)", nvidia_smi())
    found = {
        "time": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "dry_run": dry,
        "host": platform.node(),
        "cpu": cpu_name(),
        "python": platform.python_version(),
        "git_sha": git_sha(env),
        "gpus": gpus,
        "nvidia_smi": "found" if query else "not found: no NVIDIA driver here",
        "driver_cuda": cuda.group(1) if cuda else None,
        **probe(TORCH_PROBE, env),
    }
    jax = probe(JAX_PROBE, env)
    found |= {("jax_error" if k == "error" else k): v for k, v in jax.items()}
    folder = out / "facts"
    folder.mkdir(parents=True, exist_ok=True)
    (folder / f"device-{found['time'].replace(':', '')}.json").write_text(json.dumps(found, indent=1))
    failed = [k for k in ("error", "jax_error") if k in found]
    return record(
        folder,
        name="facts",
        what="nvidia-smi, torch and jax: the device and what measured on it",
        budget_s=SETUP_BUDGET_S,
        status="failed" if failed else "ok",
        seconds=time.monotonic() - start,
        result=device_line(found),
    )


def device_line(f: dict) -> str:
    gpus = ", ".join(f"{g['name']} ({g['memory_mib']} MiB)" for g in f.get("gpus", [])) or "no GPU"
    torch = f"torch {f.get('torch', '?')} (CUDA {f.get('torch_cuda')}, sees {len(f.get('torch_sees', []))} GPU)"
    jax = f"jax {f.get('jax', '?')} ({f.get('jax_backend', f.get('jax_error', '?'))})"
    driver = (f.get("gpus") or [{}])[0].get("driver", "-")
    return f"{gpus}; driver {driver}, CUDA {f.get('driver_cuda')}; {torch}; {jax}"


# ------------------------------------------------------------------------------------------- report and summary


def report(out: Path, runner: Runner, time_left: float) -> dict:
    """The report over every step's folder, in the time left (a deadline's: what the steps left of it)."""
    folders = [out / s.name for s in STEPS if (out / s.name / "runs.csv").exists()]
    (out / "report" / "step.log").unlink(missing_ok=True)  # the report is remade whole, so is its log

    def skip(ctx: Context) -> str | None:
        if not folders:
            return "no step recorded a trial"
        if time_left < MIN_STEP_S:
            return (
                f"{max(time_left, 0):.0f} s left before --deadline-s, less than a step needs ({MIN_STEP_S} s): "
                "`python -m bench gpu-check --summarize --out DIR` makes it from the rows"
            )
        return None

    step = Step(
        "report",
        "python -m bench report over every step's folder -> report/report.md, plots/",
        REPORT_BUDGET_S,
        lambda ctx: bench(
            "report", *map(str, folders), "--out", str(out / "report"), "--benchmarks", str(out / "benchmarks")
        ),
        skip=skip,
    )
    return run_step(step, Context(dry=False, folder=out / "report", gpus=0, ag_news=None), runner, time_left)


def summarize(out: Path) -> str:
    """summary.json and summary.md from facts/*.json and every <step>/step.json in `out`; returns the markdown."""
    steps, devices = records(out)
    (out / "summary.json").write_text(json.dumps({"facts": devices, "steps": steps}, indent=1))
    lines = [f"# gpu-check: {out.name}", ""]
    if any(d.get("dry_run") for d in devices):
        lines += ["**Dry run**: tiny shapes on the CPU. No number here is a GPU's.", ""]
    lines += [facts_line(d) for d in devices]
    lines += ["", "| step | status | seconds | budget s | exit code | result |", "|---|---|---|---|---|---|"]
    lines += [step_line(s) for s in steps]
    lines += [
        "",
        "Each step's commands, log and results are in its folder (`<step>/step.log`, `step.json`); the "
        "tables and plots are in `report/report.md`.",
        "",
    ]
    text = "\n".join(lines)
    (out / "summary.md").write_text(text)
    return text


def facts_line(d: dict) -> str:
    return f"- {d['time']} on {d['host']} (git {d.get('git_sha') or '?'}, Python {d['python']}): {device_line(d)}"


def step_line(s: dict) -> str:
    seconds = "" if s.get("seconds") is None else f"{s['seconds']:.0f}"
    code = "" if s.get("exit_code") is None else s["exit_code"]
    result = "; ".join(x for x in (s.get("result") or s.get("reason"), s.get("note")) if x).replace("|", "/")
    cells = [s["name"], s["status"], seconds, s["budget_s"], code, result]
    # the rows' text (a run's error, a search's verdict) shown as text, never a formula (OWASP's CSV-injection rule)
    return "| " + " | ".join(escaped(str(c)) for c in cells) + " |"


def records(out: Path) -> tuple[list[dict], list[dict]]:
    """The steps' records (<step>/step.json, in the check's order) and the device facts (facts/device-*.json) in
    `out`. ConfigError (one line) naming the first that is damaged: not JSON, or not a record gpu-check writes."""
    order = ["install", "facts", *NAMES, "report"]
    steps = [read_record(p, step_line) for p in out.glob("*/step.json")]
    steps.sort(key=lambda s: order.index(s["name"]) if s["name"] in order else len(order))
    devices = [read_record(p, facts_line) for p in sorted((out / "facts").glob("device-*.json"))]
    return steps, devices


def read_record(path: Path, line: Callable[[dict], str]) -> dict:
    """One record gpu-check wrote, as long as `line` can show it."""
    accepted = "accepted: a record gpu-check writes (remove it: a step without one runs again)"
    try:
        found = json.loads(path.read_text(encoding="utf-8"))
    except (UnicodeDecodeError, ValueError) as e:
        raise ConfigError(f"{path}: not JSON ({type(e).__name__}: {str(e).splitlines()[0]}); {accepted}") from None
    except OSError as e:
        raise ConfigError(f"{path}: cannot read it: {e.strerror}; {accepted}") from None
    try:
        if not isinstance(found, dict) or not all(isinstance(found.get(k, ""), str) for k in ("name", "status")):
            raise TypeError("not an object with a name and a status")
        line(found)
    except (KeyError, TypeError, ValueError, AttributeError, IndexError) as e:
        why = f"lacks {e}" if isinstance(e, KeyError) else str(e).splitlines()[0]
        raise ConfigError(f"{path}: not a gpu-check record ({why}); {accepted}") from None
    return found


# ---------------------------------------------------------------------------------------------------------- main


def time_left(deadline: float) -> float:
    """What a command started now may run before it is stopped, so that its stop (STOP_S) and the last summary and
    archive (ARCHIVE_S) still end by the deadline (a time.monotonic())."""
    return deadline - time.monotonic() - STOP_S - ARCHIVE_S


def run_steps(
    args,
    names: list[str],
    out: Path,
    runner: Runner,
    deadline: float,
    ag_news: Path | None,
    ended: Callable[[], None],
    minilm: Path | None = None,
) -> None:
    """install, facts, then the chosen steps in the table's order, each within its budget and the deadline;
    `ended` after each (the summary, the streamed archive). `minilm`: MiniLM's weights carried beside the wheels."""
    gpus = cuda_device_count()
    chosen = [s for s in STEPS if s.name in names]
    total = 2 * SETUP_BUDGET_S + sum(s.budget(args.dry_run) for s in chosen) + REPORT_BUDGET_S
    within = "" if math.isinf(deadline) else f", within {deadline - time.monotonic():.0f} s"
    print(
        f"gpu-check: {'dry run, tiny on the CPU' if args.dry_run else f'{gpus} GPU(s)'}; steps "
        f"{', '.join(s.name for s in chosen)}; budgets {total / 60:.1f} min in all{within}; -> {out}",
        flush=True,
    )
    install(args, out, runner)
    facts(out, args.dry_run, runner.env)
    ended()
    for step in chosen:
        run_step(step, Context(args.dry_run, out / step.name, gpus, ag_news, minilm), runner, time_left(deadline))
        ended()


def lease_defaults(args) -> None:
    """--lease: the deadline, the folder and $OUT, each unless given."""
    if not args.lease:
        return
    args.deadline_s = LEASE_S if args.deadline_s is None else args.deadline_s
    args.out = args.out or (LEASE_OUT + ("_dry" if args.dry_run else ""))
    args.stream = args.stream or os.environ.get("OUT")
    if not args.stream:
        raise ConfigError(
            "--lease: $OUT is not set, so there is no folder to stream into; accepted: --stream DIR, "
            "or OUT=DIR (the device tool sets it)"
        )


def main(argv: list[str] | None = None) -> int:
    args = parse(argv)
    if args.table:
        print(readme_table())
        return 0
    steps = [s.strip() for s in args.steps.split(",") if s.strip()]
    env = {
        **os.environ,
        **child_env(),
        "PYTHONUNBUFFERED": "1",
        "WANDB_MODE": "disabled",
        "HF_HUB_OFFLINE": "1",
        "XLA_PYTHON_CLIENT_PREALLOCATE": "false",  # as every trial runs (harness/runner.py): tests, probes too
        "PYTHONPATH": os.pathsep.join(p for p in (str(REPO), os.environ.get("PYTHONPATH", "")) if p),
    }
    runner = Runner(env)

    def body() -> int:
        lease_defaults(args)
        deadline = time.monotonic() + (args.deadline_s if args.deadline_s is not None else math.inf)
        unknown = [s for s in steps if s not in NAMES]
        if unknown:
            raise ConfigError(f"--steps={','.join(unknown)}: no such step; accepted: {','.join(NAMES)}")
        ag_news = Path(args.ag_news) if args.ag_news else None
        # The curve's weights, carried beside the wheels: named relative to the tree where they lie in it, as every
        # trial runs there; the path is part of each trial's identity, so a lease in another folder still resumes
        carried = Path(args.wheels).resolve() / wheels.MINILM_FP16
        minilm = carried.relative_to(REPO) if carried.is_relative_to(REPO) else carried
        if ag_news and not all((ag_news / f).is_file() for f in ("train.csv", "test.csv")):
            raise ConfigError(f"--ag-news={ag_news}: no train.csv and test.csv there; accepted: AG News' folder")
        default = f"results_gpu/{datetime.now(timezone.utc):%Y-%m-%d}_{host_slug()}{'_dry' if args.dry_run else ''}"
        out = Path(args.out or default).resolve()
        if args.summarize and not out.is_dir():
            raise ConfigError(f"--out={out}: no such folder; accepted: a gpu-check's output folder")
        if args.summarize:  # a damaged record or results file stops it before anything is kept or remade
            records(out)
            for rows in out.glob("*/*.csv"):  # keep() reads each runs.csv's run_id and status
                load_rows([rows], required=("run_id", "status") if rows.name == "runs.csv" else ())
        if not args.summarize:  # each step's trials get results_dir=<out>/<step>, AG News as data.path=
            check_path_value("--out", "results_dir", out)
            if ag_news:
                check_path_value("--ag-news", "data.path", ag_news)
            check_path_value("--wheels", "model.checkpoint", carried)
        folder = Path(args.stream).resolve() if args.stream else None
        if folder is not None and (folder == out or out in folder.parents):
            raise ConfigError(
                f"--stream={folder}: inside --out, it would pack itself; accepted: a folder outside "
                "it (the device tool's $OUT)"
            )
        # the commit `make gpu-wheels` recorded names every row (git_sha): the tree travels without its own .git
        # (a device's copy may hold another checkout's, whose HEAD is not this tree's)
        recorded = wheels.recorded_commit(Path(args.wheels))
        if recorded:
            runner.env[GIT_SHA_ENV] = recorded

        def ended() -> None:
            summarize(out)
            if stream is not None:
                stream.step_ended()

        stream = Stream(out, folder) if folder is not None else None
        try:
            if stream is not None:
                stream.start()
            if not args.summarize:
                if args.lease and not args.dry_run and not args.fresh:
                    seed(out, steps)
                run_steps(args, steps, out, runner, deadline, ag_news, ended, minilm if carried.is_file() else None)
            else:
                for line in keep(out):
                    print(line, flush=True)
            report(out, runner, time_left(deadline))
            print(summarize(out), flush=True)
        finally:  # whatever happened, what was recorded travels back
            if stream is not None:
                stream.close()
            if args.archive and out.is_dir():
                print(f"gpu-check: {archive(out, Path(args.archive))}", flush=True)
        ended_as = [s["status"] for s in records(out)[0]]
        return 1 if any(s in ("failed", "timeout") for s in ended_as) else 0

    return run(
        "gpu-check",
        body,
        first=runner.stop,
        interrupted="the running step was stopped; the steps that ended are in their folders",
    )
