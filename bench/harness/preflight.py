"""Preflight: every trial a command line names (all combinations of a -m sweep, including the sweep an
experiment config declares) is composed with Hydra's compose API and validated, before Hydra starts anything.
Bad input gets one clear line and a non-zero exit before any process starts or any row is written.
"""

from __future__ import annotations

import contextlib
import copy
import itertools
import re
import sys
from pathlib import Path

from hydra import compose, initialize_config_dir
from hydra.core.global_hydra import GlobalHydra
from hydra.core.override_parser.overrides_parser import OverridesParser
from omegaconf import OmegaConf

from bench import estimators
from bench.config import CONF_DIR, GROUPS, available, register_configs, resolve, validate_process
from bench.errors import ConfigError
from bench.harness.launch import check_launch
from bench.harness.scenario import RUNNER_FOLDERS, Registry, scenario_of, validate
from bench.harness.trust import check_config_dir
from bench.harness.tuning import check_tuning
from bench.harness.tuning_space import expand, trained_params
from bench.measure.system import cuda_device_count
from bench.store.csv import check_folders, check_results_file

MAX_PREFLIGHT = 2000  # sweeps larger than this are validated per job instead

try:  # Hydra's own step that applies a command line's value overrides to a composed config (private, hydra-core 1.3)
    from hydra._internal.config_loader_impl import ConfigLoaderImpl

    _apply_values = ConfigLoaderImpl._apply_overrides_to_config
except (ImportError, AttributeError):  # another Hydra: every trial composed whole, as Hydra's compose does it
    _apply_values = None


def one_line(e: BaseException) -> str:
    """Hydra/OmegaConf errors span lines and causes; keep the first two meaningful lines."""
    lines = []
    while e is not None:
        lines += [
            ln.strip()
            for ln in str(e).splitlines()
            if ln.strip() and not ln.strip().startswith(("full_key", "object_type", "reference_type"))
        ]
        e = e.__cause__
    return "; ".join(lines[:2]) or "invalid configuration"


def _check_group(key: str, value: str, dirs: list[Path]) -> None:
    group = key.lstrip("+~")
    if group in GROUPS and value not in ("null", "None") and value not in available(group, dirs):
        raise ConfigError(f"{group}={value}: unknown option; accepted: {', '.join(available(group, dirs))}")


def searchpath(folder: Path) -> str:
    """The override that adds a folder of configs to what Hydra composes from (`--config-dir FOLDER`), quoted as
    Hydra's override grammar reads a quoted value: a folder's name may hold , = [ ] or quotes."""
    uri = f"file://{Path(folder).resolve()}"
    # in a quoted value a backslash is literal except before a quote (or the closing one), where it is doubled
    uri = re.sub(r"(\\+)(?='|$)", lambda m: m.group(1) * 2, uri).replace("'", "\\'")
    return f"hydra.searchpath=['{uri}']"


def check_path_value(option: str, key: str, path: Path) -> None:
    """A path a command passes on to trials as `key=PATH`: Hydra must read it back as that path, not as a sweep
    (a comma), an interpolation (${...}) or a parse error (= quotes brackets, a non-ASCII letter)."""
    try:
        (o,) = OverridesParser.create().parse_overrides([f"{key}={path}"])
        same = not o.is_sweep_override() and o.value() == str(path) and "${" not in str(path)
    except Exception:  # noqa: BLE001 (Hydra raises several types; every one means it cannot carry the path)
        same = False
    if not same:
        raise ConfigError(
            f"{option}={path}: Hydra cannot read it back from {key}=PATH; accepted: a path of ASCII "
            "letters, digits, spaces and / . _ - : (not = , ' \" [ ] ( ) { } ${ ; or &)"
        )


def _search(overrides: list[str]) -> list[str]:
    return [o for o in overrides if o.split("=", 1)[0] == "hydra.searchpath"]


def _search_dirs(parsed) -> list[Path]:
    """The folders a hydra.searchpath override adds (file:// ones: what --config-dir adds)."""
    dirs = []
    for o in parsed:
        if o.get_key_element() == "hydra.searchpath" and isinstance(o.value(), list):
            dirs += [Path(str(v).removeprefix("file://")) for v in o.value() if str(v).startswith("file://")]
    return dirs


