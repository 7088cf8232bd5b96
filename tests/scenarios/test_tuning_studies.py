"""Tuning as studies (bench/harness/tuning.py, tuning_space.py), on made-up configs and rows: every study of every
group gets the same budget and spends no more, its confirming trials and the points beyond its grid included;
studies run at seeds of their own and draw points of their own; a search whose best point is its highest
learning rate goes on above it; a space's knobs are drawn within their ranges. One real sweep (slow) runs two
studies of a drawn space on the tiny model."""

from __future__ import annotations

import math
from collections import Counter

import pytest

from bench.errors import ConfigError
from bench.harness.preflight import expand_sweep
from bench.harness.tuning import above, below, check_tuning, confirming, repeating, trials_per_mode
from bench.harness.tuning_space import STUDY_SEEDS, Group, drawn, expand, space_of
from bench.store.read import read_rows
from tests.scenarios.test_cost_to_target import TINY
from tests.support import sweep_here

KNOBS = {
    "optimizer.lr": {"low": 1e-3, "high": 1.0},
    "mezo.eps": {"low": 1e-4, "high": 1e-2},
    "lozo.rank": [1, 2, 4],
    "lozo.interval": {"low": 10, "high": 100},
    "optimizer.momentum": 0.9,
}
SPACE = {
    "backprop": {"sample": 4, "knobs": {"optimizer.lr": {"low": 1e-2, "high": 10.0}, "optimizer.momentum": 0.9}},
    "mezo": {
        "sample": 4,
        "knobs": {"optimizer.lr": {"low": 1e-3, "high": 1.0}, "mezo.eps": {"low": 1e-4, "high": 1e-2}},
    },
}

STEPS = {"steps_to_target": "40"}


def value(overrides: list[str], key: str) -> str | None:
    return next((o.split("=", 1)[1] for o in reversed(overrides) if o.startswith(f"{key}=")), None)


def test_a_drawn_point_keeps_to_its_knobs_ranges_and_types():
    points = drawn(KNOBS, 16, study=0)
    assert len(points) == 16 and all(p["optimizer.momentum"] == 0.9 for p in points)
    for key in ("optimizer.lr", "mezo.eps"):
        assert all(KNOBS[key]["low"] <= p[key] <= KNOBS[key]["high"] for p in points)
    assert all(isinstance(p["lozo.interval"], int) and 10 <= p["lozo.interval"] <= 100 for p in points)
    assert {p["lozo.rank"] for p in points} == {1, 2, 4}  # every value of a list is drawn
    # the learning rate, the sequence's first coordinate: 16 points evenly spread in log lr, one per sixteenth
    bins = sorted(int(16 * math.log(p["optimizer.lr"] / 1e-3) / math.log(1e3)) for p in points)
    assert bins == list(range(16))
    assert drawn(KNOBS, 16, study=0) == points  # the same on every rerun
    # two studies of four: each spread over the range, the second's in between the first's
    both = [p["optimizer.lr"] for s in (0, 1) for p in drawn(KNOBS, 4, study=s)]
    assert sorted(int(8 * math.log(lr / 1e-3) / math.log(1e3)) for lr in both) == list(range(8))


