"""Cost to a target: a trial stops at the first evaluation that meets its target and its row says what reaching
it cost; one that does not reach it by the cap is a row too (not_reached); a trial that dies mid-curve keeps the
curve and is not reached; the tuning sweeper gives every mode the same budget and repeats each winner; the report's
section lists the sweep (its statistics, on made-up rows: test_cost_report.py); bad targets and search spaces are
one line before anything runs.

What a target trial records is measured in the test's process (run_here); the crash and the tuning sweep run as
`python -m bench` (a process that dies; Hydra's sweeper and launcher)."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from bench.config import resolve
from bench.errors import ConfigError
from bench.harness.preflight import compose_trials
from bench.harness.tuning import (
    below_a_miss,
    confirming,
    expand,
    incumbents,
    known_points,
    next_round,
    rounds,
    winners,
)
from bench.report.build import build, results_of
from bench.scenarios import REPORT_SECTIONS
from bench.scenarios.model.scenario import MODEL, make_row
from bench.scenarios.model.schedule import next_evaluation, previous_evaluation
from bench.scenarios.model.trial import Clock, Target
from bench.store.read import read_history, read_rows
from tests.support import FakeClock, bench_here, composed, run_here, sweep_here

REPO = Path(__file__).resolve().parents[2]
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


def bench(*args: str, env: dict | None = None) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "bench", *args],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=900,
        env={**os.environ, **(env or {})},
    )


def target(metric="eval_accuracy", value=0.5, max_steps=9, warmup=1, *more: str):
    ((_, composed),) = compose_trials(
        [
            *TINY,
            f"warmup_steps={warmup}",
            f"target.metric={metric}",
            f"target.value={value}",
            f"target.max_steps={max_steps}",
            *more,
        ],
        False,
    )[0]
    return Target(resolve(composed))


def test_the_first_evaluation_that_meets_the_target_is_the_one():
    t = target(value=0.5, warmup=2)
    assert not t.check((1.3, 0.25), 1, 0.0) and not t.check((1.2, 0.49), 3, 0.0)
    assert t.check((1.1, 0.5), 5, 0.0)  # met: >= the value
    assert not t.check((0.9, 0.9), 7, 0.0)  # reached once: a later evaluation changes nothing
    cols = t.columns([2.0, 0.1], [0.1] * 8, samples_per_step=4)
    assert cols["target_status"] == "reached" and cols["steps_to_target"] == 2 + 6  # warm-up steps train too
    assert cols["samples_to_target"] == 32 and cols["seconds_to_target"] == pytest.approx(0.1 + 0.1 + 0.6)
    loss = target(metric="eval_loss", value=1.0)
    assert not loss.check((1.2, 0.9), 1, 0.0) and loss.check((0.99, 0.1), 3, 0.0)  # lower is better
    assert target().columns([1.0], [0.1], 4) == {"target_status": "not_reached"}


def test_the_wall_clock_to_a_target_leaves_the_evaluations_out():
    now = FakeClock()

    class Slow:  # a trainer whose evaluation takes 0.3 s
        def evaluate(self, batches):
            now.advance(0.3)
            return 1.0, 0.5

    clock = Clock(now)
    now.advance(0.05)  # training
    assert clock.evaluate(Slow(), []) == (1.0, 0.5) and clock.evaluate(Slow(), []) == (1.0, 0.5)
    now.advance(0.02)  # training again
    # AlgoPerf's two clocks, apart: a clock that counted the evaluations would read 0.67 s
    assert clock.eval_s == pytest.approx(0.6) and clock.training_s() == pytest.approx(0.07)
    t = target(value=0.5)
    assert t.check((1.0, 0.5), 3, clock.training_s()) and t.reached[1] == pytest.approx(0.07)


def test_a_capped_search_trial_ends_at_its_groups_best_unless_it_meets_the_target_there():
    """tune_stop_after=6 (the group's best took 6 steps): the evaluation at step 6 still decides (a tie reaches), the
    first one past it that has not met the target ends the trial capped; at the step cap it is not_reached."""
    tie = target("eval_accuracy", 0.5, 11, 2, "tune_stop_after=6")
    assert not tie.check((1.3, 0.2), 1, 0.0) and tie.check((1.2, 0.5), 3, 0.0)  # steps 2 + 4 = 6: reached
    assert tie.columns([0.1, 0.1], [0.1] * 4, 4)["target_status"] == "reached"
    late = target("eval_accuracy", 0.5, 11, 2, "tune_stop_after=6")
    assert not late.check((1.3, 0.2), 1, 0.0) and late.check((1.2, 0.4), 3, 0.0)  # step 6, not met: capped
    assert not late.check((1.0, 0.9), 5, 0.0)  # capped once: a later evaluation changes nothing
    assert late.columns([0.1, 0.1], [0.1] * 4, 4) == {"target_status": "capped"}
    at_cap = target("eval_accuracy", 0.5, 6, 2, "tune_stop_after=6")  # the cap ends it first: not_reached
    assert not at_cap.check((1.2, 0.4), 3, 0.0) and at_cap.columns([0.1], [0.1], 4) == {"target_status": "not_reached"}


def test_capping_runs_each_groups_points_from_its_highest_learning_rate_down_stopped_at_its_best():
    search = [
        ("g", ["case=mezo", "optimizer.lr=0.01"]),
        ("g", ["case=mezo", "optimizer.lr=1.0"]),
        ("g", ["case=mezo", "optimizer.lr=0.1"]),
        ("h", ["case=backprop", "optimizer.lr=0.3"]),
    ]
    assert [[(g, o[-1]) for g, o in r] for r in rounds(search)] == [
        [("g", "optimizer.lr=1.0"), ("h", "optimizer.lr=0.3")],
        [("g", "optimizer.lr=0.1")],
        [("g", "optimizer.lr=0.01")],
    ]
    rows = [
        ("g", [], {"status": "diverged", "target_status": "", "steps_to_target": ""}),
        ("g", [], {"status": "ok", "target_status": "reached", "steps_to_target": "301"}),
        ("g", [], {"status": "ok", "target_status": "reached", "steps_to_target": "181"}),
        ("g", [], {"status": "ok", "target_status": "capped", "steps_to_target": ""}),
        ("h", [], {"status": "ok", "target_status": "not_reached", "steps_to_target": ""}),
    ]
    assert incumbents(rows) == {"g": 181}  # h has none yet: its next point runs uncapped


def test_a_trial_stops_at_its_target_and_records_what_it_cost(tmp_path, capsys):
    # eval_loss <= 100 holds at the first evaluation: the trial stops there, 1 warm-up + 2 timed steps
    (outcome,) = run_here(*TINY, "target.metric=eval_loss", "target.value=100", "target.max_steps=21", results=tmp_path)
    assert outcome["status"] == "ok", outcome
    out = capsys.readouterr()
    (row,) = read_rows(tmp_path / "runs.csv")
    assert row["status"] == "ok" and row["target_status"] == "reached"
    assert row["steps_to_target"] == "3" and row["steps_timed"] == "2" and row["samples_to_target"] == "12"
    wall, timed = float(row["wall_to_target_s"]), float(row["seconds_to_target"])
    # what holds on any host: the steps' own seconds are the timed steps' and the first priced at the median; the
    # wall clock holds the compilation, the warm-up and every step (how they compare to each other is the host's)
    steps_s, warm_s = float(row["total_train_time_s"]), float(row["warmup_time_s"])
    assert timed > steps_s > 0 and wall >= (warm_s + steps_s) * (1 - 1e-9)
    assert float(row["mib_s_to_target"]) == pytest.approx(float(row["excess_mem_mb"]) * timed)
    assert float(row["eval_time_s"]) > 0  # the evaluations' seconds, kept apart from the wall time to the target
    assert row["eval_examples"] == "16" and len(row["eval_fingerprint"]) == 16  # the examples the target was met on
    assert "eval_loss 100 reached in 3 steps" in out.out
    # what the report needs beside: the evaluation interval, and backprop's step in forward passes (about 3)
    assert row["eval_every"] == "2" and row["tune_objective"] == ""
    assert 2 < float(row["flops_per_step"]) / float(row["flops_forward"]) < 4


def test_every_row_says_how_many_held_out_examples_its_target_is_met_on_a_crashed_one_too():
    """From the config, so a row the trial never wrote (a crash, an OOM) is in its target's group: whole batches of
    data.num_eval (18 at batch 4: 16); none without evaluation."""
    row = lambda *more: make_row(composed(*TINY, *more), {}, {})
    assert row("data.num_eval=18")["eval_examples"] == 16 and row("data.num_eval=16")["eval_examples"] == 16
    assert row("evaluate=false", "eval_every=0")["eval_examples"] is None


def unreached_row(tmp_path, max_steps: int, *more: str) -> dict:
    """The row of a trial that never meets its target (accuracy 1.0 at a learning rate that barely moves)."""
    (outcome,) = run_here(
        *TINY,
        "target.metric=eval_accuracy",
        "target.value=1.0",
        f"target.max_steps={max_steps}",
        "optimizer.lr=1e-6",
        *more,
        results=tmp_path,
    )
    assert outcome["status"] == "ok", outcome
    (row,) = read_rows(tmp_path / "runs.csv")
    return row


def test_a_target_not_reached_by_the_cap_is_a_row_not_a_failure(tmp_path):
    row = unreached_row(tmp_path, 7)
    assert row["status"] == "ok" and row["target_status"] == "not_reached" and row["steps_timed"] == "6"
    assert row["steps_to_target"] == "" and row["wall_to_target_s"] == ""
    history = read_history({**row, "_source": str(tmp_path / "runs.csv")})
    assert [i for i, a in enumerate(history["eval_accuracy"]) if a is not None] == [1, 3, 5]


def test_with_eval_resolution_a_trial_also_evaluates_in_between_while_its_interval_is_coarse(tmp_path):
    """eval_every=4, eval_resolution=0.25, 1 warm-up step: every step while one step is a quarter of the count or
    more, then as soon as the next would be more, and at every 4th step as without it; the last step ends it."""
    row = unreached_row(tmp_path, 21, "eval_every=4", "eval_resolution=0.25")
    assert row["eval_resolution"] == "0.25" and row["steps_timed"] == "20"
    history = read_history({**row, "_source": str(tmp_path / "runs.csv")})
    timed = [i + 1 for i, a in enumerate(history["eval_accuracy"]) if a is not None]
    assert timed == [1, 2, 3, 4, 5, 7, 8, 11, 12, 16, 20]  # counts 2-6, 8, 9, 12, 13, 17, 21 with the warm-up


@pytest.mark.parametrize("every", [1, 7, 20, 100])
@pytest.mark.parametrize("warmup", [0, 1, 5])
@pytest.mark.parametrize("resolution", [0.05, 0.1, 0.25])
def test_the_schedule_knows_every_count_within_its_resolution(every, warmup, resolution):
    """Each evaluation's count N (warm-up included) lies within the fraction of N of the one before, or right after
    it; every eval_every-th step is among them (the schedule without resolution), and between those each is the
    latest the rule allows."""
    done, seen = 0, []
    while done < 2000:
        n = next_evaluation(done, every, resolution, warmup)
        gap = n - done
        assert 1 <= gap <= every and (gap == 1 or gap <= resolution * (warmup + n))
        assert n % every == 0 or gap + 1 > resolution * (warmup + n + 1)  # one step later would be too coarse
        if n <= 300 or len(seen) % 10 == 0:  # previous_evaluation walks the schedule from 0: a sample past 300
            assert previous_evaluation(n, every, resolution, warmup) == done
        seen.append(done := n)
    assert set(range(every, 2000, every)) <= set(seen)


def test_without_resolution_the_schedule_is_every_n_steps():
    steps = [0]
    while steps[-1] < 100:
        steps.append(next_evaluation(steps[-1], 20))
    assert steps[1:] == [20, 40, 60, 80, 100] and previous_evaluation(41, 20) == 40 == previous_evaluation(60, 20)


def test_a_capped_trial_is_a_row_that_says_where_it_stopped(tmp_path, capsys):
    row = unreached_row(tmp_path, 9, "tune_stop_after=5")
    assert row["target_status"] == "capped" and row["tune_stop_after"] == "5" and row["steps_timed"] == "4"
    assert "eval_accuracy 1 not reached in 5 steps, its group's best: capped" in capsys.readouterr().out


@pytest.mark.slow
def test_a_trial_that_dies_mid_curve_keeps_it_and_is_not_reached(tmp_path):
    out = bench(
        *TINY,
        "target.metric=eval_accuracy",
        "target.value=1.0",
        "target.max_steps=9",
        f"results_dir={tmp_path}",
        env={"BENCH_INJECT_FAULT": "after_eval:segv"},
    )
    (row,) = read_rows(tmp_path / "runs.csv")
    assert out.returncode == 1 and row["status"] == "crashed" and row["target_status"] == ""
    history = read_history({**row, "_source": str(tmp_path / "runs.csv")})
    assert history["eval_accuracy"][1] is not None and len(history["loss"]) == 2  # the curve up to the evaluation


def test_the_tuning_choice_is_the_fastest_trial_that_reached():
    rows = [
        ("g", ["lr=1"], {"status": "ok", "wall_to_target_s": "9.0"}),
        ("g", ["lr=2"], {"status": "ok", "wall_to_target_s": "4.0"}),
        ("g", ["lr=3"], {"status": "ok", "wall_to_target_s": ""}),  # not reached
        ("g", ["lr=4"], {"status": "diverged", "wall_to_target_s": ""}),
        ("h", ["lr=5"], {"status": "ok", "wall_to_target_s": ""}),
    ]
    assert winners(rows, "wall_to_target_s") == {"g": ["lr=2"]}  # h reached nowhere: no winner, no repeats


@pytest.mark.parametrize(
    "reached, won",
    [
        ({"1": 161, "0.316": 161, "0.1": 161, "0.0316": 181}, "0.316"),  # three tie: the middle one
        ({"1": 161, "0.316": 181, "0.1": 161}, "0.1"),  # two tie, not neighbours: the lower
        ({"1": 21, "0.316": 41}, "1"),  # no tie: the fewest steps, wherever it sits
    ],
)
def test_points_that_tie_go_to_the_middle_learning_rate(reached, won):
    """Steps to the target come in whole evaluations, so grid neighbours tie; the rounds run the highest learning
    rate first, and taking the first of the tied would take the one nearest divergence."""
    rows = [("g", [f"optimizer.lr={lr}"], {"status": "ok", "steps_to_target": str(n)}) for lr, n in reached.items()]
    rows.append(("g", ["optimizer.lr=3.16"], {"status": "diverged", "steps_to_target": ""}))
    assert winners(rows, "steps_to_target") == {"g": [f"optimizer.lr={won}"]}


def backprop_at_lora(*trials) -> list[tuple[str, list[str], dict]]:
    """A capped search as backprop's at rank-1 LoRA ran (3.16 and 1 stalled to the cap, 0.316 reached at the first
    evaluation, the lower points capped at it), then the trials given: (lr, tuning, seed, cap, target, steps)."""
    search = [
        ("3.16", "search", None, None, "not_reached", None),
        ("1", "search", None, None, "not_reached", None),
        ("0.316", "search", None, None, "reached", 21),
        ("0.1", "search", None, 21, "capped", None),
        ("0.0316", "search", None, 21, "capped", None),
    ]
    return group_rows("case=backprop", *search, *trials)


def group_rows(case: str, *trials) -> list[tuple[str, list[str], dict]]:
    """Group g's (group, overrides, row) triples as the sweeper holds them, one per trial: (lr, tuning, seed, cap,
    target status, steps); an empty target status is a diverged trial."""
    out = []
    for lr, tuning, seed, cap, status, steps in trials:
        extra = [f"seed={seed}"] * (seed is not None) + [f"tune_stop_after={cap}"] * (cap is not None)
        row = {"status": "ok" if status else "diverged", "target_status": status, "steps_to_target": steps or ""}
        out.append(("g", [case, f"optimizer.lr={lr}", f"tuning={tuning}", *extra], {**row, "seed": seed or 0}))
    return out


def lora_point(lr) -> list[str]:
    """backprop_at_lora's point at learning rate lr, as the sweeper names it (its overrides less the per-trial ones)."""
    return ["case=backprop", f"optimizer.lr={lr}"]


