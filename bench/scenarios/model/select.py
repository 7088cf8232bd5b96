"""Choosing the model rows a comparison shows: what the model's report sections, plots and targets share.

Which rows count. A configuration (config_hash) measured several times is shown by its latest ok row: a re-run
after a fix should replace the old numbers, not be averaged with them. Rows whose status is not ok are kept apart
(`Selection.failed`) and never enter a number or a plot.

Which rows are compared. A context is what stays fixed in one comparison: model and its size, data, optimizer and
its hyperparameters, batch, sequence length, dtype, dropout, device, and how many devices a trial ran on and how
(parallel, devices, nodes, the FSDP settings: CONTEXT_COLUMNS). Within a context there is one cell per framework x
mode, the mode as variant() names it: remat, tangents K, torch's jvp_impl, JAX's unrolled layers, mezo_eps,
attn_implementation and the trainable scope are part of that name (backprop+remat, jvp(K=4), jvp[naive],
backprop[unrolled], mezo(eps=0.0001), backprop(attn=sdpa), jacfwd[head]). So two rows that differ in any knob that
changes the measured numbers land in different cells, and their labels say how they differ. A knob at its default
is left out of the label, so the usual label stays short; a CSV written before a knob had a column reads as the
default. A comparison beyond one device (comparison()) is a context less its parallel settings: the same model,
data and per-device batch on one device, under DDP and under FSDP, on 1, 2, ... devices.

Nothing here imports matplotlib: the sweep process prints summary_table() at its end. Reading the CSVs, and the
"latest row wins" rule itself, are bench/store/read.py's.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, fields

from bench import estimators
from bench.config import default, optimizer_presets
from bench.parallel import STRATEGIES
from bench.report.section import RUNS_CSV, Results
from bench.report.tables import fixed_width, num
from bench.scenarios.model.columns import REQUIRED_COLUMNS
from bench.spec import FRAMEWORKS, LORA_DEFAULT_ROLES, LORA_ROLES, TRAINABLE_SCOPES
from bench.store.read import DAMAGED, latest, started

STUDY_EXPERIMENT = "seed_agnews"  # conf/experiment/seed_agnews.yaml: the UMass forward-AD study's AG-News experiment
STUDY_MODES = (estimators.EXACT, estimators.FORWARD_GRADIENT)  # what it compared: backprop against the jvp


# ------------------------------------------------------------------------------------------------------ knobs

# Knobs that change the measured numbers beyond the shape of a trial, with the value a run has when its config
# does not set it: the schema's default (bench/config.py). A row from a CSV written before the knob had a column
# reads as this default: what those runs used, since no conf/experiment/ overrode these before they were recorded.
PARALLEL_COLUMNS = ("parallel", "devices", "nodes", "fsdp_reshard_after_forward", "fsdp_offload")
KNOB_DEFAULTS = {k: default(k) for k in ("attn_implementation", "directions", *PARALLEL_COLUMNS)}
KNOB_DEFAULTS |= {"dropout": default("model.dropout")}
# every estimator's settings, by their columns (mezo_eps: mezo.eps's default)
SETTING_OPTIONS = estimators.setting_columns()
KNOB_DEFAULTS |= {column: default(option) for column, option in SETTING_OPTIONS.items()}
# the optimizer's hyperparameters as runs.csv names them (adam_eps: optimizer.eps, apart from mezo_eps)
OPTIMIZER_COLUMNS = {
    "lr": "lr",
    "momentum": "momentum",
    "weight_decay": "weight_decay",
    "beta1": "beta1",
    "beta2": "beta2",
    "eps": "adam_eps",
}
OPTIMIZER_KNOBS = tuple(OPTIMIZER_COLUMNS.values())
# Each optimizer preset's hyperparameters (conf/optimizer/<name>.yaml over the schema's defaults); an optimizer
# without a preset falls back to the schema's.
SCHEMA_OPTIMIZER = {column: default(f"optimizer.{key}") for key, column in OPTIMIZER_COLUMNS.items()}
OPTIMIZER_DEFAULTS = {
    name: {OPTIMIZER_COLUMNS[k]: v for k, v in values.items() if k in OPTIMIZER_COLUMNS}
    for name, values in optimizer_presets().items()
}
KNOB_NAMES = {"weight_decay": "weight decay", "adam_eps": "eps"}  # as a label shows them; the rest by column


def _number_text(x: float) -> str:
    """A float as short text that reads back as the same float: 0.001, 5e-05, 0.1 (never 0.1000000001 as 0.1)."""
    short = f"{x:g}"
    return short if float(short) == x else repr(x)


def _canonical(value) -> str:
    text = str(value).strip()
    if text.lower() in ("true", "false"):
        return text.capitalize()  # "True" as CsvSink writes a bool; "true" as a person or YAML would
    try:
        return _number_text(float(text))  # "0.001" and "1e-3" are one value: CSV cells are text
    except ValueError:
        return text


def knob_default(column: str, optimizer: str = "", row: dict | None = None) -> str:
    """The knob's value when a run does not set it, as canonical text; an optimizer's own for its hyperparameters;
    for an estimator's setting the device decides (jvp.impl=auto), what a run of `row`'s framework and device runs."""
    if column in OPTIMIZER_KNOBS:
        return _canonical(OPTIMIZER_DEFAULTS.get(optimizer, SCHEMA_OPTIMIZER)[column])
    if row is not None and column in SETTING_OPTIONS and row.get("framework") in FRAMEWORKS:
        name, key = SETTING_OPTIONS[column].split(".")
        estimator, kind = estimators.get(name), "cuda" if str(row.get("device", "")).startswith("cuda") else "cpu"
        return _canonical(getattr(estimator.resolve(estimator.settings(), row["framework"], kind), key))
    return _canonical(KNOB_DEFAULTS[column])


def knob(row: dict, column: str) -> str:
    """The row's value of a knob as canonical text (numbers compared by value); its default where the cell is
    empty or the CSV has no such column."""
    value = row.get(column)
    if value in (None, "") or (value == "auto" and column in SETTING_OPTIONS):  # auto: what the device decides
        return knob_default(column, row.get("optimizer", "") or "", row)
    return _canonical(value)


def non_default(row: dict, column: str) -> str:
    """The knob's value where it is not the default, else ""."""
    value = knob(row, column)
    return "" if value == knob_default(column, row.get("optimizer", "") or "", row) else value