def _check_moved(o) -> None:
    """A setting typed by the top-level key it had before it moved into its estimator's node: one line giving
    the new spelling (Hydra's own error would only say the key is not in the config)."""
    option = estimators.moved().get(o.key_or_group)
    if option:
        value = o.input_line.split("=", 1)[1] if "=" in o.input_line else ""
        # the new spelling is only proposed with a value its estimator accepts: never suggest what is refused next
        if problem := _moved_value_problem(option, o):
            raise ConfigError(f"{o.input_line}: {o.key_or_group} is now {option}, and {problem}")
        raise ConfigError(f"{o.input_line}: {o.key_or_group} is now {option}; accepted: {option}={value}")


def _moved_value_problem(option: str, o) -> str | None:
    """What the estimator's own check says of the value(s) of a moved key under its new name (None: accepted)."""
    name, field = option.split(".", 1)
    estimator = estimators.get(name)
    if o.is_sweep_override() and not o.is_discrete_sweep():
        return None  # a range or interval: its values are checked when the sweep expands them
    values = list(o.sweep_iterator()) if o.is_discrete_sweep() else [o.value()]
    for value in values:
        try:
            settings = estimator.settings(**{field: value})
        except TypeError:
            return None
        if problem := estimator.check(settings):
            return problem
    return None


@contextlib.contextmanager
def _hydra_context():
    """Hydra's compose API needs an initialised GlobalHydra (inside a running app, callbacks, it already is) and
    the schema in its ConfigStore (registering twice is harmless)."""
    register_configs()
    if GlobalHydra.instance().is_initialized():
        yield
    else:
        with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
            yield


def _compose(overrides: list[str], **kw):
    try:
        return compose("config", overrides=overrides, **kw)
    except Exception as e:  # noqa: BLE001 (Hydra raises several types; all become one line)
        raise ConfigError(one_line(e)) from e


def expand_sweep(overrides: list[str], multirun: bool) -> list[list[str]]:
    """All trials (as override lists) that `python -m bench [-m] overrides...` would run."""
    parser = OverridesParser.create()
    try:
        parsed = parser.parse_overrides(overrides)
    except Exception as e:  # noqa: BLE001
        raise ConfigError(one_line(e)) from e
    fixed, sweeps, hydra_overrides, dirs = [], {}, [], _search_dirs(parsed)
    for folder in dirs:  # --config-dir's folder, or one the command line names in hydra.searchpath: data
        check_config_dir(folder)
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
        for v in o.sweep_string_iterator() if o.is_sweep_override() else [o.value()]:
            _check_group(key, str(v), dirs)
        _check_moved(o)
    if multirun:  # an experiment config may declare its own sweep (hydra.sweeper.params)
        with _hydra_context():
            base = _compose(fixed + [opts[0] for opts in sweeps.values()] + hydra_overrides, return_hydra_config=True)
        if base.hydra.sweeper.get("space") is not None:  # the tuning sweeper: a grid of points per case
            sweeper = OmegaConf.to_container(base.hydra.sweeper, resolve=True)
            check_tuning(
                sweeper.get("objective", "wall_to_target_s"),
                sweeper.get("repeats", []),
                sweeper.get("budget"),
                sweeper.get("confirm", []),
                sweeper.get("capping", False),
                sweeper.get("stop_at_miss", False),
                sweeper.get("studies", 1),
                base.seed,
            )
            arguments = fixed + [f"{k}={','.join(v.split('=', 1)[1] for v in vs)}" for k, vs in sweeps.items()]
            with _hydra_context():  # a space placed by the trained parameters composes each combination for them
                compose_one = _composer(_search(overrides))
                search = expand(
                    sweeper.get("params"),
                    sweeper["space"],
                    arguments,
                    lambda combo: trained_params(compose_one(combo)),
                    sweeper.get("budget"),
                    sweeper.get("studies", 1),
                    len(sweeper.get("confirm", [])),
                    base.seed,
                )
            return [trial for _, trial in search]
        for k, v in (base.hydra.sweeper.get("params") or {}).items():
            (o,) = parser.parse_overrides([f"{k}={v}"])
            if o.key_or_group not in sweeps and not any(f.split("=")[0].lstrip("+~") == k for f in fixed):
                values = list(o.sweep_string_iterator()) if o.is_sweep_override() else [str(o.value())]
                for value in values:
                    _check_group(k, value, dirs)
                sweeps[o.key_or_group] = [f"{k}={value}" for value in values]
    return [fixed + list(combo) for combo in itertools.product(*sweeps.values())]


