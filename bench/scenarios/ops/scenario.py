"""Scenario `ops`: op-level AD micro-benchmarks. One trial is one framework x every op x every shape, in one
spawned process, and writes one row per op and shape to ops.csv, plus one W&B run.

The op definitions, framework-neutral (inputs for a shape; the primal, jvp and vjp written out in numpy, the
analytic derivatives every framework is checked against), are bench/ops_spec.py; the ops in each framework are
bench/torch_impl/ops.py and bench/jax_impl/ops.py. The trial (child side, `measure`): for every op and shape of
the plan, build the primal, jvp and vjp, time each (warm-up, sync after every call, median of the samples), and
check the results against the analytic derivative, untimed.

A failing op or shape is one row with status error or oom; the rest still run. Before each measurement,
`on_progress` receives the rows so far and the op about to run, so a trial that dies (segfault, timeout, host
memory limit) still leaves its finished rows, and the parent can say which op it died in: the op it ended in
gets the trial's status and error, each op it never reached the same status with "not reached".
"""

from __future__ import annotations

import math
from collections.abc import Callable
from pathlib import Path

from bench.config import MAX_OPS_CALLS, BenchConfig
from bench.errors import ConfigError, at_least, choice, count
from bench.harness.scenario import Scenario, finished_runs, identity_of
from bench.harness.signals import classify, error_line, maybe_inject_fault
from bench.measure.system import cpu_name, host_facts, thread_env
from bench.measure.timing import time_calls
from bench.ops_spec import OP_NAMES, Shape, make_problem, relative_error, shape_name, tolerance
from bench.scenarios.ops.columns import COLUMNS
from bench.scenarios.ops.report import summary_table
from bench.spec import implementation
from bench.store.wandb import OPS_TABLE, WandbSink, geomean_key, run_config, run_tags

DTYPES = ("fp32", "fp64", "bf16")
THREADS = ("1", "all")
# An op's largest input, 2^31 entries (8 GiB in fp32, and jvp and vjp hold several): past the memory of any one
# device; a typo (ops.sizes=1000000) would fail allocating, or swap a host, instead of being refused.
MAX_OP_ELEMENTS = 1 << 31
# Everything an ops trial's measurements depend on (the ops node aside, model keys do not matter to it).
IDENTITY_KEYS = ("scenario", "framework", "device", "dtype", "threads", "seed", "ops")
SUMMARY_KEYS = (
    "run_id",
    "sweep_id",
    "framework",
    "execution",
    "dtype",
    "threads",
    "num_threads",
    "device",
    "device_name",
    "git_sha",
)
SUMMARY_METRICS = ("primal_s", "jvp_s", "vjp_s", "vjp_backward_s", "jvp_over_primal", "vjp_over_primal", "status")
# The columns every row of a trial shares (make_rows' common part): its W&B run's config under the CSV's names.
WANDB_CONFIG_COLUMNS = (
    "framework",
    "execution",
    "dtype",
    "threads",
    "num_threads",
    "device",
    "device_name",
    "warmup",
    "repeats",
    "seed",
    "sweep_id",
    "experiment",
    "config_hash",
    "hostname",
    "python_version",
    "git_sha",
    "jax_version",
    "jaxlib_version",
    "torch_version",
)
RATIOS = ("jvp_over_primal", "vjp_over_primal")


