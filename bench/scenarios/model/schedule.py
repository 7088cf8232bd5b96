"""When a trial evaluates: every `eval_every` timed steps; with `eval_resolution` f, also in between while
`eval_every` steps would be more than the fraction f of the step count (warm-up included), so the step a target was
first met at is known within f of it: every step up to about 1/f steps, then at least every f-th part of the count.
A fixed interval of 20 knows a count of 21 only as one in 1-21 and one of 1,001 within 2%; with f = 0.1 both are
known within 10%, for about 35 more evaluations in the first 200 steps. Every evaluation of `eval_every` alone still
happens, so a finer schedule can only meet a target at the same evaluation or an earlier one."""

from __future__ import annotations

import math


def next_evaluation(done: int, every: int, resolution: float = 0.0, warmup: int = 0) -> int:
    """The timed step (counted from 1) of the next evaluation after one at `done` timed steps (0: none yet)."""
    regular = (done // every + 1) * every
    if not resolution:
        return regular
    # the next count N at most the last P / (1 - f): then N - P <= f N, and the first step at the target lies in
    # [P + 1, N]; the small epsilon keeps 9 / 0.9 from rounding down to 9.999...
    fine = math.floor((warmup + done) / (1 - resolution) + 1e-9) - warmup
    return min(regular, max(done + 1, fine))


def previous_evaluation(step: int, every: int, resolution: float = 0.0, warmup: int = 0) -> int:
    """The timed step of the last scheduled evaluation before timed step `step` (0 where there was none): where a
    target met at `step` was last seen unmet."""
    done = 0
    while (n := next_evaluation(done, every, resolution, warmup)) < step:
        done = n
    return done
