"""What fits: the largest batch (or sequence length) each way of differentiating runs in a memory budget.

    python -m bench capacity budget_mb=1536 framework=torch,jax mode=inference,backprop,jvp,mezo model=minilm_l6
    python -m bench capacity --search seq_len budget_mb=1536 batch_size=4 ...
    python -m bench capacity +experiment=what_fits

Every combination of the overrides (a,b lists sweep, as with `python -m bench -m`) is searched on its own. A probe
is a real trial, isolated and recorded like any other (a runs.csv row: ok, or oom when it did not fit) under the
budget, enforced for real: on CUDA by the framework's own allocator limit (torch's per-process memory fraction,
XLA_PYTHON_CLIENT_MEM_FRACTION), on the CPU by the host-memory watchdog on the trial process's RSS (which holds the
interpreter, the framework and the weights too: the budget is the whole process's). The search:

  1. probe the start value (1); if it does not fit, the result is "does not fit";
  2. probe twice that; fit memory as affine in the value (peak = a + b x) through the two, and probe the value
     it predicts just fits;
  3. from then on the largest value that fitted and the smallest that did not bracket the answer: probe the
     prediction when it falls inside the bracket, else its middle, until they are adjacent. Values double while
     nothing has failed yet, up to the limit (seq_len: the model's max positions; batch: data.num_train).

A search ends within --max-probes probes (default 12: two to start, then about log2 of the bracket).

A ladder (`--ladder F`, `ladder()`) is the sweep up to what fits: it probes start, F x start, F^2 x start, ... up to
the limit and stops at the first rung that does not fit, so every rung is a measured trial (the shape sweep,
conf/experiment/shapes.yaml) and the answer, the largest rung that fits, is known within a factor of F. The result
per combination goes to capacity.csv beside runs.csv (columns.py): the largest value that fitted, its peak memory,
step time and tokens/s, the number of probes and their run ids. The command that runs the probes is run.py.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field

SEARCHES = ("batch_size", "seq_len")
MAX_PROBES = 12
OUT_OF_MEMORY = ("oom", "over")  # what a probe that does not fit the budget ends as


@dataclass(frozen=True)
class Probe:
    value: int
    status: str  # ok | oom | over (ran, but its peak passed the budget) | error | crashed | timeout
    peak_mb: float | None
    run_id: str
    row: dict = field(default_factory=dict, compare=False)

    @property
    def fits(self) -> bool:
        return self.status == "ok"


@dataclass
class Search:
    probes: list[Probe]
    best: Probe | None  # the largest value that fitted
    # fits | fits at the limit | does not fit | undecided (probes spent) | failed (a probe errored); a ladder's
    # largest rung (the next rung did not fit) in place of fits
    verdict: str


def search(
    probe: Callable[[int], Probe], budget_mb: float, start: int = 1, limit: int = 1 << 20, max_probes: int = MAX_PROBES
) -> Search:
    """The largest value in [start, limit] whose probe fits, by prediction then bisection (module docstring).
    `probe(value)` runs one trial; a probe that neither fits nor runs out of memory ends the search as failed."""
    probes: list[Probe] = []

    def run(value: int) -> Probe:
        p = probe(value)
        probes.append(p)
        return p

    first = run(start)
    if not first.fits:
        return Search(probes, None, "does not fit" if first.status in OUT_OF_MEMORY else "failed")
    lo, hi = first, None  # largest fitted, smallest that did not
    while len(probes) < max_probes and (hi is None or hi.value > lo.value + 1):
        if hi is None and lo.value >= limit:
            return Search(probes, lo, "fits at the limit")
        nxt = next_value(probes, lo, hi, budget_mb, limit)
        p = run(nxt)
        if p.fits:
            lo = p if p.value > lo.value else lo
        elif p.status in OUT_OF_MEMORY:
            hi = p if hi is None or p.value < hi.value else hi
        else:
            return Search(probes, lo, "failed")
    if hi is not None and hi.value == lo.value + 1:
        return Search(probes, lo, "fits")
    return Search(probes, lo, "undecided")


def next_value(probes: list[Probe], lo: Probe, hi: Probe | None, budget_mb: float, limit: int) -> int:
    """The next value to probe: the affine prediction where it falls inside the bracket, else the bracket's
    middle (or, while nothing failed, twice the largest fitted)."""
    top = hi.value - 1 if hi is not None else limit
    fitted = sorted({p.value: p for p in probes if p.fits and p.peak_mb is not None}.values(), key=lambda p: p.value)
    guess = None
    if len(fitted) >= 2:
        (x0, y0), (x1, y1) = (fitted[-2].value, fitted[-2].peak_mb), (fitted[-1].value, fitted[-1].peak_mb)
        slope = (y1 - y0) / (x1 - x0)
        if slope > 0:
            guess = math.floor(x1 + (budget_mb - y1) / slope)
    if guess is None or not lo.value < guess <= top:
        guess = (lo.value + top + 1) // 2 if hi is not None else min(top, 2 * lo.value)
    if guess == lo.value and hi is None:  # the limit
        guess = top
    return max(lo.value + 1, min(top, guess))


LARGEST_RUNG = "largest rung"  # a ladder's verdict where search()'s would be "fits": the next rung did not


def ladder(
    probe: Callable[[int], Probe], factor: int, start: int = 1, limit: int = 1 << 20, max_probes: int = MAX_PROBES
) -> Search:
    """Every rung start x factor^k up to `limit`, smallest first, until one does not fit (module docstring).
    `probe(value)` runs one trial; a probe that neither fits nor runs out of memory ends the ladder as failed."""
    probes: list[Probe] = []
    value = start
    while True:
        p = probe(value)
        probes.append(p)
        if not p.fits:
            best = probes[-2] if len(probes) > 1 else None
            if p.status not in OUT_OF_MEMORY:
                return Search(probes, best, "failed")
            return Search(probes, best, LARGEST_RUNG if best is not None else "does not fit")
        value *= factor
        if value > limit:
            return Search(probes, p, "fits at the limit")
        if len(probes) == max_probes:
            return Search(probes, p, "undecided")