# ------------------------------------------------------------------------------------------------ mode names


def variant(row: dict) -> str:
    """The mode as a reader names it: backprop+remat, backprop+compile, jvp(K=4), jvp[naive], jacfwd[head],
    mezo(eps=0.0001), backprop(attn=sdpa)... The knobs a mode's numbers depend on are in it, each only when not
    at its default."""
    mode = row.get("mode", "")
    name = mode
    if str(row.get("remat")).lower() == "true":
        name += "+remat"
    if str(row.get("compile")).lower() == "true":  # torch.compile (torch only)
        name += "+compile"
    settings, tags = [], []
    if mode in estimators.names():  # the row's own estimator's settings, as it shows them
        estimator = estimators.get(mode)
        off = {key: non_default(row, column) for key, column in estimators.columns_of(mode).items()}
        settings, tags = estimator.variant({k: v for k, v in off.items() if v})
        if estimator.draws and non_default(row, "directions"):
            settings.append(knob(row, "directions"))
    if non_default(row, "attn_implementation"):
        settings.append(f"attn={knob(row, 'attn_implementation')}")
    if row.get("xla_autotune_level") not in (None, ""):  # XLA's autotuning set (0: off): another compile
        settings.append(f"autotune={row['xla_autotune_level']}")
    if settings:
        name += f"({', '.join(settings)})"
    name += "".join(f"[{t}]" for t in tags)
    if str(row.get("scan_layers")).lower() == "false":  # JAX's unrolled layers (scan_layers' default: true)
        name += "[unrolled]"
    if row.get("trainable") not in (None, "", "all"):
        name += f"[{scope_label(row)}]"
    return name


def scope_label(row: dict) -> str:
    """A row's trainable scope as a reader names it: bias, last_k=2, lora(r=8), lora(r=4, all_linear)..."""
    scope = row.get("trainable") or "all"
    if scope == "last_k":
        return f"last_k={row.get('last_k')}"
    if scope == "lora":
        settings = [f"r={row.get('lora_rank')}"]
        if row.get("lora_alpha") not in (None, "") and float(row["lora_alpha"]) != default("lora.alpha"):
            settings.append(f"alpha={float(row['lora_alpha']):g}")
        targets = str(row.get("lora_targets") or "")  # as the row writes them: query+value
        if targets and targets != "+".join(LORA_DEFAULT_ROLES):
            settings.append("all_linear" if targets == "+".join(LORA_ROLES) else targets)
        if row.get("lora_dropout") not in (None, "") and float(row["lora_dropout"]) != default("lora.dropout"):
            settings.append(f"dropout={float(row['lora_dropout']):g}")
        return f"lora({', '.join(settings)})"
    return scope


