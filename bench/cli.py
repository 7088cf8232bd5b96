"""`python -m bench [COMMAND]`: the suite's one command line, and the only module that knows every command.

    python -m bench [key=value ...]          one trial, or with -m a sweep (Hydra): one spawned process per trial
    python -m bench report [...]             tables and plots from the results -> report.md (bench/report/)
    python -m bench capacity [...]           the largest batch or sequence length in a memory budget
    python -m bench overhead [...]           the harness against a plain training loop (make perf)
    python -m bench targets [...]            the training modes' memory and speed targets, met or missed
    python -m bench dashboard [...]          the W&B workspace and report of the runs
    python -m bench rerun RUN_ID             a recorded trial again, from its saved config: same losses?
    python -m bench gpu-check [...]          on a lent GPU machine: the CUDA tests and the GPU measurements

Trials: before Hydra starts anything, every trial the command line names is composed and validated
(bench/harness/preflight.py), so bad input gets one clear line and exit 2 before any process starts or any row is
written. Hydra then runs one job per trial (bench/harness/runner.py), each resolved once into the typed config.
The exit code is made of the jobs' outcomes: 1 when any trial ended error or crashed, else 0.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

import hydra

from bench.config import CONF_DIR, LAUNCH_ID, available, launch_id, options, register_configs, resolve
from bench.errors import ConfigError
from bench.harness import command, rerun, runner, sweep
from bench.harness.launch import LAUNCHER_PID, adopt, quiet_helpers, stop_descendants
from bench.harness.preflight import compose_trials, preflight, searchpath
from bench.harness.trust import check_config_dir
from bench.report import build as report
from bench.report import dashboard
from bench.scenarios import COLUMNS, REPORT_SECTIONS, SCENARIOS
from bench.scenarios.capacity import run as capacity
from bench.scenarios.gpu import check as gpu_check
from bench.scenarios.model.report import targets
from bench.scenarios.overhead import run as overhead

CASE_NOTE = (
    "case=NAME is a mode preset: it sets mode and the keys that come with it (backprop_remat: mode=backprop "
    "remat=true; jacfwd_head: mode=jacfwd trainable=head); a key given on the command line wins."
)

# Flags that ask Hydra for information rather than runs: handed over untouched.
_HYDRA_INFO_FLAGS = (
    "--hydra-help",
    "--cfg",
    "-c",
    "--info",
    "-i",
    "--resolve",
    "--package",
    "-p",
    "--shell-completion",
    "-sc",
    "--version",
)
# Hydra takes one of these at a time (with two it raises a ValueError): each flag, long and short
_HYDRA_MODES = {
    "-m": "-m",
    "--multirun": "-m",
    "--cfg": "--cfg",
    "-c": "--cfg",
    "--info": "--info",
    "-i": "--info",
    "--shell-completion": "-sc",
    "-sc": "-sc",
    "--run": "--run",
    "-r": "--run",
}
# Another primary config, or a job pickled by Hydra: either would run trials that preflight never saw
_PRIMARY = "conf/config.yaml is the suite's primary config"
_HYDRA_REFUSED = {
    "--config-path": _PRIMARY,
    "-cp": _PRIMARY,
    "--config-name": _PRIMARY,
    "-cn": _PRIMARY,
    "--experimental-rerun": "a recorded trial runs again with python -m bench rerun RUN_ID",
}
_CONFIG_DIR = ("--config-dir", "-cd")
_CONFIG_DIR_ACCEPTED = "a folder of configs laid out as conf/ (experiment/NAME.yaml, model/NAME.yaml, ...)"

register_configs()


class SweepCallback(sweep.SweepCallback):
    """The sweep callback conf/config.yaml names: the harness's, given the scenarios."""

    scenarios = SCENARIOS


@hydra.main(version_base="1.3", config_path=str(CONF_DIR), config_name="config")
def _hydra_app(cfg) -> dict:
    return runner.run_job(cfg, SCENARIOS)