def confirmed_next(*trials, capping: bool = False):
    """What the sweeper's confirming (seed 4) makes of backprop_at_lora's search and then the trials given: (the
    winners, the trials to run next)."""
    return confirming(backprop_at_lora(*trials), "steps_to_target", [4], capping)


def test_a_winner_that_misses_at_a_confirming_seed_loses_and_the_points_it_capped_run_again():
    """hydra.sweeper.confirm: a point's cost is its worst over the search's seed and the confirming ones. 0.316
    misses at seed 4, so the capped points are no longer known to lose: the highest runs uncapped (41 steps), is
    confirmed, and the one below it runs again capped at 41 (it could still tie); then 0.1 wins. Without confirm,
    0.316 would."""
    assert winners(backprop_at_lora(), "steps_to_target")["g"][:2] == lora_point("0.316")
    assert confirmed_next() == ({}, [("g", [*lora_point("0.316"), "tuning=confirm", "seed=4"])])
    missed = ("0.316", "confirm", 4, None, "not_reached", None)
    assert confirmed_next(missed) == ({}, [("g", [*lora_point("0.1"), "tuning=search"])])
    uncapped = ("0.1", "search", None, None, "reached", 41)
    assert confirmed_next(missed, uncapped) == ({}, [("g", [*lora_point("0.1"), "tuning=confirm", "seed=4"])])
    held = ("0.1", "confirm", 4, None, "reached", 41)
    assert confirmed_next(missed, uncapped, held) == (
        {},
        [("g", [*lora_point("0.0316"), "tuning=search", "tune_stop_after=41"])],
    )
    again = ("0.0316", "search", None, 41, "capped", None)
    assert confirmed_next(missed, uncapped, held, again) == ({"g": lora_point("0.1")}, [])


