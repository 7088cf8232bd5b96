"""Same seed, same numbers: every training mode of both frameworks, with dropout on (the tiny model's default
0.1), takes bit-identical steps when built twice from one seed, and other steps from another seed. A trainer is
built as a trial builds it (make_trainer, which seeds what the framework would draw at random: torch's global
generator drives dropout). That the whole trial process repeats itself is tests/harness/test_rerun.py's."""

from __future__ import annotations

import functools

import numpy as np
import pytest

from bench import data
from bench.config import model_preset
from bench.spec import FRAMEWORKS, StepSpec, implementation
from bench.weights import build_weights

TINY, _ = model_preset("tiny", num_layers=1)  # one layer: JAX compiles each of the programs below in a few seconds
assert TINY.dropout > 0  # the point: dropout draws random masks every step
WEIGHTS = build_weights(TINY, 0)
BATCHES = data.make_batches(data.data_spec(num_train=64, num_eval=8), 4, 16, 0, "train")[:3]
MODES = {"backprop": {}, "backprop+remat": {"remat": True}, "jvp": {}, "jacfwd": {"trainable": "head"}, "mezo": {}}


def losses(framework: str, mode: str, seed: int, build: int = 0) -> list[float]:
    """The losses of three steps of a trainer built afresh (`build` tells builds apart for the cache below). A second
    JAX trainer of the same program reads it from the suite's XLA compilation cache (tests/conftest.py): built
    anew, as a trial builds it, without paying the compile twice."""
    return steps_of(framework, mode, seed, build)


@functools.cache
def steps_of(framework: str, mode: str, seed: int, build: int) -> list[float]:
    spec = StepSpec(mode=mode.split("+")[0], seed=seed, **MODES[mode])
    trainer = implementation(framework, "steps").make_trainer(TINY, WEIGHTS, spec, "cpu")
    return [float(trainer.step(trainer.to_device([b]))) for b in BATCHES]


@pytest.mark.slow
@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("framework", FRAMEWORKS)
def test_a_seed_fixes_every_step(framework, mode):
    assert losses(framework, mode, 0) == losses(framework, mode, 0, build=1)  # bit for bit, built twice


@pytest.mark.slow
@pytest.mark.parametrize("mode", ["backprop", "mezo"])  # dropout alone; and with seeded directions
@pytest.mark.parametrize("framework", FRAMEWORKS)
def test_another_seed_takes_other_steps(framework, mode):
    first, other = losses(framework, mode, 0), losses(framework, mode, 1)
    assert not np.allclose(first[1:], other[1:], rtol=0, atol=1e-7)


@pytest.mark.slow
def test_checkpointing_replays_the_first_pass_dropout():
    """remat recomputes each layer in the backward pass with the dropout masks of its forward pass: the same steps
    as plain backprop, to rounding."""
    for framework in FRAMEWORKS:
        np.testing.assert_allclose(losses(framework, "backprop+remat", 0), losses(framework, "backprop", 0), rtol=1e-6)