def test_every_study_draws_its_own_points_and_runs_at_its_own_seeds():
    trials = expand({"framework": "torch,jax", "case": "backprop,mezo"}, SPACE, [], budget=6, studies=3, reserve=1)
    per = Counter(group for group, _ in trials)
    assert len(per) == 2 * 2 * 3 and set(per.values()) == {4}  # every group's study the same number of points
    for group, overrides in trials:  # every trial says its group and study
        assert value(overrides, "tune_study") == str(group.study) and f"tune_group='{group.name}'" in overrides
        assert value(overrides, "seed") == (None if group.study == 0 else str(STUDY_SEEDS * group.study))
    lrs = {}
    for group, overrides in trials:
        lrs.setdefault((value(overrides, "framework"), value(overrides, "case"), group.study), []).append(
            value(overrides, "optimizer.lr")
        )
    for case in ("backprop", "mezo"):
        assert len({tuple(lrs["torch", case, s]) for s in range(3)}) == 3  # each study its own points
        assert all(lrs["torch", case, s] == lrs["jax", case, s] for s in range(3))  # both frameworks the same
    # a grid: the same points in every study, at the study's seed
    grid = {"backprop": [{"optimizer.lr": 0.1}, {"optimizer.lr": 1.0}]}
    again = expand({"case": "backprop"}, grid, [], studies=2, seed=7)
    assert [(g.study, g.seed, value(o, "optimizer.lr")) for g, o in again] == [
        (0, None, "0.1"),
        (0, None, "1.0"),
        (1, 1007, "0.1"),
        (1, 1007, "1.0"),
    ]


def test_a_study_confirms_and_repeats_at_its_own_seeds():
    g = Group("case=mezo", 2, 2 * STUDY_SEEDS)
    point = ["case=mezo", "optimizer.lr=0.1", "tune_study=2"]
    rows = [(g, [*point, "tuning=search", f"seed={g.seed}"], {"status": "ok", "target_status": "reached", **STEPS})]
    assert confirming(rows, "steps_to_target", [4], budget=5) == ({}, [(g, [*point, "tuning=confirm", "seed=2004"])])
    confirmed = {"status": "ok", "target_status": "reached", "seed": 2004, **STEPS}
    rows.append((g, [*point, "tuning=confirm", "seed=2004"], confirmed))
    won, todo = confirming(rows, "steps_to_target", [4], budget=5)
    assert todo == [] and won == {g: point}
    assert repeating(won, [1, 2]) == [[*point, "tuning=repeat", "seed=2001"], [*point, "tuning=repeat", "seed=2002"]]


def reach(group, lr: float, steps: int | None, tuning: str = "search", seed: int = 0):
    """One trial's (group, overrides, row): reached in `steps`, or (None) capped short."""
    row = {"status": "ok", "seed": seed, "target_status": "reached" if steps else "capped"}
    row["steps_to_target"] = str(steps) if steps else ""
    at = [f"seed={seed}"] if tuning == "confirm" else []
    return (group, ["case=jvp", f"optimizer.lr={lr}", f"tuning={tuning}", *at], row)


def test_confirming_counts_in_the_budget_and_stops_at_it():
    """Two points reached at the search's seed; the faster misses its confirming seed, so the next needs one:
    within a budget of 4 it runs; within 3 the group has spent its trials, and with nothing confirmed it has no
    winner (never one chosen by a seed alone)."""
    rows = [reach("g", 1.0, 20), reach("g", 0.1, 40), reach("g", 1.0, None, "confirm", 4)]
    rows[-1][2]["status"] = "diverged"
    assert confirming(rows, "steps_to_target", [4], budget=4) == (
        {},
        [("g", ["case=jvp", "optimizer.lr=0.1", "tuning=confirm", "seed=4"])],
    )
    assert confirming(rows, "steps_to_target", [4], budget=3) == ({}, [])
    assert confirming(rows, "steps_to_target", [4]) == confirming(rows, "steps_to_target", [4], budget=4)
    # a confirmed point wins when the budget is spent, though a faster unconfirmed one would have run next
    rows = [reach("g", 1.0, 20), reach("g", 0.1, 40), reach("g", 0.1, 40, "confirm", 4)]
    rows.insert(0, reach("g", 3.0, 10))
    assert confirming(rows, "steps_to_target", [4], budget=4) == ({"g": ["case=jvp", "optimizer.lr=0.1"]}, [])
    assert confirming(rows, "steps_to_target", [4], budget=5)[1][0][1][1] == "optimizer.lr=3.0"


