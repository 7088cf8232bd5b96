"""The ways of differentiating, as plug-ins: one framework-neutral module each (bench/estimators/<name>.py, which
`mode=<name>` selects), found by name; base.py says what a module declares. Adding a module here is what makes a
mode known: nothing lists them elsewhere (docs/estimators.md says how to add one)."""

from __future__ import annotations

import functools
import importlib
import pkgutil

from bench.estimators.base import Estimator, setting_fields

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
# The order reports and tables list them in: the baseline, the exact gradients, then the estimates; a module
# this list does not name comes after these, alphabetically.
ORDER = ("inference", "backprop", "jvp", "jacfwd", "mezo", "hizoo")


@functools.cache
def names() -> tuple[str, ...]:
    """Every estimator's name (its module's), in ORDER."""
    found = [m.name for m in pkgutil.iter_modules(__path__) if m.name not in _NOT_ESTIMATORS]
    return tuple(sorted(found, key=lambda n: (ORDER.index(n) if n in ORDER else len(ORDER), n)))


@functools.cache
def get(name: str) -> Estimator:
    """The estimator `mode=name` runs (ValueError naming the accepted ones for another name)."""
    if name not in names():
        raise ValueError(f"mode={name}: accepted {' | '.join(names())}")
    estimator = importlib.import_module(f"{__name__}.{name}").ESTIMATOR
    if not isinstance(estimator, Estimator) or estimator.name != name:
        raise TypeError(f"bench/estimators/{name}.py: ESTIMATOR must be an Estimator named {name!r}")
    return estimator


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
