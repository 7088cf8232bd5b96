"""The tuning sweeper's search per (mode, scope), on made-up configs and rows: a one-direction estimator's grid is
placed as 1/d from where it was measured to work, every (mode, scope) gets the same number of points spanning the
same decades, and a (mode, scope) all of whose points diverged gets the next points below, within its budget.
cost_to_target_curve's own grids are checked as the sweeper expands them (each combination's config composed for
its trained parameters)."""

from __future__ import annotations

import math
from collections import defaultdict

import pytest

from bench.errors import ConfigError
from bench.harness.preflight import expand_sweep
from bench.harness.tuning import below, check_tuning, expand, lr_of
from bench.store.read import read_rows
from tests.scenarios.test_cost_to_target import TINY
from tests.support import sweep_here

SIZES = {"classifier": 1_540, "bias": 27_652, "last_k": 1_925_000}  # made-up trained parameters per scope
GRID = [{"optimizer.lr": 10.0**e} for e in range(-3, 1)]  # four points, three decades
SPACE = {
    "backprop": [{"optimizer.lr": 10.0**e} for e in range(-2, 2)],
    "mezo": {"points": [{**p, "mezo.eps": 1e-3} for p in GRID], "scale": "1/d", "at": 1_540},
    "jvp": {"points": GRID, "scale": "1/d", "at": 1_540},
}


def dimension(combo: list[str]) -> int:
    """A made-up config's trained parameters: by its trainable scope alone."""
    return SIZES[next(o.split("=", 1)[1] for o in combo if o.startswith("trainable="))]


def grids(trials) -> dict[str, list[float]]:
    """{tune_group: its learning rates, ascending} (one study)."""
    out = defaultdict(list)
    for group, overrides in trials:
        out[group.name].append(lr_of(overrides))
    return {g: sorted(v) for g, v in out.items()}


def test_a_one_direction_estimators_grid_is_placed_as_one_over_d():
    params = {"trainable": "classifier,bias,last_k", "case": "backprop,jvp,mezo"}
    found = grids(expand(params, SPACE, ["model=tiny"], dimension, budget=5))
    assert len(found) == 9 and {len(lrs) for lrs in found.values()} == {4}  # the same points per (mode, scope)
    for group, lrs in found.items():
        assert math.log10(lrs[-1] / lrs[0]) >= 3 - 1e-9, group  # every grid spans three decades
    for mode in ("jvp", "mezo"):
        at = {s: found[f"trainable={s} case={mode}"] for s in SIZES}
        assert at["classifier"] == pytest.approx([1e-3, 1e-2, 1e-1, 1.0])  # where it was measured: as given
        for scope, d in SIZES.items():  # elsewhere lr x 1540 / d, to three significant digits
            assert at[scope] == pytest.approx([lr * 1_540 / d for lr in at["classifier"]], rel=5e-3)
    # backprop's steps do not depend on d: its grid is the same at every scope
    assert len({tuple(found[f"trainable={s} case=backprop"]) for s in SIZES}) == 1


def test_a_placed_grid_keeps_its_other_settings_and_needs_its_counts():
    trials = expand({"trainable": "bias", "case": "mezo"}, SPACE, [], dimension)
    assert all("mezo.eps=0.001" in o and "tuning=search" in o for _, o in trials)
    with pytest.raises(ConfigError, match="needs the trained parameters"):
        expand({"case": "jvp"}, SPACE, [])
    with pytest.raises(ConfigError, match=r"space.jvp.scale=1/sqrt\(d\): accepted 1/d"):
        expand({"case": "jvp"}, {"jvp": {**SPACE["jvp"], "scale": "1/sqrt(d)"}}, [], dimension)
    with pytest.raises(ConfigError, match="space.jvp.at=0: accepted a positive number"):
        expand({"case": "jvp"}, {"jvp": {**SPACE["jvp"], "at": 0}}, [], dimension)
    with pytest.raises(ConfigError, match="space.jvp.scael: accepted points, scale, at"):
        expand({"case": "jvp"}, {"jvp": {**SPACE["jvp"], "scael": "1/d"}}, [], dimension)
    with pytest.raises(ConfigError, match="budget=3: smaller than the 4 points"):
        expand({"case": "jvp"}, SPACE, ["trainable=bias"], dimension, budget=3)
    with pytest.raises(ConfigError, match=r"budget=0: accepted an integer in \[1, 1,000\]"):
        check_tuning("wall_to_target_s", [1], 0)
    # bounded: a group whose every point diverges must not descend until killed
    with pytest.raises(ConfigError, match=r"budget=1000000000: accepted an integer in \[1, 1,000\]"):
        check_tuning("wall_to_target_s", [1], 1_000_000_000)


def searched(group: str, lrs: list[float], statuses: list[str]) -> list[tuple[str, list[str], dict]]:
    return [
        (group, ["case=mezo", f"optimizer.lr={lr}", "mezo.eps=0.001", "tuning=search"], {"status": s})
        for lr, s in zip(lrs, statuses)
    ]