COMMANDS = {
    "options": lambda argv: print_options(argv),
    "report": lambda argv: report.main(argv, REPORT_SECTIONS),
    "capacity": capacity.main,
    "overhead": overhead.main,
    "targets": targets.main,
    "dashboard": lambda argv: dashboard.main(argv, COLUMNS),
    "rerun": lambda argv: rerun.main(argv, SCENARIOS),
    "gpu-check": gpu_check.main,
}


def main(argv: list[str] | None = None) -> None:
    argv = list(sys.argv[1:] if argv is None else argv)
    adopt()  # started by another command of the suite (bench overhead's suite side): die with it
    if argv and argv[0] in COMMANDS:
        sys.exit(COMMANDS[argv[0]](argv[1:]))
    if any(a in ("-h", "--help") for a in argv):
        print(help_text())
        return
    sys.exit(trials(argv))


def trials(argv: list[str]) -> int:
    """Trials and sweeps through Hydra: preflight every trial, run the jobs, return the launch's exit code."""
    os.environ[LAUNCHER_PID] = str(os.getpid())  # jobs name their temp folders after this launch
    os.environ.pop(LAUNCH_ID, None)
    quiet_helpers()
    launch_id()  # a new id for this launch: its Hydra folder and sweep_id, for every job it starts
    flags, config_dir, overrides = hydra_flags(argv)
    info = any(f in _HYDRA_INFO_FLAGS for f in flags)
    multirun = "-m" in (_HYDRA_MODES.get(f) for f in flags)

    def body() -> int:
        check_flags(flags, config_dir)
        if config_dir is not None:  # data, as a saved config is: --cfg job --resolve would print what it resolves
            check_config_dir(Path(config_dir))
        if info:
            sys.argv = [sys.argv[0], *argv]
            _hydra_app()
            return 0
        search = [searchpath(Path(config_dir))] if config_dir is not None else []
        preflight(overrides + search, multirun, SCENARIOS)
        ((_, first),) = compose_trials(overrides + search, multirun, limit=1)[0]
        folder = Path(resolve(first).results_dir) / "hydra" / f"outcomes_{launch_id()}"
        os.environ[runner.OUTCOMES] = str(folder.resolve())  # every job leaves its outcome there
        # Hydra's errors as raised: bench.harness.command says them in one line (a full disk while Hydra writes
        # its own files included) where Hydra would print a stack trace and its HYDRA_FULL_ERROR advice
        os.environ.setdefault("HYDRA_FULL_ERROR", "1")
        sys.argv = [sys.argv[0], *argv]
        _hydra_app()
        return exit_code(runner.outcomes(folder))

    return command.run(
        "",
        body,
        first=stop_descendants,
        interrupted="the running trial was stopped and nothing recorded for it (a curve it had drawn "
        "is kept in history/); the same command with resume=true runs the trials not recorded yet",
    )


def hydra_flags(argv: list[str]) -> tuple[list[str], str | None, list[str]]:
    """The command line's Hydra flags (their names), the folder --config-dir adds ("" when none follows it), and
    the overrides (key=value, each a trial's or a sweep's)."""
    flags, config_dir, overrides, rest = [], None, [], iter(argv)
    for a in rest:
        if not a.startswith("-"):
            overrides.append(a)
            continue
        name, eq, value = a.partition("=")
        flags.append(name)
        if name in _CONFIG_DIR:
            config_dir = value if eq else next(rest, "")
    return flags, config_dir, overrides


def check_flags(flags: list[str], config_dir: str | None) -> None:
    """Hydra's flags that would end in a traceback, or run trials past preflight: one line each (ConfigError)."""
    modes = list(dict.fromkeys(_HYDRA_MODES[f] for f in flags if f in _HYDRA_MODES))
    if len(modes) > 1:
        raise ConfigError(
            f"{' with '.join(modes)}: Hydra takes one of -m, --cfg, --info, -sc; "
            "accepted: --cfg job|hydra|all without -m, each key one value (it prints that trial's "
            "config)"
        )
    for f in flags:
        if f in _HYDRA_REFUSED:
            raise ConfigError(
                f"{f}: not taken here ({_HYDRA_REFUSED[f]}); accepted: --config-dir DIR, "
                f"{_CONFIG_DIR_ACCEPTED}, which join conf/'s"
            )
    if config_dir is not None and not config_dir.strip():  # Path("") is the working directory: never meant
        raise ConfigError(
            f"--config-dir={config_dir}: no folder given; accepted: --config-dir DIR, {_CONFIG_DIR_ACCEPTED}"
        )
    if config_dir is not None and not Path(config_dir).is_dir():
        raise ConfigError(
            f"--config-dir={config_dir}: not a folder; accepted: {_CONFIG_DIR_ACCEPTED}, which join conf/'s"
        )


