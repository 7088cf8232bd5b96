"""When a trial has met its target (cfg.target), and what it cost to. The target is checked at each held-out
evaluation and is met once `target.hold` evaluations in a row are at or past its value: a held-out accuracy near
its target crosses it by chance and falls back (one example of 128 is 0.8 points), and a count made at a crossing
that does not hold measures the sample, not the training. The count is the first evaluation of the run that
held: the model was there then; the evaluations after it only verify that it stayed. The trial stops at the
run's last evaluation. `target.levels`, easier values, are recorded on the way by the same rule."""

from __future__ import annotations

from dataclasses import dataclass, field

from bench.config import BenchConfig


@dataclass
class Held:
    """One value's rule: met once `hold` evaluations in a row meet it, at the first of them."""

    value: float
    hold: int
    run: list[tuple[int, float]] = field(default_factory=list)  # the evaluations in a row so far: (step, seconds)
    reached: tuple[int, float] | None = None  # (timed step index, Clock.training_s) of the run's first evaluation

    def see(self, met: bool, step: int, wall_s: float) -> None:
        if self.reached is None:
            self.run = [*self.run, (step, wall_s)] if met else []
            if len(self.run) >= self.hold:
                self.reached = self.run[0]


class Target:
    """Cost to a target: whether the trial ends at an evaluation, and its columns: steps and samples (warm-up
    steps included: they train too), the steps' own time (the first, compiling step counted at the median step),
    the wall time from the compilation to the held run's first evaluation less the evaluations' own (Clock), and
    the target's status: reached, not_reached (at the step cap), or capped (a tuning trial past the steps its
    group's best took, cfg.tune_stop_after: it can no longer win)."""

    def __init__(self, cfg: BenchConfig):
        t = cfg.target
        self.metric, self.warmup = t.metric, cfg.warmup_steps
        self.stop_after, self.max_steps = cfg.tune_stop_after, t.max_steps
        self.main = Held(t.value, t.hold)
        self.levels = [Held(v, t.hold) for v in sorted(t.levels, reverse=t.metric == "eval_loss")]  # easiest first
        self.capped = False

    @property
    def reached(self) -> tuple[int, float] | None:
        return self.main.reached

    def count(self, step: int) -> int:
        """The steps a timed step index stands for, warm-up included."""
        return self.warmup + step + 1

    def met(self, evaluation: tuple[float, float], value: float) -> bool:
        loss, accuracy = evaluation
        return meets(self.metric, accuracy if self.metric == "eval_accuracy" else loss, value)

    def check(self, evaluation: tuple[float, float], step: int, wall_s: float) -> bool:
        """Whether the trial ends at this evaluation (`wall_s`: the clock's training seconds so far): the target
        held, or it is capped. Capped: past the step its group's best met it at (and short of the step cap, where it
        would end not_reached anyway) with no run under way that began by then: a run begun at that very
        evaluation ties, so it runs on until it holds or breaks."""
        if self.metric is None or self.main.reached is not None or self.capped:
            return False
        for held in (*self.levels, self.main):
            held.see(self.met(evaluation, held.value), step, wall_s)
        if self.main.reached is not None:
            return True
        began = self.count(self.main.run[0][0]) if self.main.run else None
        if self.stop_after is not None and self.stop_after <= self.count(step) < self.max_steps:
            self.capped = began is None or began > self.stop_after
        return self.capped

    def columns(self, warm: list[float], times: list[float], samples_per_step: int) -> dict:
        if self.metric is None:
            return {}
        levels = {"levels_to_target": self.levels_cell()} if self.levels else {}
        if self.reached is None:
            return {"target_status": "capped" if self.capped else "not_reached", **levels}
        step, wall = self.reached
        steps = self.count(step)
        own = sorted(times)[len(times) // 2] + sum(warm[1:]) + sum(times[: step + 1])  # first step at the median
        return {
            "target_status": "reached",
            "steps_to_target": steps,
            "samples_to_target": steps * samples_per_step,
            "seconds_to_target": own,
            "wall_to_target_s": wall,
            **levels,
        }

    def levels_cell(self) -> str:
        """Each level's steps, then the target's: "0.3:40;0.35:;0.4:120" (no steps: not held by the trial's end)."""
        return cell((*self.levels, self.main), self.count)


def meets(metric: str, measured: float, value: float) -> bool:
    """An accuracy at or above its value, a loss at or below."""
    return measured >= value if metric == "eval_accuracy" else measured <= value


def cell(held: tuple[Held, ...], count) -> str:
    return ";".join(f"{h.value:g}:{count(h.reached[0]) if h.reached else ''}" for h in held)


def replay_levels(evaluations: list[float | None], values: list[float], metric: str, hold: int, warmup: int) -> str:
    """The levels_to_target cell a trial would have written had `values` been its target.levels, from its kept
    evaluation history (one entry per timed step, None where it did not evaluate), by the rule Target applies.
    Exact for any level at or below a reached target: the trial ran until the target held, and each easier level
    held by then; a level past the target is known only as far as the trial ran."""
    held = tuple(Held(x, hold) for x in values)
    for step, v in enumerate(evaluations):
        if v is not None:
            for h in held:
                h.see(meets(metric, v, h.value), step, 0.0)
    return cell(held, lambda step: warmup + step + 1)


def parse_levels(cell: str | None) -> list[tuple[float, int | None]]:
    """A levels_to_target cell read back: [(value, steps or None where it never held)], as written; a damaged pair
    (a hand-edited CSV) is left out, so a report prices the rest."""
    out = []
    for pair in str(cell or "").split(";"):
        value, _, steps = pair.partition(":")
        try:
            out.append((float(value), int(float(steps)) if steps.strip() else None))
        except ValueError:
            continue
    return out