def compose_trials(overrides: list[str], multirun: bool, limit: int = MAX_PREFLIGHT):
    """(override list, composed config) for every trial of the command line, up to `limit`."""
    trials = expand_sweep(overrides, multirun)
    with _hydra_context():
        compose_one = _composer(_search(overrides))
        return [(combo, compose_one(combo)) for combo in trials[:limit]], len(trials)


def _composer(search: list[str]):
    """compose(combo) for the trials of one command line, as Hydra's compose gives it, at a fraction of the cost:
    Hydra composes the config groups a combo chooses (model=, case=, +experiment=, ...) from their files, then
    applies the value overrides (seed=1, optimizer.lr=0.1) to the result. Trials choosing the same groups are
    composed once (a compose is ~150 ms: Hydra re-reads and re-merges every file), each trial's values applied to
    a copy by Hydra's own step (cost_to_target_gpu's 128 trials: 4 compositions). `search`: the hydra.searchpath
    override of a --config-dir, composed with every trial."""
    repo = GlobalHydra.instance().hydra.config_loader.repository
    parser, composed = OverridesParser.create(), {}

    def compose_one(combo: list[str]):
        try:
            parsed = parser.parse_overrides(combo)
        except Exception as e:  # noqa: BLE001
            raise ConfigError(one_line(e)) from e
        for o in parsed:  # a tuning space's or an experiment's points, as well as the command line's
            _check_moved(o)
        # Hydra's own split (hydra/_internal/defaults_list.py, Overrides): a group unless its key names none or
        # its value is a dict; a hydra.* override goes to the hydra node, which this config no longer has
        if _apply_values is None or any(o.is_hydra_override() for o in parsed):
            return _compose(combo + search)
        group = [repo.group_exists(o.key_or_group) and not isinstance(o.value(), dict) for o in parsed]
        groups = tuple(o.input_line for o, g in zip(parsed, group) if g)
        if groups not in composed:
            composed[groups] = _compose([*groups, *search])
        cfg = copy.deepcopy(composed[groups])
        try:
            _apply_values([o for o, g in zip(parsed, group) if not g], cfg)
        except Exception as e:  # noqa: BLE001 (Hydra raises several types; all become one line)
            raise ConfigError(one_line(e)) from e
        return cfg

    return compose_one


def preflight(overrides: list[str], multirun: bool, scenarios: Registry) -> int:
    """Compose and validate every trial; raise ConfigError (one line) at the first bad one. Returns the count."""
    trials, total = compose_trials(overrides, multirun)
    files: dict = {}  # each results file the trials write, once: (path, its schema)
    folders: dict = {}  # each results_dir, and the folders its scenarios' trials write there
    hydra_overrides = [o for o in overrides if o.lstrip("+~").startswith("hydra")]
    # Hydra starts a single run itself; only a multirun goes through the launcher
    launcher = launcher_of(trials[0][0] + hydra_overrides) if trials and multirun else {}
    for combo, composed in trials:
        try:
            cfg = resolve(composed)
            scenario = scenario_of(scenarios, cfg.scenario)
            validate_process(cfg)
            check_launch(cfg, launcher, cuda_device_count())  # the devices asked for, before what they would run
            validate(scenario, cfg)
            files[Path(cfg.results_dir) / scenario.results_file] = scenario.columns
            folders.setdefault(Path(cfg.results_dir), set()).update(scenario.folders)
        except ConfigError as e:
            varying = [o for o in combo if o not in overrides]
            raise ConfigError(f"{e} (trial {' '.join(varying)})" if varying else str(e)) from e
    for path, columns in files.items():
        note = check_results_file(path, columns)  # ResultsFileError is a ConfigError: one line
        if note:
            print(f"bench: {note}", file=sys.stderr)
    for results_dir, names in folders.items():
        check_folders(results_dir, (*RUNNER_FOLDERS, *sorted(names)))
    return total


def launcher_of(overrides: list[str]) -> dict:
    """The Hydra launcher a command line selects (its node: _target_, nodes, tasks_per_node, ...)."""
    with _hydra_context():
        return OmegaConf.to_container(_compose(overrides, return_hydra_config=True).hydra.launcher, resolve=True)
