"""`python -m bench capacity`: every combination of the overrides searched on its own (bench/scenarios/capacity/
search.py), each probe a real model trial run and recorded by the harness under the budget.

    python -m bench capacity budget_mb=1536 framework=torch,jax mode=inference,backprop,jvp,mezo model=minilm_l6
    python -m bench capacity --search seq_len budget_mb=1536 batch_size=4 ...
    python -m bench capacity +experiment=what_fits
    python -m bench capacity --ladder 4 +experiment=shapes          # every rung measured, up to what fits
"""

from __future__ import annotations

import os
from collections.abc import Callable
from datetime import datetime, timezone
from pathlib import Path

from bench.config import LAUNCH_ID, BenchConfig, launch_id, lora_columns, resolve
from bench.data import MIN_SEQ_LEN
from bench.errors import ConfigError
from bench.harness.command import OneLineParser, run
from bench.harness.launch import LAUNCHER_PID, stop_descendants
from bench.harness.preflight import compose_trials, preflight
from bench.harness.runner import run_job
from bench.harness.scenario import config_hash
from bench.measure.system import cuda_memory_mb
from bench.report.tables import num
from bench.scenarios.capacity.columns import COLUMNS, RESULTS_FILE
from bench.scenarios.capacity.report import capacity_table
from bench.scenarios.capacity.search import MAX_PROBES, OUT_OF_MEMORY, SEARCHES, Probe, Search, ladder, search
from bench.scenarios.model.scenario import MODEL
from bench.store.csv import CsvSink
from bench.store.read import read_rows

PROBES = {MODEL.name: MODEL}  # a probe is a model trial


def probe_with_runner(overrides: list[str], key: str, budget_mb: float, on_cpu: bool) -> Callable[[int], Probe]:
    """probe(value): one trial of these overrides at key=value, run and recorded by the runner under the budget."""

    def probe(value: int) -> Probe:
        limits = [f"budget_mb={budget_mb:g}"] + ([f"max_host_mem_mb={budget_mb:g}"] if on_cpu else [])
        ((_, composed),), _ = compose_trials([*overrides, f"{key}={value}", *limits], multirun=False)
        cfg = resolve(composed)
        csv = Path(cfg.results_dir) / MODEL.results_file
        earlier = out_of_memory(read_rows(csv), cfg, budget_mb) if cfg.resume else None
        if earlier is not None:
            print(
                f"bench capacity: {key}={value} recorded out of memory in this budget as {earlier['run_id']}",
                flush=True,
            )
            return Probe(value, earlier["status"], num(earlier, "peak_mem_mb"), earlier["run_id"], earlier)
        out = run_job(cfg, PROBES)
        row = {r["run_id"]: r for r in read_rows(csv)}.get(out["run_id"], {})
        peak = num(row, "peak_mem_mb")
        status = out["status"]
        if status == "skipped":  # resume found the probe recorded finished: that row is its outcome
            status = row.get("status") or status
        if status == "ok" and peak is not None and peak > budget_mb:
            # on the CPU the watchdog samples the RSS: a peak between two samples can pass the budget unkilled;
            # the kernel's high-water mark (the row's peak) says it did not fit
            status = "over"
        return Probe(value, status, peak, out["run_id"], row)

    return probe


def out_of_memory(rows: list[dict], cfg: BenchConfig, budget_mb: float) -> dict | None:
    """With resume, the probe's latest row when it ran out of memory in this same budget: it would again (resume
    itself skips only finished trials), so a ladder deepened by a later command does not run its last rung twice."""
    h = config_hash(MODEL, cfg)
    mine = [r for r in rows if r.get("config_hash") == h]
    last = mine[-1] if mine else {}
    return last if last.get("status") in OUT_OF_MEMORY and num(last, "budget_mb") == budget_mb else None


def limit_of(cfg: BenchConfig, key: str) -> int:
    """The largest value a search may reach: the model's positions (seq_len); the training samples (batch)."""
    if key == "seq_len":
        return int(cfg.model.max_position_embeddings)
    per_device = cfg.data.num_train // (cfg.devices * cfg.nodes)
    return max(1, per_device)


def result_row(
    cfg: BenchConfig,
    key: str,
    budget_mb: float,
    s: Search,
    started: str,
    experiment: str = "",
    factor: int | None = None,
) -> dict:
    best = s.best.row if s.best is not None else {}
    fixed = "seq_len" if key == "batch_size" else "batch_size"
    return {
        "capacity_id": launch_id(),
        "started_at": started,
        "framework": cfg.framework,
        "mode": cfg.mode,
        "model": cfg.model.name,
        "num_layers": cfg.model.num_layers,
        "search": key,
        fixed: getattr(cfg, fixed),
        "budget_mb": budget_mb,
        "device": best.get("device") or cfg.device,
        "device_name": best.get("device_name", ""),
        "parallel": cfg.parallel,
        "devices": cfg.devices,
        "dtype": cfg.dtype,
        "optimizer": cfg.optimizer.name,
        "trainable": cfg.trainable,
        "remat": cfg.remat,
        "jvp_impl": best.get("jvp_impl") or cfg.jvp.impl,  # as the probes ran it (jvp.impl=auto resolved)
        "verdict": s.verdict,
        "max_value": s.best.value if s.best is not None else None,
        "peak_mem_mb": best.get("peak_mem_mb"),
        "step_time_median_s": best.get("step_time_median_s"),
        "tokens_per_s": best.get("tokens_per_s"),
        "probes": len(s.probes),
        "probe_values": " ".join(f"{p.value}:{p.status}" for p in s.probes),
        "probe_run_ids": " ".join(p.run_id for p in s.probes),
        "experiment": experiment,
        **lora_columns(cfg),
        "ladder": factor,
    }


