"""The error a person fixes: bad input, found before any trial process starts."""

from __future__ import annotations


class ConfigError(ValueError):
    """Bad user input; the message is one line naming the option, the bad value and what is accepted."""


class PluginError(ConfigError):
    """An installed package's plug-in (an estimator or a model family) that breaks its contract: one line naming
    the package and what it lacks, before anything runs (bench/plugins.py)."""
