"""How sure the "Cost to target" section is, on made-up seeds whose answer is known: the exponent of steps against
trained parameters fitted on seed-level points (exactly 1 on noiseless points, its bootstrap interval holding the
truth and narrowing with more seeds, missed seeds dropped and counted); a ratio's bootstrap interval (the same, and
unbounded where resampled medians land on a missed seed); peak memory's noise band and the ties it makes; the
performance profile over levels of the target; a group's cost over several tuning studies; fewer than five seeds
said."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest

from bench.scenarios.model.report.cost import framework_table, matched_memory, profile_table, seeds_note
from bench.scenarios.model.report.cost_curve import curve_table
from bench.scenarios.model.report.cost_stats import INF, cost_groups, levels, performance_profile, problems, value
from bench.scenarios.model.report.cost_uncertainty import fit_seeds, memory_band, ratio_interval, ties
from tests.scenarios.test_cost_report import cost_row, only, table_of

DS = (1_540.0, 10_756.0, 27_652.0, 75_268.0)  # trained parameters of four scopes


def noisy(truth: float, seeds: int, spread: float, rng: np.random.Generator) -> list[float]:
    """`seeds` draws of truth x e^N(0, spread): a cost's seed-to-seed noise, multiplicative."""
    return list(truth * np.exp(rng.normal(0.0, spread, seeds)))


def width(interval) -> float:
    return interval[1] - interval[0]


def test_the_exponent_is_exactly_one_on_noiseless_points_and_zero_on_flat_ones():
    fit = fit_seeds({d: [0.05 * d] * 3 for d in DS})
    assert fit.exponent == pytest.approx(1.0) and (fit.points, fit.scopes, fit.dropped) == (12, 4, 0)
    assert (fit.lo, fit.hi) == (pytest.approx(1.0), pytest.approx(1.0))  # every resample the same points
    flat = fit_seeds({d: [60.0] * 3 for d in DS})
    assert flat.exponent == pytest.approx(0.0, abs=1e-12) and flat.hi - flat.lo == pytest.approx(0.0, abs=1e-12)
    one = fit_seeds({1e3: [10.0], 1e4: [100.0]})
    assert one.exponent == pytest.approx(1.0) and one.lo is None  # one seed a scope: resampling cannot move it
    assert fit_seeds({1e3: [10.0, 12.0]}) is None  # one scope: nothing to fit


def test_a_missed_seed_is_dropped_from_the_fit_and_counted():
    fit = fit_seeds({1e3: [10.0, INF, 10.0], 1e4: [100.0, 100.0, INF], 1e5: [INF, INF]})
    assert fit.exponent == pytest.approx(1.0) and (fit.points, fit.scopes, fit.dropped) == (4, 2, 4)
    assert fit_seeds({1e3: [10.0], 1e4: [INF, INF]}) is None  # one scope left: no fit


def test_the_curve_table_fits_seeds_flags_a_censored_median_and_counts_the_dropped():
    """MeZO at two scopes, 0.01 d steps; at bias one of its five seeds missed: the median there is flagged, the
    seed is dropped from the fit (9 seeds fitted), the exponent still that of the others, with no spread."""
    rows = []
    for scope, d in (("classifier", 1_540), ("bias", 27_652)):
        kw = dict(n_trainable=d, trainable=scope, tune_group=f"mezo-{scope}")
        steps = round(0.01 * d)
        rows.append(cost_row("mezo", steps, 1.0, **kw))
        for seed in (1, 2, 3, 5, 6):
            reached = not (scope == "bias" and seed == 6)
            rows.append(cost_row("mezo", steps, 1.0, tuning="repeat", seed=seed, reached=reached, **kw))
    (line,) = curve_table(only(rows)).splitlines()[2:]
    cells = [c.strip() for c in line.split("|")[1:-1]]
    b = math.log(277 / 15) / math.log(27_652 / 1_540)  # the steps rounded to whole ones: about 1
    assert cells[2:4] == ["15", "277† [277–∞]"] and cells[4] == f"{b:.2f} [{b:.2f}, {b:.2f}]"
    assert cells[-1] == "9 seeds at 2 of 2 scopes (1 missed: dropped)"


def test_the_exponents_interval_holds_the_truth_and_narrows_with_more_seeds():
    """steps = 0.05 d x e^N(0, 0.3) at four scopes: at 5 seeds a scope and at 80, the 95% interval holds 1, and 80
    seeds' is narrower (about 4 times: sqrt(16))."""
    rng = np.random.default_rng(7)
    few = fit_seeds({d: noisy(0.05 * d, 5, 0.3, rng) for d in DS})
    many = fit_seeds({d: noisy(0.05 * d, 80, 0.3, rng) for d in DS})
    assert few.lo < 1.0 < few.hi and many.lo < 1.0 < many.hi
    assert width((many.lo, many.hi)) < width((few.lo, few.hi)) / 2
    rng = np.random.default_rng(7)
    again = fit_seeds({d: noisy(0.05 * d, 5, 0.3, rng) for d in DS})
    assert (again.lo, again.hi) == (few.lo, few.hi)  # a fixed generator seed: the same rows, the same report