# Each probe is a trial: a bisection between 1 and any limit a trial takes ends within 64 probes (2^64), and a ladder
# of factor 2 or more reaches any limit sooner; past this --max-probes is a typo that would probe until killed.
MAX_PROBES_LIMIT = 64


def parse(argv: list[str] | None):
    parser = OneLineParser(
        "capacity",
        "python -m bench capacity [--search batch_size|seq_len] budget_mb=MiB key=value ...",
        description=(__doc__ or "").split("\n\n")[0],
    )
    parser.add_argument("--search", default="batch_size", choices=SEARCHES, help="what grows (default batch_size)")
    parser.add_argument(
        "--start",
        type=int,
        help=f"the first value probed (default: batch_size 1, seq_len {MIN_SEQ_LEN}, the shortest a trial takes)",
    )
    parser.add_argument(
        "--max-probes",
        type=int,
        default=MAX_PROBES,
        help=f"per search, an integer in [3, {MAX_PROBES_LIMIT}] (default {MAX_PROBES})",
    )
    parser.add_argument(
        "--ladder",
        type=int,
        metavar="F",
        help="a sweep up to what fits: probe start, F x start, F^2 x start, ... to the limit, stopping at the first "
        "that does not fit (every rung measured), instead of bisecting to the largest value",
    )
    parser.add_argument("overrides", nargs="*", help="key=value overrides (a,b sweeps), budget_mb=MiB among them")
    args = parser.parse_intermixed_args(argv)  # options may come before, between or after the overrides
    if args.start is None:
        args.start = MIN_SEQ_LEN if args.search == "seq_len" else 1
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse(argv)
    os.environ[LAUNCHER_PID] = str(os.getpid())  # the probes' temp folders are named after this launch
    os.environ.pop(LAUNCH_ID, None)
    launch_id()  # this search's id: its probes' sweep_id and capacity_id
    experiment = next((o.split("=", 1)[1] for o in args.overrides if o.lstrip("+").startswith("experiment=")), "")
    results: list[dict] = []

    def body() -> int:
        started = datetime.now(timezone.utc).isoformat(timespec="seconds")
        for overrides, cfg, budget in prepare(args):
            on_cpu = cfg.device == "cpu" or not cuda_memory_mb()
            shown = ("framework", "mode", "case", "parallel")
            label = " ".join(o for o in overrides if o.split("=")[0] in shown)
            print(f"bench capacity: {label or 'trial'}: largest {args.search} within {budget:g} MiB", flush=True)
            probe, limit = probe_with_runner(overrides, args.search, budget, on_cpu), limit_of(cfg, args.search)
            if args.ladder:
                s = ladder(probe, args.ladder, args.start, limit, args.max_probes)
            else:
                s = search(probe, budget, args.start, limit, args.max_probes)
            row = result_row(cfg, args.search, budget, s, started, experiment, args.ladder)
            CsvSink(Path(cfg.results_dir) / RESULTS_FILE, COLUMNS).write(row)
            results.append(row)
        print(capacity_table(results))
        return 1 if any(r["verdict"] == "failed" for r in results) else 0

    return run(
        "capacity",
        body,
        first=stop_descendants,
        interrupted=f"the running probe was stopped; searches finished so far are in {RESULTS_FILE}",
    )


def prepare(args) -> list[tuple[list[str], BenchConfig, float]]:
    """(overrides, config, budget MiB) of every combination, validated like any trial, before any runs."""
    low = 1 if args.ladder else 3
    if (
        args.start < 1
        or not low <= args.max_probes <= MAX_PROBES_LIMIT
        or (args.ladder is not None and args.ladder < 2)
    ):
        raise ConfigError(
            f"--start={args.start} --max-probes={args.max_probes} --ladder={args.ladder}: accepted start >= 1, "
            f"max-probes in [3, {MAX_PROBES_LIMIT}] (a ladder's from 1), ladder >= 2"
        )
    if any(o.split("=")[0].lstrip("+") == args.search for o in args.overrides):
        raise ConfigError(f"{args.search}: it is what --search={args.search} varies; accepted: leave it out")
    preflight([*args.overrides, f"{args.search}={args.start}"], multirun=True, scenarios=PROBES)
    trials, _ = compose_trials([*args.overrides, f"{args.search}={args.start}"], multirun=True)
    combos = []
    for combo, composed in trials:
        cfg = resolve(composed)
        budget = cfg.budget_mb or (min(cuda_memory_mb()) if cuda_memory_mb() and cfg.device != "cpu" else None)
        if budget is None:
            raise ConfigError(
                "budget_mb=null: no GPU here to take the budget from; accepted: budget_mb=<MiB> "
                "(on the CPU it limits the trial process's RSS)"
            )
        combos.append(([o for o in combo if not o.startswith(f"{args.search}=")], cfg, float(budget)))
    return combos
