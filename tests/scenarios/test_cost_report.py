"""The "Cost to target" section's statistics on made-up rows with known answers: a winner's cost comes only from
fresh seeds (never the search trial that chose it, a missed seed infinite in the median), picked by the objective
the rows name; a rerun never joins the search; groups split by every setting variant() names and by the whole
target; steps to the target as a bracket of evaluations; forward passes to the target; the matched-memory table per
trained scope; the performance profile's fractions."""

from __future__ import annotations

import math

import pytest

from bench.harness.rerun import as_rerun
from bench.harness.tuning import incumbents, winners
from bench.scenarios.model.report.cost import cost_table, matched_memory, ordered, profile_table, trials_table
from bench.scenarios.model.report.cost_stats import (
    INF,
    cost_groups,
    held_out_error,
    performance_profile,
    problems,
    target_label,
)
from tests.scenarios.test_cost_to_target import target
from tests.support import first_table, trial


def cost_row(mode, steps, wall, peak=500.0, mib_s=None, tuning="search", seed=0, lr=0.01, reached=True, **kw):
    """A target trial's row, its costs given (made up: the report's arithmetic is what is checked); evaluated every
    10 steps after 1 warm-up step, so a count that met the target is 1 + a multiple of 10."""
    kw.setdefault("tune_group", f"torch-{mode}" if tuning else "")
    return trial(
        kw.pop("framework", "torch"),
        mode,
        target_metric="eval_accuracy",
        target_value=0.8,
        target_max_steps=1001,
        eval_every=kw.pop("eval_every", 10),
        tuning=tuning,
        seed=seed,
        lr=lr,
        peak_mem_mb=peak,
        target_status="reached" if reached else "not_reached",
        steps_to_target=steps if reached else "",
        wall_to_target_s=wall if reached else "",
        seconds_to_target=wall / 2 if reached else "",
        mib_s_to_target=(mib_s if mib_s is not None else wall * 100) if reached else "",
        **kw,
    )


def table_of(groups) -> dict[str, list[str]]:
    """{mode label: its cells} of the cost table."""
    lines = first_table(cost_table(groups))[2:]
    return {line.split("|")[2].strip(): [c.strip() for c in line.split("|")[1:-1]] for line in lines}


def only(rows):
    ((_, groups),) = cost_groups(rows).items()
    return groups


BACKPROP = [  # the search: lr 0.01 wins on wall time, lr 0.1 on steps
    cost_row("backprop", 51, 10.0),
    cost_row("backprop", 41, 16.0, lr=0.1),
    cost_row("backprop", 11, 1.0, tuning="repeat", seed=0),  # the search's own seed again: not fresh, left out
    cost_row("backprop", 61, 12.0, tuning="repeat", seed=1, flops_per_step=3e9, flops_forward=1e9),
    cost_row("backprop", 51, 10.0, tuning="repeat", seed=2, flops_per_step=3e9, flops_forward=1e9),
    cost_row("backprop", 71, 14.0, tuning="repeat", seed=3, flops_per_step=3e9, flops_forward=1e9),
]


