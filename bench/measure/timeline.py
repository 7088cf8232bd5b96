"""Where a step's time goes, read from a profiler's trace: framework-neutral, knows nothing of BERT.

Both frameworks' profilers write the Chrome trace-event format (torch.profiler's export_chrome_trace, the
perfetto_trace.json.gz of jax.profiler.trace): complete events ("ph": "X") with a thread, a start and a duration
in microseconds. The trial wraps every profiled step in an event named "step"; each framework says which of the
other events are its operations and to which category each belongs (bench/<framework>_impl/profile.py). Here:

    self time   an operation's duration less that of the operations nested in it on the same thread (torch's
                aten::linear holds an aten::addmm; XLA's while-loop thunk holds its body's thunks)
    busy        the time within a step when at least one operation runs, on any thread (XLA:CPU runs independent
                thunks on several threads at once, so self times summed can exceed the wall time)
    categories  each moment of busy time goes to the operations running then (each thread's innermost), split
                evenly between threads that run at once; what is left of the step's wall time is `overhead`: no
                operation of the framework's ran (Python, dispatch, the runtime launching work, waiting)

so the categories of a step add up to its wall time. Times are per step, the mean over the profiled steps.
"""

from __future__ import annotations

import gzip
import json
import tempfile
from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

# The categories of the row's time_<category>_ms columns and of the report's "Time, explained", in this order.
# random: every random draw (jvp's tangents, MeZO's perturbations and their regeneration in the update, dropout
# masks); optimizer: the update's arithmetic (a fused draw-and-update counts as random: the draw dominates it).
CATEGORIES = ("matmul", "attention", "elementwise", "random", "optimizer", "collectives", "overhead")
STEP_EVENT = "step"  # the annotation the trial puts around each profiled step
TOP_OPS = 15  # operations listed per trial in its trace summary


@dataclass
class Op:
    """One operation's event: its name, category, thread, start and duration (microseconds), and what encloses
    it on its thread (annotations such as torch's "Optimizer.step#SGD.step")."""

    name: str
    category: str
    thread: tuple
    start: float
    dur: float
    enclosing: tuple[str, ...] = ()
    self_us: float = 0.0
    children: list[tuple[float, float]] = field(default_factory=list)  # nested operations' intervals


@dataclass
class Explained:
    """A trace's steps explained: milliseconds per step by category (summing to `wall_ms`), and the operations
    that took the most self time."""

    steps: int
    wall_ms: float
    by_category_ms: dict[str, float]
    top_ops: list[dict] = field(default_factory=list)

    def columns(self) -> dict:
        return {
            "profile_steps_traced": self.steps,
            "profile_step_ms": self.wall_ms,
            **{f"time_{c}_ms": self.by_category_ms[c] for c in CATEGORIES},
        }


def load_events(path: Path) -> list[dict]:
    """The trace's events, from a Chrome trace JSON file (gzipped or not; an object with traceEvents, or a list)."""
    path = Path(path)
    opener = gzip.open if path.suffix == ".gz" else open
    with opener(path, "rt") as f:
        data = json.load(f)
    return data["traceEvents"] if isinstance(data, dict) else data


def complete(events: list[dict]) -> list[dict]:
    return [e for e in events if e.get("ph") == "X" and "dur" in e and "ts" in e]


def step_windows(events: list[dict]) -> list[tuple[float, float]]:
    """(start, end) in microseconds of each profiled step, in order."""
    steps = sorted((e["ts"], e["ts"] + e["dur"]) for e in complete(events) if e["name"] == STEP_EVENT)
    if not steps:
        raise ValueError(f"the trace has no '{STEP_EVENT}' event: nothing to explain")
    return steps


