"""`python -m bench`: the Hydra app. One job = one trial, measured in its own spawned process (bench/runner.py).
scenario=model (default): one AD mode on BERT; scenario=ops: op-level AD micro-benchmarks (bench/scenarios/).

Before Hydra starts anything, every trial the command line names is composed and validated (bench/preflight.py),
so bad input gets one clear line and a non-zero exit before any process starts or any row is written.
"""

from __future__ import annotations

import os
import signal
import sys
from dataclasses import fields

import hydra

from bench import sweep
from bench.config import (
    CONF_DIR,
    GROUPS,
    LAUNCH_ID,
    BenchConfig,
    DataConfig,
    LoggerConfig,
    ModelConfig,
    OpsConfig,
    OptimizerConfig,
    available,
    launch_id,
    register_configs,
    to_container,
)
from bench.errors import ConfigError
from bench.preflight import compose_trials, preflight
from bench.runner import LAUNCHER_PID, OUTCOMES, run_job, stop_descendants
from bench.system import Interrupted, interrupts_raise

CASE_NOTE = ("case=NAME is a mode preset: it sets mode and the keys that come with it (backprop_remat: mode=backprop "
             "remat=true; jacfwd_head: mode=jacfwd trainable=head); a key given on the command line wins.")

# Flags that ask Hydra for information rather than runs: handed over untouched.
_HYDRA_INFO_FLAGS = ("--hydra-help", "--cfg", "-c", "--info", "-i", "--resolve", "--package", "-p",
                     "--shell-completion", "-sc", "--version", "--config-path", "-cp", "--config-name", "-cn",
                     "--config-dir", "-cd", "--experimental-rerun")

register_configs()


@hydra.main(version_base="1.3", config_path="../conf", config_name="config")
def _hydra_app(cfg) -> dict:
    return run_job(cfg)


def main(argv: list[str] | None = None) -> None:
    argv = list(sys.argv[1:] if argv is None else argv)
    if any(a in ("-h", "--help") for a in argv):
        print(help_text())
        return
    os.environ[LAUNCHER_PID] = str(os.getpid())  # jobs name their temp folders after this launch
    os.environ.pop(LAUNCH_ID, None)
    launch_id()  # a new id for this launch: its Hydra folder and sweep_id, for every job it starts
    if not any(a.split("=")[0] in _HYDRA_INFO_FLAGS for a in argv):
        multirun = any(a in ("-m", "--multirun") for a in argv)
        overrides = [a for a in argv if not a.startswith("-")]
        try:
            preflight(overrides, multirun)
        except ConfigError as e:
            print(f"bench: error: {e}", file=sys.stderr)
            sys.exit(2)
    sys.argv = [sys.argv[0], *argv]
    try:
        with interrupts_raise(first=stop_descendants):
            _hydra_app()
    except (Interrupted, KeyboardInterrupt) as e:
        code = e.exit_code if isinstance(e, Interrupted) else 130
        print(f"bench: interrupted ({signal.Signals(code - 128).name}): the running trial was stopped and nothing "
              "recorded for it; the same command with resume=true runs the trials not recorded yet", file=sys.stderr)
        sys.exit(code)
    sys.exit(exit_code(sweep.LAST_STATUSES if sweep.LAST_STATUSES is not None else OUTCOMES))


def exit_code(statuses: list[str]) -> int:
    """0 when every trial produced its measurement (ok; oom and timeout are measured outcomes; skipped was
    recorded before), 1 when any trial ended error or crashed."""
    return 1 if any(s in ("error", "crashed") for s in statuses) else 0


# ---------------------------------------------------------------------------------------------------------------
# --help


def shown(value) -> str:
    """A default as it would be typed on the command line."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return str(value).lower()
    return str(value).replace(" ", "")


def help_text() -> str:
    (_, composed), = compose_trials([], multirun=False)[0]
    defaults = to_container(composed)  # what a trial gets when nothing is given: conf/config.yaml and its presets

    def section(title, cls, prefix=""):
        node = defaults.get(prefix.rstrip("."), {}) if prefix else defaults
        rows = [f"  {prefix}{f.name:<{24 - len(prefix)}} {f.metadata['help']} [default: {shown(node.get(f.name))}]"
                for f in fields(cls) if "help" in f.metadata]  # fmt: skip
        return f"{title}\n" + "\n".join(rows)

    groups = "\n".join(f"  {g:<24} {' | '.join(available(g))}" for g in GROUPS if (CONF_DIR / g).exists())
    return "\n\n".join([
        "bench: JAX vs PyTorch automatic-differentiation benchmarks on BERT (scenario=model) and on single ops "
        "(scenario=ops)",
        "usage:\n  python -m bench [key=value ...]                  one trial\n"
        "  python -m bench scenario=ops [framework=jax]     op micro-benchmarks: every op x size, one process\n"
        "  python -m bench -m key=a,b [key=x,y ...]         a sweep (cartesian product), one process per trial\n"
        "  python -m bench -m +experiment=NAME              a ready-made experiment (conf/experiment)\n"
        "  python -m bench -m ... hydra/launcher=joblib     local parallel; submitit_local / submitit_slurm",
        f"config groups (choose with group=option)\n{groups}\n  {CASE_NOTE}",
        section("options", BenchConfig),
        section("model.* (override a preset field, e.g. model.num_layers=4)", ModelConfig, "model."),
        section("data.*", DataConfig, "data."),
        section("optimizer.*", OptimizerConfig, "optimizer."),
        section("logger.*", LoggerConfig, "logger."),
        section("ops.* (scenario=ops; e.g. ops.names=[matmul,exp] ops.sizes=[256,1024])", OpsConfig, "ops."),
        "outputs: <results_dir>/runs.csv (one row per trial), <results_dir>/ops.csv (scenario=ops: one row per op "
        "and shape),\n  <results_dir>/logs/, <results_dir>/wandb/\n"
        "Hydra's own flags: --hydra-help, --cfg job, --info",
    ])


if __name__ == "__main__":
    main()