def test_a_winners_cost_comes_only_from_fresh_seeds_and_is_priced_against_backprop():
    """Each mode's medians over its repeats at seeds the search did not use, over backprop's: the winning search
    trial (mezo's 501 steps) is not among them, a missed seed is infinite in the median."""
    rows = [
        *BACKPROP,
        cost_row("jvp", 151, 24.0, peak=300.0),
        cost_row("jvp", 0, 0.0, lr=0.1, reached=False),
        *(
            cost_row("jvp", s, w, peak=300.0, tuning="repeat", seed=i)
            for i, (s, w) in enumerate([(181, 30.0), (151, 24.0), (211, 36.0)], 1)
        ),
        cost_row("mezo", 501, 25.0, peak=250.0),
        cost_row("mezo", 401, 20.0, peak=250.0, tuning="repeat", seed=1, flops_per_step=2e9, flops_forward=1e9),
        cost_row("mezo", 701, 35.0, peak=250.0, tuning="repeat", seed=2, flops_per_step=2e9, flops_forward=1e9),
        cost_row("mezo", 0, 0.0, peak=250.0, tuning="repeat", seed=3, reached=False),
    ]
    table = table_of(only(rows))
    assert table["backprop"][4:8] == ["2/2", "3", "61 [51–71]", "52–61"]  # seeds 1-3; known within an evaluation
    assert table["jvp"][4:7] == ["1/2", "3", "181 [151–211]"]
    # median of 401, 701, ∞ (never 501), flagged: a seed missed
    assert table["mezo"][4:7] == ["1/1", "3 (1 missed)", "701† [401–∞]"]
    # forward passes: steps x counted FLOPs / one forward's; backprop 3 a step, MeZO 2 (its missed seed: infinite)
    assert table["backprop"][8] == "183 [153–213]" and table["mezo"][8] == "1402† [802–∞]"
    # steps (its bootstrap interval, then the range the evaluation interval allows), forward passes, wall, peak,
    # MiB*s: over backprop's
    lo, hi = (181 - 9) / 61, 181 / (61 - 9)
    steps, forwards, wall, peak, mib_s = table["jvp"][-5:]
    assert steps.startswith("2.97× [") and steps.endswith(f"] ({lo:.2f}–{hi:.2f})") and forwards == "-"
    assert wall.startswith("2.50× [") and mib_s == wall and peak == "0.60× [0.60, 0.60]"  # every seed's peak alike
    interval = [float(v) for v in wall[len("2.50× [") : -1].split(", ")]
    assert interval[0] < 2.5 < interval[1]  # 30/12: within the seeds' 24/14 to 36/10
    # MeZO's missed seed: resampled medians that land on it are unbounded above, and the ratio is flagged
    assert [c.split(" [")[0] for c in table["mezo"][-4:]] == ["7.66×", "2.92×", "0.50×", "2.92×"]
    assert table["mezo"][-4].endswith(", ∞]†") and table["mezo"][-2] == "0.50× [0.50, 0.50]"
    assert table["backprop"][-4:] == ["1.00×", "1.00×", "1.00×", "1.00×"]  # the reference over itself, exactly


def test_a_missed_seed_counts_as_infinite_in_the_median():
    rows = [cost_row("mezo", 101, 5.0), cost_row("mezo", 201, 9.0, tuning="repeat", seed=1)]
    missed = lambda seed: cost_row("mezo", 0, 0.0, tuning="repeat", seed=seed, reached=False)  # noqa: E731
    (g,) = only([*rows, missed(2)]).values()
    cost = g.cost("steps_to_target")
    assert (cost.median, cost.lo, cost.hi, cost.seeds) == (INF, 201, INF, 2)  # median of 201 and ∞
    (g,) = only([*rows, missed(2), missed(3)]).values()
    assert math.isinf(g.cost("wall_to_target_s").median) and table_of({("torch", "mezo"): g})["mezo"][6] == (
        "not reached"
    )
    (g,) = only([*rows, missed(2), cost_row("mezo", 301, 12.0, tuning="repeat", seed=3)]).values()
    assert g.cost("steps_to_target").median == 301  # 201, 301, ∞


def test_the_winner_is_picked_by_the_objective_the_rows_name():
    rows = [{**r, "tune_objective": "steps_to_target"} for r in BACKPROP]
    (g,) = only(rows).values()
    assert g.winner["lr"] == 0.1 and g.seeds() == []  # lr 0.1 had the fewest steps; it was never repeated
    (g,) = only(BACKPROP).values()  # rows without the column: the sweeper's default, wall time
    assert g.winner["lr"] == 0.01 and len(g.seeds()) == 3


