"""A target that holds (bench/scenarios/model/target.py): met once target.hold evaluations in a row meet it, counted
at the first of them; easier values on the way (target.levels -> levels_to_target); forward passes as each
estimator declares them (passes_to_target); and their refusals, in one line before anything runs."""

from __future__ import annotations

import functools
import random
from dataclasses import replace

import pytest

from bench import estimators
from bench.config import BenchConfig
from bench.scenarios.model.report.cost_stats import cost_groups, target_label, value
from bench.scenarios.model.scenario import make_row
from bench.scenarios.model.schedule import next_evaluation
from bench.scenarios.model.target import Target, parse_levels, replay_levels
from bench.store.read import read_history, read_rows
from tests.scenarios.test_cost_report import cost_row
from tests.scenarios.test_cost_to_target import capped_sweep
from tests.support import bench_here, composed, run_here

TINY = [
    "model=tiny",
    "batch_size=4",
    "seq_len=32",
    "warmup_steps=1",
    "data.num_train=64",
    "data.num_eval=16",
    "logger=none",
    "evaluate=true",
    "eval_every=2",
]


@functools.cache
def base() -> BenchConfig:
    """A target trial's config, composed once: each test sets its target on a copy (Hydra composes in ~0.5 s)."""
    return composed(*TINY, "target.metric=eval_accuracy", "target.value=0.5", "target.max_steps=41")


def target(value=0.5, metric="eval_accuracy", hold=1, levels=(), stop_after=None) -> Target:
    cfg = base()
    at = replace(cfg.target, metric=metric, value=value, hold=hold, levels=list(levels))
    return Target(replace(cfg, target=at, tune_stop_after=stop_after))


def feed(t: Target, accuracies: list[float], start: int = 1) -> list[bool]:
    """Evaluations every 2 timed steps from `start`, each an accuracy (loss 1 - accuracy): whether each ended it."""
    return [t.check((1 - a, a), start + 2 * i, float(i)) for i, a in enumerate(accuracies)]


def test_a_crossing_that_falls_back_is_not_the_target_and_one_that_holds_counts_at_its_first_evaluation():
    t = target(hold=3)
    # crosses at steps 2 and 4 (counts 3, 5), falls back at 6; holds from 8: met at its third evaluation
    assert feed(t, [0.2, 0.6, 0.5, 0.4, 0.7, 0.55, 0.9, 0.1], start=0) == [False] * 6 + [True, False]
    assert t.reached == (8, 4.0)  # the run's first evaluation: step index 8 at 4 s of training
    cols = t.columns([0.1], [0.1] * 13, samples_per_step=4)
    assert (
        cols["target_status"] == "reached" and cols["steps_to_target"] == 1 + 8 + 1 and "levels_to_target" not in cols
    )
    assert cols["seconds_to_target"] == pytest.approx(0.1 + 0.9)  # to the first evaluation, not the last
    one = target()  # hold=1, the default: the first evaluation at the target, as before
    assert feed(one, [0.2, 0.6]) == [False, True] and one.reached == (3, 1.0)
    loss = target(metric="eval_loss", value=0.5, hold=2)  # lower is better: losses 0.7, 0.4, 0.6, 0.4, 0.5
    assert feed(loss, [0.3, 0.6, 0.4, 0.6, 0.5]) == [False] * 4 + [True] and loss.reached == (7, 3.0)


def test_never_held_by_the_cap_is_not_reached():
    t = target(hold=2)
    assert not any(feed(t, [0.6, 0.4, 0.6, 0.4, 0.6]))
    assert t.columns([0.1], [0.1] * 10, 4) == {"target_status": "not_reached"}


