"""bench.measure.timeline on hand-made traces: self time under nesting, busy time across threads, the categories
adding up to the step, and a trace without steps refused."""

from __future__ import annotations

import gzip
import json

import pytest

from bench.measure.timeline import CATEGORIES, busy_us, explain, load_events, operations


def ev(name, ts, dur, tid=1, cat="op"):
    return {"ph": "X", "name": name, "ts": ts, "dur": dur, "pid": 1, "tid": tid, "cat": cat}


def by_name(event, enclosing):
    """Ops are cat == "op"; their category is the part of the name before the first dot."""
    if event.get("cat") != "op":
        return None
    return "optimizer" if "Optimizer.step" in enclosing else event["name"].split(".")[0]


def test_self_time_subtracts_nested_operations_only():
    events = [
        ev("step", 0, 100, cat="annotation"),
        ev("matmul.outer", 10, 50),
        ev("elementwise.inner", 20, 15),
        ev("matmul.inner2", 40, 10),
        ev("Optimizer.step", 70, 20, cat="annotation"),
        ev("elementwise.u", 75, 10),
    ]
    ops = {o.name: o for o in operations(events, by_name)}
    assert ops["matmul.outer"].self_us == pytest.approx(50 - 15 - 10)
    assert ops["elementwise.inner"].self_us == pytest.approx(15)
    assert ops["elementwise.u"].category == "optimizer"  # inside torch.optim's annotation
    assert ops["elementwise.u"].enclosing == ("step", "Optimizer.step")
    x = explain(events, by_name).by_category_ms  # a nested operation's time is its own, not its parent's
    assert (x["matmul"], x["elementwise"], x["optimizer"]) == pytest.approx((0.025 + 0.010, 0.015, 0.010))
    assert x["overhead"] == pytest.approx(0.1 - 0.05 - 0.01)


def test_busy_time_is_the_union_over_threads():
    assert busy_us([(0, 10), (5, 15), (20, 30)]) == pytest.approx(25)
    assert busy_us([(0, 30), (5, 10)]) == pytest.approx(30)
    assert busy_us([]) == 0


def test_categories_add_up_to_the_step_and_overlap_is_shared():
    # two steps of 100 us; in each, two threads run a matmul and an elementwise op at once for 40 us, then a
    # random draw for 20 us: busy 60 us, overhead 40 us; the 40 us when both run are split between them
    events = []
    for start in (0, 1000):
        events += [
            ev("step", start, 100, cat="annotation"),
            ev("matmul.a", start + 10, 40, tid=2),
            ev("elementwise.b", start + 10, 40, tid=3),
            ev("random.c", start + 60, 20, tid=2),
        ]
    x = explain(events, by_name)
    assert x.steps == 2 and x.wall_ms == pytest.approx(0.1)
    assert sum(x.by_category_ms.values()) == pytest.approx(x.wall_ms)
    assert x.by_category_ms["overhead"] == pytest.approx(0.04)
    assert x.by_category_ms["random"] == pytest.approx(0.02)
    assert x.by_category_ms["matmul"] == pytest.approx(0.02) == x.by_category_ms["elementwise"]
    assert set(x.columns()) >= {f"time_{c}_ms" for c in CATEGORIES}
    assert [o["name"] for o in x.top_ops][:2] == ["matmul.a", "elementwise.b"]
    assert x.top_ops[0]["calls_per_step"] == 1


def test_every_category_is_its_known_duration():
    """A step of 200 us whose every category is known by construction, overhead included: a matmul that starts
    before the step (only its part inside counts), an attention op holding an elementwise one, a random draw on a
    second thread overlapping the attention (the 10 us both run split between them), an optimizer op, gaps
    nothing runs in (overhead), and an op after the step that no category may count."""
    events = [
        ev("step", 100, 200, cat="annotation"),
        ev("matmul.early", 80, 50),
        ev("attention.a", 150, 60),
        ev("elementwise.in_attention", 160, 10),
        ev("random.r", 200, 30, tid=2),
        ev("Optimizer.step", 260, 30, cat="annotation"),
        ev("elementwise.update", 265, 25),
        ev("matmul.between_steps", 320, 40),
    ]
    x = explain(events, by_name).by_category_ms
    # us: matmul 100-130 = 30; attention 60 less 10 nested = 50, less half of the 10 (200-210) it shares with the
    # random draw = 45; elementwise 10; random 30 - 5 = 25; optimizer 25; collectives 0; overhead, where nothing
    # runs: 130-150, 230-265 and 290-300 = 65
    want = {
        "matmul": 30,
        "attention": 45,
        "elementwise": 10,
        "random": 25,
        "optimizer": 25,
        "collectives": 0,
        "overhead": 65,
    }
    assert x == pytest.approx({c: us / 1e3 for c, us in want.items()})


def test_a_trace_without_steps_is_refused(tmp_path):
    path = tmp_path / "t.json.gz"
    with gzip.open(path, "wt") as f:
        json.dump({"traceEvents": [ev("matmul.a", 0, 10)]}, f)
    with pytest.raises(ValueError, match="no 'step' event"):
        explain(load_events(path), by_name)