def test_the_report_breaks_a_tie_as_the_sweeper_does():
    """Three points tie at 161 steps (run from the highest learning rate down, as capping's rounds run them): the
    report's winner is the sweeper's, the middle learning rate, and its cost comes from that point's seeds."""
    rows = [
        {**cost_row("jvp", steps, 30.0, lr=lr, reached=steps is not None), "tune_objective": "steps_to_target"}
        for lr, steps in ((1.0, 161), (0.316, 161), (0.1, 161), (0.0316, None))
    ]
    repeats = [cost_row("jvp", 141 + 20 * s, 30.0, lr=0.316, tuning="repeat", seed=s) for s in (1, 2, 3)]
    (g,) = only([*rows, *repeats]).values()
    search = [(r["tune_group"], [f"optimizer.lr={r['lr']}"], r) for r in rows]
    assert winners(search, "steps_to_target") == {"torch-jvp": ["optimizer.lr=0.316"]}
    assert g.winner["lr"] == 0.316 and g.seeds() == repeats


def test_a_point_that_missed_at_a_confirming_seed_cannot_win():
    """The search's fastest point (lr 0.316, 21 steps) missed the target at the sweeper's confirming seed 4; lr 0.1
    (41 steps) reached there too: the report's winner is 0.1, as the sweeper's, and seed 4 prices nothing. Where
    0.316 reaches at seed 4 but in 821 steps, its worst is 821 and 0.1 still wins."""
    rows = [
        {**cost_row("backprop", 21, 5.0, lr=0.316), "tune_objective": "steps_to_target"},
        {**cost_row("backprop", 41, 9.0, lr=0.1), "tune_objective": "steps_to_target"},
        cost_row("backprop", None, 0.0, lr=0.316, tuning="confirm", seed=4, reached=False),
        cost_row("backprop", 41, 9.0, lr=0.1, tuning="confirm", seed=4),
    ]
    repeats = [cost_row("backprop", 41, 9.0, lr=0.1, tuning="repeat", seed=s) for s in (1, 2, 3, 4)]
    (g,) = only([*rows, *repeats]).values()
    assert g.winner["lr"] == 0.1 and g.seeds() == repeats[:3] and len(g.confirms) == 2
    (g,) = only([*rows[:2], *repeats]).values()  # without the confirming rows: the fastest point wins
    assert g.winner["lr"] == 0.316
    slow = cost_row("backprop", 821, 90.0, lr=0.316, tuning="confirm", seed=4)  # reached, but its worst is 821
    (g,) = only([*rows[:2], slow, rows[3], *repeats]).values()
    assert g.winner["lr"] == 0.1
    # the sweeper's capping: 0.1's confirming trial stopped at 0.316's 821 steps without the target, a miss
    stopped = cost_row("backprop", None, 0.0, lr=0.1, tuning="confirm", seed=4, reached=False, tune_stop_after=821)
    (g,) = only([*rows[:2], slow, {**stopped, "target_status": "capped"}, *repeats]).values()
    assert g.winner["lr"] == 0.316


def test_the_sweeper_and_the_report_count_a_trial_reached_only_if_it_ended_ok():
    """One rule (tuning.reached) for capping's incumbents, the report's winner and its seeds: a row whose target
    says reached but whose trial did not end ok (it crashed after the evaluation) caps nothing, wins nothing and
    prices a seed as missed."""
    broken = lambda row: {**row, "status": "crashed"}  # noqa: E731
    fast, slow = cost_row("mezo", 101, 5.0, lr=0.1), cost_row("mezo", 201, 9.0, lr=0.01)
    search = [(r["tune_group"], [], r) for r in (broken(fast), slow)]
    assert incumbents(search) == {"torch-mezo": 201}
    repeats = [cost_row("mezo", 181 + 20 * s, 9.0, lr=0.01, tuning="repeat", seed=s) for s in (1, 2, 3)]
    (g,) = only([broken(fast), slow, broken(repeats[0]), *repeats[1:]]).values()
    assert g.winner["lr"] == 0.01
    cost = g.cost("steps_to_target")
    assert (cost.median, cost.lo, cost.hi) == (241, 221, INF)  # 221, 241 and the crashed seed as infinite