def test_a_ratios_interval_holds_the_truth_and_narrows_with_more_seeds():
    rng = np.random.default_rng(3)
    assert ratio_interval([[10.0] * 5], [[5.0] * 5]) == (2.0, 2.0)  # no spread: the ratio itself
    few = ratio_interval([noisy(200.0, 5, 0.2, rng)], [noisy(100.0, 5, 0.2, rng)])
    many = ratio_interval([noisy(200.0, 60, 0.2, rng)], [noisy(100.0, 60, 0.2, rng)])
    assert few[0] < 2.0 < few[1] and many[0] < 2.0 < many[1] and width(many) < width(few) / 2
    assert ratio_interval([[1.0]], []) is None


def test_a_censored_median_makes_the_ratio_unbounded_on_its_side():
    """A missed seed is censored at the cap: resampled medians that land on one are known only to exceed it, so a
    ratio over them is unbounded above (below, where it is the denominator); the ratio of finite medians inside."""
    missed = [[100.0, 120.0, INF, INF, 110.0]]  # median 120, two of five seeds missed
    lo, hi = ratio_interval(missed, [[50.0] * 5])
    assert math.isinf(hi) and 1.0 < lo <= 2.4
    lo, hi = ratio_interval([[50.0] * 5], missed)
    assert lo == 0.0 and 0.4 <= hi < 1.0


def test_peak_memorys_noise_band_makes_budgets_within_it_ties():
    """Backprop's peak spreads 40 MiB over its seeds (480-520): MeZO's 505 MiB budget lies within that of
    backprop's 500, so the two are one row, a tie, and the faster (backprop) answers it; 700 MiB stands apart."""
    assert ties([700.0, 405.0, 400.0], 40.0) == [[400.0, 405.0], [700.0]] and ties([400.0, 405.0], None) == [
        [400.0],
        [405.0],
    ]
    rows = []
    for mode, wall, seed_peaks in (("backprop", 5.0, (480, 500, 520)), ("mezo", 20.0, (505,) * 3)):
        rows.append(cost_row(mode, 51, wall, peak=seed_peaks[1]))
        rows += [cost_row(mode, 51, wall, peak=p, tuning="repeat", seed=s) for s, p in enumerate(seed_peaks, 1)]
    rows += [cost_row("jvp", 101, 9.0, peak=700.0), cost_row("jvp", 101, 9.0, peak=700.0, tuning="repeat", seed=1)]
    groups = only(rows)
    assert memory_band(list(groups.values())) == 40.0
    fits = matched_memory(groups)
    assert [row[2:4] + row[6:] for row in fits] == [
        ["500–505 (tie)", "backprop", "backprop, mezo", "±40.0"],
        ["700", "backprop", "-", "±40.0"],
    ]


def test_levels_of_the_target_are_read_from_their_column_and_absent_in_old_rows():
    row = {"levels_to_target": "0.3:40;0.35:;0.4:120", "target_value": 0.4, "steps_to_target": 121}
    assert levels(row) == {0.3: 40.0, 0.35: None, 0.4: 121.0}  # the target's own steps: its own column
    assert levels({"target_value": 0.4, "steps_to_target": 121}) == {0.4: 121.0}


def profile_rows() -> list[dict]:
    """Backprop and MeZO at 2 scopes x 2 frameworks, each seed's steps recorded at a lower level too (0.3; the
    target 0.8). MeZO takes 1.5x backprop's steps at every problem but JAX's bias at the target, which its seeds
    miss (they held 0.3)."""
    rows = []
    for fw in ("torch", "jax"):
        for scope in ("classifier", "bias"):
            for mode, factor in (("backprop", 1.0), ("mezo", 1.5)):
                missed = mode == "mezo" and fw == "jax" and scope == "bias"
                kw = dict(framework=fw, trainable=scope, tune_group=f"{fw}-{mode}-{scope}")
                at = dict(levels_to_target=f"0.3:{round(40 * factor) + 1}")
                for tuning, seed in (("search", 0), *(("repeat", s) for s in (1, 2, 3, 5, 6))):
                    reached = tuning == "search" or not missed
                    rows.append(
                        cost_row(
                            mode,
                            round(100 * factor) + 1,
                            10 * factor,
                            reached=reached,
                            tuning=tuning,
                            seed=seed,
                            **kw,
                            **at,
                        )
                    )
    return rows


