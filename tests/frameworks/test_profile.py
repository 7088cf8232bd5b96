"""Each framework's profiler trace of a few steps (bench/<framework>_impl/profile.py), read back as a user's tool
would read it: the file opens, holds one "step" event per step traced with the framework's operations inside, and
every operation gets a category, so the step's time is explained (bench/measure/timeline.py)."""

from __future__ import annotations

import pytest

from bench import data
from bench.config import model_preset
from bench.measure.timeline import CATEGORIES, STEP_EVENT, complete, explain, load_events, operations
from bench.spec import FRAMEWORKS, StepSpec, implementation
from bench.weights import build_weights
from tests.support import torch_threads

TINY, _ = model_preset("tiny")
WEIGHTS = build_weights(TINY, 0)
STEPS = 2


@pytest.fixture(scope="module", params=FRAMEWORKS)
def traced(request, tmp_path_factory):
    """A jvp trainer of each framework after warm-up, its trace of STEPS steps, and the trace's events."""
    fw = request.param
    trainer = implementation(fw, "steps").make_trainer(TINY, WEIGHTS, StepSpec(mode="jvp"), "cpu")
    micro = data.make_batches(data.data_spec(num_train=64), 4, 32, 0, "train")[:3]
    updates = [trainer.to_device([b]) for b in micro]
    trainer.compile(updates[0])
    trainer.sync(trainer.step(updates[0]))  # the first step compiles: never traced
    prof = implementation(fw, "profile")
    path = prof.record(trainer, updates[1:], tmp_path_factory.mktemp(fw))
    events = load_events(path)
    return fw, trainer, prof, path, events


def test_the_trace_opens_and_holds_each_step_with_its_operations(traced):
    fw, trainer, prof, path, events = traced
    assert path.exists() and path.stat().st_size > 0
    steps = [e for e in complete(events) if e["name"] == STEP_EVENT]
    assert len(steps) == STEPS
    ops = operations(events, prof.classify(trainer, events))
    for s in steps:
        inside = [o for o in ops if s["ts"] <= o.start < s["ts"] + s["dur"]]
        assert len(inside) > 10, fw  # a BERT step is many operations, each of them seen
    assert {o.category for o in ops} <= set(CATEGORIES)


def test_a_jvp_step_is_explained_by_category(traced):
    fw, trainer, prof, _, events = traced
    x = explain(events, prof.classify(trainer, events))
    assert x.steps == STEPS
    assert sum(x.by_category_ms.values()) == pytest.approx(x.wall_ms)
    # a forward gradient multiplies matrices (layers, attention) and draws its tangent
    for category in ("matmul", "attention", "random", "elementwise"):
        assert x.by_category_ms[category] > 0, (fw, category, x.by_category_ms)
    assert x.by_category_ms["collectives"] == 0  # one device
    assert x.top_ops and all(o["self_ms_per_step"] >= 0 for o in x.top_ops)


def test_torch_traces_the_draws_its_pool_of_threads_makes(tmp_path):
    """A big unit's chunks are drawn by a pool of threads (torch_impl/directions.fill): the trace holds them, one
    generator's op per chunk, each counted as random time, not as the host's overhead."""
    import torch

    from bench.torch_impl import directions, profile

    unit = directions.Units({"w": torch.zeros(3 * directions.CHUNK)})[0]

    class Drawing:  # a trainer whose step is one draw of the unit
        device = torch.device("cpu")

        def step(self, _):
            return directions.draw(unit, 0, 0, 0)

        def sync(self, out):
            return out

    with torch_threads(2):
        directions.draw(unit, 0, 0, 0)  # the pool's threads exist before the profiler starts
        events = load_events(profile.record(Drawing(), [None], tmp_path))
    ops = [op for op in operations(events, profile.classify(None, events)) if op.name == "aten::normal_"]
    assert len(ops) == 3 and {op.category for op in ops} == {"random"}
    if profile.every_thread() is not None:
        (step,) = [e for e in complete(events) if e["name"] == STEP_EVENT]
        calling = (step.get("pid"), step.get("tid"))
        assert all(op.thread != calling for op in ops)  # off the calling thread, and still in the trace