def test_capping_lets_a_run_begun_by_the_best_s_step_finish_and_stops_one_begun_after():
    """tune_stop_after=6 (the group's best met the target at count 6), evaluations at counts 2, 4, 6, 8, ...; at the
    step cap a trial ends not_reached, with or without a run under way (test_cost_to_target's capping test)."""
    tie = target(hold=3, stop_after=6)  # begun at 6: it ties if it holds, so it runs on
    assert feed(tie, [0.1, 0.1, 0.6, 0.6, 0.6], start=0) == [False, False, False, False, True]
    assert tie.columns([0.1], [0.1] * 9, 4)["steps_to_target"] == 6
    broke = target(hold=3, stop_after=6)  # begun at 4, broken at 8: capped there
    assert feed(broke, [0.1, 0.6, 0.6, 0.1, 0.6], start=0) == [False, False, False, True, False]
    assert broke.columns([0.1], [0.1] * 7, 4) == {"target_status": "capped"}
    late = target(hold=3, stop_after=7)  # begun at 8, past the best's 7: it cannot win
    assert feed(late, [0.1, 0.1, 0.1, 0.6], start=0) == [False, False, False, True]
    assert late.columns([0.1], [0.1] * 7, 4) == {"target_status": "capped"}


def test_levels_are_recorded_on_the_way_by_the_same_rule_easiest_first():
    t = target(hold=2, levels=[0.45, 0.3])
    assert feed(t, [0.31, 0.2, 0.35, 0.46, 0.44, 0.5, 0.6], start=0) == [False] * 6 + [True]
    # 0.3 held from count 6 (0.35, 0.46); 0.45 crossed at 8, fell back at 10, held from 12; 0.5 from 12
    cell = t.columns([0.1], [0.1] * 13, 4)["levels_to_target"]
    assert cell == "0.3:6;0.45:12;0.5:12" and parse_levels(cell) == [(0.3, 6), (0.45, 12), (0.5, 12)]
    missed = target(value=0.9, levels=[0.3])
    feed(missed, [0.1, 0.2])
    assert missed.columns([0.1], [0.1] * 3, 4) == {"target_status": "not_reached", "levels_to_target": "0.3:;0.9:"}
    losses = target(metric="eval_loss", value=0.5, levels=[2.0, 1.0])  # a loss: the highest is easiest
    feed(losses, [-0.5, 0.1])  # losses 1.5, 0.9
    assert losses.levels_cell() == "2:3;1:5;0.5:" and parse_levels("") == []


@pytest.mark.parametrize("seed", range(6))
def test_levels_replayed_from_a_history_are_those_the_trial_would_have_recorded(seed):
    """A row that recorded no levels gets them from its kept evaluations (one entry per timed step, None between):
    the cell Target writes for the same evaluations, up to where the trial ended."""
    rng = random.Random(seed)
    t = target(hold=3, levels=[0.3, 0.4])
    accuracies = []
    for _ in range(60):
        accuracies.append(round(min(1.0, max(0.0, 0.2 + 0.01 * len(accuracies) + rng.gauss(0, 0.08))), 3))
        if feed(t, accuracies[-1:], start=1 + 2 * (len(accuracies) - 1))[0]:
            break
    history = [None] * (2 * len(accuracies) + 1)
    history[1::2] = accuracies
    replayed = replay_levels(history, [0.3, 0.4, 0.5], "eval_accuracy", hold=3, warmup=1)
    assert replayed == t.levels_cell() and parse_levels(replayed)[-1][1] == t.columns([0.1], [0.1] * 3, 4).get(
        "steps_to_target"
    )
    losses = [None, 1.5, None, 0.9, 0.8]  # a loss: met at or under
    assert replay_levels(losses, [1.0, 0.85], "eval_loss", hold=2, warmup=0) == "1:4;0.85:"


def test_a_geometric_schedule_puts_no_count_at_the_first_evaluation_alone():
    """eval_resolution=0.25 with eval_every=20 and one warm-up step (the cost experiments'): counts growing by about
    4/3 from step 2, then every 20th."""
    done, counts = 0, []
    while done < 120:
        counts.append(1 + (done := next_evaluation(done, 20, 0.25, 1)))
    assert counts == [2, 3, 4, 5, 6, 8, 10, 13, 17, 21, 28, 37, 41, 54, 61, 81, 101, 121]