def operations(events: list[dict], classify: Callable[[dict, tuple[str, ...]], str | None]) -> list[Op]:
    """Every event `classify` calls an operation (it returns its category, or None for anything else), with its
    self time and the names of the events enclosing it on its thread."""
    by_thread = defaultdict(list)
    for e in complete(events):
        by_thread[(e.get("pid"), e.get("tid"))].append(e)
    ops: list[Op] = []
    for thread, evs in by_thread.items():
        evs.sort(key=lambda e: (e["ts"], -e["dur"]))
        stack: list[tuple[dict, Op | None]] = []  # (event, its Op if it is one)
        for e in evs:
            end = e["ts"] + e["dur"]
            while stack and stack[-1][0]["ts"] + stack[-1][0]["dur"] < end - 1e-3:
                stack.pop()
            enclosing = tuple(s[0]["name"] for s in stack)
            category = classify(e, enclosing)
            op = None
            if category is not None:
                op = Op(e["name"], category, thread, e["ts"], e["dur"], enclosing, e["dur"])
                parent = next((o for _, o in reversed(stack) if o is not None), None)
                if parent is not None:
                    parent.self_us -= e["dur"]
                    parent.children.append((e["ts"], end))
                ops.append(op)
            stack.append((e, op))
    return ops


def busy_us(intervals: list[tuple[float, float]]) -> float:
    """The length of the union of intervals."""
    total, reach = 0.0, -float("inf")
    for start, end in sorted(intervals):
        if end > reach:
            total += end - max(start, reach)
            reach = end
    return total


def self_segments(op: Op) -> list[tuple[float, float]]:
    """The parts of an operation's interval its nested operations do not cover."""
    out, at = [], op.start
    for start, end in sorted(op.children):
        if start > at:
            out.append((at, start))
        at = max(at, end)
    if op.start + op.dur > at:
        out.append((at, op.start + op.dur))
    return out


def shares(ops: list[Op], start: float, end: float) -> dict[str, float]:
    """Microseconds per category within [start, end): each moment is credited to the operations running then
    (each thread's innermost), split evenly where several threads run at once, so the shares add up to the busy
    time exactly."""
    edges = []
    for o in ops:
        for a, b in self_segments(o):
            a, b = max(a, start), min(b, end)
            if b > a:
                edges += [(a, 1, o.category), (b, -1, o.category)]
    edges.sort(key=lambda e: (e[0], e[1]))
    out = dict.fromkeys(CATEGORIES, 0.0)
    active: dict[str, int] = defaultdict(int)
    last = None
    for t, delta, category in edges:
        running = sum(active.values())
        if last is not None and running and t > last:
            for c, n in active.items():
                if n:
                    out[c] += (t - last) * n / running
        active[category] += delta
        last = t
    return out


def explain(events: list[dict], classify: Callable[[dict, tuple[str, ...]], str | None]) -> Explained:
    """The steps of a trace, explained by category (see the module docstring)."""
    windows = step_windows(events)
    ops = operations(events, classify)
    wall = sum(end - start for start, end in windows)
    by_cat = dict.fromkeys(CATEGORIES, 0.0)
    per_op: dict[tuple[str, str], list[float]] = defaultdict(lambda: [0.0, 0])
    for start, end in windows:
        inside = [o for o in ops if o.start < end and o.start + o.dur > start]  # clipped to the step by shares
        for c, us in shares(inside, start, end).items():
            by_cat[c] += us
        for o in inside:
            per_op[(o.name, o.category)][0] += o.self_us
            per_op[(o.name, o.category)][1] += 1
    n = len(windows)
    by_cat["overhead"] += wall - sum(by_cat.values())
    top = sorted(per_op.items(), key=lambda kv: -kv[1][0])[:TOP_OPS]
    return Explained(
        steps=n,
        wall_ms=wall / n / 1e3,
        by_category_ms={c: v / n / 1e3 for c, v in by_cat.items()},
        top_ops=[
            {"name": name, "category": cat, "self_ms_per_step": us / n / 1e3, "calls_per_step": calls / n}
            for (name, cat), (us, calls) in top
        ],
    )


def traced_overhead_share(prof, trainer, micro_batches) -> float:
    """The share of one more step of `trainer`, traced by a framework's profile module `prof` into a folder that
    is removed after, in which none of its operations ran: `overhead` over the step's wall time (explain)."""
    with tempfile.TemporaryDirectory() as folder:
        events = load_events(prof.record(trainer, [micro_batches], Path(folder)))
    explained = explain(events, prof.classify(trainer, events))
    return explained.by_category_ms["overhead"] / explained.wall_ms
