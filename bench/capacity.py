"""What fits: the largest batch (or sequence length) each way of differentiating runs in a memory budget.

    python -m bench.capacity budget_mb=1536 framework=torch,jax mode=inference,backprop,jvp,mezo model=minilm_l6
    python -m bench.capacity --search seq_len budget_mb=1536 batch_size=4 ...
    python -m bench.capacity +experiment=what_fits

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

A search ends within --max-probes probes (default 12: two to start, then about log2 of the bracket). The result
per combination goes to capacity.csv beside runs.csv: the largest value that fitted, its peak memory, step time
and tokens/s, the number of probes and their run ids.
"""

from __future__ import annotations

import math
import os
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path

from bench.capacity_report import CAPACITY_COLUMNS, capacity_table
from bench.config import LAUNCH_ID, launch_id, to_container
from bench.errors import ConfigError
from bench.preflight import compose_trials, preflight
from bench.runner import LAUNCHER_PID, run_job
from bench.sinks import CsvSink, read_rows
from bench.system import Interrupted, cuda_memory_mb, interrupts_raise
from bench.tables import OneLineParser, num

SEARCHES = ("batch_size", "seq_len")
MAX_PROBES = 12
OUT_OF_MEMORY = ("oom", "over")  # what a probe that does not fit the budget ends as
RESULTS_FILE = "capacity.csv"


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
    verdict: str  # fits | fits at the limit | does not fit | undecided (probes spent) | failed (a probe errored)


def search(probe: Callable[[int], Probe], budget_mb: float, start: int = 1, limit: int = 1 << 20,
           max_probes: int = MAX_PROBES) -> Search:  # fmt: skip
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


# ---------------------------------------------------------------------------------------------------------------
# the command


def probe_with_runner(overrides: list[str], key: str, budget_mb: float, on_cpu: bool) -> Callable[[int], Probe]:
    """probe(value): one trial of these overrides at key=value, run and recorded by the runner under the budget."""

    def probe(value: int) -> Probe:
        limits = [f"budget_mb={budget_mb:g}"] + ([f"max_host_mem_mb={budget_mb:g}"] if on_cpu else [])
        ((_, cfg),), _ = compose_trials([*overrides, f"{key}={value}", *limits], multirun=False)
        out = run_job(cfg)
        c = to_container(cfg)
        rows = {r["run_id"]: r for r in read_rows(Path(c["results_dir"]) / "runs.csv")}
        row = rows.get(out["run_id"], {})
        peak = num(row, "peak_mem_mb")
        status = out["status"]
        if status == "ok" and peak is not None and peak > budget_mb:
            # on the CPU the watchdog samples the RSS: a peak between two samples can pass the budget unkilled;
            # the kernel's high-water mark (the row's peak) says it did not fit
            status = "over"
        return Probe(value, status, peak, out["run_id"], row)

    return probe


def limit_of(c: dict, key: str) -> int:
    """The largest value a search may reach: the model's positions (seq_len); the training samples (batch)."""
    if key == "seq_len":
        return int(c["model"]["max_position_embeddings"])
    per_device = c["data"]["num_train"] // (c["devices"] * c["nodes"])
    return max(1, per_device)


def result_row(c: dict, key: str, budget_mb: float, s: Search, started: str, experiment: str = "") -> dict:
    best = s.best.row if s.best is not None else {}
    fixed = "seq_len" if key == "batch_size" else "batch_size"
    return {
        "capacity_id": launch_id(), "started_at": started, "framework": c["framework"], "mode": c["mode"],
        "model": c["model"]["name"],
        "num_layers": c["model"]["num_layers"], "search": key, fixed: c[fixed], "budget_mb": budget_mb,
        "device": best.get("device") or c["device"], "device_name": best.get("device_name", ""),
        "parallel": c["parallel"], "devices": c["devices"], "dtype": c["dtype"], "optimizer": c["optimizer"]["name"],
        "trainable": c["trainable"], "remat": c["remat"], "jvp_impl": c["jvp_impl"], "verdict": s.verdict,
        "max_value": s.best.value if s.best is not None else None, "peak_mem_mb": best.get("peak_mem_mb"),
        "step_time_median_s": best.get("step_time_median_s"), "tokens_per_s": best.get("tokens_per_s"),
        "probes": len(s.probes), "probe_values": " ".join(f"{p.value}:{p.status}" for p in s.probes),
        "probe_run_ids": " ".join(p.run_id for p in s.probes), "experiment": experiment,
    }  # fmt: skip