def test_the_profiles_problems_are_scopes_frameworks_and_levels_of_the_target():
    """8 problems (2 scopes x 2 frameworks x 2 levels): backprop the cheapest at each; MeZO within 2x at 7 of them,
    and never at JAX's bias at the target, which its seeds missed."""
    found = cost_groups(profile_rows())
    costs = problems(found, "steps_to_target")
    assert len(costs) == 8 and {level for *_, level in costs} == {None, 0.3}
    assert all(set(c) == {"backprop", "mezo"} for c in costs.values())
    profile = performance_profile(costs)
    assert profile["backprop"] == [1, 1, 1, 1] and profile["mezo"] == [0, 7 / 8, 7 / 8, 7 / 8]
    table = profile_table(found)
    assert "| mezo | steps (of 8) | 0% | 88% | 88% | 88% |" in table  # 8 problems: no warning
    # rows that kept no step times know their wall at the target's own level only: 4 problems, and the table says
    # what one is worth
    assert "| mezo | wall s (of 4, under 8: a fraction moves 25% a problem) | 0% | 75% | 75% | 75% |" in table


def test_a_lower_levels_time_is_read_from_the_trials_kept_step_times(tmp_path):
    """With each trial's step times kept (history/), a lower level's time is the target's less the steps after the
    level's count, so wall time has the steps' 8 problems: steps of 0.1 s after a 2 s compile, at 0.3 backprop's 41
    steps and MeZO's 61; JAX's MeZO at bias missed the target and still held 0.3 at 61 (its compile and 61 steps)."""
    (tmp_path / "history").mkdir()
    rows = []
    for r in profile_rows():
        steps = int(r["steps_to_target"] or 1001)
        timed = (
            {"seconds_to_target": 0.1 * steps, "wall_to_target_s": 2.0 + 0.1 * steps} if r["steps_to_target"] else {}
        )
        r = r | {"_source": str(tmp_path / "runs.csv"), "compile_time_s": 2.0} | timed
        (tmp_path / "history" / f"{r['run_id']}.json").write_text(json.dumps({"step_time_s": [0.1] * steps}))
        rows.append(r)
    found = cost_groups(rows)
    costs = problems(found, "wall_to_target_s")
    assert len(costs) == 8
    low = next(p for p in costs if p[1:] == ("bias", "jax", 0.3))
    assert costs[low] == pytest.approx({"backprop": 2.0 + 4.1, "mezo": 2.0 + 6.1})
    assert costs[next(p for p in costs if p[1:] == ("bias", "jax", None))]["mezo"] == INF
    assert problems(found, "seconds_to_target")[low] == pytest.approx({"backprop": 4.1, "mezo": 6.1})
    assert "| mezo | wall s (of 8) | 0% | 88% | 88% | 88% |" in profile_table(found)
    # the recorded time to the target stands: a level held at its step costs it exactly, and one before it less the
    # steps between (not the compile and the steps summed again, which can differ from the recorded clock)
    first = rows[0] | {"wall_to_target_s": 12.0}
    assert value(first, "wall_to_target_s", 0.3) == pytest.approx(12.0 - 0.1 * (101 - 41))
    assert value(first | {"levels_to_target": "0.3:101"}, "wall_to_target_s", 0.3) == 12.0
    # a history shorter than the count prices nothing there (the level's cost is unknown, not missed)
    (tmp_path / "history" / f"{rows[0]['run_id']}.json").write_text(json.dumps({"step_time_s": [0.1] * 10}))
    assert value(rows[0], "wall_to_target_s", 0.3) is None


def test_a_groups_cost_is_the_median_over_its_studies_of_each_ones_median():
    """Three tuning studies, each its own search and five fresh seeds: their medians 100, 300 and 200; the group's
    cost 200, its seeds all fifteen, its winner the first study's."""
    rows = []
    for study, (lr, base) in enumerate(((0.1, 100), (0.01, 300), (0.1, 200))):
        kw = dict(tune_study=study, lr=lr)
        rows.append(cost_row("mezo", base, 10.0, **kw))
        rows += [
            cost_row("mezo", base + d, 10.0, tuning="repeat", seed=s, **kw)
            for s, d in zip(range(1, 6), (-2, -1, 0, 1, 2))
        ]
    (g,) = only(rows).values()
    assert len(g.studies()) == 3 and len(g.seeds()) == 15 and g.winner["lr"] == 0.1
    cost = g.cost("steps_to_target")
    assert (cost.median, cost.lo, cost.hi, cost.seeds) == (200, 98, 302, 15)
    assert table_of({("torch", "mezo"): g})["mezo"][5:7] == ["15 (3 studies)", "200 [98–302]"]
    (one,) = only([{k: v for k, v in r.items() if k != "tune_study"} for r in rows[:6]]).values()
    assert one.studies() == [one] and one.cost("steps_to_target").median == 100  # rows without the column: one