def mode_label(row: dict) -> str:
    """variant() without the trainable scope: for plots whose x axis is the scope's size."""
    return variant({**row, "trainable": "all"})


# ------------------------------------------------------------------------------------------- beyond one device


def strategy(c: dict) -> str:
    """How a trial (a row, or a context as a dict) spread its work over devices: "none", "ddp", "fsdp FULL_SHARD"
    (gathered parameters freed after the forward pass, gathered again for the backward), "fsdp SHARD_GRAD_OP"
    (kept until the backward: fsdp_reshard_after_forward=false), with " + CPU offload". FULL_SHARD and
    SHARD_GRAD_OP are FSDP's names for the two (torch.distributed.fsdp.ShardingStrategy)."""
    name = knob(c, "parallel")
    if name == "fsdp":
        name += " FULL_SHARD" if knob(c, "fsdp_reshard_after_forward") == "True" else " SHARD_GRAD_OP"
    if knob(c, "fsdp_offload") == "True":
        name += " + CPU offload"
    return name


def world_size(c: dict) -> int:
    """Devices in the trial: devices (per node) x nodes; 1 for a row written before the columns existed."""
    return int(num({"d": knob(c, "devices")}, "d") or 1) * int(num({"n": knob(c, "nodes")}, "n") or 1)


def parallel_label(c: dict) -> str:
    """ "ddp × 2 devices", "fsdp SHARD_GRAD_OP × 2 nodes × 4 devices + CPU offload" (4 devices on each of 2
    nodes); "" at the defaults (one device, no strategy), so a single-device label reads as it always has. Only
    the counts `c` has are named: a plot against devices drops them from its titles."""
    if all(knob(c, k) == knob_default(k) for k in PARALLEL_COLUMNS):
        return ""
    counts = []
    if "nodes" in c and knob(c, "nodes") != "1":
        counts.append(f"{knob(c, 'nodes')} nodes")
    if "devices" in c:
        counts.append(f"{knob(c, 'devices')} device{'' if knob(c, 'devices') == '1' else 's'}")
    offload = " + CPU offload" if knob(c, "fsdp_offload") == "True" else ""
    return " × ".join([strategy({**c, "fsdp_offload": False}), *counts]) + offload


def parallel_short(row: dict) -> str:
    """parallel_label in a terminal's few characters: "ddp×2", "fsdp×2" (FULL_SHARD), "fsdp(SHARD_GRAD_OP)×2",
    "fsdp+offload×2", "ddp×8 (2 nodes)"; "" at the defaults."""
    if not parallel_label(row):
        return ""
    name = knob(row, "parallel")
    if name == "fsdp" and knob(row, "fsdp_reshard_after_forward") != "True":
        name += "(SHARD_GRAD_OP)"
    if knob(row, "fsdp_offload") == "True":
        name += "+offload"
    nodes = knob(row, "nodes")
    return f"{name}×{world_size(row)}" + ("" if nodes == "1" else f" ({nodes} nodes)")


def strategy_order(row: dict) -> tuple:
    """none, ddp, fsdp SHARD_GRAD_OP, fsdp FULL_SHARD, + CPU offload (the HPML lecture's order: each holds less
    per device than the one before), then by the number of devices."""
    name = knob(row, "parallel")
    return (
        STRATEGIES.index(name) if name in STRATEGIES else len(STRATEGIES),
        knob(row, "fsdp_reshard_after_forward") == "True",
        knob(row, "fsdp_offload") == "True",
        world_size(row),
        name,
    )


def summary_table(rows: list[dict]) -> str:
    """A fixed-width table of trials: what `make bench` and every sweep print at the end. A "parallel" column
    (ddp×2, fsdp×2...) only when some trial ran beyond one device."""
    if not rows:
        return "(no trials recorded)"
    parallel = any(parallel_short(r) for r in rows)
    head = [
        "framework",
        "mode",
        *(["parallel"] if parallel else []),
        "model",
        "status",
        "excess MiB",
        "peak MiB",
        "step ms",
        "compile s",
        "samples/s",
        "loss first->last",
    ]
    body = []
    for r in rows:

        def f(key, fmt, scale=1.0, r=r):
            v = num(r, key)
            return "-" if v is None else format(v * scale, fmt)

        loss = "-" if num(r, "loss_first") is None else f"{f('loss_first', '.4f')}->{f('loss_last', '.4f')}"
        body.append(
            [
                r.get("framework", ""),
                variant(r),
                *([parallel_short(r) or "none"] if parallel else []),
                r.get("model", ""),
                r.get("status", ""),
                f("excess_mem_mb", ".0f"),
                f("peak_mem_mb", ".0f"),
                f("step_time_median_s", ".1f", 1e3),
                f("compile_time_s", ".1f"),
                f("samples_per_s", ".1f"),
                loss,
            ]
        )
    lines = [fixed_width(head, body)]
    failed = [r for r in rows if r.get("status") not in ("ok", "skipped")]
    for r in failed:
        lines.append(f"  {r.get('run_id', '')}: {r.get('status')}: {r.get('error', '')}")
    return "\n".join(lines)