def main(argv: list[str] | None = None) -> int:
    parser = OneLineParser("bench.capacity", "python -m bench.capacity [--search batch_size|seq_len] budget_mb=MiB "
                           "key=value ...", description=__doc__.split("\n\n")[0])  # fmt: skip
    parser.add_argument("--search", default="batch_size", choices=SEARCHES, help="what grows (default batch_size)")
    parser.add_argument("--start", type=int, default=1, help="the first value probed (default 1)")
    parser.add_argument("--max-probes", type=int, default=MAX_PROBES, help=f"per search (default {MAX_PROBES})")
    parser.add_argument("overrides", nargs="*", help="key=value overrides (a,b sweeps), budget_mb=MiB among them")
    args = parser.parse_intermixed_args(argv)  # options may come before, between or after the overrides
    os.environ[LAUNCHER_PID] = str(os.getpid())  # the probes' temp folders are named after this launch
    os.environ.pop(LAUNCH_ID, None)
    launch_id()  # this search's id: its probes' sweep_id and capacity_id
    experiment = next((o.split("=", 1)[1] for o in args.overrides if o.lstrip("+").startswith("experiment=")), "")
    try:
        combos = prepare(args)
    except ConfigError as e:
        print(f"bench.capacity: error: {e}", file=sys.stderr)
        return 2
    results, started = [], datetime.now(timezone.utc).isoformat(timespec="seconds")
    try:
        with interrupts_raise():
            for overrides, c, budget in combos:
                on_cpu = c["device"] == "cpu" or not cuda_memory_mb()
                shown = ("framework", "mode", "case", "parallel")
                label = " ".join(o for o in overrides if o.split("=")[0] in shown)
                print(f"bench.capacity: {label or 'trial'}: largest {args.search} within {budget:g} MiB", flush=True)
                s = search(probe_with_runner(overrides, args.search, budget, on_cpu), budget, args.start,
                           limit_of(c, args.search), args.max_probes)  # fmt: skip
                row = result_row(c, args.search, budget, s, started, experiment)
                CsvSink(Path(c["results_dir"]) / RESULTS_FILE, CAPACITY_COLUMNS).write(row)
                results.append(row)
    except (Interrupted, KeyboardInterrupt) as e:
        code = e.exit_code if isinstance(e, Interrupted) else 130
        print("bench.capacity: interrupted: the running probe was stopped; searches finished so far are in "
              f"{RESULTS_FILE}", file=sys.stderr)  # fmt: skip
        return code
    print(capacity_table(results))
    return 1 if any(r["verdict"] == "failed" for r in results) else 0


def prepare(args) -> list[tuple[list[str], dict, float]]:
    """(overrides, composed config, budget MiB) of every combination, validated like any trial, before any runs."""
    if args.start < 1 or args.max_probes < 3:
        raise ConfigError(f"--start={args.start} --max-probes={args.max_probes}: accepted start >= 1, max-probes >= 3")
    if any(o.split("=")[0].lstrip("+") == args.search for o in args.overrides):
        raise ConfigError(f"{args.search}: it is what --search={args.search} varies; accepted: leave it out")
    preflight([*args.overrides, f"{args.search}={args.start}"], multirun=True)
    trials, _ = compose_trials([*args.overrides, f"{args.search}={args.start}"], multirun=True)
    combos = []
    for combo, cfg in trials:
        c = to_container(cfg)
        budget = c["budget_mb"] or (min(cuda_memory_mb()) if cuda_memory_mb() and c["device"] != "cpu" else None)
        if budget is None:
            raise ConfigError("budget_mb=null: no GPU here to take the budget from; accepted: budget_mb=<MiB> "
                              "(on the CPU it limits the trial process's RSS)")  # fmt: skip
        combos.append(([o for o in combo if not o.startswith(f"{args.search}=")], c, float(budget)))
    return combos


if __name__ == "__main__":
    sys.exit(main())
