"""The schema holds together: every default is written once (in the schema, not in conf/config.yaml), the
option table in docs/options.md and --help are generated from it, the config resolved once round-trips through the
trial's payload, and every preset composes."""

from __future__ import annotations

from dataclasses import fields
from pathlib import Path

import pytest
from omegaconf import OmegaConf

from bench import cli
from bench.config import CONF_DIR, GROUPS, NODES, BenchConfig, available, default, from_dict, options, resolve, to_dict
from bench.harness.preflight import compose_trials

REPO = Path(__file__).resolve().parents[2]


def test_every_default_is_written_once_in_the_schema():
    """conf/config.yaml names the default presets and Hydra's settings, and no option's value."""
    top = OmegaConf.to_container(OmegaConf.load(CONF_DIR / "config.yaml"))
    assert set(top) == {"defaults", "hydra"}
    for group, node in NODES.items():
        for name in available(group):
            preset = OmegaConf.to_container(OmegaConf.load(CONF_DIR / group / f"{name}.yaml"))
            unknown = set(preset) - {f.name for f in fields(node)} - {"defaults"}
            assert not unknown, (group, name, unknown)


def test_options_doc_is_generated_from_the_schema():
    """docs/options.md is what `make docs` writes now: regenerate it after changing an option."""
    assert (REPO / "docs" / "options.md").read_text() == cli.options_markdown()


def test_every_option_has_help_and_appears_in_help():
    listed = {name for name, _, _ in options()}
    for f in fields(BenchConfig):
        node = NODES.get(f.name) or (f.default_factory if "help" not in f.metadata else None)
        if node is not None:  # a preset's node (model.*) or a node of its own (target.*)
            assert {f"{f.name}.{g.name}" for g in fields(node)} <= listed
        else:
            assert f.name in listed, f.name
    text = cli.help_text()
    assert all(name in text for name in listed)


def test_defaults_are_read_from_the_schema():
    assert default("optimizer.lr") == 1e-3 and default("seed") == 0 and default("model.dropout") == 0.1


def test_the_resolved_config_is_typed_and_round_trips():
    ((_, composed),) = compose_trials(["model=tiny", "mode=jvp", "jvp.num_tangents=4", "max_timed_s=3"], False)[0]
    cfg = resolve(composed)
    assert isinstance(cfg, BenchConfig) and cfg.model.num_layers == 2 and cfg.jvp.num_tangents == 4
    assert cfg.max_timed_s == 3.0 and isinstance(cfg.max_timed_s, float)
    assert from_dict(to_dict(cfg)) == cfg
    with pytest.raises(AttributeError):
        cfg.num_tangent  # noqa: B018 (a typo fails at once)


@pytest.mark.parametrize("group", [g for g in GROUPS if g != "experiment"])
def test_every_preset_composes(group):
    for name in available(group):
        ((_, composed),) = compose_trials([f"{group}={name}"], False)[0]
        assert isinstance(resolve(composed), BenchConfig)
