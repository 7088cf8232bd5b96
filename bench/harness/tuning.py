"""Tuning with a fixed budget per mode, then the winners again at other seeds: the Hydra sweeper a cost-to-target
comparison runs with (conf/experiment/cost_to_target.yaml; `hydra/sweeper=bench_tuning`).

A method compared at a target is only as good as its tuning (forward-gradient claims did not survive backprop
with a tuned learning rate), so every way of differentiating gets the same number of trials, as AlgoPerf gives
every submission the same tuning budget:

    hydra:
      sweeper:
        params: {framework: "torch,jax", case: "backprop,jvp,mezo"}   # what is compared (a grid, as Hydra's own)
        space:                                                         # per case (or mode): its points, each a
          backprop: [{optimizer.lr: 0.01}, {optimizer.lr: 0.03}, ...]  # trial's overrides; every case the same
          mezo: [{optimizer.lr: 1.0e-4, mezo.eps: 1.0e-3}, ...]        # number of points: the budget
        objective: wall_to_target_s                                    # a column of the row: lower is better
        repeats: [1, 2]                                                # seeds the winner runs again with

Phase one runs every point of every combination of `params` (`tuning=search`); phase two runs each combination's
winner, the point with the smallest objective among the trials that reached it, at every seed of `repeats`
(`tuning=repeat`). Every trial carries its combination as `tune_group`. A combination that no point brought to
the target has no winner, and is not repeated. Both phases go through the configured launcher (joblib, SLURM...).

Why a grid and not hydra-optuna-sweeper: the budgets here are a handful of points per mode, where a TPE sampler
has nothing to learn from; a grid is the same for every mode and framework (fair), runs in parallel, and is the
same on every rerun. Optuna's sweeper tunes one study per launch, across every swept key at once, so it would
share the budget between modes instead of giving each its own.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Mapping, Sequence
from pathlib import Path

from hydra.core.override_parser.overrides_parser import OverridesParser
from hydra.plugins.sweeper import Sweeper
from omegaconf import OmegaConf

from bench.errors import ConfigError
from bench.harness.plan import add_trials
from bench.spec import MAX_SEED

# What picks a winner: a cost to the target, lower is better (each a column of scenario=model's rows)
OBJECTIVES = ("wall_to_target_s", "seconds_to_target", "steps_to_target", "samples_to_target", "mib_s_to_target")


def check_tuning(objective, repeats) -> None:
    """Before any trial: the objective is a cost the rows carry, the repeats are seeds (ConfigError, one line)."""
    if objective not in OBJECTIVES:
        raise ConfigError(
            f"hydra.sweeper.objective={objective}: accepted {' | '.join(OBJECTIVES)} (a cost to the "
            "target: the lowest wins)"
        )
    seeds = list(repeats) if isinstance(repeats, (list, tuple)) else None
    if seeds is None or any(isinstance(s, bool) or not isinstance(s, int) or not 0 <= s < MAX_SEED for s in seeds):
        raise ConfigError(
            f"hydra.sweeper.repeats={repeats}: accepted a list of seeds, integers in [0, 2^63), that "
            "each winner runs again with"
        )


def expand(params: Mapping[str, str] | None, space: Mapping, arguments: Sequence[str]) -> list[tuple[str, list[str]]]:
    """Phase one's trials: (tune_group, overrides) for every combination of `params` and the command line's
    sweeps, times the points of that combination's case (or mode). ConfigError (one line) for a combination
    without a space, an empty space, or spaces of different sizes (the budget is the same for every mode)."""
    parser = OverridesParser.create()
    overrides = parser.parse_overrides([*(f"{k}={v}" for k, v in (params or {}).items()), *arguments])
    lists, compared = {}, set(params or {})  # what a group is named by: the keys compared
    for o in overrides:
        key = o.get_key_element()
        values = list(o.sweep_string_iterator()) if o.is_sweep_override() else [o.get_value_element_as_str()]
        lists[key] = [f"{key}={v}" for v in values]
        if len(values) > 1:
            compared.add(key)
    sizes = {name: len(points) for name, points in space.items()}
    if not sizes or min(sizes.values()) == 0:
        raise ConfigError(
            f"hydra.sweeper.space={dict(sizes)}: a search space is empty; accepted: at least one point per case"
        )
    if len(set(sizes.values())) > 1:
        raise ConfigError(
            f"hydra.sweeper.space: {sizes} points; accepted: the same number for every case (the "
            "tuning budget is the same for every way of differentiating)"
        )
    trials = []
    for combo in itertools.product(*lists.values()):
        choices = dict(o.split("=", 1) for o in combo)
        name = choices.get("case") or choices.get("+case") or choices.get("mode")
        if name not in space:
            raise ConfigError(f"case={name}: no search space in hydra.sweeper.space; accepted: {' | '.join(space)}")
        group = " ".join(o for o in combo if o.split("=", 1)[0] in compared)
        for point in space[name]:
            trials.append(
                (
                    group,
                    [*combo, *(f"{k}={v}" for k, v in dict(point).items()), "tuning=search", f"tune_group='{group}'"],
                )
            )
    return trials


def winners(results: list[tuple[str, list[str], dict]], objective: str) -> dict[str, list[str]]:
    """Each group's winning overrides: the smallest objective among its trials that have one (reached the
    target, ended ok); a group none of whose trials has one has no winner."""
    best: dict[str, tuple[float, list[str]]] = {}
    for group, overrides, row in results:
        try:
            value = float(row.get(objective) or "nan")
        except ValueError:
            continue
        if row.get("status") == "ok" and math.isfinite(value) and (group not in best or value < best[group][0]):
            best[group] = (value, overrides)
    return {group: overrides for group, (_, overrides) in best.items()}


class TuningSweeper(Sweeper):
    def __init__(
        self,
        params: Mapping | None = None,
        space: Mapping | None = None,
        objective: str = "wall_to_target_s",
        repeats: Sequence[int] = (),
        max_batch_size: int | None = None,
    ) -> None:
        super().__init__()
        self.params = dict(params or {})
        self.space = {k: [dict(p) for p in v] for k, v in (space or {}).items()}
        self.objective, self.repeats, self.max_batch_size = objective, list(repeats), max_batch_size

    def setup(self, *, hydra_context, task_function, config) -> None:
        from hydra.core.plugins import Plugins  # as Hydra's BasicSweeper: plugins are found when a sweep starts

        self.config = config
        self.launcher = Plugins.instance().instantiate_launcher(
            hydra_context=hydra_context, task_function=task_function, config=config
        )

    def launch(self, trials: list[list[str]], first: int) -> list:
        returns = []
        size = self.max_batch_size or len(trials) or 1
        for i in range(0, len(trials), size):
            batch = trials[i : i + size]
            returns += list(self.launcher.launch(batch, initial_job_idx=first + i))
        for r in returns:
            _ = r.return_value  # a job that raised raises here, as Hydra's BasicSweeper does
        return returns

    def sweep(self, arguments: list[str]) -> list:
        sweep_dir = Path(self.config.hydra.sweep.dir)
        sweep_dir.mkdir(parents=True, exist_ok=True)
        OmegaConf.save(self.config, sweep_dir / "multirun.yaml")
        search = expand(self.params, self.space, arguments)
        returns = self.launch([overrides for _, overrides in search], 0)
        rows = [
            (group, overrides, (r.return_value or {}).get("row") or {})
            for (group, overrides), r in zip(search, returns)
        ]
        won = winners(rows, self.objective)
        repeats = [
            [*(o for o in overrides if not o.startswith(("tuning=", "seed="))), "tuning=repeat", f"seed={seed}"]
            for overrides in won.values()
            for seed in self.repeats
        ]
        # the jobs' "i of n" and the summary's trials: exact now that the winners are known
        add_trials(sweep_dir, repeats, len(search) + len(repeats))
        groups = len({group for group, _ in search})
        print(
            f"bench: search done: {len(won)} of {groups} group(s) reached the target; {len(repeats)} trial(s) "
            "repeat the winners",
            flush=True,
        )
        return [returns, self.launch(repeats, len(search))]
