"""Steps to the target against the trained parameters, on made-up rows whose answer is known: the curve table with
its exponent fitted on seed-level points (the fit itself: test_cost_uncertainty.py), a missed scope shown and its
seeds dropped, the section and its plot from rows; and the dropout the cost tables say their trials ran with, a
group split where it differs."""

from __future__ import annotations

import pytest

from bench.harness.preflight import compose_trials
from bench.scenarios.model.report.cost import CostSection, cost_table, dropout_note
from bench.scenarios.model.report.cost_curve import curve_table, params_chart, theory
from bench.scenarios.model.report.cost_stats import cost_groups
from tests.scenarios.test_cost_report import cost_row, only
from tests.support import REPO

SCOPES = {  # scope: (trained parameters, its row's columns)
    "classifier": (1_540, {"trainable": "classifier"}),
    "bias": (27_652, {"trainable": "bias"}),
    "lora_r1": (10_756, {"trainable": "lora", "lora_rank": 1}),
    "lora_r8": (75_268, {"trainable": "lora", "lora_rank": 8}),
    "last_k1": (1_925_000, {"trainable": "last_k", "last_k": 1}),
}


def test_theory_is_one_for_one_direction_estimates_and_zero_for_exact_gradients():
    assert [theory(m) for m in ("backprop", "jacfwd", "jvp", "mezo", "hizoo", "lozo")] == [0, 0, 1, 1, 1, 1]


def curve_rows(missed: str = "last_k1") -> list[dict]:
    """Backprop reaching the target in 51 steps at every scope; MeZO in 0.01 d steps, except at `missed`; both
    with a search trial and three fresh seeds each."""
    rows = []
    for scope, (d, columns) in SCOPES.items():
        for mode, steps in (("backprop", 51), ("mezo", round(0.01 * d))):
            kw = dict(n_trainable=d, tune_group=f"{mode}-{scope}", dropout=0.0, **columns)
            reached = not (mode == "mezo" and scope == missed)
            rows.append(cost_row(mode, steps, steps / 10, reached=reached, **kw))
            rows += [
                cost_row(mode, steps, steps / 10, reached=reached, tuning="repeat", seed=s, **kw) for s in (1, 2, 3)
            ]
    return rows


def test_the_curve_section_renders_from_rows_with_a_missed_target(tmp_path):
    (key,) = cost_groups(curve_rows())
    groups = only(curve_rows())
    table = curve_table(groups)
    lines = {line.split("|")[2].strip(): [c.strip() for c in line.split("|")[1:-1]] for line in table.splitlines()[2:]}
    head = [c.strip() for c in table.splitlines()[0].split("|")[1:-1]]
    assert head[2:7] == [
        "classifier (1,540)",
        "lora(r=1) (10,756)",
        "bias (27,652)",
        "lora(r=8) (75,268)",
        "last_k=1 (1,925,000)",
    ]  # the scopes, smallest d first
    assert lines["backprop"][2:] == ["51"] * 5 + ["0.00 [0.00, 0.00]", "0", "15 seeds at 5 of 5 scopes"]
    assert lines["mezo"][2:6] == ["15", "108", "277", "753"]
    assert lines["mezo"][6] == "not reached (cap 1001)"  # shown at its cap, not fitted
    exponent = float(lines["mezo"][7].split()[0])
    assert exponent == pytest.approx(1.0, abs=0.02)
    assert lines["mezo"][8:] == ["1", "12 seeds at 4 of 5 scopes"]  # its search missed there: no winner, no seeds
    chart = params_chart(key, groups)
    guides = {s.guide: s for s in chart.series if s.guide}
    assert {s.mode for s in chart.series if not s.guide} == {"backprop", "mezo"}
    cap = guides["the step cap"]
    assert (cap.xs, cap.ys) == ([1_540, 1_925_000], [1001, 1001])  # across every scope
    mezo = next(s for s in chart.series if s.mode == "mezo")
    assert mezo.xs == [1_540, 10_756, 27_652, 75_268]  # the missed scope skipped
    theory_line = guides["theory: steps ∝ d"]
    assert theory_line.ys[-1] / theory_line.ys[0] == pytest.approx(theory_line.xs[-1] / theory_line.xs[0])


def test_a_winner_not_yet_run_at_a_fresh_seed_is_not_a_miss():
    """A search that reached the target whose repeats have not run (a search-only sweep, repeats=[]): its scope says
    so, is not fitted, and draws no step-cap line as a missed one would."""
    rows = [r for r in curve_rows(missed="") if not (r["mode"] == "mezo" and r.get("tuning") == "repeat")]
    (key,) = cost_groups(rows)
    groups = only(rows)
    mezo = next(line for line in curve_table(groups).splitlines() if "| mezo |" in line)
    assert mezo.count("reached in the search; no fresh seed yet") == 5 and "not reached" not in mezo
    assert not any(s.guide == "the step cap" for s in params_chart(key, groups).series)


