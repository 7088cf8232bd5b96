"""`python -m bench`: the Hydra app. One job = one trial, measured in its own spawned process (bench/runner.py).
scenario=model (default): one AD mode on BERT; scenario=ops: op-level AD micro-benchmarks (bench/ops/).

Before Hydra starts anything, every trial the command line names (all combinations of a -m sweep, including the
sweep an experiment config declares) is composed and validated, so bad input gets one clear line and a non-zero
exit before any process starts or any row is written.
"""

from __future__ import annotations

import contextlib
import itertools
import sys
from dataclasses import fields

import hydra

from bench.config import (
    CONF_DIR,
    GROUPS,
    BenchConfig,
    ConfigError,
    DataConfig,
    LoggerConfig,
    ModelConfig,
    OpsConfig,
    OptimizerConfig,
    available,
    register_configs,
    validate,
)

# Flags that ask Hydra for information rather than runs: handed over untouched.
_HYDRA_INFO_FLAGS = ("--hydra-help", "--cfg", "-c", "--info", "-i", "--resolve", "--package", "-p",
                     "--shell-completion", "-sc", "--version", "--config-path", "-cp", "--config-name", "-cn",
                     "--config-dir", "-cd", "--experimental-rerun")
MAX_PREFLIGHT = 2000  # sweeps larger than this are validated per job instead (composition takes ~20 ms each)

register_configs()


@hydra.main(version_base="1.3", config_path="../conf", config_name="config")
def _hydra_app(cfg) -> dict:
    from bench.runner import run_job

    return run_job(cfg)


def main(argv: list[str] | None = None) -> None:
    argv = list(sys.argv[1:] if argv is None else argv)
    if any(a in ("-h", "--help") for a in argv):
        print(help_text())
        return
    if not any(a.split("=")[0] in _HYDRA_INFO_FLAGS for a in argv):
        multirun = any(a in ("-m", "--multirun") for a in argv)
        overrides = [a for a in argv if not a.startswith("-")]
        try:
            preflight(overrides, multirun)
        except ConfigError as e:
            print(f"bench: error: {e}", file=sys.stderr)
            sys.exit(2)
    sys.argv = [sys.argv[0], *argv]
    _hydra_app()


# ---------------------------------------------------------------------------------------------------------------
# preflight: compose and validate every trial of the command line


def _one_line(e: BaseException) -> str:
    """Hydra/OmegaConf errors span lines and causes; keep the first two meaningful lines."""
    lines = []
    while e is not None:
        lines += [ln.strip() for ln in str(e).splitlines()
                  if ln.strip() and not ln.strip().startswith(("full_key", "object_type", "reference_type"))]
        e = e.__cause__
    return "; ".join(lines[:2]) or "invalid configuration"


def _check_group(key: str, value: str) -> None:
    group = key.lstrip("+~")
    if group in GROUPS and value not in ("null", "None") and value not in available(group):
        raise ConfigError(f"{group}={value}: unknown option; accepted: {', '.join(available(group))}")


@contextlib.contextmanager
def _hydra_context():
    """Hydra's compose API needs an initialised GlobalHydra; inside a running app (callbacks) it already is."""
    from hydra import initialize_config_dir
    from hydra.core.global_hydra import GlobalHydra

    if GlobalHydra.instance().is_initialized():
        yield
    else:
        with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
            yield


def _compose(overrides: list[str], **kw):
    from hydra import compose

    try:
        return compose("config", overrides=overrides, **kw)
    except Exception as e:  # noqa: BLE001 (Hydra raises several types; all become one line)
        raise ConfigError(_one_line(e)) from e


def expand_sweep(overrides: list[str], multirun: bool) -> list[list[str]]:
    """All trials (as override lists) that `python -m bench [-m] overrides...` would run."""
    from hydra.core.override_parser.overrides_parser import OverridesParser

    parser = OverridesParser.create()
    try:
        parsed = parser.parse_overrides(overrides)
    except Exception as e:  # noqa: BLE001
        raise ConfigError(_one_line(e)) from e
    fixed, sweeps, hydra_overrides = [], {}, []
    for o in parsed:
        key = o.get_key_element()
        if o.key_or_group.startswith("hydra"):
            hydra_overrides.append(o.input_line)
        elif o.is_sweep_override():
            if not multirun:
                raise ConfigError(f"{o.input_line}: a sweep needs -m (python -m bench -m {o.input_line} ...)")
            sweeps[o.key_or_group] = [f"{key}={v}" for v in o.sweep_string_iterator()]
        else:
            fixed.append(o.input_line)
        for v in (o.sweep_string_iterator() if o.is_sweep_override() else [o.value()]):
            _check_group(key, str(v))
    if multirun:  # an experiment config may declare its own sweep (hydra.sweeper.params)
        with _hydra_context():
            base = _compose(fixed + [opts[0] for opts in sweeps.values()] + hydra_overrides,
                            return_hydra_config=True)
        for k, v in (base.hydra.sweeper.get("params") or {}).items():
            (o,) = parser.parse_overrides([f"{k}={v}"])
            if o.key_or_group not in sweeps and not any(f.split("=")[0].lstrip("+~") == k for f in fixed):
                values = list(o.sweep_string_iterator()) if o.is_sweep_override() else [str(o.value())]
                for value in values:
                    _check_group(k, value)
                sweeps[o.key_or_group] = [f"{k}={value}" for value in values]
    return [fixed + list(combo) for combo in itertools.product(*sweeps.values())]


def compose_trials(overrides: list[str], multirun: bool, limit: int = MAX_PREFLIGHT):
    """(override list, composed config) for every trial of the command line, up to `limit`."""
    trials = expand_sweep(overrides, multirun)
    with _hydra_context():
        return [(combo, _compose(combo)) for combo in trials[:limit]], len(trials)


def preflight(overrides: list[str], multirun: bool) -> int:
    """Compose and validate every trial; raise ConfigError (one line) at the first bad one. Returns the count."""
    trials, total = compose_trials(overrides, multirun)
    for combo, cfg in trials:
        try:
            validate(cfg)
        except ConfigError as e:
            varying = [c for c in combo if c not in overrides]
            raise ConfigError(f"{e} (trial {' '.join(varying)})" if varying else str(e)) from e
    return total


# ---------------------------------------------------------------------------------------------------------------
# --help


def help_text() -> str:
    def section(title, cls, prefix=""):
        rows = [f"  {prefix}{f.name:<{24 - len(prefix)}} {f.metadata.get('help', '')}" for f in fields(cls)
                if "help" in f.metadata]
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
        f"config groups (choose with group=option)\n{groups}",
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