def test_a_winner_slow_at_a_confirming_seed_loses_to_a_point_fast_at_both():
    """0.316 reaches at seed 4 only at step 821: its cost is 821, and the points capped at 21 might beat it. 0.1
    runs again capped at 821, reaches at 41 at both seeds, and wins; 0.0316 then runs capped at 41."""
    slow = ("0.316", "confirm", 4, None, "reached", 821)
    assert confirmed_next(slow) == ({}, [("g", [*lora_point("0.1"), "tuning=search", "tune_stop_after=821"])])
    fast = [("0.1", "search", None, 821, "reached", 41), ("0.1", "confirm", 4, None, "reached", 41)]
    assert confirmed_next(slow, *fast) == ({}, [("g", [*lora_point("0.0316"), "tuning=search", "tune_stop_after=41"])])
    assert confirmed_next(slow, *fast, ("0.0316", "search", None, 41, "capped", None)) == ({"g": lora_point("0.1")}, [])


def test_with_capping_a_confirming_trial_stops_at_the_best_confirmed_points_steps():
    """capping: past the steps of the best point confirmed so far a confirming trial can no longer win, so it stops
    there, and one so stopped counts as a miss. The first confirming trial runs uncapped (nothing is confirmed);
    0.316 is confirmed at 821, 0.1 (41 at the search's seed) is confirmed capped at 821, misses there, and the
    point below it runs again capped at 821; then 0.316 wins."""
    assert confirmed_next(capping=True) == ({}, [("g", [*lora_point("0.316"), "tuning=confirm", "seed=4"])])
    slow, fast = ("0.316", "confirm", 4, None, "reached", 821), ("0.1", "search", None, 821, "reached", 41)
    assert confirmed_next(slow, fast, capping=True) == (
        {},
        [("g", [*lora_point("0.1"), "tuning=confirm", "seed=4", "tune_stop_after=821"])],
    )
    stopped = ("0.1", "confirm", 4, 821, "capped", None)
    assert confirmed_next(slow, fast, stopped, capping=True) == (
        {},
        [("g", [*lora_point("0.0316"), "tuning=search", "tune_stop_after=821"])],
    )
    assert confirmed_next(slow, fast, stopped, ("0.0316", "search", None, 821, "capped", None), capping=True) == (
        {"g": lora_point("0.316")},
        [],
    )