# ---------------------------------------------------------------------------------------------- choosing rows

# What identifies a configuration when a row has no config_hash (written before the column existed).
_IDENTITY_COLUMNS = (
    "framework",
    "mode",
    "model",
    "num_layers",
    "hidden_size",
    "data",
    "trainable",
    "last_k",
    "lora_rank",
    "lora_alpha",
    "lora_dropout",
    "lora_targets",
    "optimizer",
    *OPTIMIZER_KNOBS,
    "batch_size",
    "grad_accum",
    "seq_len",
    "steps",
    "epochs",
    "seed",
    "remat",
    "scan_layers",
    *estimators.setting_columns(),
    "attn_implementation",
    "dropout",
    "dtype",
    "directions",
    "device",
    *PARALLEL_COLUMNS,
)


def experiment_of(row: dict) -> str:
    """The conf/experiment a row was launched by: its `experiment` column; before that column existed, an
    experiment named its sweep (sweep_id)."""
    return row.get("experiment") or ("" if "experiment" in row else row.get("sweep_id", "")) or ""


def provenance(rows) -> str:
    """ "From experiment `default_bench`." / "From sweeps `…`, `…`.": where a table's rows came from, or ""."""
    experiments = sorted({experiment_of(r) for r in rows if experiment_of(r)})
    sweeps = sorted({r.get("sweep_id") for r in rows if not experiment_of(r) and r.get("sweep_id")})
    parts = []
    for what, names in (("experiment", experiments), ("sweep", sweeps)):
        if names:
            parts.append(f"{what}{'s' if len(names) > 1 else ''} {', '.join(f'`{n}`' for n in names)}")
    return f"From {' and '.join(parts)}." if parts else ""


def context_heading(key: Context, rows) -> list[str]:
    """A context's markdown heading and where its rows came from, as the report's per-context sections open."""
    where = provenance(rows)
    return [f"### {context_label(key)}", "", *([where, ""] if where else [])]


def config_key(row: dict) -> str | tuple:
    return row.get("config_hash") or tuple(row.get(c, "") for c in _IDENTITY_COLUMNS)


@dataclass
class Selection:
    ok: list[dict]  # the latest ok row of each configuration, oldest first
    failed: list[dict]  # every row whose status is not ok, oldest first
    repeats: int  # older ok rows of repeated configurations, set aside


def select(rows: list[dict]) -> Selection:
    ok = [r for r in rows if r.get("status") == "ok"]
    chosen = latest(ok, key=config_key)
    return Selection(
        ok=chosen,
        failed=sorted((r for r in rows if r.get("status") != "ok"), key=started),
        repeats=len(ok) - len(chosen),
    )


@dataclass
class View:
    """What the model's report sections read: runs.csv's rows, the rows that count, grouped by context."""

    rows: list[dict]
    sel: Selection
    contexts: dict[Context, Cells]


def view(results: Results) -> View:
    """The model rows of a report's results, chosen and grouped once for every section that reads them. A tuning
    sweep's trials (a grid of learning rates per mode) are the "Cost to target" section's alone."""
    if "model" not in results.cache:
        rows = [r for r in results.rows(RUNS_CSV, required=REQUIRED_COLUMNS) if not r.get("tuning")]
        sel = select(rows)
        results.cache["model"] = View(rows, sel, group_contexts(sel))
    return results.cache["model"]


# --------------------------------------------------------------------------------------------------- contexts

