"""Configs the suite reads back are data, never code: a saved config (`python -m bench rerun`) and a folder of
configs added with --config-dir may come from someone else. OmegaConf would resolve a `${...}` in them (an
environment variable's value, `${oc.env:WANDB_API_KEY}`, into a row) and Hydra would instantiate a `_target_` in
them (a callback that runs any function); so both are refused in one line, before any trial, naming the key and
never its value. The user's own command line is theirs and is not checked here. docs/reproducibility.md, "What the
suite trusts".
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path

from omegaconf import OmegaConf

from bench.errors import ConfigError

INTERPOLATION = "${"  # what makes OmegaConf resolve a string (an escaped one too: it unescapes it, to resolve later)
CODE_KEY = "_target_"  # what Hydra's instantiate imports and calls
# What an experiment may set of Hydra's own node: its sweep's settings and where Hydra writes. The rest is code or
# reaches it: callbacks, job.env_set (LD_PRELOAD, PYTHONPATH), a logging config (a handler's class), a launcher's
# (submitit's setup lines are shell commands); the launcher is the user's to choose on the command line
HYDRA_SETTINGS = ("sweeper", "sweep", "run")
_PACKAGE = re.compile(r"^#\s*@package\s+(\S+)")


def _walk(node, key: str = "") -> Iterator[tuple[str, str | None, object]]:
    """(dotted key, the mapping key there or None, the value) of every node of plain data (dicts, lists, scalars)."""
    if isinstance(node, dict):
        for k, v in node.items():
            path = f"{key}.{k}" if key else str(k)
            yield path, str(k), v
            yield from _walk(v, path)
    elif isinstance(node, list):
        for i, v in enumerate(node):
            yield from _walk(v, f"{key}[{i}]")
    else:
        yield key, None, node


def check_data(data, where: str, what: str) -> None:
    """ConfigError (one line naming the key, never its value) at the first interpolation or `_target_` in `data`,
    read from `where` (a file), which is `what` (a saved config, a --config-dir)."""
    for key, name, value in _walk(data):
        if name is None and isinstance(value, str) and INTERPOLATION in value:
            raise ConfigError(
                f"{where}: {key} holds an interpolation (${{...}}); interpolations are not accepted from {what} "
                "(it is data: write the value itself); nothing was run"
            )
        if name == CODE_KEY:
            raise ConfigError(
                f"{where}: {key}: a _target_ (code Hydra would import and call) is not accepted from {what}; "
                "nothing was run"
            )


def check_config_dir(folder: Path) -> None:
    """Every YAML file of a --config-dir folder as data: no interpolation, no `_target_`, no Hydra settings
    beyond HYDRA_SETTINGS (its top-level `hydra` node, a `# @package hydra...` header, a defaults entry placed
    `@hydra...`), no hydra/ folder (Hydra's own config groups: launchers, sweepers, logging). ConfigError, one line."""
    what = "a --config-dir"
    if (folder / "hydra").exists():
        raise ConfigError(
            f"--config-dir={folder}: its hydra/ folder (Hydra's own launchers, sweepers, logging, callbacks: code) "
            f"is not accepted; accepted: hydra.{'/'.join(HYDRA_SETTINGS)} settings in an experiment"
        )
    for path in sorted(folder.rglob("*.yaml")):
        try:
            text = path.read_text()
            data = OmegaConf.to_container(OmegaConf.create(text), resolve=False) if text.strip() else {}
        except Exception as e:  # noqa: BLE001 (a YAML or encoding error: either way Hydra could not read it)
            raise ConfigError(f"{path}: not a YAML config ({type(e).__name__}); nothing was run") from None
        check_data(data, str(path), what)
        header = [_PACKAGE.match(line) for line in text.splitlines() if line.startswith("#")]
        package = next((m.group(1) for m in header if m), "")
        placed = [
            str(e)
            for e in (data.get("defaults") or [] if isinstance(data, dict) else [])
            if re.search(r"@(_global_\.)?hydra\b", str(e))
        ]
        hydra = data.get("hydra") if isinstance(data, dict) else None
        # a sweep's params or a tuning point naming a hydra.* key would set it for every job
        inner = next(
            (k for k, name, _ in _walk(data) if k != "hydra" and re.match(r"[+~]*hydra(\.|$)", name or "")), None
        )
        if inner:
            key = inner
        elif re.match(r"(_global_\.)?hydra\b", package):
            key = f"@package {package}"
        elif placed:
            key = f"the defaults entry {placed[0]}"
        elif hydra is not None and not isinstance(hydra, dict):
            key = "hydra"
        elif extra := sorted(set(hydra or {}) - set(HYDRA_SETTINGS)):
            key = f"hydra.{extra[0]}"
        else:
            continue
        raise ConfigError(
            f"{path}: {key}: Hydra's own settings (callbacks, job.env_set, logging: code) are not accepted from "
            f"{what}; accepted: hydra.{{{', '.join(HYDRA_SETTINGS)}}} settings; nothing was run"
        )