def test_each_estimator_declares_its_forward_passes_a_step():
    declared = lambda mode, **row: estimators.get(mode).forward_passes_for(row)  # noqa: E731
    assert declared("backprop") == 1 and declared("inference") == 1  # a backward pass is not a forward pass
    assert declared("mezo") == 2 and declared("mezo", mezo_q="4") == 8 and declared("mezo", mezo_q="") == 2
    assert declared("jvp") == 1 and declared("jvp", num_tangents="4") == 4  # one forward-mode pass per tangent
    assert declared("hizoo") == 3 and declared("lozo") == 2
    assert declared("jacfwd", n_trainable="1540") == 1540 and declared("jacfwd") is None  # a pass per direction
    # the report reads rows from before the column the same way; a row's own column wins
    old = {"mode": "mezo", "mezo_q": "2", "steps_to_target": "21"}
    assert value(old, "passes_to_target") == 84 and value({**old, "passes_to_target": "42"}, "passes_to_target") == 42


def test_the_report_names_the_hold_and_reads_rows_from_before_it_as_one():
    row = cost_row("backprop", 51, 10.0)
    labels = [target_label(next(iter(cost_groups([{**row, "target_hold": h}])))) for h in (3, 1, "")]
    assert "· held at 3 evaluations in a row ·" in labels[0] and "held at" not in labels[1] and labels[1] == labels[2]
    assert len(cost_groups([{**row, "target_hold": 1}, {**row, "target_hold": "", "run_id": "old"}])) == 1


@pytest.mark.slow
def test_a_held_target_trial_records_hold_levels_and_passes(tmp_path):
    """eval_loss <= 100 holds at every evaluation: with hold=2 the trial meets it at count 3 and stops at 5."""
    (outcome,) = run_here(
        *TINY,
        "mode=mezo",
        "target.metric=eval_loss",
        "target.value=100",
        "target.max_steps=21",
        "target.hold=2",
        "target.levels=[200]",
        results=tmp_path,
    )
    assert outcome["status"] == "ok", outcome
    (row,) = read_rows(tmp_path / "runs.csv")
    assert row["target_status"] == "reached" and row["steps_to_target"] == "3" and row["steps_timed"] == "4"
    assert row["target_hold"] == "2" and row["levels_to_target"] == "200:3;100:3" and row["passes_to_target"] == "6"
    history = read_history({**row, "_source": str(tmp_path / "runs.csv")})
    assert [i for i, a in enumerate(history["eval_accuracy"]) if a is not None] == [1, 3]
    assert make_row(composed(*TINY), {}, {})["target_hold"] is None  # no target, no hold


@pytest.mark.parametrize(
    "args,message",
    [
        (["target.hold=0"], "target.hold=0: accepted an integer in [1, 100]"),
        (["target.hold=101"], "target.hold=101: accepted an integer in [1, 100]"),
        (["target.hold=5"], "target.hold=5: 5 evaluations in a row end at step 11 at the earliest, past"),
        (["target.levels=[0.6]"], "target.levels=[0.6]: accepted distinct values easier than target.value=0.5"),
        (["target.levels=[0.3,0.3]"], "target.levels=[0.3,0.3]: accepted distinct values"),
        (["target.levels=[0]"], "target.levels=[0.0]: accepted distinct values"),
    ],
)
def test_bad_holds_and_levels_are_one_line_before_anything_runs(args, message, tmp_path):
    target_args = ["target.metric=eval_accuracy", "target.value=0.5", "target.max_steps=9"]
    out = bench_here(*TINY, *target_args, *args, results=tmp_path)
    assert out.returncode == 2 and message in out.stderr and len(out.stderr.strip().splitlines()) == 1
    assert not (tmp_path / "runs.csv").exists()


def test_a_hold_without_a_target_is_refused(tmp_path):
    out = bench_here(*TINY, "target.hold=3", results=tmp_path)
    assert out.returncode == 2 and "target.value/max_steps/hold/levels without target.metric" in out.stderr


@pytest.mark.slow
def test_a_capped_sweep_with_a_hold_lets_a_tie_verify_its_run(tmp_path):
    """capping with target.hold=2: the first point holds from its first evaluation (count 3) to its second (5); the
    next, capped at 3, meets the target there too, so it runs on to verify the run and ties instead of being capped."""
    out, rows = capped_sweep(tmp_path, "target.hold=2")
    assert [
        (r["tuning"], r["tune_stop_after"], r["target_status"], r["steps_to_target"], r["steps_timed"]) for r in rows
    ] == [
        ("search", "", "reached", "3", "4"),
        ("search", "3", "reached", "3", "4"),
        ("repeat", "", "reached", "3", "4"),
    ]