class OpsScenario(Scenario):
    name = "ops"
    results_file = "ops.csv"
    columns = COLUMNS

    # -- parent side -------------------------------------------------------------------------------------------
    def validate(self, cfg: BenchConfig) -> None:
        validate(cfg)

    def identity(self, cfg: BenchConfig) -> dict:
        ident = identity_of(cfg, IDENTITY_KEYS)
        ident["threads"] = str(ident["threads"])
        if cfg.framework == "jax":  # always jitted: ops.compile changes nothing
            ident["ops"] = {**ident["ops"], "compile": False}
        return ident

    def kind(self, cfg: BenchConfig) -> str:
        return "ops"

    def label(self, cfg: BenchConfig) -> str:
        return f"{cfg.framework} ops {execution(cfg)} {cfg.dtype} threads={cfg.threads} device={cfg.device}"

    def env(self, cfg: BenchConfig) -> dict[str, str]:
        return thread_env(str(cfg.threads))

    def rows(self, cfg: BenchConfig, outcome: dict, ids: dict) -> list[dict]:
        return make_rows(cfg, outcome, ids)

    def describe(self, outcome: dict, rows: list[dict]) -> str:
        ok = sum(r["status"] == "ok" for r in rows)
        text = f"{ok}/{len(rows)} ok in {rows[0]['wall_time_s']:.1f} s"
        if outcome["status"] != "ok":
            return f"{outcome['status'].upper()} {outcome.get('error') or ''}  ({text})".strip()
        bad = [r for r in rows if r["status"] != "ok"]
        return text + "".join(f"\n    {r['op']} {r['shape']}: {r['status']}: {r.get('error')}" for r in bad[:5])

    def log_wandb(self, cfg: BenchConfig, rows: list[dict], outcome: dict, results_dir: Path) -> None:
        """One W&B run per ops trial, named by its label, grouped by its sweep: config, the flattened config and
        the rows' common columns under the CSV's names (WANDB_CONFIG_COLUMNS); summary, each op and shape's
        numbers ("matmul/1024x1024/vjp_s") and the geometric mean of each ratio over the ok rows
        ("jvp_over_primal_geomean"); a W&B Table of the trial's rows (OPS_TABLE)."""
        lg, first = cfg.logger, rows[0]
        summary = {k: first[k] for k in SUMMARY_KEYS}
        summary["rows_ok"] = sum(r["status"] == "ok" for r in rows)
        summary["rows"] = len(rows)
        for r in rows:
            for k in SUMMARY_METRICS:
                summary[f"{r['op']}/{r['shape']}/{k}"] = r.get(k)
        summary.update(ratio_geomeans(rows))
        WandbSink(
            project=lg.project,
            group=first["sweep_id"],
            name=self.label(cfg),
            config=run_config(identity_of(cfg, self.config_keys(cfg)), {k: first.get(k) for k in WANDB_CONFIG_COLUMNS}),
            mode=lg.mode,
            dir=results_dir,
            entity=lg.entity,
            tags=run_tags(cfg.framework, "ops", first.get("execution"), first.get("experiment"), *lg.tags),
            job_type="ops",
        ).write(summary, tables={OPS_TABLE: rows})

    def sweep_rows(self, rows: list[dict], hashes: list[str], sweep_id: str) -> list[dict]:
        # every row of this sweep's trials (one per op and shape); a resumed trial shows the rows of the run that made
        # it skip (its latest run whose every row finished, as resume reads)
        mine = [r for r in rows if r.get("sweep_id") == sweep_id]
        skipped = set(hashes) - {r.get("config_hash") for r in mine}
        earlier = finished_runs(r for r in rows if r.get("config_hash") in skipped)
        return mine + [r for run in earlier.values() for r in run]

    def summary(self, rows: list[dict]) -> str:
        return summary_table(rows)

    # -- child side --------------------------------------------------------------------------------------------
    def measure(self, cfg: BenchConfig, on_progress: Callable[[dict], None]) -> dict:
        return measure(cfg, on_progress)


# ---------------------------------------------------------------------------------------------------------------
# validation and the plan


def as_list(value) -> list:
    """A list option given as one value (ops.names=matmul, ops.sizes=1024) is a list of one."""
    if value is None:
        return []
    return list(value) if isinstance(value, (list, tuple)) else [value]


def plan(cfg: BenchConfig) -> list[tuple[str, Shape]]:
    """(op, (rows, cols)) in the order an ops trial measures them: op by op, the square sizes, then the shapes."""
    o = cfg.ops
    names = as_list(o.names) or list(OP_NAMES)
    shapes = [(n, n) for n in as_list(o.sizes)] + [(s[0], s[1]) for s in as_list(o.shapes)]
    shapes = list(dict.fromkeys(shapes))  # sizes=[64] and shapes=[[64,64]] name one measurement
    return [(name, shape) for name in names for shape in shapes]


def _positive_int(v) -> bool:
    return isinstance(v, int) and not isinstance(v, bool) and v >= 1


