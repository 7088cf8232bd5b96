"""Evaluation at the head scopes (trainable=classifier, head), where the trunk is frozen: it runs once per held-out
batch and the head reads the one row it kept (bench.models' HEAD_TOKEN: BERT's first token, a decoder's last that
is not padding), in both frameworks and each family: the loss and accuracy of the whole model's pass, before and
after steps that move the head, with the trunk run once per batch."""

from __future__ import annotations

import functools

import numpy as np
import pytest

from bench import data, models
from bench.config import model_preset
from bench.spec import OptimizerSpec, StepSpec, implementation
from bench.weights import build_weights

pytestmark = pytest.mark.usefixtures("fp32_pinned")  # tests/frameworks/conftest.py


@functools.cache
def setup(preset: str):
    spec, _ = model_preset(preset, dropout=0.0)
    d = data.data_spec(num_train=64, num_eval=16)
    batch = lambda split: data.make_batches(d, 4, 16, 0, split, pad_id=spec.pad_token_id)
    held_out = batch("test")[:3]
    for b in held_out:  # rows padded at their ends, by 0 to 9 tokens, so a decoder's last token is not the last
        for r, k in enumerate((0, 3, 9, 5)):
            if k:
                b["input_ids"][r, -k:], b["attention_mask"][r, -k:] = spec.pad_token_id, 0
    return spec, build_weights(spec, 0), batch("train")[:2], held_out


@pytest.mark.parametrize("framework", ["torch", pytest.param("jax", marks=pytest.mark.slow)])  # jax: 3-5 s compiling
@pytest.mark.parametrize(
    "preset,trainable", [("tiny", "classifier"), ("tiny", "head"), ("opt_tiny", "classifier"), ("llama_tiny", "head")]
)
def test_the_head_on_the_kept_row_scores_as_the_whole_model(framework, preset, trainable):
    spec, weights, train, held_out = setup(preset)
    token = models.of(spec).HEAD_TOKEN
    step = StepSpec(mode="backprop", trainable=trainable, optimizer=OptimizerSpec(name="sgd", lr=0.5))
    t = implementation(framework, "steps").make_trainer(spec, weights, step, "cpu")
    assert t.head_token == token
    batches, runs = t.to_device(held_out), []
    trunk = t._head_inputs_of
    t._head_inputs_of = lambda *a: runs.append(1) or trunk(*a)

    def whole():
        t.head_token = None
        try:
            return t.evaluate(batches)
        finally:
            t.head_token = token

    t.compile(t.to_device(train[:1]))
    seen = []
    for b in train:
        kept, ref = t.evaluate(batches), whole()
        assert kept[1] == ref[1] and kept[0] == pytest.approx(ref[0], rel=1e-6, abs=1e-7)
        seen.append(kept[0])
        t.step(t.to_device([b]))
    assert len(runs) == len(batches)  # the trunk once per held-out batch, however often it is evaluated
    assert not np.isclose(seen[0], seen[1], rtol=1e-6)  # the head moved, and the kept rows were scored by the new one


def test_a_trainer_beyond_the_head_scopes_runs_the_whole_model():
    spec, weights, _, _ = setup("tiny")
    for framework in ("torch", "jax"):
        step = StepSpec(mode="inference", trainable="bias")
        assert implementation(framework, "steps").make_trainer(spec, weights, step, "cpu").head_token is None
