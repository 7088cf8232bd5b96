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
    events = [ev("step", 0, 100, cat="annotation"), ev("matmul.outer", 10, 50), ev("elementwise.inner", 20, 15),
              ev("matmul.inner2", 40, 10), ev("Optimizer.step", 70, 20, cat="annotation"), ev("elementwise.u", 75, 10)]
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
        events += [ev("step", start, 100, cat="annotation"), ev("matmul.a", start + 10, 40, tid=2),
                   ev("elementwise.b", start + 10, 40, tid=3), ev("random.c", start + 60, 20, tid=2)]  # fmt: skip
    x = explain(events, by_name)
    assert x.steps == 2 and x.wall_ms == pytest.approx(0.1)
    assert sum(x.by_category_ms.values()) == pytest.approx(x.wall_ms)
    assert x.by_category_ms["overhead"] == pytest.approx(0.04)
    assert x.by_category_ms["random"] == pytest.approx(0.02)
    assert x.by_category_ms["matmul"] == pytest.approx(0.02) == x.by_category_ms["elementwise"]
    assert set(x.columns()) >= {f"time_{c}_ms" for c in CATEGORIES}
    assert [o["name"] for o in x.top_ops][:2] == ["matmul.a", "elementwise.b"]
    assert x.top_ops[0]["calls_per_step"] == 1


def test_a_trace_without_steps_is_refused(tmp_path):
    path = tmp_path / "t.json.gz"
    with gzip.open(path, "wt") as f:
        json.dump({"traceEvents": [ev("matmul.a", 0, 10)]}, f)
    with pytest.raises(ValueError, match="no 'step' event"):
        explain(load_events(path), by_name)