def test_a_group_whose_every_point_diverged_is_searched_below_within_its_budget():
    grid = [1e-3, 1e-2, 1e-1, 1.0]
    rows = [
        *searched("all diverged", grid, ["diverged"] * 4),
        *searched("one trained", grid, ["ok", "diverged", "diverged", "diverged"]),  # a stable lr bracketed
        *searched("one crashed", grid, ["crashed", "diverged", "diverged", "diverged"]),  # not a divergence
    ]
    ((group, overrides),) = below(rows, budget=6)
    assert group == "all diverged" and lr_of(overrides) == pytest.approx(1e-4)  # a decade below, as the grid
    assert overrides == ["case=mezo", "optimizer.lr=0.0001", "mezo.eps=0.001", "tuning=search"]
    rows.append((group, overrides, {"status": "diverged"}))  # diverged again: the next one, down to the budget
    ((_, more),) = below(rows, budget=6)
    assert lr_of(more) == pytest.approx(1e-5)
    rows.append((group, more, {"status": "diverged"}))
    assert below(rows, budget=6) == []  # six trials: its budget is spent
    assert below(rows[:4], budget=4) == [] and below(rows[:4], budget=None) == []  # no trials left: none below
    assert lr_of(below(searched("one point", [0.5], ["diverged"]), budget=2)[0][1]) == pytest.approx(0.05)


@pytest.mark.slow
@pytest.mark.parametrize(
    "name, scopes, points, spacing, placed_apart",
    [
        ("cost_to_target_curve", 5, 3, 1.5, 1_000),  # the hour: from the probe's 1,540 parameters to ~1.9 M
        ("cost_to_target_curve_estimators", 4, 7, 0.5, 40),  # half decades: from the probe to rank-8 LoRA's 75,268
    ],
)
def test_a_curve_experiment_searches_every_scope_with_the_same_budget(name, scopes, points, spacing, placed_apart):
    """The experiment as the sweeper expands it: per mode its scopes, each with the same number of points evenly
    spaced in log lr over three decades, jvp's and MeZO's placed by their trained parameters (the same lr x d at
    every scope), backprop's not."""
    trials = expand_sweep([f"+experiment={name}"], multirun=True)
    by: dict = defaultdict(list)
    for t in trials:
        scope = next(o for o in t if o.startswith("+experiment/cost_to_target_curve="))
        by[
            (next(o for o in t if o.startswith("case=")), next(o for o in t if o.startswith("framework=")), scope)
        ].append(lr_of(t))
    assert len(trials) == 2 * scopes * 3 * points and {len(v) for v in by.values()} == {points}
    for lrs in by.values():
        apart = [math.log10(b / a) for a, b in zip(sorted(lrs), sorted(lrs)[1:])]
        assert apart == pytest.approx([spacing] * (points - 1), abs=0.01)
        assert math.log10(max(lrs) / min(lrs)) == pytest.approx(3, abs=0.01)
    scopes_run = {k[2] for k in by}
    for case in ("case=jvp", "case=mezo"):
        lowest = sorted(min(by[(case, "framework=torch", s)]) for s in scopes_run)
        assert lowest[-1] / lowest[0] > placed_apart
    assert len({tuple(sorted(by[("case=backprop", "framework=jax", s)])) for s in scopes_run}) == 1


@pytest.mark.slow
def test_a_sweep_places_its_grid_by_the_composed_scope_and_searches_below_where_it_diverged(tmp_path):
    """A real sweep on the tiny model's classifier (132 parameters): one point, 1e6 at twice that d, so 2e6 here
    (the sweeper counted d from the composed config); it diverges, and the budget of 2 buys one point a decade
    below, which diverges too: two search trials, no winner, nothing repeated."""
    out = sweep_here(
        "-m",
        *TINY,
        "trainable=classifier",
        "target.metric=eval_accuracy",
        "target.value=0.9",
        "target.max_steps=5",
        "hydra/sweeper=bench_tuning",
        "hydra.sweeper.params={framework:torch,case:backprop}",
        "hydra.sweeper.space={backprop:{points:[{optimizer.lr:1.0e6}],scale:1/d,at:264}}",
        "hydra.sweeper.budget=2",
        "hydra.sweeper.repeats=[1]",
        f"results_dir={tmp_path}",
    )
    assert out.returncode == 0, out.stdout[-2000:] + out.stderr[-2000:]  # a diverged trial is an outcome
    assert "up to 1 beyond grids or confirming" in out.stdout and "each group: 1 study(ies) x 2 trials" in out.stdout
    rows = read_rows(tmp_path / "runs.csv")
    assert [(float(r["lr"]), r["status"], r["tuning"]) for r in rows] == [
        (2e6, "diverged", "search"),
        (2e5, "diverged", "search"),
    ]
    assert len({r["tune_group"] for r in rows}) == 1
    assert "every point of 1 group(s) diverged: searching below them" in out.stdout