def validate(cfg: BenchConfig) -> None:
    """The keys scenario=ops reads; the model keys are not looked at."""
    o = cfg.ops
    if cfg.profile:
        raise ConfigError(
            "profile=true: scenario=ops times single ops and has no training step to trace; accepted "
            "with scenario=model"
        )
    if cfg.parallel != "none" or cfg.devices != 1 or cfg.nodes != 1:
        raise ConfigError(
            f"parallel={cfg.parallel} devices={cfg.devices} nodes={cfg.nodes}: scenario=ops times single ops on "
            "one device; accepted: parallel=none devices=1 nodes=1"
        )
    choice("dtype", cfg.dtype, DTYPES)
    choice("threads", str(cfg.threads), THREADS)
    names = as_list(o.names)
    for name in names:
        if name not in OP_NAMES:
            raise ConfigError(f"ops.names={name}: unknown op; accepted: {', '.join(OP_NAMES)}")
        if names.count(name) > 1:
            raise ConfigError(f"ops.names: {name} is listed {names.count(name)} times; accepted: each op once")
    for n in as_list(o.sizes):
        if not _positive_int(n):
            raise ConfigError(f"ops.sizes={n}: accepted integers >= 1 (square sizes n, e.g. ops.sizes=[64,1024])")
    for s in as_list(o.shapes):
        if not (isinstance(s, (list, tuple)) and len(s) == 2 and all(_positive_int(v) for v in s)):
            raise ConfigError(
                f"ops.shapes={o.shapes}: accepted a list of [rows, cols] pairs of integers >= 1, e.g. "
                "ops.shapes=[[64,4096]]"
            )
    if not as_list(o.sizes) and not as_list(o.shapes):
        raise ConfigError("ops.sizes=[] and ops.shapes=[]: nothing to measure; accepted: at least one size or shape")
    for rows, cols in dict.fromkeys(shape for _, shape in plan(cfg)):
        if rows * cols > MAX_OP_ELEMENTS:
            raise ConfigError(
                f"ops: shape ({rows}, {cols}) has {rows * cols:,} entries; accepted: {MAX_OP_ELEMENTS:,} at most "
                "(ops.sizes n: n * n, ops.shapes: rows * cols)"
            )
    count("ops.warmup", o.warmup, 1, MAX_OPS_CALLS)  # the first call compiles; it must never be timed
    count("ops.repeats", o.repeats, 1, MAX_OPS_CALLS)
    at_least("ops.min_sample_s", o.min_sample_s, 0)


def ratio_geomeans(rows: list[dict]) -> dict:
    """The geometric mean of each cost ratio over the trial's ok rows (geomean_key; None without one): one
    number per trial for the views. Geometric, because ratios of different ops multiply, they do not add."""
    out = {}
    for ratio in RATIOS:
        values = [float(r[ratio]) for r in rows if r.get("status") == "ok" and (r.get(ratio) or 0) > 0]
        out[geomean_key(ratio)] = math.exp(sum(map(math.log, values)) / len(values)) if values else None
    return out


def execution(cfg: BenchConfig) -> str:
    """How the functions run: jax always jitted; torch eager or torch.compile'd."""
    if cfg.framework == "jax":
        return "jit"
    return "compile" if cfg.ops.compile else "eager"


# ---------------------------------------------------------------------------------------------------------------
# parent side: rows


def make_rows(cfg: BenchConfig, outcome: dict, ids: dict) -> list[dict]:
    """One row per op and shape of the plan, in its order. A trial that ended early (crashed, timeout, oom, or an
    error before the first op) leaves its finished rows; the op it ended in gets its status and error, and each
    op it never reached the same status with "not reached"."""
    common = {
        **ids,
        "framework": cfg.framework,
        "execution": outcome.get("execution", execution(cfg)),
        "dtype": cfg.dtype,
        "threads": str(cfg.threads),
        "num_threads": outcome.get("num_threads"),
        "device": outcome.get("device", cfg.device),
        "device_name": outcome.get("device_name"),
        "warmup": cfg.ops.warmup,
        "repeats": cfg.ops.repeats,
        "seed": cfg.seed,
        **{k: v for k, v in host_facts().items() if k in COLUMNS},
    }
    done = {(r["op"], r["shape"]): r for r in outcome.get("rows", [])}
    current = tuple(outcome["current"]) if outcome.get("current") else None
    rows = []
    for name, shape in plan(cfg):
        key = (name, shape_name(shape))
        if key in done:
            measured = done[key]
        elif current is None or key == current:
            measured = {"status": outcome["status"], "error": outcome.get("error")}
        else:
            cause = f"{' '.join(current)} ({outcome['status']})"
            measured = {"status": outcome["status"], "error": f"not reached: the trial ended in {cause}"}
        row = {**common, "op": name, "shape": key[1], "rows": shape[0], "cols": shape[1], **measured}
        rows.append({k: v for k, v in row.items() if k in COLUMNS})
    return rows


# ---------------------------------------------------------------------------------------------------------------
# child side: the trial itself


def measure(cfg: BenchConfig, on_progress: Callable[[dict], None] | None = None) -> dict:
    ops, dev = implementation(cfg.framework, "ops"), implementation(cfg.framework, "device")
    num_threads = ops.setup(str(cfg.threads), cfg.dtype)
    device = dev.resolve_device(cfg.device)
    kind = dev.device_kind(device)
    info = {
        "device": kind,
        "device_name": dev.device_name(device) if kind == "cuda" else cpu_name(),
        "num_threads": num_threads,
        "execution": execution(cfg),
    }
    rows: list[dict] = []
    for name, shape in plan(cfg):
        if on_progress is not None:
            on_progress({**info, "rows": rows, "current": [name, shape_name(shape)]})
        maybe_inject_fault(f"op={name}")  # tests: BENCH_INJECT_FAULT=op=matmul:segv
        row = measure_op(ops, device, name, shape, cfg)
        print(describe_op(row), flush=True)  # the trial's log: results/logs/<run_id>.log
        rows.append(row)
    return {**info, "status": "ok", "rows": rows}