def test_a_winner_confirmed_at_its_seeds_wins_at_once():
    held = [("0.316", "confirm", s, None, "reached", 21) for s in (4, 5)]
    won, todo = confirming(backprop_at_lora(*held), "steps_to_target", [4, 5])
    assert won == {"g": lora_point("0.316")} and todo == []


def jvp_at_the_probe(*trials) -> list[tuple[str, list[str], dict]]:
    """PyTorch jvp's capped search at the linear probe as cost_to_target ran it with stop_at_miss (10 and 3.16
    diverged, 1, 0.316 and 0.1 reached at 161 steps, 0.0316 capped at 161, so 0.01 was skipped), then the trials
    given: (lr, tuning, seed, cap, target, steps)."""
    search = [
        ("10", "search", None, None, "", None),
        ("3.16", "search", None, None, "", None),
        ("1", "search", None, None, "reached", 161),
        ("0.316", "search", None, 161, "reached", 161),
        ("0.1", "search", None, 161, "reached", 161),
        ("0.0316", "search", None, 161, "capped", None),
    ]
    return group_rows("case=jvp", *search, *trials)


JVP_GRID = {"g": [["case=jvp", f"optimizer.lr={lr}"] for lr in ("10", "3.16", "1", "0.316", "0.1", "0.0316", "0.01")]}


