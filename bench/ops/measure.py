"""The ops trial, in its own spawned process (bench/runner.py child_main): for every op and shape of the plan,
build the primal, jvp and vjp, time each (warm-up, sync after every call, median of the samples), and check the
results against the analytic derivative, untimed.

A failing op or shape is one row with status error or oom; the rest still run. Before each measurement,
`on_progress` receives the rows so far and the op about to run, so a trial that dies (segfault, timeout, host
memory limit) still leaves its finished rows, and the parent can say which op it died in.
"""

from __future__ import annotations

from collections.abc import Callable

from bench.config import ops_plan
from bench.ops.spec import Shape, make_problem, relative_error, shape_name, tolerance
from bench.trackers import time_calls


def execution(c: dict) -> str:
    """How the functions run: jax always jitted; torch eager or torch.compile'd."""
    if c["framework"] == "jax":
        return "jit"
    return "compile" if c["ops"]["compile"] else "eager"


def _framework(name: str):
    # Imported here, in the trial process: threads were set in its environment before this import.
    if name == "torch":
        from bench.ops import torch_ops as impl
    else:
        from bench.ops import jax_ops as impl
    return impl


def measure_ops(c: dict, on_progress: Callable[[dict], None] | None = None) -> dict:
    from bench.runner import _maybe_inject_fault, cpu_name, device_kind

    impl = _framework(c["framework"])
    num_threads = impl.setup(str(c["threads"]), c["dtype"])
    device = impl.resolve_device(c["device"])
    kind = device_kind(device)
    info = {
        "device": kind,
        "device_name": impl.device_name(device) if kind == "cuda" else cpu_name(),
        "num_threads": num_threads,
        "execution": execution(c),
    }
    rows: list[dict] = []
    for name, shape in ops_plan(c):
        if on_progress is not None:
            on_progress({**info, "rows": rows, "current": [name, shape_name(shape)]})
        _maybe_inject_fault(f"op={name}")  # tests: BENCH_INJECT_FAULT=op=matmul:segv
        row = measure_op(impl, device, name, shape, c)
        print(describe_op(row), flush=True)  # the trial's log: results/logs/<run_id>.log
        rows.append(row)
    return {**info, "status": "ok", "rows": rows}


def measure_op(impl, device, name: str, shape: Shape, c: dict) -> dict:
    """One op at one shape: the row's measurements, status and error. Never raises for what the op does."""
    from bench.runner import classify

    o, dtype = c["ops"], c["dtype"]
    row: dict = {"op": name, "shape": shape_name(shape), "rows": shape[0], "cols": shape[1]}
    try:
        problem = make_problem(name, shape, dtype, c["seed"])
        x = impl.to_device(problem.primals, dtype, device)
        t = impl.to_device(problem.tangents, dtype, device)
        (ct,) = impl.to_device((problem.cotangent,), dtype, device)
        fns = impl.build(name, shape, compile=o["compile"])
        timing = {"sync": impl.sync(device), "warmup": o["warmup"], "repeats": o["repeats"],
                  "min_sample_s": o["min_sample_s"]}  # fmt: skip
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
        if o["check"]:
            row.update(check(impl, problem, primal.out, jvp.out, vjp.out, None if backward is None else backward.out))
    except Exception as e:  # noqa: BLE001 (one op's failure is its row; the others still run)
        msg = " ".join(str(e).split())[:500]
        row.update(status=classify(e), error=f"{type(e).__name__}: {msg}")
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
    text = (f"{head}  primal {ms('primal_s')}  jvp {ms('jvp_s')} ({row['jvp_over_primal']:.2f}x)  "
            f"vjp {ms('vjp_s')} ({row['vjp_over_primal']:.2f}x)  backward {ms('vjp_backward_s')}")  # fmt: skip
    return text if row["status"] == "ok" else f"{text}  {row['status'].upper()} {row.get('error', '')}"