def test_a_rerun_does_not_join_the_search():
    """A rerun (python -m bench rerun) of the slower search point, faster this time: the search still has two
    trials, its winner stays, the rerun is no seed of it; the trials table lists it as a rerun."""
    rerun = cost_row("backprop", 21, 2.0, lr=0.1, tuning="rerun")
    groups = only([*BACKPROP, rerun])
    (g,) = groups.values()
    assert len(g.search) == 2 and g.winner["lr"] == 0.01 and rerun not in g.seeds() and g.reruns == [rerun]
    assert table_of(groups)["backprop"][4:7] == ["2/2", "3", "61 [51–71]"]
    assert any("| rerun |" in line and rerun["run_id"] in line for line in trials_table(groups).splitlines())


def test_the_rerun_command_runs_a_sweeps_trial_as_a_rerun():
    cfg = target()
    cfg.tuning, cfg.tune_group = "search", "framework=torch case=mezo"
    assert (as_rerun(cfg).tuning, cfg.tune_group) == ("rerun", "framework=torch case=mezo")


@pytest.mark.parametrize(
    "setting",
    [
        {"directions": "rademacher"},
        {"jvp_impl": "naive"},
        {"jvp_tangent": "redraw"},
        {"num_tangents": 4},
        {"attn_implementation": "sdpa"},
        {"compile": True},
        {"trainable": "bias"},
    ],
)
def test_a_setting_that_changes_the_numbers_splits_the_group(setting):
    """Two jvp searches that differ in one setting variant() names: two groups, each with its own winner."""
    rows = [cost_row("jvp", 101, 5.0), cost_row("jvp", 201, 9.0, lr=0.1)]
    other = [{**r, **setting, "tune_group": "torch-jvp-other"} for r in rows]
    groups = only([*rows, *other])
    assert len(groups) == 2 and all(len(g.search) == 2 and g.winner for g in groups.values())


def test_each_tuned_mode_brings_its_own_optimizer_and_is_priced_against_backprop_on_it():
    """A tuning sweep's optimizer is part of the mode, as cost_to_target runs them (backprop on momentum SGD, the
    estimators on plain SGD): one table, backprop's optimizer named in its label, the ratios over it; backprop on
    two optimizers is two groups, and a mode on a third then has no single reference."""
    momentum = [{**r, "momentum": 0.9} for r in BACKPROP]
    jvp = [cost_row("jvp", 151, 24.0)]
    jvp += [cost_row("jvp", s, 30.0, tuning="repeat", seed=i) for i, s in enumerate([181, 151, 211], 1)]
    table = table_of(only([*momentum, *jvp]))
    assert set(table) == {"backprop · sgd (momentum 0.9)", "jvp"}
    assert table["jvp"][-5].startswith("2.97× [") and table["backprop · sgd (momentum 0.9)"][-5].startswith("1.00×")
    adamw = [{**r, "optimizer": "adamw", "tune_group": "torch-backprop-adamw"} for r in BACKPROP]
    table = table_of(only([*momentum, *adamw, *jvp]))
    assert set(table) == {"backprop · sgd (momentum 0.9)", "backprop · adamw", "jvp"} and table["jvp"][-5] == "-"


def test_joules_to_the_target_are_priced_where_a_counter_was_read():
    """A GPU's rows carry joules to the target (docs/energy.md): the table adds them and their ratio over backprop's;
    rows without them (a CPU without RAPL) keep the table as it was."""
    assert "joules" not in first_table(cost_table(only(BACKPROP)))[0]
    jvp = [cost_row("jvp", 151, 24.0)]
    jvp += [cost_row("jvp", s, 30.0, tuning="repeat", seed=i) for i, s in enumerate([181, 151, 211], 1)]
    rows = [{**r, "energy_to_target_j": 100 * float(r["steps_to_target"])} for r in [*BACKPROP, *jvp]]
    table = table_of(only(rows))
    assert first_table(cost_table(only(rows)))[0].split("|")[-3:-1] == [" joules ", " joules × "]
    assert table["backprop"][-2:] == ["6100 [5100–7100]", "1.00×"]
    assert table["jvp"][-2] == "18100 [15100–21100]" and table["jvp"][-1].startswith("2.97× [")