def test_stop_at_miss_skips_the_points_below_a_miss_under_a_reached_one():
    """The descent ends at 0.0316, capped at 161 below points that reached: 0.01 would miss 161 too. Not below a
    point that missed by fewer steps than the bound, nor below a miss above every reached point, nor a diverged one."""
    known = known_points(jvp_at_the_probe(), "steps_to_target")["g"].values()
    assert below_a_miss(known, 0.01, 161) and below_a_miss(known, 0.01, 21)
    assert not below_a_miss(known, 0.01, 201)  # 0.0316 was stopped at 161: at 201 it, and 0.01, might reach
    assert not below_a_miss(known, 0.0316, 161)  # nothing between 0.0316 and the points that reached missed
    stalled = [("g", ["optimizer.lr=3.16"], {"status": "ok", "target_status": "not_reached", "steps_to_target": ""})]
    stalled.append(("g", ["optimizer.lr=1"], {"status": "ok", "target_status": "reached", "steps_to_target": "41"}))
    assert not below_a_miss(known_points(stalled, "steps_to_target")["g"].values(), 0.316, 41)  # a miss above
    # the sweeper's next round: 0.01 left out with stop_at_miss (run capped at 161 without); a group with no
    # reached point yet runs its point uncapped
    last = [("g", ["case=jvp", "optimizer.lr=0.01"]), ("h", ["case=mezo", "optimizer.lr=0.01"])]
    assert next_round(jvp_at_the_probe(), last, "steps_to_target", stop_at_miss=True) == [last[1]]
    assert next_round(jvp_at_the_probe(), last, "steps_to_target") == [
        ("g", ["case=jvp", "optimizer.lr=0.01", "tune_stop_after=161"]),
        last[1],
    ]