def measure_op(impl, device, name: str, shape: Shape, cfg: BenchConfig) -> dict:
    """One op at one shape: the row's measurements, status and error. Never raises for what the op does."""
    o, dtype = cfg.ops, cfg.dtype
    row: dict = {"op": name, "shape": shape_name(shape), "rows": shape[0], "cols": shape[1]}
    try:
        problem = make_problem(name, shape, dtype, cfg.seed)
        x = impl.to_device(problem.primals, dtype, device)
        t = impl.to_device(problem.tangents, dtype, device)
        (ct,) = impl.to_device((problem.cotangent,), dtype, device)
        fns = impl.build(name, shape, compile=o.compile)
        timing = {"sync": impl.sync(device), "warmup": o.warmup, "repeats": o.repeats, "min_sample_s": o.min_sample_s}
        primal = time_calls(fns.primal, x, **timing)
        jvp = time_calls(fns.jvp, x, t, **timing)
        vjp = time_calls(fns.vjp, x, ct, **timing)
        timings = [primal, jvp, vjp]
        backward = None
        if fns.backward is not None:
            _, pullback = fns.forward(x)  # the forward half once, untimed: residuals for the backward half
            backward = time_calls(fns.backward, pullback, ct, **timing)
            timings.append(backward)
        row.update(
            primal_s=primal.stats.median_s,
            jvp_s=jvp.stats.median_s,
            vjp_s=vjp.stats.median_s,
            vjp_backward_s=None if backward is None else backward.stats.median_s,
            jvp_over_primal=jvp.stats.median_s / primal.stats.median_s,
            vjp_over_primal=vjp.stats.median_s / primal.stats.median_s,
            cpu_util=sum(r.cpu_s for r in timings) / sum(r.wall_s for r in timings),
            status="ok",
        )
        if o.check:
            row.update(check(impl, problem, primal.out, jvp.out, vjp.out, None if backward is None else backward.out))
    except Exception as e:  # noqa: BLE001 (one op's failure is its row; the others still run)
        row.update(status=classify(e), error=error_line(e))
    return row


def check(impl, problem, primal_out, jvp_out, vjp_out, backward_out=None) -> dict:
    """Relative errors against the analytic results (numpy, float64); status error beyond the tolerance."""
    want = problem.want()
    out_j, tangent = impl.to_numpy(jvp_out)
    out_v, cotangents = impl.to_numpy(vjp_out)
    errors = {
        "primal_err": relative_error(impl.to_numpy(primal_out), want["primal"]),
        "jvp_err": max(relative_error(out_j, want["primal"]), relative_error(tangent, want["jvp"])),
        "vjp_err": max(relative_error(out_v, want["primal"]), relative_error(cotangents, want["vjp"])),
    }
    if backward_out is not None:
        errors["vjp_err"] = max(errors["vjp_err"], relative_error(impl.to_numpy(backward_out), want["vjp"]))
    tol = tolerance(problem.op, problem.shape, problem.dtype)
    result: dict = {**errors, "tolerance": tol}
    bad = [(k, v) for k, v in errors.items() if not v <= tol]  # `not <=`: a NaN is bad too
    if bad:
        what = ", ".join(f"{k.removesuffix('_err')} {v:.2e}" for k, v in bad)
        result.update(status="error", error=f"differs from the analytic result: relative error {what} > {tol:.1e}")
    return result


def describe_op(row: dict) -> str:
    head = f"{row['op']:<10} {row['shape']:>10}"
    if row.get("primal_s") is None:
        return f"{head}  {row['status'].upper()} {row.get('error', '')}"
    ms = lambda k: "-" if row.get(k) is None else f"{row[k] * 1e3:.4g} ms"
    text = (
        f"{head}  primal {ms('primal_s')}  jvp {ms('jvp_s')} ({row['jvp_over_primal']:.2f}x)  "
        f"vjp {ms('vjp_s')} ({row['vjp_over_primal']:.2f}x)  backward {ms('vjp_backward_s')}"
    )
    return text if row["status"] == "ok" else f"{text}  {row['status'].upper()} {row.get('error', '')}"


OPS = OpsScenario()
