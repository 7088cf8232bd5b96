"""JAX compiles a program once per host: the hyper-parameters that leave a program as it is are its arguments, not
constants (the optimizer's in its state, the estimators' eps passed to their programs), so the points of a tuning
grid lower to the same programs, which is what the persistent compilation cache's key holds; and a trial's row
says whether its programs were compiled or read from that cache (compile_cache)."""

from __future__ import annotations

import csv

import pytest

from bench import data
from bench.config import model_preset
from bench.estimators.hizoo import HizooSettings
from bench.estimators.lozo import LozoSettings
from bench.estimators.mezo import MezoSettings
from bench.jax_impl import estimators as jax_estimators
from bench.jax_impl.steps import make_trainer
from bench.spec import OptimizerSpec, StepSpec
from bench.weights import build_weights
from tests.support import FAST, bench

SPEC, _ = model_preset("tiny", dropout=0.0, num_layers=1)
BATCH = data.make_batches(data.data_spec(num_train=4, num_eval=2), 2, 8, 0, "train", epochs=1)[:1]


def lowered(mode: str, optimizer: OptimizerSpec, settings=None) -> dict[str, str]:
    """The text of every program a trial of `mode` compiles (the timed step's and the optimizer state's)."""
    step = StepSpec(mode=mode, trainable="bias", optimizer=optimizer, settings=settings)
    t = make_trainer(SPEC, build_weights(SPEC, 0), step, "cpu")
    return {name: program.as_text() for name, program in t.lower(t.to_device(BATCH)).items()}


SGD = OptimizerSpec(name="sgd", lr=1e-3, momentum=0.9, weight_decay=0.01)
ADAMW = OptimizerSpec(name="adamw", lr=1e-3, weight_decay=0.01, eps=1e-8)


@pytest.mark.slow
@pytest.mark.parametrize(
    ("mode", "a", "b"),
    [
        ("backprop", (ADAMW, None), (OptimizerSpec(name="adamw", lr=3e-5, weight_decay=0.1, eps=1e-6), None)),
        (
            "mezo",
            (SGD, MezoSettings(eps=1e-3)),
            (OptimizerSpec(lr=1e-5, momentum=0.5, weight_decay=0.1), MezoSettings(eps=1e-2)),
        ),
        ("hizoo", (SGD, HizooSettings(eps=1e-3, alpha=1e-6)), (SGD, HizooSettings(eps=1e-2, alpha=1e-3))),
        ("lozo", (SGD, LozoSettings(eps=1e-3)), (SGD, LozoSettings(eps=1e-2))),
    ],
)
def test_another_learning_rate_or_eps_lowers_to_the_same_programs(mode, a, b):
    first, second = lowered(mode, *a), lowered(mode, *b)
    assert list(first) == list(second)
    for name in first:
        assert first[name] == second[name], f"{mode}: {name} differs between {a} and {b}"


@pytest.mark.slow
@pytest.mark.parametrize(
    ("mode", "a", "b"),
    [
        ("mezo", MezoSettings(eps=1e-3), MezoSettings(eps=1e-2)),
        ("hizoo", HizooSettings(eps=1e-3, alpha=1e-6), HizooSettings(eps=1e-2, alpha=1e-3)),
        ("lozo", LozoSettings(eps=1e-3), LozoSettings(eps=1e-2)),
    ],
)
def test_a_split_step_as_several_programs_lowers_another_eps_to_the_same_programs(mode, a, b, monkeypatch):
    """BitFit's tiny state runs a split step as one program (above); a large one as several, eps an argument of
    each."""
    monkeypatch.setattr(jax_estimators, "ONE_PROGRAM_BELOW", 0)
    first, second = lowered(mode, SGD, a), lowered(mode, SGD, b)
    assert {"_move_loss", "_update"} <= set(first) and "_whole" not in first and first == second


def test_momentum_on_or_off_is_another_program(monkeypatch):
    """What changes the program stays static: SGD's momentum buffer exists or not (and the comparison above is not
    blind to a difference)."""
    monkeypatch.setattr(jax_estimators, "ONE_PROGRAM_BELOW", 0)  # three programs: the update changes, not the pass
    plain = lowered("mezo", OptimizerSpec(lr=1e-3), MezoSettings())
    heavy = lowered("mezo", OptimizerSpec(lr=1e-3, momentum=0.9), MezoSettings())
    assert plain["_update"] != heavy["_update"] and plain["_move_loss"] == heavy["_move_loss"]


@pytest.mark.slow
def test_a_trial_says_whether_its_programs_came_from_the_cache(tmp_path):
    """A grid's second point reads the first's programs (hit), the first compiled them (miss), and a trial with the
    cache off says so. JAX_COMPILATION_CACHE_DIR (the tests' own cache) is cleared for these trials: it stands over
    compile_cache_dir."""
    env = {"JAX_COMPILATION_CACHE_DIR": ""}
    common = ["framework=jax", "mode=mezo", *FAST, "logger=none"]
    cache = tmp_path / "cache"
    bench("-m", *common, "optimizer.lr=1e-3,1e-4", f"compile_cache_dir={cache}", results=tmp_path, env=env)
    bench(*common, "compile_cache_dir=null", results=tmp_path, env=env)
    with open(tmp_path / "runs.csv") as f:
        rows = list(csv.DictReader(f))
    assert [(r["status"], r["compile_cache"]) for r in rows] == [("ok", "miss"), ("ok", "hit"), ("ok", "off")]
    assert any(cache.iterdir())