def test_a_point_the_descent_skipped_runs_once_the_bound_rises_and_the_point_above_it_could_reach():
    """PyTorch jvp at the probe as measured: 0.316 costs 301 at seed 4, 0.1 201 and wins the confirmation; 1 misses
    there. The bound is now 201, past 0.0316's cap, so 0.0316 runs again capped at 201 and, one at a time, 0.01 runs
    only if 0.0316 reached by then (it did: 181); had 0.0316 missed again, 0.01 would never run. Without the grid
    (no stop_at_miss) the skipped point is not known, so it never runs."""
    confirmed = [
        ("0.316", "confirm", 4, None, "reached", 301),
        ("0.1", "confirm", 4, 301, "reached", 201),
        ("1", "confirm", 4, 201, "capped", None),
    ]
    rows = jvp_at_the_probe(*confirmed)
    again = ("g", ["case=jvp", "optimizer.lr=0.0316", "tuning=search", "tune_stop_after=201"])
    assert confirming(rows, "steps_to_target", [4], True, JVP_GRID) == ({}, [again])
    missed = jvp_at_the_probe(*confirmed, ("0.0316", "search", None, 201, "capped", None))
    assert confirming(missed, "steps_to_target", [4], True, JVP_GRID) == ({"g": ["case=jvp", "optimizer.lr=0.1"]}, [])
    reached = jvp_at_the_probe(*confirmed, ("0.0316", "search", None, 201, "reached", 181))
    confirm = ("g", ["case=jvp", "optimizer.lr=0.0316", "tuning=confirm", "seed=4", "tune_stop_after=201"])
    assert confirming(reached, "steps_to_target", [4], True, JVP_GRID) == ({}, [confirm])
    reached.append(("g", list(confirm[1]), {"status": "ok", "target_status": "capped", "seed": 4}))
    skipped = ("g", ["case=jvp", "optimizer.lr=0.01", "tuning=search", "tune_stop_after=201"])
    assert confirming(reached, "steps_to_target", [4], True, JVP_GRID) == ({}, [skipped])
    assert confirming(reached, "steps_to_target", [4], True) == ({"g": ["case=jvp", "optimizer.lr=0.1"]}, [])


def test_every_mode_gets_the_same_budget():
    space = {
        "backprop": [{"optimizer.lr": 0.1}, {"optimizer.lr": 0.3}],
        "mezo": [{"optimizer.lr": 1e-3, "mezo.eps": 1e-3}, {"optimizer.lr": 1e-2, "mezo.eps": 1e-3}],
    }
    trials = expand({"framework": "torch,jax", "case": "backprop,mezo"}, space, ["model=tiny"])
    assert len(trials) == 2 * 2 * 2 and len({g for g, _ in trials}) == 4
    assert any("mezo.eps=0.001" in o and "case=mezo" in o for _, o in trials)
    with pytest.raises(ConfigError, match="the same number for every case"):
        expand({"case": "backprop,mezo"}, {**space, "mezo": space["mezo"][:1]}, [])
    with pytest.raises(ConfigError, match="a search space is empty"):
        expand({"case": "backprop"}, {"backprop": []}, [])
    with pytest.raises(ConfigError, match="case=jvp: no search space"):
        expand({"case": "jvp"}, space, [])


@pytest.fixture(scope="module")
def tuned(tmp_path_factory):
    """A real tuning sweep: torch backprop and MeZO, two points each, a target every point reaches (eval_loss
    <= 100), the winners repeated at seed 1; then the same command with resume=true, which skips every trial."""
    results = tmp_path_factory.mktemp("tuned")
    space = (
        "hydra.sweeper.space={backprop:[{optimizer.lr:0.01},{optimizer.lr:0.02}],"
        "mezo:[{optimizer.lr:0.001},{optimizer.lr:0.002}]}"
    )
    params = "hydra.sweeper.params={framework:torch,case:'backprop,mezo'}"
    args = [
        "-m",
        *TINY,
        "hydra/sweeper=bench_tuning",
        params,
        space,
        "hydra.sweeper.repeats=[1]",
        "target.metric=eval_loss",
        "target.value=100",
        "target.max_steps=5",
        f"results_dir={results}",
    ]
    out = sweep_here(*args)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    resumed = sweep_here(*args, "resume=true")
    assert resumed.returncode == 0, resumed.stdout[-3000:] + resumed.stderr[-3000:]
    return results, read_rows(results / "runs.csv"), out.stdout, resumed.stdout


@pytest.mark.slow
def test_a_tuning_sweep_searches_then_repeats_each_winner(tuned):
    _, rows, stdout, _ = tuned
    search = [r for r in rows if r["tuning"] == "search"]
    repeats = [r for r in rows if r["tuning"] == "repeat"]
    assert len(search) == 4 and len(repeats) == 2 and "6 trial(s): 6 ok" in stdout
    assert {r["tune_objective"] for r in rows} == {"wall_to_target_s"}  # the sweeper's, for the report to pick by
    for r in repeats:
        group = [s for s in search if s["tune_group"] == r["tune_group"]]
        best = min(group, key=lambda s: float(s["wall_to_target_s"]))
        assert r["seed"] == "1" and r["lr"] == best["lr"] and r["mode"] == best["mode"]


