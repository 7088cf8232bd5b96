"""Tables (and later plots) from results CSVs."""

from __future__ import annotations


def _num(row: dict, key: str) -> float | None:
    v = row.get(key)
    if v in (None, ""):
        return None
    try:
        return float(v)
    except (TypeError, ValueError):
        return None


def variant(row: dict) -> str:
    """The mode as a reader names it: backprop+remat, jvp(K=4), jvp[naive], jacfwd[head]..."""
    mode = row.get("mode", "")
    name = mode
    if str(row.get("remat")).lower() == "true":
        name += "+remat"
    if mode == "jvp":
        k = row.get("num_tangents")
        if k not in (None, "", "1", 1):
            name += f"(K={k})"
        if row.get("framework") == "torch" and row.get("jvp_impl") not in (None, "", "func"):
            name += f"[{row['jvp_impl']}]"
    if row.get("trainable") not in (None, "", "all"):
        name += f"[{row['trainable']}]"
    return name


def summary_table(rows: list[dict]) -> str:
    """A fixed-width table of trials: what `make bench` and every sweep print at the end."""
    if not rows:
        return "(no trials recorded)"
    head = ["framework", "mode", "model", "status", "excess MiB", "peak MiB", "step ms", "compile s",
            "samples/s", "loss first->last"]
    table = [head]
    for r in rows:
        def f(key, fmt, scale=1.0, r=r):
            v = _num(r, key)
            return "-" if v is None else format(v * scale, fmt)

        loss = "-" if _num(r, "loss_first") is None else f"{f('loss_first', '.4f')}->{f('loss_last', '.4f')}"
        table.append([r.get("framework", ""), variant(r), r.get("model", ""), r.get("status", ""),
                      f("excess_mem_mb", ".0f"), f("peak_mem_mb", ".0f"), f("step_time_median_s", ".1f", 1e3),
                      f("compile_time_s", ".1f"), f("samples_per_s", ".1f"), loss])
    widths = [max(len(str(row[i])) for row in table) for i in range(len(head))]
    lines = ["  ".join(str(c).ljust(w) for c, w in zip(row, widths)).rstrip() for row in table]
    lines.insert(1, "  ".join("-" * w for w in widths))
    failed = [r for r in rows if r.get("status") not in ("ok", "skipped")]
    for r in failed:
        lines.append(f"  {r.get('run_id', '')}: {r.get('status')}: {r.get('error', '')}")
    return "\n".join(lines)