def test_a_study_whose_point_missed_at_its_confirming_seed_has_no_winner():
    """As the sweeper decides: study 1's only point reached the target at its search seed and diverged at its
    confirming one, so that study has no winner and no fresh seeds; the group is priced over study 0's five, which
    are not "fewer than five", and the seeds cell says one study found none."""
    rows = [
        cost_row("mezo", 101, 10.0, lr=0.1, tune_study=0),
        cost_row("mezo", 101, 10.0, lr=0.1, tune_study=0, tuning="confirm", seed=4),
    ]
    rows += [cost_row("mezo", 121, 10.0, lr=0.1, tune_study=0, tuning="repeat", seed=s) for s in (1, 2, 3, 5, 6)]
    rows += [
        cost_row("mezo", 61, 5.0, lr=1.0, tune_study=1, seed=1000),
        cost_row("mezo", 61, 5.0, lr=1.0, tune_study=1, tuning="confirm", seed=1004, reached=False),
    ]
    (g,) = only(rows).values()
    assert [s.winner["lr"] if s.winner else None for s in g.studies()] == [0.1, None]
    assert g.cost("steps_to_target").median == 121 and seeds_note({("torch", "mezo"): g}) == ""
    assert table_of({("torch", "mezo"): g})["mezo"][5] == "5 (2 studies, 1 without a winner)"


def test_fewer_than_five_fresh_seeds_are_said_and_jax_is_priced_against_torch():
    rows = []
    for fw, seeds, wall in (("torch", (1, 2, 3), 10.0), ("jax", (1, 2, 3, 5, 6), 20.0)):
        kw = dict(framework=fw, tune_group=f"{fw}-mezo")
        rows += [
            cost_row("mezo", 101, wall, **kw),
            *(cost_row("mezo", 101, wall, tuning="repeat", seed=s, **kw) for s in seeds),
        ]
    groups = only(rows)
    assert seeds_note(groups).startswith("Fewer than 5 fresh seeds: PyTorch mezo (3);")
    (line,) = framework_table(groups).splitlines()[2:]
    assert line == "| JAX | mezo | 5 / 3 | 1.00× [1.00, 1.00] (0.91–1.10) | 2.00× [2.00, 2.00] | 1.00× [1.00, 1.00] |"
    assert seeds_note({k: g for k, g in groups.items() if k[0] == "jax"}) == ""
    # two studies, the second priced over two seeds so far: the note says which count it is
    jax = [r for r in rows if r["framework"] == "jax"]
    second = [{**r, "tune_study": 1, "seed": r["seed"] + 1000} for r in jax[:3]]
    note = seeds_note(only([*({**r, "tune_study": 0} for r in jax), *second]))
    assert note.startswith("Fewer than 5 fresh seeds: JAX mezo (2 in the fewest of its 2 studies);")


def test_rows_without_levels_get_them_replayed_from_their_kept_evaluations(tmp_path):
    """Rows that recorded no easier levels (target.levels unset) but kept their histories: 0.75 and 0.875 of the
    target (0.6, 0.7 of 0.8) replayed, so the profile has three levels a problem; a row without a history is as it was,
    and one with its own cell keeps it."""
    (tmp_path / "history").mkdir()
    rows = []
    for r in profile_rows():
        r = {k: v for k, v in r.items() if k != "levels_to_target"} | {"_source": str(tmp_path / "runs.csv")}
        steps = int(r["steps_to_target"] or 1001)
        easy = 39 if r["mode"] == "backprop" else 59  # the index of the first evaluation at 0.65: counts 41, 61
        history = [None] * (steps - 1)
        for i in range(9, steps - 1, 10):
            history[i] = 0.8 if r["steps_to_target"] and i == steps - 2 else 0.65 if i >= easy else 0.3
        (tmp_path / "history" / f"{r['run_id']}.json").write_text(json.dumps({"eval_accuracy": history}))
        rows.append(r)
    costs = problems(cost_groups(rows), "steps_to_target")
    assert len(costs) == 12 and {level for *_, level in costs} == {None, 0.6, 0.7}
    assert costs[next(p for p in costs if p[1:] == ("bias", "jax", 0.6))] == {"backprop": 41, "mezo": 61}
    assert costs[next(p for p in costs if p[1:] == ("bias", "jax", 0.7))] == {"backprop": 101, "mezo": INF}
    (own,) = cost_groups([{**rows[0], "levels_to_target": "0.5:11"}]).values()
    assert levels(next(iter(own.values())).rows[0]) == {0.5: 11.0, 0.8: 101.0}
    (bare,) = cost_groups([{**rows[0], "_source": ""}]).values()
    assert levels(next(iter(bare.values())).rows[0]) == {0.8: 101.0}
