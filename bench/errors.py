"""The error a person fixes: bad input, found before any trial process starts."""

from __future__ import annotations


class ConfigError(ValueError):
    """Bad user input; the message is one line naming the option, the bad value and what is accepted."""
