"""The ways of differentiating, as plug-ins: one framework-neutral module each (bench/estimators/<name>.py, which
`mode=<name>` selects), found by name, and those installed packages declare as entry points in the group
`bench.estimators` (bench/plugins.py); base.py says what a module declares. Adding a module here, or installing a
package that declares one, is what makes a mode known: nothing lists them elsewhere (docs/estimators.md says how)."""

from __future__ import annotations

import functools
import pkgutil

from bench import plugins
from bench.errors import PluginError
from bench.estimators.base import Estimator, setting_fields
from bench.spec import FRAMEWORKS

GROUP = "bench.estimators"
_NOT_ESTIMATORS = {"base"}
# The roles the reports compare estimators in, named once: a report names a role, not a mode. The reference of
# every cost and ratio is the exact gradient; a forward pass is the floor of memory and time; the forward gradient
# and the zeroth-order estimator are the two backprop-free families the UMass study and MeZO measured (the
# project's targets are theirs: docs/speed.md, docs/memory.md).
BASELINE = "inference"
EXACT = "backprop"
FORWARD_GRADIENT = "jvp"
EXACT_FORWARD = "jacfwd"  # the exact gradient by forward mode, one pass per trained parameter
ZEROTH_ORDER = "mezo"
# What each framework's module of an estimator must define (bench/<framework>_impl/estimators/__init__.py says what
# each function does), by whether the estimator takes optimizer steps (Estimator.updates): the gradient the update
# applies, or the step that is all a trial times (inference); in JAX also the memory every trial's breakdown reads,
# and a step split into several programs is all of SPLIT_STEP. docs/estimators.md lists the same.
SPLIT_STEP = ("prepare", "lower", "programs", "step")
REQUIRED = {
    "torch": {True: ("gradient",), False: ("step",)},
    "jax": {True: ("gradient", "memory"), False: ("memory", *SPLIT_STEP)},
}


@functools.cache
def found() -> dict[str, plugins.Plugin]:
    """{name: where it comes from} of every estimator: this package's modules, then the installed packages'."""
    builtin = {m.name: f"{__name__}.{m.name}" for m in pkgutil.iter_modules(__path__) if m.name not in _NOT_ESTIMATORS}
    return plugins.found(GROUP, builtin)


@functools.cache
def names() -> tuple[str, ...]:
    """Every estimator's name, in the order reports list them: by the rank each declares, then those that declare
    none, alphabetically."""
    return tuple(sorted(found(), key=lambda n: (_load(n).rank is None, _load(n).rank or 0, n)))


def get(name: str) -> Estimator:
    """The estimator `mode=name` runs (ValueError naming the accepted ones for another name)."""
    if name not in found():
        raise ValueError(f"mode={name}: accepted {' | '.join(names())}")
    return _load(name)


@functools.cache
def _load(name: str) -> Estimator:
    """The module's ESTIMATOR, checked: an Estimator of its name; a plug-in's names a module per framework."""
    plugin = found()[name]
    estimator = getattr(plugin.load(), "ESTIMATOR", None)
    if not isinstance(estimator, Estimator) or estimator.name != name:
        raise PluginError(f"{plugin}: ESTIMATOR must be an instance of bench.estimators.base.Estimator named {name}")
    if plugin.package != plugins.BUILTIN:
        declared = estimator.implementations
        if sorted(declared) != sorted(FRAMEWORKS):
            raise PluginError(
                f"{plugin}: ESTIMATOR.implementations={declared}: accepted a module for each of "
                f"{' | '.join(FRAMEWORKS)}"
            )
        for framework, module in declared.items():  # read from its source: the launching process imports no framework
            if plugins.missing(module):
                raise PluginError(f"{plugin}: no module {module} (ESTIMATOR.implementations)")
            bound, required = plugins.top_level_names(module), REQUIRED[framework][estimator.updates]
            lacking = [f for f in required if bound is not None and f not in bound]
            _refuse_lacking(plugin, framework, module, lacking, required)
    return estimator


def module_of(name: str, framework: str) -> str:
    """The module of estimator `name`'s gradient in `framework`: bench.<framework>_impl.estimators.<name> for
    this package's, the module a plug-in's ESTIMATOR.implementations names for an installed package's."""
    return get(name).implementations.get(framework, f"bench.{framework}_impl.estimators.{name}")


def check_module(name: str, framework: str, module, functions: tuple[str, ...] | None = None) -> None:
    """Refuse a framework module of estimator `name`, loaded, that lacks one of `functions` (by default what REQUIRED
    asks of it), in one line naming the package it comes from."""
    functions = functions or REQUIRED[framework][get(name).updates]
    _refuse_lacking(found()[name], framework, module.__name__, plugins.lacking(module, functions), functions)


def _refuse_lacking(plugin, framework: str, module: str, lacking: list[str], functions: tuple[str, ...]) -> None:
    if lacking:
        raise PluginError(
            f"{plugin}: its {framework} module {module} lacks {', '.join(lacking)} "
            f"(a {framework} estimator module defines {', '.join(functions)}: docs/estimators.md)"
        )


def settings_nodes() -> dict[str, type]:
    """{name: its settings dataclass} of every estimator that has settings: the config's nodes NAME.*."""
    return {name: get(name).settings for name in names() if get(name).settings is not None}


@functools.cache  # the estimators are fixed in a process: callers read the dict, never change it
def setting_columns() -> dict[str, str]:
    """{runs.csv column: option} of every estimator's settings: NAME_<setting> (mezo_q: mezo.q), or the key it had
    before it moved into its node (num_tangents: jvp.num_tangents), so rows recorded before read the same."""
    columns = {}
    for name in names():
        old = {key: old for old, key in get(name).moved.items()}
        columns |= {old.get(f.name, f"{name}_{f.name}"): f"{name}.{f.name}" for f in setting_fields(get(name))}
    return columns


@functools.cache
def columns_of(name: str) -> dict[str, str]:
    """{setting: its runs.csv column} of the estimator `name` (num_tangents: num_tangents, eps: mezo_eps)."""
    return {o.split(".")[1]: column for column, o in setting_columns().items() if o.split(".")[0] == name}


def step_columns(step) -> dict:
    """The columns of the settings `step` runs with (its mode's alone), from its node: {num_tangents: 4, ...}."""
    settings = get(step.mode).settings_of(step)
    return {column: getattr(settings, key) for key, column in columns_of(step.mode).items()}


def moved() -> dict[str, str]:
    """{old top-level key: its option now} of the settings that moved into an estimator's node."""
    return {old: f"{name}.{key}" for name in names() for old, key in get(name).moved.items()}
