"""The error a person fixes: bad input, found before any trial process starts; and the one-line checks of an
option's value that raise it, which every scenario's validation shares."""

from __future__ import annotations

import math


class ConfigError(ValueError):
    """Bad user input; the message is one line naming the option, the bad value and what is accepted."""


class PluginError(ConfigError):
    """An installed package's plug-in (an estimator or a model family) that breaks its contract: one line naming
    the package and what it lacks, before anything runs (bench/plugins.py)."""


def choice(name: str, value, accepted) -> None:
    if value not in accepted:
        raise ConfigError(f"{name}={value}: accepted {' | '.join(map(str, accepted))}")


def is_number(value) -> bool:
    """A real, finite number (a bool is not one; nan and inf are not accepted anywhere)."""
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def count(name: str, value, low: int, high: int) -> None:
    """An integer count in [low, high]: every count a user sets is bounded, the bound in the message."""
    if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
        raise ConfigError(f"{name}={value}: accepted an integer in [{low}, {high:,}]")


def at_least(name: str, value, low) -> None:
    if not is_number(value) or value < low:
        raise ConfigError(f"{name}={value}: must be a number >= {low}")


def above(name: str, value, low) -> None:
    if not is_number(value) or value <= low:
        raise ConfigError(f"{name}={value}: accepted a finite number > {low}")


def in_unit(name: str, value) -> None:
    """[0, 1): momentum, betas, dropout."""
    if not is_number(value) or not 0 <= value < 1:
        raise ConfigError(f"{name}={value}: accepted a number in [0, 1)")