@pytest.mark.slow
def test_a_tuning_sweep_counts_its_own_trials_and_a_resume_its_skipped_ones(tuned):
    """The progress counts this sweep's trials (the command line's params and space, the repeats once the winners
    are known), and a resumed sweep's summary counts every trial it skipped, the repeats included."""
    _, rows, stdout, resumed = tuned
    for out in (stdout, resumed):
        assert "up to 6 trials (4 to search, then up to 2 repeating the winners)" in out
        assert "search done: 2 of 2 group(s) reached the target; trials per mode, every one its tuning ran: " in out
        assert "backprop 2, mezo 2; 2 trial(s) repeat the winners" in out
        progress = re.findall(r"^(\[\d+/\d+\]) ", out, re.MULTILINE)
        assert sorted(set(progress)) == [f"[{i}/6]" for i in range(1, 7)], progress
    assert resumed.count(": skipped (recorded ok as") == 6
    assert resumed.strip().splitlines()[-1] == "bench: 6 trial(s): 6 skipped"
    table = resumed.split("excess MiB")[-1].splitlines()
    assert sum(line.startswith("torch ") for line in table) == 6  # the summary table: each trial it skipped
    assert len(rows) == 6  # nothing ran again


def capped_sweep(results: Path, *settings: str):
    """A real capped tuning sweep of torch backprop at two learning rates on the tiny model, a target every point
    reaches (eval_loss <= 100) by its first evaluation, the winner repeated at seed 1: (its output, its rows)."""
    out = sweep_here(
        "-m",
        *TINY,
        "hydra/sweeper=bench_tuning",
        "hydra.sweeper.params={framework:torch,case:backprop}",
        "hydra.sweeper.space={backprop:[{optimizer.lr:0.01},{optimizer.lr:0.02}]}",
        "hydra.sweeper.repeats=[1]",
        "hydra.sweeper.capping=true",
        *settings,
        "target.metric=eval_loss",
        "target.value=100",
        "target.max_steps=5",
        f"results_dir={results}",
    )
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    return out, read_rows(results / "runs.csv")


@pytest.mark.slow
def test_a_capped_sweep_runs_the_highest_learning_rate_first_and_caps_the_rest_at_its_steps(tmp_path):
    """hydra.sweeper.capping=true: the first round's point (the higher learning rate) runs uncapped and reaches
    the target at its first evaluation (step 3), the next runs with tune_stop_after=3 (and ties, so reaches too),
    the winner's repeat runs uncapped; the sweep's summary counts all three."""
    out, rows = capped_sweep(tmp_path)
    assert [(r["tuning"], r["lr"], r["tune_stop_after"], r["target_status"]) for r in rows] == [
        ("search", "0.02", "", "reached"),
        ("search", "0.01", "3", "reached"),
        ("repeat", rows[2]["lr"], "", "reached"),
    ]
    assert out.stdout.strip().splitlines()[-1] == "bench: 3 trial(s): 3 ok"


@pytest.mark.slow
def test_a_confirming_seed_runs_before_the_repeats_and_its_row_says_so(tmp_path):
    """hydra.sweeper.confirm=[2]: the search's winner runs at seed 2 (tuning=confirm), reaches, and only then is
    repeated at the fresh seed; the report counts seed 2 as the choice's, never as a seed of its cost."""
    out, rows = capped_sweep(tmp_path, "hydra.sweeper.confirm=[2]", "hydra.sweeper.objective=steps_to_target")
    assert [(r["tuning"], r["lr"], r["seed"], r["target_status"]) for r in rows] == [
        ("search", "0.02", "0", "reached"),
        ("search", "0.01", "0", "reached"),
        ("confirm", "0.01", "2", "reached"),  # the tie goes to the lower of two: 0.01
        ("repeat", "0.01", "1", "reached"),
    ]
    assert "bench: confirming: 1 trial(s)" in out.stdout
    report = build(REPORT_SECTIONS, results_of([tmp_path]), tmp_path)
    backprop = next(line for line in report.text.splitlines() if line.startswith("| PyTorch | backprop |"))
    assert "| 2/2 | 1 |" in backprop  # two search trials reached; one seed prices the winner (seed 1, not 2)


def test_a_resumed_sweeps_summary_shows_the_trials_it_skipped_as_diverged():
    """Resume skips a trial recorded ok or diverged; the sweep's summary shows the row that made it skip for both (a
    search below a diverged point is resumed with its diverged trials), never a crashed row, another sweep's or a
    rerun's."""
    rows = [
        {"config_hash": "a", "sweep_id": "old", "run_id": "1", "status": "ok"},
        {"config_hash": "b", "sweep_id": "old", "run_id": "2", "status": "diverged"},
        {"config_hash": "c", "sweep_id": "old", "run_id": "3", "status": "crashed"},
        {"config_hash": "d", "sweep_id": "old", "run_id": "4", "status": "diverged"},
        {"config_hash": "c", "sweep_id": "new", "run_id": "5", "status": "ok"},
        {"config_hash": "e", "sweep_id": "new", "run_id": "6", "status": "ok"},  # a repeat: not known up front
        # python -m bench rerun of trial 1: its hash, but no sweep's trial (resume skips on rows of its own kind)
        {"config_hash": "a", "sweep_id": "later", "run_id": "7", "status": "ok", "tuning": "rerun"},
    ]
    shown = MODEL.sweep_rows(rows, ["a", "b", "c"], "new")
    assert [r["run_id"] for r in shown] == ["1", "2", "5", "6"]