def test_the_budget_holds_the_points_and_the_confirming_trials():
    with pytest.raises(ConfigError, match=r"budget=4: smaller than the 4 points and 1 confirming"):
        expand({"case": "mezo"}, {"mezo": SPACE["mezo"]}, [], budget=4, reserve=1)
    trials = expand({"case": "mezo"}, {"mezo": SPACE["mezo"]}, [], budget=5, reserve=1)
    rows = [(g, o, {"status": "diverged"}) for g, o in trials]
    assert below(rows, 5, reserve=1) == []  # the fifth trial is the confirming seed's
    assert len(below(rows, 6, reserve=1)) == 1


def test_a_search_whose_best_is_its_highest_learning_rate_goes_on_above():
    rows = [reach("g", 0.01, 80), reach("g", 0.1, 30), reach("h", 0.01, 20), reach("h", 0.1, None)]
    ((group, overrides),) = above(rows, "steps_to_target", budget=4)
    assert group == "g" and overrides == ["case=jvp", "optimizer.lr=1", "tuning=search"]  # a spacing above it
    rows.append((group, overrides, {"status": "ok", "target_status": "reached", "steps_to_target": "10"}))
    assert above(rows, "steps_to_target", budget=3) == []  # its budget spent
    assert [o[1] for _, o in above(rows, "steps_to_target", budget=6)] == ["optimizer.lr=10"]
    assert above(rows, "steps_to_target", budget=6, reserve=3) == []  # the rest is the confirming trials'
    rows.append(("g", ["case=jvp", "optimizer.lr=10", "tuning=search"], {"status": "diverged"}))
    assert above(rows, "steps_to_target", budget=9) == []  # bracketed: the point above diverged
    assert above(rows, "steps_to_target", budget=None) == []  # no budget, no extension (as below)


def test_every_trial_a_mode_ran_is_counted():
    rows = [reach(Group("case=jvp", s), 0.1, 40) for s in (0, 1)] + [reach("g", 0.1, 40, "confirm", 4)]
    rows.append((Group("case=mezo"), ["case=mezo", "optimizer.lr=1"], {"status": "diverged"}))
    assert trials_per_mode(rows) == {"jvp": 3, "mezo": 1}


def test_bad_study_options_are_refused_in_one_line():
    with pytest.raises(ConfigError, match=r"studies=0: accepted an integer in \[1, 100\]"):
        check_tuning("steps_to_target", [1], 5, studies=0)
    with pytest.raises(ConfigError, match=r"repeats=\[1, 1000\]: with hydra.sweeper.studies=2, accepted seeds"):
        check_tuning("steps_to_target", [1, 1000], 5, studies=2)
    with pytest.raises(ConfigError, match=r"^seed=1000: with hydra.sweeper.studies=2"):
        check_tuning("steps_to_target", [1], 5, studies=2, seed=1000)
    check_tuning("steps_to_target", [1, 1000], 5, studies=1)  # one study: any seed
    with pytest.raises(ConfigError, match=r"^seed=1: the search's seed is also in hydra.sweeper.repeats"):
        check_tuning("steps_to_target", [1], 5, seed=1)
    with pytest.raises(ConfigError, match=r"space.mezo.sample=0: accepted an integer in \[1, 1,000\]"):
        space_of("mezo", {"sample": 0, "knobs": KNOBS})
    with pytest.raises(ConfigError, match=r"space.mezo.knobs.mezo.eps=\{'low': 0, 'high': 1\}: accepted \{low, high\}"):
        space_of("mezo", {"sample": 2, "knobs": {"mezo.eps": {"low": 0, "high": 1}}})
    with pytest.raises(ConfigError, match=r"space.mezo: points or sample and knobs"):
        space_of("mezo", {"sample": 2, "knobs": KNOBS, "points": []})
    with pytest.raises(ConfigError, match=r"space.mezo: scale=1/d needs optimizer.lr"):
        space_of("mezo", {"sample": 2, "knobs": {"mezo.eps": 1e-3}, "scale": "1/d", "at": 10})