@pytest.mark.parametrize(
    "column,other",
    [
        ("eval_every", 25),
        ("eval_resolution", 0.1),
        ("warmup_steps", 2),
        ("target_max_steps", 501),
        ("eval_examples", 512),
        ("target_hold", 3),
    ],
)
def test_a_different_target_is_a_different_table(column, other):
    rows = [cost_row("backprop", 51, 10.0), cost_row("mezo", 301, 20.0)]
    found = cost_groups([*rows, *({**r, column: other} for r in rows)])
    assert len(found) == 2 and all(len(groups) == 2 for groups in found.values())


def test_a_target_says_how_many_held_out_examples_it_is_met_on_and_their_standard_error():
    """0.4 on 128 examples: sqrt(0.4 x 0.6 / 128) = 0.043, a model at 0.36 scores 0.4 or more one time in six; on
    512, half that. Rows from before the column say nothing of it."""
    labels = {
        n: target_label(
            next(iter(cost_groups([{**cost_row("backprop", 51, 10.0), "target_value": 0.4, "eval_examples": n}])))
        )
        for n in (128, 512, "")
    }
    assert labels[128].startswith("eval_accuracy 0.4 on 128 held-out examples (standard error 0.043 there) · cap")
    assert "on 512 held-out examples (standard error 0.022 there)" in labels[512]
    assert labels[""].startswith("eval_accuracy 0.4 · cap 1001 steps")
    loss = {**cost_row("backprop", 51, 10.0), "target_metric": "eval_loss", "target_value": 1.2, "eval_examples": 128}
    assert target_label(next(iter(cost_groups([loss])))).startswith("eval_loss 1.2 on 128 held-out examples · cap")
    assert held_out_error(0.5, 100) == pytest.approx(0.05)


def test_with_eval_resolution_steps_are_known_within_it():
    """Evaluated every 20 steps and within 10% in between after 1 warm-up step (timed steps 1-17 each, then 19, 20,
    22, ..., 99, 100, 111, 120, 133, 140, ...): backprop's 4, 8 and 9 steps are known exactly, jvp's 112, 121 and 134
    within 10% (their lows 102, 113 and 122), and the ratio's range follows."""
    res = {"eval_every": 20, "eval_resolution": 0.1}
    rows = [
        cost_row("backprop", 9, 1.0, **res),
        *(cost_row("backprop", s, 1.0, tuning="repeat", seed=i, **res) for i, s in enumerate([4, 8, 9], 1)),
        cost_row("jvp", 121, 9.0, **res),
        *(cost_row("jvp", s, 9.0, tuning="repeat", seed=i, **res) for i, s in enumerate([112, 121, 134], 1)),
    ]
    groups = only(rows)
    table = table_of(groups)
    assert [g.steps_bracket() for g in ordered(groups)] == [(8, 8), (113, 121)]
    assert table["backprop"][6:8] == ["8 [4–9]", "8"] and table["jvp"][6:8] == ["121 [112–134]", "113–121"]
    # 121 over 8, its range 113/8 to 121/8 after the bootstrap interval
    assert table["jvp"][-5].startswith("15.12× [") and table["jvp"][-5].endswith("] (14.1–15.1)")