def test_a_line_drawn_over_another_says_so_in_the_legend():
    """jvp and MeZO with the same medians at every scope (they draw the same directions): the line drawn second
    would hide the first, so its legend entry names it; another framework's same numbers are not the same line."""
    rows = curve_rows(missed="")
    rows += [
        {**r, "mode": "jvp", "tune_group": r["tune_group"].replace("mezo", "jvp")} for r in rows if r["mode"] == "mezo"
    ]
    (key,) = cost_groups(rows)
    labels = [s.label for s in params_chart(key, only(rows)).series if not s.guide]
    assert sorted(labels) == ["torch backprop", "torch jvp", "torch mezo (= jvp)"] or sorted(labels) == [
        "torch backprop",
        "torch jvp (= mezo)",
        "torch mezo",
    ]
    other = [{**r, "framework": "jax"} for r in rows if r["mode"] == "mezo"]
    keys = cost_groups(rows + other)
    assert all(
        "(=" not in s.label or s.framework == "torch" for k in keys for s in params_chart(k, only(rows + other)).series
    )


def test_the_cost_section_shows_the_curve_and_the_dropout(tmp_path):
    class Results:  # what the section reads of a results folder: its rows
        cache: dict = {}

        def rows(self, *_, **__):
            return curve_rows()

    text = "\n".join(CostSection().render(Results(), tmp_path))
    assert "#### Steps to the target against the trained parameters" in text
    assert "Dropout 0 in every mode's trials." in text
    assert (tmp_path / "steps_vs_params.png").stat().st_size > 1000


def test_the_cost_tables_say_the_dropout_their_rows_ran_with():
    """At model.dropout 0.1 backprop trains with it and MeZO runs in eval mode: the table says so; rows without a
    dropout column read as the default."""
    rows = [cost_row("backprop", 51, 10.0, dropout=0.1), cost_row("mezo", 301, 20.0, dropout=0.1)]
    note = dropout_note(only(rows))
    assert note.startswith("Dropout differs between the modes: 0.1 for backprop; 0 for mezo")
    old = [{k: v for k, v in r.items() if k != "dropout"} for r in rows]
    assert dropout_note(only(old)) == note
    assert dropout_note(only([{**r, "dropout": 0.0} for r in rows])) == "Dropout 0 in every mode's trials."


def test_a_cost_group_splits_on_differing_dropout():
    """The same search at model.dropout 0.1 and 0: two tables, each with its own winner."""
    rows = [cost_row("backprop", 51, 10.0, dropout=0.1), cost_row("backprop", 41, 16.0, lr=0.1, dropout=0.1)]
    found = cost_groups([*rows, *({**r, "dropout": 0.0} for r in rows)])
    assert len(found) == 2 and all(g.winner for groups in found.values() for g in groups.values())
    assert sorted(dict(key)["dropout"] for key in found) == ["0", "0.1"]


@pytest.mark.slow
@pytest.mark.parametrize("name", sorted(p.stem for p in (REPO / "conf" / "experiment").glob("cost_to_target*.yaml")))
def test_every_cost_experiment_trains_every_mode_without_dropout(name):
    """MeZO's recipe runs the model in eval mode: a cost experiment runs every mode so, for an equal function."""
    trials, _ = compose_trials([f"+experiment={name}"], multirun=True, limit=1_000)
    assert {cfg.model.dropout for _, cfg in trials} == {0.0} and len({cfg.mode for _, cfg in trials}) >= 3


def test_a_scope_whose_every_learning_rate_diverged_says_so():
    """The grid never went low enough there: the curve says diverged (not a cap it might have reached), the cost
    table how many of the search's trials diverged."""
    rows = [r for r in curve_rows() if not (r["mode"] == "mezo" and r["trainable"] == "bias")]
    kw = dict(n_trainable=27_652, tune_group="mezo-bias", dropout=0.0, trainable="bias", reached=False)
    rows += [cost_row("mezo", 0, 0.0, status="diverged", lr=lr, **kw) for lr in (0.1, 1.0)]
    groups = only(rows)
    mezo = next(line for line in curve_table(groups).splitlines() if "| mezo |" in line)
    assert [c.strip() for c in mezo.split("|")[1:-1]][4] == "diverged at every lr"
    bias = next(line for line in cost_table(groups).splitlines() if "| mezo[bias] |" in line)
    assert "| 0/2 (2 diverged) |" in bias
