"""The scenarios, by name: what `scenario=` selects. One registry, no `if scenario == ...` anywhere else.

    model   one way of differentiating BERT in one framework -> runs.csv   (bench/scenarios/model.py)
    ops     op-level AD micro-benchmarks in one framework    -> ops.csv    (bench/scenarios/ops.py)

A new scenario is a module with a Scenario subclass (bench/scenarios/base.py) and one line in SCENARIOS.
"""

from __future__ import annotations

from bench.config import hash_identity, to_container, validate_process
from bench.errors import ConfigError
from bench.scenarios.base import Scenario
from bench.scenarios.model import ModelScenario
from bench.scenarios.ops import OpsScenario

SCENARIOS: dict[str, Scenario] = {s.name: s for s in (ModelScenario(), OpsScenario())}
DEFAULT = "model"


def scenario_of(c: dict) -> Scenario:
    """The scenario a composed config (as a plain dict) selects; an unknown name is a ConfigError."""
    name = c.get("scenario", DEFAULT)
    if name not in SCENARIOS:
        raise ConfigError(f"scenario={name}: accepted {' | '.join(SCENARIOS)}")
    return SCENARIOS[name]


def validate(cfg) -> None:
    """Raise ConfigError (one line) for the first problem in a composed config: the process keys every trial
    reads, then its scenario's own."""
    c = to_container(cfg)
    scenario = scenario_of(c)
    validate_process(c)
    scenario.validate(c)


def trial_identity(cfg) -> dict:
    """What `resume=true` compares: the keys the trial's scenario says change its measurements."""
    c = to_container(cfg)
    return scenario_of(c).identity(c)


def config_hash(cfg) -> str:
    return hash_identity(trial_identity(cfg))