def test_rows_from_before_the_new_columns_still_report():
    """No eval_every, flops_forward, passes_to_target or tune_objective columns: the costs are there, the bracket
    and the FLOP-equivalent passes are "-", the declared passes come from the estimator, the winner by wall time."""
    old = [{k: v for k, v in r.items() if k not in ("eval_every", "flops_forward")} for r in BACKPROP]
    table = table_of(only(old))
    assert table["backprop"][6:10] == ["61 [51–71]", "-", "-", "61 [51–71]"]  # backprop: 1 forward pass a step
    assert table["backprop"][12] == "12.0 [10.0–14.0]"


def test_the_matched_memory_table_is_per_trained_scope():
    """At the classifier MeZO fits in less memory than backprop; at bias backprop is fastest but needs the most:
    each scope's budgets are its own modes', never another scope's; the scopes smallest first."""
    rows = []
    for scope, n, modes in (
        ("bias", 27_652, [("backprop", 5.0, 700.0), ("mezo", 30.0, 450.0)]),
        ("classifier", 1_540, [("backprop", 10.0, 500.0), ("mezo", 20.0, 400.0)]),
    ):
        for mode, wall, peak in modes:
            kw = dict(peak=peak, trainable=scope, n_trainable=n, tune_group=f"torch-{mode}-{scope}")
            rows += [cost_row(mode, 51, wall, **kw), cost_row(mode, 51, wall, tuning="repeat", seed=1, **kw)]
    fits = matched_memory(only(rows))
    assert [row[1:4] for row in fits] == [
        ["classifier", "400", "mezo[classifier]"],
        ["classifier", "500", "backprop[classifier]"],
        ["bias", "450", "mezo[bias]"],
        ["bias", "700", "backprop[bias]"],
    ]
    assert all(row[5] == "1" for row in fits)  # how many seeds each median is over
    assert all(row[6:] == ["-", "-"] for row in fits)  # one seed each: no spread to take a noise band from


def test_the_performance_profile_counts_problems_within_tau_of_the_best():
    costs = {
        "p1": {"A": 10.0, "B": 20.0, "C": INF},
        "p2": {"A": 30.0, "B": 15.0, "C": 100.0},
        "p3": {"A": INF, "B": INF},  # nobody reached it: no best, left out
        "p4": {"A": 5.0},  # B and C did not run it: unsolved by them
    }
    profile = performance_profile(costs, taus=(1, 2, 4, 10))
    assert profile["A"] == pytest.approx([2 / 3, 1, 1, 1])
    assert profile["B"] == pytest.approx([1 / 3, 2 / 3, 2 / 3, 2 / 3])
    assert profile["C"] == pytest.approx([0, 0, 0, 1 / 3])


def test_the_performance_profiles_problems_are_scopes_and_targets():
    """From rows: backprop and MeZO at two scopes; MeZO reaches the classifier's target in 1.5x backprop's wall
    time and misses at bias."""
    rows = []
    for scope, mezo in (("classifier", 15.0), ("bias", None)):
        for mode, wall in (("backprop", 10.0), ("mezo", mezo)):
            g = dict(trainable=scope, tune_group=f"{mode}-{scope}")
            rows += [
                cost_row(mode, 51, wall or 0.0, reached=wall is not None, **g),
                cost_row(mode, 51, wall or 0.0, reached=wall is not None, tuning="repeat", seed=1, **g),
            ]
    found = cost_groups(rows)
    costs = problems(found, "wall_to_target_s")
    assert sorted((scope, fw, level) for _, scope, fw, level in costs) == [
        ("bias", "torch", None),
        ("classifier", "torch", None),
    ]
    profile = performance_profile(costs)
    assert profile["backprop"] == [1, 1, 1, 1] and profile["mezo"] == [0, 0.5, 0.5, 0.5]
    # two problems: the table says a fraction moves half a problem at a time
    mezo = next(line for line in profile_table(found).splitlines() if line.startswith("| mezo | wall s (of 2,"))
    assert "under 8: a fraction moves 50% a problem" in mezo and mezo.endswith("| 0% | 50% | 50% | 50% |")