@pytest.mark.slow
def test_the_cost_experiment_runs_studies_of_drawn_points_with_each_estimators_knobs():
    """conf/experiment/cost_to_target.yaml as the sweeper expands it: per (framework, scope, mode) two studies of
    three drawn points, study 1 at its own seed; backprop with momentum SGD, MeZO's eps drawn; HiZOO's smoothing and
    LOZO's rank and interval drawn when they are compared."""
    trials = expand_sweep(["+experiment=cost_to_target"], multirun=True)
    assert len(trials) == 2 * 2 * 3 * 2 * 3
    study = Counter((value(t, "tune_group"), value(t, "tune_study"), value(t, "seed")) for t in trials)
    assert set(study.values()) == {3} and {(s, seed) for _, s, seed in study} == {("0", None), ("1", "1000")}
    assert all(value(t, "optimizer.momentum") == "0.9" for t in trials if value(t, "case") == "backprop")
    assert len({value(t, "mezo.eps") for t in trials if value(t, "case") == "mezo"}) == 6
    more = expand_sweep(["+experiment=cost_to_target", "hydra.sweeper.params.case='hizoo,lozo'"], multirun=True)
    for key in ("hizoo.alpha", "hizoo.eps", "lozo.rank", "lozo.interval", "lozo.eps"):
        assert len({value(t, key) for t in more if value(t, "case") == key.split(".")[0]}) > 1, key


@pytest.mark.slow
def test_a_sweep_of_two_studies_keeps_each_within_its_budget(tmp_path):
    """A real sweep: torch backprop on the tiny model, two studies of one point drawn from a learning-rate range, a
    target every point meets at its first evaluation (eval_loss <= 100), one confirming seed and one repeat per
    study. Each study's point is its best and its highest, so the search goes a decade above it (capped at its
    steps, it ties, and the tie goes to the lower); then the confirming seed: three trials of the budget of 4. Every
    row says its study, and each study's trials run at its own seeds."""
    out = sweep_here(
        "-m",
        *TINY,
        "hydra/sweeper=bench_tuning",
        "hydra.sweeper.params={framework:torch,case:backprop}",
        "hydra.sweeper.space={backprop:{sample:1,knobs:{optimizer.lr:{low:0.001,high:0.01}}}}",
        "hydra.sweeper.studies=2",
        "hydra.sweeper.budget=4",
        "hydra.sweeper.confirm=[2]",
        "hydra.sweeper.repeats=[1]",
        "hydra.sweeper.capping=true",
        "hydra.sweeper.objective=steps_to_target",
        "target.metric=eval_loss",
        "target.value=100",
        "target.max_steps=5",
        f"results_dir={tmp_path}",
    )
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    assert "each group: 2 study(ies) x 4 trials" in out.stdout
    assert "2 group(s) best at their highest learning rate: searching above" in out.stdout
    assert "trials per mode, every one its tuning ran: backprop 6;" in out.stdout
    rows = read_rows(tmp_path / "runs.csv")
    by = {(r["tune_study"], r["tuning"]): [] for r in rows}
    for r in rows:
        by[r["tune_study"], r["tuning"]].append((float(r["lr"]), int(r["seed"]), r["target_status"]))
    for study, seed in (("0", 0), ("1", 1000)):
        (drawn, _, _), (higher, _, capped) = by[study, "search"]
        assert higher == pytest.approx(10 * drawn, rel=5e-3) and capped == "reached"  # tied at the cap
        assert [s for _, s, _ in by[study, "search"]] == [seed, seed]
        assert by[study, "confirm"] == [(drawn, seed + 2, "reached")]
        assert by[study, "repeat"] == [(drawn, seed + 1, "reached")]
    assert by["0", "search"][0][0] != by["1", "search"][0][0]  # each study its own point
    assert len({r["tune_group"] for r in rows}) == 1 and len(rows) == 8