# What stays fixed within one comparison table; the framework and the mode (variant(): the trainable scope and
# the mode's own knobs included) vary within it.
CONTEXT_COLUMNS = (
    "model",
    "num_layers",
    "hidden_size",
    "data",
    "optimizer",
    *OPTIMIZER_KNOBS,
    "batch_size",
    "grad_accum",
    "seq_len",
    "dtype",
    "dropout",
    "device",
    "device_name",
    *PARALLEL_COLUMNS,
)
_CONTEXT_KNOBS = (*OPTIMIZER_KNOBS, "dropout", *PARALLEL_COLUMNS)
SCOPE_COLUMNS = ("trainable", "last_k", "lora_rank", "lora_alpha", "lora_dropout", "lora_targets")  # scope_label's

Context = tuple  # ((column, value), ...)
Cells = dict  # (framework, variant) -> row


def context_key(row: dict, drop: tuple[str, ...] = (), keep: tuple[str, ...] = ()) -> Context:
    """The row's context: CONTEXT_COLUMNS less `drop`, plus `keep` (e.g. trainable, for a plot per scope). Knobs
    are canonical (knob()): "0.001" and "1e-3", or an empty cell and the default, are one context. Values are
    text, as a CSV has them, also for a row the runner has not written yet."""
    return tuple(
        (c, knob(row, c) if c in _CONTEXT_KNOBS else str(row.get(c, "") or ""))
        for c in (*CONTEXT_COLUMNS, *keep)
        if c not in drop
    )


def context_label(key: Context) -> str:
    """minilm_l6 (6 layers, hidden 384) · synthetic · B8 T128 · sgd · fp32 · cpu (AMD EPYC x2); a knob away from
    its default is named after what it belongs to: "sgd (lr 0.0001, momentum 0.9)", "fp32 · dropout 0", and a
    trial beyond one device says how, last: "... · cpu (AMD EPYC x2) · fsdp FULL_SHARD × 2 devices"."""
    c = dict(key)
    model = c.get("model", "") or "?"
    layers = c.get("num_layers")
    size = [
        f"{layers} layer{'' if layers == '1' else 's'}" if layers else "",
        f"hidden {c['hidden_size']}" if c.get("hidden_size") else "",
    ]
    if any(size):
        model += f" ({', '.join(s for s in size if s)})"
    shape = " ".join(
        s
        for s in (
            f"B{c['batch_size']}" if c.get("batch_size") else "",
            f"x{c['grad_accum']} accumulated" if c.get("grad_accum") not in (None, "", "1") else "",
            f"T{c['seq_len']}" if c.get("seq_len") else "",
        )
        if s
    )
    trainable = c.get("trainable", "")
    if trainable == "last_k":
        trainable = f"last {c.get('last_k') or 'k'} layers"
    elif trainable == "lora":
        trainable = scope_label(c)
    optimizer = c.get("optimizer", "")
    hyper = [f"{KNOB_NAMES.get(k, k)} {c[k]}" for k in OPTIMIZER_KNOBS if k in c and c[k] != knob_default(k, optimizer)]
    if hyper:
        optimizer = f"{optimizer or 'optimizer'} ({', '.join(hyper)})"
    dropout = c.get("dropout", "")
    device = c.get("device", "")
    if c.get("device_name"):
        device += f" ({c['device_name']})"
    parts = [
        model,
        c.get("data", ""),
        shape,
        f"trainable {trainable}" if trainable else "",
        optimizer,
        c.get("dtype", ""),
        f"dropout {dropout}" if dropout and dropout != knob_default("dropout") else "",
        device,
        parallel_label(c),
    ]
    return " · ".join(p for p in parts if p)


def _sortable(v: str) -> tuple:
    try:
        return (0, float(v), "")
    except (TypeError, ValueError):
        return (1, 0.0, str(v))


def context_order(key: Context) -> tuple:
    return tuple(_sortable(v) for _, v in key)


def comparison(key: Context) -> Context:
    """A context less its parallel settings: what stays fixed when the same trial runs on one device, under DDP
    and under FSDP, on 1, 2, ... devices (batch_size is per device, so each device's work is the same)."""
    return tuple((c, v) for c, v in key if c not in PARALLEL_COLUMNS)


def mode_order(row: dict) -> tuple:
    mode = row.get("mode", "")
    scope = row.get("trainable") or "all"
    return (
        estimators.names().index(mode) if mode in estimators.names() else len(estimators.names()),
        TRAINABLE_SCOPES.index(scope) if scope in TRAINABLE_SCOPES else len(TRAINABLE_SCOPES),
        str(row.get("remat")).lower() == "true",
        *settings_order(row),
        mode_label(row),
    )