def exit_code(statuses: list[str]) -> int:
    """0 when every trial produced its measurement (ok; oom and timeout are measured outcomes; skipped was
    recorded before), 1 when any trial ended error or crashed."""
    return 1 if any(s in ("error", "crashed") for s in statuses) else 0


def composed_defaults():
    """What a trial gets when nothing is given: the schema and the default presets."""
    ((_, composed),) = compose_trials([], multirun=False)[0]
    return resolve(composed)


def options_markdown() -> str:
    """docs/options.md: every option with its help and default, from the schema (`make docs` writes it; a test
    checks the file is what this returns)."""
    rows = [
        f"| `{name}` | {text.replace('|', '&#124;')} | `{value}` |"
        for name, text, value in options(defaults=composed_defaults())
    ]
    return "\n".join(
        [
            "# Options",
            "",
            "Every option of `python -m bench`, generated from the schema (bench/config.py) by `make docs`; "
            "`python -m bench --help` prints the same. Defaults are those of the default presets "
            "(`model=minilm_l6 data=synthetic optimizer=sgd logger=wandb ops=default`); `model.*`, `data.*`, "
            "`optimizer.*`, `logger.*` and `ops.*` override a field of the preset chosen. How to run trials, sweeps "
            "and experiments: [usage.md](usage.md).",
            "",
            "| option | what it does, what it accepts | default |",
            "| --- | --- | --- |",
            *rows,
            "",
        ]
    )


def print_options(argv: list[str]) -> int:
    """`python -m bench options`: docs/options.md's text (the markdown option table) on stdout."""
    parser = command.OneLineParser("options", "python -m bench options", description=print_options.__doc__)
    parser.parse_args(argv)
    print(options_markdown(), end="")
    return 0


def help_text() -> str:
    defaults = composed_defaults()
    rows = "\n".join(f"  {name:<32} {text} [default: {value}]" for name, text, value in options(defaults=defaults))
    groups = "\n".join(
        f"  {g:<24} {' | '.join(available(g))}"
        for g in ("model", "data", "optimizer", "logger", "ops", "case", "experiment")
    )
    return "\n\n".join(
        [
            "bench: JAX vs PyTorch automatic-differentiation benchmarks on BERT (scenario=model) and on single ops "
            "(scenario=ops)",
            "usage:\n  python -m bench [key=value ...]                  one trial\n"
            "  python -m bench scenario=ops [framework=jax]     op micro-benchmarks: every op x size, one process\n"
            "  python -m bench -m key=a,b [key=x,y ...]         a sweep (cartesian product), one process per trial\n"
            "  python -m bench -m +experiment=NAME              a ready-made experiment (conf/experiment)\n"
            "  python -m bench -m ... hydra/launcher=joblib     local parallel; submitit_local / submitit_slurm\n"
            "  python -m bench COMMAND --help                   " + " | ".join(COMMANDS),
            f"config groups (choose with group=option)\n{groups}\n  {CASE_NOTE}",
            f"options (model.*, data.*, optimizer.*, logger.*, ops.* override a preset's field)\n{rows}",
            "outputs: <results_dir>/runs.csv (one row per trial), <results_dir>/ops.csv (scenario=ops: one row per op "
            "and shape),\n  <results_dir>/history/, <results_dir>/logs/, <results_dir>/wandb/\n"
            "Hydra's own flags: --hydra-help, --cfg job (one trial, without -m), --info, --config-dir DIR (configs "
            "laid out as conf/, joining its own)",
        ]
    )