@pytest.mark.slow
def test_the_report_lists_the_tuning_sweep(tuned, tmp_path):
    results, rows, _, _ = tuned
    report = build(REPORT_SECTIONS, results_of([results]), tmp_path)
    section = report.text.split("## Cost to target")[1].split("\n## ")[0]
    mezo = next(line for line in section.splitlines() if line.startswith("| PyTorch | mezo |"))
    assert "2/2" in mezo and "Every trial of the search" in section
    assert all(r["run_id"] in section for r in rows)  # every trial listed
    assert (tmp_path / "plots" / "cost_curves.png").stat().st_size > 1000
    assert "## Framework × mode" not in report.text  # tuning trials stay out of the per-step tables


@pytest.mark.parametrize(
    "args,message",
    [
        (["mode=inference", "target.metric=eval_accuracy", "target.value=0.5", "target.max_steps=9"], "mode=inference"),
        (["target.metric=eval_accuracy", "target.value=1.5", "target.max_steps=9"], "target.value=1.5: an accuracy"),
        (["target.metric=eval_accuracy", "target.value=0", "target.max_steps=9"], "target.value=0.0: an accuracy"),
        (
            ["target.metric=eval_accuracy", "target.value=0.5", "target.max_steps=9", "evaluate=false", "eval_every=0"],
            "checked at each evaluation",
        ),
        (["target.metric=eval_accuracy", "target.value=0.5", "target.max_steps=2"], "target.max_steps=2: smaller than"),
        (["target.metric=accuracy", "target.value=0.5", "target.max_steps=9"], "target.metric=accuracy: accepted"),
        (["eval_resolution=1.0"], "eval_resolution=1.0: accepted a fraction in [0, 1)"),
        (["eval_resolution=-0.1"], "eval_resolution=-0.1: accepted a fraction in [0, 1)"),
        (["eval_every=0", "eval_resolution=0.1"], "eval_resolution=0.1: needs evaluate=true eval_every=N"),
    ],
)
def test_bad_targets_and_evaluation_schedules_are_one_line_before_anything_runs(args, message, tmp_path):
    out = bench_here(*TINY, *args, results=tmp_path)
    assert out.returncode == 2 and message in out.stderr and len(out.stderr.strip().splitlines()) == 1
    assert not (tmp_path / "runs.csv").exists()


def test_an_empty_search_space_is_refused_before_anything_runs(tmp_path):
    out = bench_here(
        "-m",
        *TINY,
        "hydra/sweeper=bench_tuning",
        "hydra.sweeper.params={case:backprop}",
        "hydra.sweeper.space={backprop:[]}",
        results=tmp_path,
    )
    assert out.returncode == 2 and "a search space is empty" in out.stderr
    assert not (tmp_path / "runs.csv").exists()


@pytest.mark.parametrize(
    "setting,message",
    [
        (
            "hydra.sweeper.objective=no_such_column",
            "hydra.sweeper.objective=no_such_column: accepted wall_to_target_s | ",
        ),
        ("hydra.sweeper.repeats=[-1]", "hydra.sweeper.repeats=[-1]: accepted a list of seeds, integers in [0, 2^63)"),
        (f"hydra.sweeper.repeats=[{2**70}]", f"hydra.sweeper.repeats=[{2**70}]: accepted a list of seeds"),
        ("hydra.sweeper.confirm=[-1]", "hydra.sweeper.confirm=[-1]: accepted a list of seeds"),
        ("hydra.sweeper.confirm=[4,1]", "hydra.sweeper.confirm=[4, 1]: seed 1 is also in repeats"),
        ("hydra.sweeper.stop_at_miss=true", "hydra.sweeper.stop_at_miss=true: needs hydra.sweeper.capping=true"),
    ],
)
def test_a_bad_objective_or_repeat_is_refused_before_the_search_runs(setting, message, tmp_path):
    """Checked where the search would only find it after every trial: no winner for a column the rows lack, a
    seed no framework takes."""
    out = bench_here(
        "-m",
        *TINY,
        "hydra/sweeper=bench_tuning",
        "hydra.sweeper.params={case:backprop}",
        "hydra.sweeper.space={backprop:[{optimizer.lr:0.1}]}",
        "hydra.sweeper.repeats=[1]",
        setting,
        results=tmp_path,
    )
    assert out.returncode == 2 and len(out.stderr.strip().splitlines()) == 1, out.stderr
    assert message in out.stderr
    assert not (tmp_path / "runs.csv").exists()