def settings_order(row: dict) -> tuple:
    """The row's own estimator's settings as a sort key, in their declared order: a way among a few by its place
    in the setting's choices (jvp's func, lazy, dual, naive), a number by its value."""
    mode = row.get("mode", "")
    if mode not in estimators.settings_nodes():
        return ()
    key, columns = [], estimators.columns_of(mode)
    for f in fields(estimators.get(mode).settings):
        value, choices = knob(row, columns[f.name]), f.metadata.get("choices")
        if choices:
            key.append(list(choices).index(value) if value in choices else len(choices))
        else:  # a number (jacfwd.chunk=auto first)
            key.append(float(value) if value.replace(".", "", 1).isdigit() else -1.0)
    return tuple(key)


def framework_order(fw: str) -> tuple:
    return (FRAMEWORKS.index(fw) if fw in FRAMEWORKS else len(FRAMEWORKS), fw)


def row_order(row: dict) -> tuple:
    """Mode, then framework: the order of every table's rows and every plot's lines."""
    return (mode_order(row), framework_order(row.get("framework", "")))


def cell_order(item) -> tuple:
    """row_order for a (cell, row) item of Cells."""
    return row_order(item[1])


def ok_cells(rows) -> dict[Context, Cells]:
    """{context: {(framework, variant): row}} of ok rows, oldest first: a later configuration of the same cell
    replaces an earlier one. The sections that show only rows with some measurement pass those."""
    out: dict[Context, Cells] = defaultdict(dict)
    for r in rows:
        out[context_key(r)][(r.get("framework", ""), variant(r))] = r
    return out


def group_contexts(sel: Selection) -> dict[Context, Cells]:
    """{context: {(framework, variant): row}}: the ok row of each cell (the latest, where several
    configurations share a cell, e.g. different random seeds), else its latest failed row."""
    out = ok_cells(sel.ok)
    for r in sel.failed:
        if r.get("status") == DAMAGED:  # no configuration to place it by: the failures table lists it
            continue
        key = context_key(r)
        if key not in out and r.get("device") not in ("cpu", "cuda"):
            # a trial that died before reporting its device carries the configured one ("auto"): it belongs with
            # the ok rows that agree on everything else
            loose = _without_device(key)
            key = next((k for k in sorted(out, key=context_order) if _without_device(k) == loose), key)
        cell = (r.get("framework", ""), variant(r))
        if out[key].get(cell, {}).get("status") != "ok":
            out[key][cell] = r
    return dict(out)


def richest_first(contexts: dict[Context, Cells]) -> list[Context]:
    """Contexts that compare the most ways of differentiating first (`make bench`'s before a sweep's slices),
    then by their values."""

    def order(key):
        cells = contexts[key]
        modes = {r.get("mode") for r in cells.values()}
        frameworks = {fw for fw, _ in cells}
        return (-len(modes), -len(frameworks), -len(cells), context_order(key))

    return sorted(contexts, key=order)


def _without_device(key: Context) -> Context:
    return tuple((c, v) for c, v in key if c not in ("device", "device_name"))


# ----------------------------------------------------------------------------------------------------- series


def series_groups(rows: list[dict], x_col: str, y_col: str, label_of, keep: tuple[str, ...] = ()) -> dict:
    """{context without x_col, plus keep: {(framework, label): {x: row}}}; a later row at the same x replaces an
    earlier one (rows come oldest first)."""
    groups: dict = defaultdict(lambda: defaultdict(dict))
    for r in rows:
        x, y = num(r, x_col), num(r, y_col)
        if x is None or y is None:
            continue
        groups[context_key(r, drop=(x_col,), keep=keep)][(r.get("framework", ""), label_of(r))][x] = r
    return groups


def best_groups(groups: dict, qualifies, limit: int | None = None) -> list[tuple[Context, dict]]:
    """The groups where some series qualifies (e.g. has >= 2 points), the most points first; at most `limit`
    (a figure's panels; a table takes them all)."""
    found = [(key, series) for key, series in groups.items() if any(qualifies(s, pts) for s, pts in series.items())]
    found.sort(key=lambda g: (-sum(len(p) for p in g[1].values()), context_order(g[0])))
    return found[:limit]


def trends(series: dict) -> list[tuple[str, str, list[float], dict]]:
    """(framework, label, its xs sorted, {x: row}) per series measured at >= 2 values, in table order: a lone point
    (another sweep's row that shares the context) shows no trend."""
    found = [(fw, label, sorted(pts), pts) for (fw, label), pts in series.items() if len(pts) >= 2]
    return sorted(found, key=lambda t: row_order(next(iter(t[3].values()))))
