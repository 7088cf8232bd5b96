"""The memory and speed targets of the training modes, checked against recorded trials.

    python -m bench -m +experiment=mode_targets     # BERT-base shapes, 8 and 12 layers, both frameworks
    python -m bench targets [results ...]           # prints the check; exit 0 even when a target is missed

The targets (per framework, at the deepest model recorded; the plain modes, trainable=all, compared within one
context: same data, optimizer and hyperparameters, batch, sequence, dtype, dropout, device and parallel settings):
    jvp excess      <= 0.6 x backprop excess
    jvp growth      <= 1.2 x one encoder layer's tangent bytes per layer (least squares over the depths)
    mezo excess     <= 1.1 x inference excess + the largest parameter tensor
    jvp step time   <= 1.1 x backprop step time
    mezo step time  <= 2.2 x inference step time
and the speed targets (`perf`, with `python -m bench overhead`'s results/overhead.csv beside the runs):
    harness         the suite's backprop step <= 1.02 x a plain training loop's (bench/scenarios/overhead/)
    JAX compile     the first step (ahead-of-time compile + the first run) <= 5 s, every mode recorded
    compile depth   JAX's ahead-of-time compile at the deepest model recorded <= 1.3 x at the shallowest, per
                    mode (+experiment=compile_depth: 6 and 24 layers)
Why each bound: a forward-mode pass holds one layer's primal and tangent activations at a time plus one tangent
(parameter-sized), where reverse mode holds every layer's activations; MeZO perturbs in place, so beyond
inference it needs only the noise of the tensor being perturbed; jvp's pass costs about what backprop's forward
and backward cost (a linear layer's jvp adds two matmuls to the primal one, as its backward does), and MeZO's two
forward passes twice inference's, with 10% for drawing the directions; a compiler that sees the layers as one loop
body compiles them once, whatever their number.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from bench import models
from bench.config import model_preset
from bench.estimators import BASELINE, EXACT, FORWARD_GRADIENT, ZEROTH_ORDER
from bench.harness.command import OneLineParser, run
from bench.measure.trackers import MiB
from bench.report.build import results_of
from bench.report.section import Results, Section
from bench.report.tables import FP32_BYTES, fixed_width, md_table, num
from bench.scenarios.model.select import (
    OPTIMIZER_KNOBS,
    PARALLEL_COLUMNS,
    Context,
    context_key,
    context_label,
    variant,
    view,
)

OVERHEAD_CSV = "overhead.csv"  # bench/scenarios/overhead/: the harness against a plain loop, beside runs.csv

# Always in a check's "where"; the other context columns only where the checked contexts differ in them.
WHERE_COLUMNS = ("model", "num_layers", "batch_size", "seq_len", "device")


@dataclass
class Check:
    framework: str
    context: str
    target: str
    measured: float | None
    limit: float | None
    unit: str

    @property
    def verdict(self) -> str:
        if self.measured is None or self.limit is None:
            return "no data"
        return "met" if self.measured <= self.limit else "MISSED"


def model_sizes(row: dict) -> tuple[float, float]:
    """(one layer's tangent MiB, the largest parameter tensor MiB) for the row's model, in fp32; the layer is the
    first, as its family's SCOPES.layer names its parameters."""
    spec, _ = model_preset(row["model"], hidden_size=int(row["hidden_size"]), num_layers=int(row["num_layers"]))
    family = models.of(spec)
    sizes = {name: int(np.prod(shape)) for name, shape in family.param_shapes(spec).items()}
    layer = sum(n for name, n in sizes.items() if family.SCOPES.layer_of(name) == 0)
    return layer * FP32_BYTES / MiB, max(sizes.values()) * FP32_BYTES / MiB


def slope(xs: list[float], ys: list[float]) -> float:
    """Least-squares slope of ys against xs (>= 2 distinct xs): the growth per unit of x (MiB per layer)."""
    mx, my = sum(xs) / len(xs), sum(ys) / len(ys)
    return sum((x - mx) * (y - my) for x, y in zip(xs, ys)) / sum((x - mx) ** 2 for x in xs)


def where(key: Context, layers: str, keys: list[Context]) -> str:
    """A context as a check names it: "bert_base (12 layers) · B8 T128 · cpu", plus the columns in which the
    checked contexts differ (e.g. "sgd (lr 0.0001)", "dropout 0"), so that no two checks read alike."""
    varying = {c for c, v in key if any(dict(k).get(c) != v for k in keys)}
    if varying & {"optimizer", *OPTIMIZER_KNOBS}:
        varying |= {"optimizer", *OPTIMIZER_KNOBS}  # a hyperparameter is shown against its optimizer's defaults
    if varying & set(PARALLEL_COLUMNS):
        varying |= set(PARALLEL_COLUMNS)  # "fsdp SHARD_GRAD_OP × 2 devices" is read from all of them together
    shown = [(c, v) for c, v in key if c in WHERE_COLUMNS or c in varying]
    return context_label((*shown, ("num_layers", layers)))


def check(rows: list[dict]) -> list[Check]:
    """Every target that the rows hold the trials for, per framework and context (bench.results' context less the
    depth: model, data, optimizer and its hyperparameters, B, T, dtype, dropout, device, parallel settings). The
    targets are stated for the plain modes, so only rows whose variant() is the bare mode count: trainable=all, no
    remat, one tangent, torch's jvp.impl=func, mezo_eps and attn_implementation at their defaults."""
    ok = [
        r
        for r in rows
        if r.get("status") == "ok"
        and variant(r) == r.get("mode")
        and num(r, "num_layers") is not None
        and num(r, "hidden_size") is not None
    ]  # older CSVs may lack them
    # latest row per (framework, context, layers, mode)
    by = {}
    for r in ok:
        by[(r["framework"], context_key(r, drop=("num_layers",)), int(r["num_layers"]), r["mode"])] = r
    groups = defaultdict(dict)
    for (fw, ctx, layers, mode), r in by.items():
        groups[(fw, ctx)].setdefault(layers, {})[mode] = r
    contexts = sorted({ctx for _, ctx in groups})
    checks = []
    for (fw, ctx), depths in sorted(groups.items()):
        deepest = max(depths)
        at = depths[deepest]
        here = where(ctx, str(deepest), contexts)
        x = lambda mode, key, at=at: num(at[mode], key) if mode in at else None  # noqa: E731
        roles = (EXACT, FORWARD_GRADIENT, BASELINE, ZEROTH_ORDER)
        bp, jv, inf, mz = (x(m, "excess_mem_mb") for m in roles)
        if bp is not None and jv is not None:
            checks.append(Check(fw, here, "jvp excess <= 0.6 x backprop excess", jv, 0.6 * bp, "MiB"))
        if inf is not None and mz is not None:
            largest = model_sizes(at[ZEROTH_ORDER])[1]
            checks.append(
                Check(
                    fw,
                    here,
                    f"mezo excess <= 1.1 x inference + largest tensor ({largest:.0f} MiB)",
                    mz,
                    1.1 * inf + largest,
                    "MiB",
                )
            )
        tb, tj = x(EXACT, "step_time_median_s"), x(FORWARD_GRADIENT, "step_time_median_s")
        if tb is not None and tj is not None:
            checks.append(Check(fw, here, "jvp step time <= 1.1 x backprop step time", tj, 1.1 * tb, "s"))
        ti, tm = x(BASELINE, "step_time_median_s"), x(ZEROTH_ORDER, "step_time_median_s")
        if ti is not None and tm is not None:
            checks.append(Check(fw, here, "mezo step time <= 2.2 x inference step time", tm, 2.2 * ti, "s"))
        jvp_depths = sorted(d for d in depths if FORWARD_GRADIENT in depths[d])
        if len(jvp_depths) >= 2:
            lo, hi = jvp_depths[0], jvp_depths[-1]
            growth = slope(jvp_depths, [num(depths[d][FORWARD_GRADIENT], "excess_mem_mb") for d in jvp_depths])
            tangent = model_sizes(depths[hi][FORWARD_GRADIENT])[0]
            checks.append(
                Check(
                    fw,
                    where(ctx, f"{lo}→{hi}", contexts),
                    f"jvp growth per layer <= 1.2 x a layer's tangent ({tangent:.1f} MiB)",
                    growth,
                    1.2 * tangent,
                    "MiB/layer",
                )
            )
    return checks


# Where a MISSED row's reason and the best reached are written (the CLI and the report's section both say it).
WHY_MISSED = "docs/methodology.md (memory targets) and docs/speed.md (speed targets)"
COMPILE_LIMIT_S = 5.0  # JAX's first step, per mode: a user should not wait on six near-identical layers
COMPILE_DEPTH_LIMIT = 1.3  # JAX's first step, deepest against shallowest: compile time independent of depth
OVERHEAD_LIMIT = 1.02  # the suite's step against a plain loop's (bench overhead): the harness in the noise


def perf(rows: list[dict], overhead: list[dict] = ()) -> list[Check]:
    """The speed targets: the harness against a plain loop (`overhead`: bench overhead's rows, the latest per
    framework and shape), and JAX's first-step compile for every variant recorded (the latest row per context and
    variant)."""
    checks = []
    latest = {(r["framework"], r["model"], r["batch_size"], r["seq_len"]): r for r in overhead}
    for (fw, model, b, t), r in sorted(latest.items()):
        checks.append(
            Check(
                fw,
                f"{model} · B{b} T{t} · backprop, {r['rounds']} rounds",
                f"harness step <= {OVERHEAD_LIMIT} x a plain loop's",
                float(r["ratio"]),
                OVERHEAD_LIMIT,
                "x",
            )
        )
    # a compile read from the persistent cache (compile_cache hit or partial) is not a compile: left out
    ok = [
        r
        for r in rows
        if r.get("status") == "ok"
        and r.get("framework") == "jax"
        and num(r, "compile_time_s")
        and r.get("compile_cache") not in ("hit", "partial")
    ]
    by = {(context_key(r), r.get("num_layers") or "", variant(r)): r for r in ok}
    contexts = sorted({ctx for ctx, _, _ in by})
    for (ctx, layers, name), r in sorted(by.items()):
        checks.append(
            Check(
                "jax",
                where(ctx, str(layers), contexts),
                f"{name} first-step compile <= {COMPILE_LIMIT_S:g} s",
                num(r, "compile_time_s"),
                COMPILE_LIMIT_S,
                "s",
            )
        )
    return checks + compile_depth(ok)


def compile_depth(rows: list[dict]) -> list[Check]:
    """JAX's compile at the deepest model recorded against the shallowest, per context (less the depth) and
    variant, the latest row of each depth: the ahead-of-time compile (aot_compile_s), or where a row predates that
    column the first step less a timed one (the first step also runs the program, which grows with depth)."""
    by = defaultdict(dict)
    for r in rows:
        if num(r, "num_layers") is not None:
            by[context_key(r, drop=("num_layers",)), variant(r)][int(r["num_layers"])] = r
    contexts = sorted({ctx for ctx, _ in by})
    checks = []
    for (ctx, name), depths in sorted(by.items()):
        if len(depths) < 2:
            continue
        lo, hi = min(depths), max(depths)
        compiled = lambda r: (
            num(r, "aot_compile_s")
            or num(r, "compile_time_s")
            - (  # noqa: E731
                num(r, "step_time_median_s") or 0.0
            )
        )
        ratio = compiled(depths[hi]) / compiled(depths[lo])
        checks.append(
            Check(
                "jax",
                where(ctx, f"{lo}→{hi}", contexts),
                f"{name} compile at {hi} layers <= {COMPILE_DEPTH_LIMIT:g} x at {lo}",
                ratio,
                COMPILE_DEPTH_LIMIT,
                "x",
            )
        )
    return checks


def table(checks: list[Check]) -> str:
    if not checks:
        return (
            "(no trials to check: run python -m bench -m +experiment=mode_targets, which records inference, "
            "backprop, jvp and mezo at two depths)"
        )
    return fixed_width(HEAD, cells(checks))


HEAD = ["framework", "where", "target", "measured", "limit", "verdict"]


def cells(checks: list[Check]) -> list[list[str]]:
    """One table row per check, under HEAD (the terminal table here, the report's markdown table)."""
    return [
        [
            c.framework,
            c.context,
            c.target,
            "-" if c.measured is None else f"{c.measured:.2f} {c.unit}",
            "-" if c.limit is None else f"{c.limit:.2f} {c.unit}",
            c.verdict,
        ]
        for c in checks
    ]


class TargetsSection(Section):
    """The training modes' targets, per framework at the deepest model recorded."""

    def render(self, results: Results, plot_dir: Path) -> list[str]:
        checks = check(view(results).sel.ok)
        if not checks:
            return []
        return [
            "## The training modes' targets",
            "",
            "Per framework at the deepest model recorded (`+experiment=mode_targets` records BERT-base shapes at "
            f"8 and 12 layers); *MISSED* rows are explained in {WHY_MISSED}.",
            "",
            md_table(HEAD, cells(checks), "lllrrl"),
            "",
        ]


def parse(argv: list[str] | None):
    p = OneLineParser("targets", "python -m bench targets [RESULTS ...]", description=__doc__.splitlines()[0])
    p.add_argument("results", nargs="*", metavar="RESULTS", help="results folders or runs CSVs (default results)")
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    """`python -m bench targets`: the targets of the results' rows, printed; exit 0 even when one is missed."""
    args = parse(argv)

    def body() -> int:
        results = results_of(args.results)
        rows = view(results).rows
        checks = check(rows)
        print(table(checks))
        speed = perf(rows, results.rows(OVERHEAD_CSV))
        if speed:
            print("\nSpeed (perf):")
            print(fixed_width(HEAD, cells(speed)))
        if any(c.verdict == "MISSED" for c in checks + speed):
            print(f"\nWhy a target is missed, and the best reached: {WHY_MISSED}.")
        return 0

    return run("targets", body)
