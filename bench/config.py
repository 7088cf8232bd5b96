"""Configuration: the presets in conf/ and their validation (one clear line per problem)."""

from __future__ import annotations

from dataclasses import fields
from pathlib import Path

from omegaconf import OmegaConf

from bench.spec import BertSpec

CONF_DIR = Path(__file__).resolve().parent.parent / "conf"


class ConfigError(ValueError):
    """Bad user input; the message is one line naming the option, the bad value and what is accepted."""


def available(group: str) -> list[str]:
    return sorted(p.stem for p in (CONF_DIR / group).glob("*.yaml"))


def model_preset(name: str, **overrides) -> tuple[BertSpec, str | None]:
    """(architecture, checkpoint) of a conf/model preset, with optional field overrides (tests, tools)."""
    path = CONF_DIR / "model" / f"{name}.yaml"
    if not path.exists():
        raise ConfigError(f"model={name}: unknown preset; accepted: {', '.join(available('model'))}")
    cfg = {**OmegaConf.to_container(OmegaConf.load(path)), **overrides}
    return bert_spec(cfg), cfg.get("checkpoint")


def bert_spec(model_cfg) -> BertSpec:
    """The BertSpec fields of a model config node (other keys such as name and checkpoint are ignored)."""
    names = {f.name for f in fields(BertSpec)}
    try:
        return BertSpec(**{k: v for k, v in dict(model_cfg).items() if k in names})
    except ValueError as e:
        raise ConfigError(str(e)) from e
