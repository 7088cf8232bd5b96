"""Tuning with a fixed budget per mode, then the winners again at other seeds: the Hydra sweeper a cost-to-target
comparison runs with (conf/experiment/cost_to_target.yaml; `hydra/sweeper=bench_tuning`).

A method compared at a target is only as good as its tuning (forward-gradient claims did not survive backprop
with a tuned learning rate), so every way of differentiating gets the same number of trials, as AlgoPerf's
external tuning gives every submission the same studies of the same number of trials:

    hydra:
      sweeper:
        params: {framework: "torch,jax", case: "backprop,jvp,mezo"}   # what is compared (a grid, as Hydra's own)
        space:                                                         # per case (or mode): a grid of points or
          backprop: [{optimizer.lr: 0.01}, {optimizer.lr: 0.03}, ...]  # knobs to draw points from, every case
          mezo: {sample: 3, knobs: {optimizer.lr: {low: 1.0e-4, high: 1.0e-2}, mezo.eps: 1.0e-3}}  # the same count
        studies: 2                                                     # independent searches per group
        objective: wall_to_target_s                                    # a column of the row: lower is better
        repeats: [1, 2]                                                # seeds each study's winner runs again with
        budget: 5                                                      # trials per group and study, all counted
        capping: true                                                  # stop a point once it cannot win
        confirm: [4]                                                   # a point's cost: its worst with these
        stop_at_miss: true                                             # a group's descent ends at its first miss

The spaces, the studies and their seeds: bench/harness/tuning_space.py. A group is a combination of `params` in
one study (`tune_group`, `tune_study` on every row), and `budget` bounds every trial it runs: its points, the
points beyond them, its confirming trials (the winner's repeats are its cost, not its search). A case's space may
be placed by the trained dimension d (`scale: 1/d`): a one-direction estimate's variance grows about as d, so its
stable learning rate falls about as 1/d. A search brackets its learning rate from both sides: where every point
of a group diverged it goes on below, and where its best point is its highest learning rate, above, a point at a
time at its points' spacing, while the group has trials left past those its confirming seeds need.

With `capping`, phase one runs each group's points in rounds, from its highest learning rate down (the ones that
diverge end at once; the first stable one is likely the fastest), and a point runs only as far as its group's best
so far took to reach the target (`tune_stop_after`; its row says `capped`): past that step it can no longer win.
This is ParamILS's adaptive capping for a cost to a target: with the steps as objective the winners are exactly the
full grid's (a point's trajectory does not depend on when it stops), and with a time as objective too while a
group's points run the same step (they differ in the learning rate only); what it saves is the steps of the
points that would have gone on to the cap.

With `stop_at_miss` (and capping), a group's descent also ends at its first point below one that reached the
target which misses its cap: a smaller step learns no faster, so the points below it would miss that cap too. It
is a line search's rule, and it assumes what the full grids have measured (no point below a miss has ever reached
sooner); it saves the points that would each run to the cap. A point so skipped runs later only if the bound it
was skipped at rises (a winner that falls at a confirming seed) and the point above it reaches within the new one.

Phase one runs every point of every group (`tuning=search`); phase two runs each group's winner, the point with
the smallest objective among the trials that reached it (points that tie: the middle learning rate among them,
`best_of`), at every seed of `repeats` (`tuning=repeat`). With `confirm`, a point's cost is its worst over the
search's seed and those seeds (`tuning=confirm` trials; `confirming`). A group that no point brought to the target
within its budget has no winner, and is not repeated. A mode's cost is the median over its studies of each
winner's cost at the repeats' seeds (the report's). Both phases go through the configured launcher.

Why not hydra-optuna-sweeper: the budgets here are a handful of points per mode, where a TPE sampler has nothing
to learn from; quasi-random points (or a grid) are the same for every mode and framework (fair), run in parallel,
and are the same on every rerun. Optuna's sweeper tunes one study per launch, across every swept key at once, so
it would share the budget between modes instead of giving each its own.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TypeVar

from hydra.plugins.sweeper import Sweeper
from omegaconf import OmegaConf

from bench.config import MAX_STUDIES
from bench.errors import ConfigError
from bench.harness.plan import add_trials, read_plan
from bench.harness.tuning_space import LR, STUDY_SEEDS, Group, expand, study_seed, trained_params
from bench.spec import MAX_SEED

# What picks a winner: a cost to the target, lower is better (each a column of scenario=model's rows)
OBJECTIVES = ("wall_to_target_s", "seconds_to_target", "steps_to_target", "samples_to_target", "mib_s_to_target")


# A group's trials: far past any grid (the experiments' run 3-7 points), short of a descent that a group whose every
# point diverges would take a decade at a time until killed.
MAX_BUDGET = 1000
EXTEND_STEP = 0.1  # below a grid of one point, the next is a decade lower
T = TypeVar("T")


def check_tuning(
    objective, repeats, budget=None, confirm=(), capping=False, stop_at_miss=False, studies=1, seed=0
) -> None:
    """Before any trial: the objective is a cost the rows carry, the repeats and the confirming seeds are seeds
    (none of them both: a winner's cost comes from seeds its choice did not use), the budget a number of trials,
    the studies a count whose seeds stay apart (every seed named below STUDY_SEEDS), stop_at_miss only with capping
    (its misses are capped points) (ConfigError, one line)."""
    if stop_at_miss and not capping:
        raise ConfigError(
            "hydra.sweeper.stop_at_miss=true: needs hydra.sweeper.capping=true (a group's descent ends at a point "
            "that misses its cap)"
        )
    if budget is not None and (
        isinstance(budget, bool) or not isinstance(budget, int) or not 1 <= budget <= MAX_BUDGET
    ):
        raise ConfigError(
            f"hydra.sweeper.budget={budget}: accepted an integer in [1, {MAX_BUDGET:,}], the trials each group's "
            "study may run (its points, the points beyond them, its confirming trials)"
        )
    if isinstance(studies, bool) or not isinstance(studies, int) or not 1 <= studies <= MAX_STUDIES:
        raise ConfigError(
            f"hydra.sweeper.studies={studies}: accepted an integer in [1, {MAX_STUDIES}], the independent searches "
            "per group, each with the same budget"
        )
    if objective not in OBJECTIVES:
        raise ConfigError(
            f"hydra.sweeper.objective={objective}: accepted {' | '.join(OBJECTIVES)} (a cost to the "
            "target: the lowest wins)"
        )
    for name, value, what in (
        ("repeats", repeats, "each winner runs again with"),
        ("confirm", confirm, "a point's search cost is also its worst over"),
    ):
        seeds = list(value) if isinstance(value, (list, tuple)) else None
        if seeds is None or any(isinstance(s, bool) or not isinstance(s, int) or not 0 <= s < MAX_SEED for s in seeds):
            raise ConfigError(
                f"hydra.sweeper.{name}={value}: accepted a list of seeds, integers in [0, 2^63), that {what}"
            )
        if studies > 1 and (far := [s for s in (*seeds, seed) if s >= STUDY_SEEDS]):
            option = f"hydra.sweeper.{name}={value}" if far[0] in seeds else f"seed={seed}"
            raise ConfigError(
                f"{option}: with hydra.sweeper.studies={studies}, accepted seeds in [0, {STUDY_SEEDS}) (study k "
                f"runs each at seed + {STUDY_SEEDS} k: no two studies share one)"
            )
    if both := sorted(set(repeats) & set(confirm)):
        raise ConfigError(
            f"hydra.sweeper.confirm={list(confirm)}: seed {both[0]} is also in repeats; accepted: seeds apart from "
            "the repeats' (a winner's cost comes only from seeds that did not choose it)"
        )
    if seed in (*repeats, *confirm):
        raise ConfigError(
            f"seed={seed}: the search's seed is also in hydra.sweeper.repeats or confirm; accepted: a seed apart "
            "from theirs (a winner's cost comes only from seeds that did not choose it)"
        )


def lr_of(overrides: Sequence[str]) -> float | None:
    """The learning rate a trial's overrides set (the last one wins, as in Hydra), or None."""
    values = [o.split("=", 1)[1] for o in overrides if o.startswith(f"{LR}=")]
    return float(values[-1]) if values else None


def spacing(lrs: Sequence[float]) -> float:
    """The ratio between a search's neighbouring learning rates on average (a grid's own spacing; 1 / EXTEND_STEP
    for a single point): how far beyond them an extension goes."""
    lrs = sorted(lrs)
    return (lrs[-1] / lrs[0]) ** (1 / (len(lrs) - 1)) if len(lrs) > 1 and lrs[-1] > lrs[0] else 1 / EXTEND_STEP


def by_group(results: list[tuple[Group, list[str], dict]]) -> dict[Group, list[tuple[list[str], dict]]]:
    """Each group's trials so far: (overrides, row), in the order they ran."""
    trials: dict = {}
    for group, overrides, row in results:
        trials.setdefault(group, []).append((overrides, row))
    return trials


def moved(overrides: Sequence[str], lr: float) -> list[str]:
    """A trial's overrides at another learning rate, uncapped (a cap is the round's to set)."""
    return [
        f"{LR}={lr:.3g}" if o.startswith(f"{LR}=") else o for o in overrides if not o.startswith("tune_stop_after=")
    ]


def below(results: list[tuple[Group, list[str], dict]], budget: int | None, reserve: int = 0) -> list:
    """The search's next trials: for each group (in a study) every one of whose trials diverged and that has
    trials left in `budget` less `reserve` (its confirming trials), one point below its lowest learning rate, a
    spacing of its points below it, its other overrides the lowest point's. A group where any trial did not diverge
    has bracketed a stable learning rate: nothing is added."""
    out = []
    for group, tried in by_group(results).items():
        lrs = sorted({lr_of(o) for o, _ in tried if lr_of(o) is not None})
        if budget is None or len(tried) >= budget - reserve or not lrs:
            continue
        if all(r.get("status") == "diverged" for _, r in tried):
            lowest = next(o for o, _ in tried if lr_of(o) == lrs[0])
            out.append((group, moved(lowest, lrs[0] / spacing(lrs))))
    return out


def above(results: list[tuple[Group, list[str], dict]], objective: str, budget: int | None, reserve: int = 0) -> list:
    """The other side: for each group (in a study) whose best point so far is its highest learning rate (the top
    edge: nothing above it was tried, so nothing above it is known to diverge) and that has trials left in `budget`
    less `reserve`, one point a spacing above the best, its other overrides the best's."""
    won = winners(results, objective)
    out = []
    for group, tried in by_group(results).items():
        lrs = sorted({lr_of(o) for o, _ in tried if lr_of(o) is not None})
        if budget is None or len(tried) >= budget - reserve or group not in won or not lrs:
            continue
        if lr_of(won[group]) == lrs[-1]:
            out.append((group, moved(won[group], lrs[-1] * spacing(lrs))))
    return out


def rounds(search: list[tuple[str, list[str]]]) -> list[list[tuple[str, list[str]]]]:
    """Phase one's trials in capping's rounds: round k holds the k-th point of every group that has one, each
    group's points from its highest learning rate down (those without one after, in their order)."""
    groups: dict[str, list[list[str]]] = {}
    for group, overrides in search:
        groups.setdefault(group, []).append(overrides)
    for points in groups.values():
        points.sort(key=lambda o: -(lr_of(o) or -math.inf))
    depth = max((len(p) for p in groups.values()), default=0)
    return [[(g, p[k]) for g, p in groups.items() if k < len(p)] for k in range(depth)]


def reached(row: dict) -> bool:
    """The trial ended ok and met its target."""
    return row.get("status") == "ok" and row.get("target_status") == "reached"


def incumbents(results: list[tuple[str, list[str], dict]]) -> dict[str, int]:
    """Each group's best so far in steps: the fewest steps to the target among its trials that reached it (ended
    ok); what capping stops the group's next points at."""
    best: dict[str, int] = {}
    for group, _, row in results:
        if reached(row):
            steps = int(float(row["steps_to_target"]))
            best[group] = min(best.get(group, steps), steps)
    return best


def next_round(
    results: list[tuple[str, list[str], dict]],
    trials: list[tuple[str, list[str]]],
    objective: str,
    stop_at_miss: bool = False,
) -> list[tuple[str, list[str]]]:
    """A capped round's trials as they run: each stopped at its group's best so far (`tune_stop_after`), and with
    stop_at_miss, those below a miss (below_a_miss at that bound) left out."""
    best = incumbents(results)
    if stop_at_miss:
        known = known_points(results, objective)
        trials = [
            (g, o) for g, o in trials if not below_a_miss(known.get(g, {}).values(), lr_of(o), best.get(g, math.inf))
        ]
    return [(g, [*o, f"tune_stop_after={best[g]}"] if g in best else o) for g, o in trials]


def best_of(candidates: Sequence[T], cost: Callable[[T], float], lr: Callable[[T], float | None]) -> T | None:
    """The candidate with the lowest cost. Points that tie (steps to the target come in whole evaluations, so a
    grid's neighbours often do) go to the middle learning rate among them, the lower of the two middle ones for an
    even count: the tied point farthest from both edges, divergence above and slowness below, so the one most likely
    to hold at fresh seeds. The sweeper and the report choose with this one rule."""
    if not candidates:
        return None
    low = min(cost(c) for c in candidates)
    tied = [c for c in candidates if cost(c) == low]
    if len(tied) == 1 or any(lr(c) is None for c in tied):
        return tied[0]
    return sorted(tied, key=lr)[(len(tied) - 1) // 2]


def winners(results: list[tuple[str, list[str], dict]], objective: str) -> dict[str, list[str]]:
    """Each group's winning overrides: best_of its trials that have a value of the objective (reached the
    target, ended ok); a group none of whose trials has one has no winner."""
    costs: dict[str, list[tuple[float, list[str]]]] = {}
    for group, overrides, row in results:
        if row.get("status") == "ok" and math.isfinite(value := cost_of(row, objective)):
            costs.setdefault(group, []).append((value, overrides))
    return {group: best_of(c, lambda v: v[0], lambda v: lr_of(v[1]))[1] for group, c in costs.items()}


def cost_of(row: dict, objective: str) -> float:
    """The row's value of the objective; nan where it has none (not reached, or a column it predates)."""
    try:
        return float(row.get(objective) or "nan")
    except ValueError:
        return math.nan


PER_TRIAL = ("tuning=", "seed=", "tune_stop_after=")  # what the sweeper adds to a point's overrides per trial


def point_of(overrides: Sequence[str]) -> list[str]:
    """A trial's point: its overrides less the sweeper's per-trial ones (its phase, seed and cap)."""
    return [o for o in overrides if not o.startswith(PER_TRIAL)]


@dataclass
class Known:
    """What a group's trials say of one point: its worst objective and steps over the seeds it has reached at (the
    search's and the confirming ones; a miss is inf), the confirming seeds it has run, and the most steps it is
    known to miss by at the search's seed (for a point the search only ever capped, the largest step it was capped
    at)."""

    point: list[str]
    worst: float = -math.inf
    steps: float = -math.inf
    seeds: set = field(default_factory=set)
    reached: bool = False
    missed: float = 0  # the most steps by which it is known not to reach at the search's seed (inf: not at all)
    unrun: bool = False  # a point of the grid with no trial yet (stop_at_miss skipped it)


def known_points(
    results: list[tuple[str, list[str], dict]], objective: str, grid: Mapping[str, list[list[str]]] | None = None
) -> dict[str, dict[tuple, Known]]:
    """Per group, what its trials say of each point (Known), and each point of `grid` (its search's points) that
    has no trial yet, unrun."""
    groups: dict[str, dict[tuple, Known]] = {}
    for group, overrides, row in results:
        p = point_of(overrides)
        k = groups.setdefault(group, {}).setdefault(tuple(p), Known(p))
        confirm = "tuning=confirm" in overrides
        if confirm:
            k.seeds.add(str(row.get("seed")))
        elif row.get("status") == "ok" and not reached(row):
            k.missed = max(k.missed, int(stop) if (stop := stop_after(overrides)) else math.inf)
        if not confirm and row.get("status") == "ok" and row.get("target_status") == "capped":
            continue  # known to miss by its cap (missed), nothing of its cost
        done = reached(row) and math.isfinite(cost_of(row, objective))
        k.reached |= done and not confirm
        k.worst = max(k.worst, cost_of(row, objective) if done else math.inf)
        k.steps = max(k.steps, float(row["steps_to_target"]) if done else math.inf)
    for group, points in (grid or {}).items():
        for p in points:
            groups.setdefault(group, {}).setdefault(tuple(p), Known(list(p), unrun=True))
    return groups


def stop_after(overrides: Sequence[str]) -> str | None:
    """The cap a trial's overrides set (tune_stop_after), or None."""
    return next((o.split("=", 1)[1] for o in overrides if o.startswith("tune_stop_after=")), None)


def below_a_miss(known: Iterable[Known], lr: float | None, bound: float) -> bool:
    """stop_at_miss: a point at learning rate lr is known not to reach the target within `bound` steps at the
    search's seed, since a point above it and below one that reached missed by then (at bound or past it): below
    the stable edge a smaller step learns no faster."""
    lrs = [(x, k) for k in known if (x := lr_of(k.point)) is not None]
    top = max((x for x, k in lrs if k.reached), default=None)
    return lr is not None and top is not None and any(lr < x < top and k.missed >= bound for x, k in lrs)


def confirming(
    results: list[tuple[str, list[str], dict]],
    objective: str,
    seeds: Sequence[int],
    capping: bool = False,
    grid: Mapping[str, list[list[str]]] | None = None,
    budget: int | None = None,
) -> tuple[dict[str, list[str]], list[tuple[str, list[str]]]]:
    """With `confirm` seeds a point's cost is its worst over the search's seed and those seeds (a miss at any is
    inf), and the lowest wins: the search's seed alone picks points at the edge of stability (backprop with LoRA
    reaches the target at a learning rate that stalls at other seeds). Branch and bound on what the rows know, per
    group: the point with the lowest cost so far that lacks a confirming seed runs at it (`tuning=confirm`; with
    `capping`, stopped at the best confirmed point's steps: past them its worst can no longer win, so a capped
    confirming trial counts as a miss), best first; then a point the search capped short of the best confirmed
    point's steps (its cap came from a point since found worse) runs again capped at them (uncapped while nothing
    is confirmed), the highest learning rate first, one at a time; with `grid` (stop_at_miss: each group's search
    points) so does a point the search skipped, unless a point above it missed by those steps (below_a_miss);
    when neither is left, or the next trials would take the group past `budget` (its trials so far, the search's
    included: confirming counts in the budget every mode gets), the best confirmed point (ties as best_of) wins. A
    study k > 0's group (Group) confirms at each seed + STUDY_SEEDS k and runs its points again at its own search
    seed. Returns (the winners, each as its point; the trials to run next)."""
    groups = known_points(results, objective, grid)
    spent = Counter(group for group, _, _ in results)
    won, todo = {}, []
    for group, known in groups.items():
        lr = lambda k: lr_of(k.point)  # noqa: E731
        want = {str(study_seed(s, group.study if isinstance(group, Group) else 0)) for s in seeds}
        confirmed = [k for k in known.values() if k.reached and want <= k.seeds and math.isfinite(k.worst)]
        best = best_of(confirmed, lambda k: k.worst, lr)
        bound, steps = (best.worst, best.steps) if best else (math.inf, math.inf)
        pending = [k for k in known.values() if k.reached and not want <= k.seeds and k.worst < bound]
        capped = [
            k
            for k in known.values()
            if not k.reached
            and k.worst == -math.inf
            and (0 < k.missed or k.unrun)
            and k.missed < steps
            and not (grid is not None and below_a_miss(known.values(), lr(k), steps))
        ]
        cap = [f"tune_stop_after={int(steps)}"] if math.isfinite(steps) else []
        study, at = (group.study, group.seed) if isinstance(group, Group) else (0, None)
        step = []
        if nxt := best_of(pending, lambda k: k.worst, lr):
            bounded = cap if capping else []
            step = [
                (group, [*nxt.point, "tuning=confirm", f"seed={study_seed(s, study)}", *bounded])
                for s in seeds
                if str(study_seed(s, study)) not in nxt.seeds
            ]
        elif capped:
            k = max(capped, key=lambda k: lr(k) or -math.inf)
            step = [(group, [*k.point, "tuning=search", *([f"seed={at}"] if at is not None else []), *cap])]
        if step and (budget is None or spent[group] + len(step) <= budget):
            todo += step
        elif best is not None:  # nothing left to learn, or no trials left to learn it with: the best confirmed
            won[group] = best.point
    return won, todo


def repeating(won: Mapping[Group, list[str]], seeds: Sequence[int]) -> list[list[str]]:
    """Phase two: each study's winner at every seed of `repeats`, study k's at seed + STUDY_SEEDS k (`tuning=repeat`):
    its cost, from seeds that did not choose it."""
    return [
        [*point_of(overrides), "tuning=repeat", f"seed={study_seed(seed, group.study)}"]
        for group, overrides in won.items()
        for seed in seeds
    ]


def mode_of(overrides: Sequence[str]) -> str:
    """The case (or mode) a trial's overrides name: what a budget is per."""
    choices = dict(o.split("=", 1) for o in overrides if "=" in o)
    return choices.get("case") or choices.get("+case") or choices.get("mode") or "?"


def trials_per_mode(results: list[tuple[Group, list[str], dict]]) -> dict[str, int]:
    """Every trial each mode's tuning ran (search, the points beyond a grid, confirming), over its groups and
    studies: the budgets, as spent."""
    return dict(Counter(mode_of(overrides) for _, overrides, _ in results))


class TuningSweeper(Sweeper):
    def __init__(
        self,
        params: Mapping | None = None,
        space: Mapping | None = None,
        objective: str = "wall_to_target_s",
        repeats: Sequence[int] = (),
        budget: int | None = None,
        capping: bool = False,
        confirm: Sequence[int] = (),
        stop_at_miss: bool = False,
        studies: int = 1,
        max_batch_size: int | None = None,
    ) -> None:
        super().__init__()
        self.params = dict(params or {})
        self.space = OmegaConf.to_container(space, resolve=True) if OmegaConf.is_config(space) else dict(space or {})
        self.objective, self.repeats, self.max_batch_size = objective, list(repeats), max_batch_size
        self.budget, self.capping, self.confirm, self.stop_at_miss = budget, capping, list(confirm), stop_at_miss
        self.studies = studies

    def setup(self, *, hydra_context, task_function, config) -> None:
        from hydra.core.plugins import Plugins  # as Hydra's BasicSweeper: plugins are found when a sweep starts

        self.config, self.config_loader = config, hydra_context.config_loader
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
        dimension = lambda combo: trained_params(self.config_loader.load_sweep_config(self.config, combo))  # noqa: E731
        reserve = len(self.confirm)  # a study's extensions leave room to confirm a point
        search = expand(
            self.params, self.space, arguments, dimension, self.budget, self.studies, reserve, self.config.seed
        )
        batches, rows = [], []

        def run(trials: list[tuple[Group, list[str]]], total: int | None) -> None:
            if total is not None:  # the jobs' "i of n" and the summary's configurations
                add_trials(sweep_dir, [o for _, o in trials], total)
            batches.append(self.launch([o for _, o in trials], len(rows)))
            rows.extend((g, o, (r.return_value or {}).get("row") or {}) for (g, o), r in zip(trials, batches[-1]))

        grid = None  # stop_at_miss: each group's search points; those its descent skipped run later if they can win
        if self.stop_at_miss:
            grid = {}
            for group, overrides in search:
                grid.setdefault(group, []).append(point_of(overrides))
        for trials in rounds(search) if self.capping else [search]:
            trials = next_round(rows, trials, self.objective, self.stop_at_miss)
            if capped := [o for _, o in trials if stop_after(o)]:  # configurations of their own: the summary's too
                add_trials(sweep_dir, capped, read_plan(sweep_dir).get("total"))
            run(trials, None)
        groups = len({group for group, _ in search})
        most = lambda extra: len(rows) + len(extra) + groups * len(self.repeats)  # noqa: E731
        while extra := below(rows, self.budget, reserve):  # groups every point of which diverged: the points below
            print(f"bench: every point of {len(extra)} group(s) diverged: searching below them", flush=True)
            run(extra, most(extra))
        while extra := above(rows, self.objective, self.budget, reserve):  # best at the top edge: the points above
            print(f"bench: {len(extra)} group(s) best at their highest learning rate: searching above", flush=True)
            run(next_round(rows, extra, self.objective) if self.capping else extra, most(extra))
        won = winners(rows, self.objective)
        while self.confirm:  # a point's cost is its worst over the search's and the confirming seeds
            won, extra = confirming(rows, self.objective, self.confirm, self.capping, grid, self.budget)
            if not extra:
                break
            print(f"bench: confirming: {len(extra)} trial(s) (confirming seeds, or points capped short)", flush=True)
            run(extra, most(extra))
        repeats = repeating(won, self.repeats)
        # the jobs' "i of n" and the summary's trials: exact now that the winners are known
        add_trials(sweep_dir, repeats, len(rows) + len(repeats))
        spent = ", ".join(f"{mode} {n}" for mode, n in sorted(trials_per_mode(rows).items()))
        print(
            f"bench: search done: {len(won)} of {groups} group(s) reached the target; trials per mode, every one "
            f"its tuning ran: {spent}; {len(repeats)} trial(s) repeat the winners",
            flush=True,
        )
        return [*batches, self.launch(repeats, len(rows))]
