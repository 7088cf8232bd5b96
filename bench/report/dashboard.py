"""W&B views of the suite's runs, built in code: one workspace and one report, the same sections in both.

    python -m bench dashboard [--results DIR] [--sweep ID ...] [--experiment NAME] [--title TEXT]
                              [--entity E] [--project P] [--dry-run [SPEC.json]] [--online]

Offline (the default; W&B has no server here): builds the workspace and the report and writes their specification
to a JSON file (--dry-run's, default <results>/dashboard.json) without touching the network. Online (--online, or
WANDB_MODE=online): saves both to W&B and prints their URLs. Once the offline runs are synced (`wandb sync
results/wandb/offline-run-*`), the same command with --online saves what the dry run described.

What the views show is one table, SECTIONS: a section is a name, what to read from it, and its panels; a panel
names the summary, history or config keys it plots. Every key is one the runs carry (bench.wandb_runs,
bench.scenarios: summary keys are the CSV's columns, config keys name the same things alike), and panels group by
config keys (framework_mode: "torch backprop+remat"), never by a list of runs, so a new sweep fills them without
edits. A key that the runs found under --results do not have is reported as "not filled by these runs" (a
single-device sweep has no communication bytes), never an error; a key the suite never logs is (check_sections).
"""

from __future__ import annotations

import json
import os
import shlex
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bench.errors import ConfigError
from bench.harness.command import OneLineParser, run
from bench.report.panels import EXCESS_MEMORY, GROUP_BY, PEAK_MEMORY, Panel, bar, line, scatter
from bench.store.wandb import (
    DEVICES,
    OPS_TABLE,
    REDACTED,
    REPORT_PLOTS,
    SWEEP_TABLE,
    geomean_key,
    offline_runs,
    resolve_wandb_mode,
)

DEFAULT_RESULTS = Path("results")
SPEC_NAME = "dashboard.json"
SPEC_FORMAT = "bench.dashboard/1"
MAX_RUNS = 200  # runs a panel draws (W&B's default is 10: a 32-trial depth sweep would lose most of them)
MAX_DEVICES = 8  # per-device bars: devices/0 .. devices/7, one node of GPUs
TITLE_MAX = 128  # W&B's limit on a report's title
# The per-step series of a model trial (bench/scenarios/model/trial.py: its history): the run's W&B history.
HISTORY_KEYS = ("loss", "step_time_s", "eval_loss", "eval_accuracy")
# Config keys beyond the CSV's columns (bench/scenarios/model.py wandb_columns).
DERIVED_CONFIG = ("variant", "framework_mode")


@dataclass(frozen=True)
class Group:
    name: str
    read: str  # what to read from it: the report's text under the section's heading
    panels: tuple[Panel, ...]
    needs: tuple[str, ...] = ()  # CSV columns it waits for: built once the scenarios' columns have them all


SECTIONS = (
    Group(
        "Memory",
        "Excess memory is what a step holds above the resident baseline (weights, framework, "
        "interpreter): the cost of the way of differentiating. Peak is the whole process's high-water mark. "
        "One bar per framework x mode, the mean of its runs; the range is their min and max, wide where the "
        "group mixes shapes (see Scaling).",
        (
            EXCESS_MEMORY,
            PEAK_MEMORY,
        ),
    ),
    Group(
        "Memory breakdown",
        "The parts of a trial's memory that have columns: the resident baseline, the "
        "step's excess, and per device the parameters' and the optimizer state's share (MiB). Parts measured "
        "later (activations, gradients) get their columns added to this panel.",
        (
            bar(
                "baseline, excess, parameters, optimizer state (MiB)",
                "baseline_mem_mb",
                "excess_mem_mb",
                "mem_params_mb",
                "mem_optimizer_mb",
            ),
        ),
    ),
    Group(
        "Step time",
        "The median synced step (s) with the 10th and 90th percentiles beside it: a wide gap is "
        "a noisy host, not a slow mode. Per step: the first timed steps show any remaining warm-up. Samples/s "
        "is the global batch over the median step.",
        (
            bar("step time p10, median, p90 (s)", "step_time_p10_s", "step_time_median_s", "step_time_p90_s"),
            line("step time per step (s)", "step_time_s"),
            bar("throughput (samples/s)", "samples_per_s"),
        ),
    ),
    Group(
        "Compile time",
        "The first (compiling) step, and the whole untimed warm-up (s): JAX traces and "
        "compiles each program once, torch's eager modes pay little here.",
        (
            bar("compile time (s)", "compile_time_s"),
            bar("warm-up time (s)", "warmup_time_s"),
        ),
    ),
    Group(
        "Training",
        "Training loss per step, and held-out loss and accuracy at each evaluation "
        "(evaluate=true, eval_every=N): whether an estimate of the gradient trains as backprop does.",
        (
            line("training loss", "loss"),
            line("held-out loss", "eval_loss"),
            line("held-out accuracy", "eval_accuracy"),
            bar("held-out accuracy at the end", "eval_accuracy"),
        ),
    ),
    Group(
        "Cost to target",
        "What reaching the held-out target cost each tuned mode (target.metric, the "
        "cost_to_target experiment): steps, seconds (the steps' own, and the wall clock with compilation and "
        "evaluations), excess memory x seconds; against the trained parameters, and at each mode's peak "
        "memory (the matched-memory view). Trials that did not reach the target have none of these keys.",
        (
            bar("wall seconds to the target", "wall_to_target_s"),
            bar("steps to the target", "steps_to_target"),
            bar("excess memory x seconds to the target (MiB*s)", "mib_s_to_target"),
            scatter(
                "steps to the target vs trained parameters",
                "steps_to_target",
                "n_trainable",
                log_y=True,
                x_measured=True,
            ),
            scatter(
                "wall seconds to the target vs peak memory (MiB)", "wall_to_target_s", "peak_mem_mb", x_measured=True
            ),
            line("held-out accuracy per step", "eval_accuracy"),
        ),
    ),
    Group(
        "Scaling",
        "Memory and time against the shape, one point per trial (the depth_scaling, seq_scaling "
        "and batch_scaling experiments): a mode whose excess grows with depth keeps every layer's activations "
        "(backprop); a flat one holds about one layer's at a time (jvp in JAX, MeZO).",
        (
            scatter("excess memory (MiB) vs depth", "excess_mem_mb", "num_layers"),
            scatter("excess memory (MiB) vs sequence length", "excess_mem_mb", "seq_len"),
            scatter("excess memory (MiB) vs batch", "excess_mem_mb", "batch_size"),
            scatter("step time (s) vs depth", "step_time_median_s", "num_layers", log_y=True),
        ),
    ),
    Group(
        "Gradient quality",
        "Cosine of the mode's gradient estimate with the exact gradient "
        "(measure_grad_cosine=true; the grad_quality experiment) against the number of tangents K: a forward "
        "gradient's cosine grows like sqrt(K / n).",
        (
            scatter("gradient cosine vs tangents", "grad_cosine", "num_tangents"),
            bar("gradient cosine", "grad_cosine"),
        ),
    ),
    Group(
        "Beyond one device",
        "Per device: each device's peak (MiB), the parameters' and optimizer state's "
        "share; communication bytes per step, measured against what the strategy should exchange "
        "(comm_bytes_expected). Single-device runs fill only device 0.",
        (
            bar("peak memory per device (MiB)", *(f"{DEVICES}/{i}/peak_mem_mb" for i in range(MAX_DEVICES))),
            bar("parameters and optimizer state per device (MiB)", "mem_params_mb", "mem_optimizer_mb"),
            bar("communication per step (bytes): measured, expected", "comm_bytes_per_step", "comm_bytes_expected"),
            scatter("communication per step (bytes) vs world size", "comm_bytes_per_step", "world_size"),
            scatter("peak memory (MiB) vs devices", "peak_mem_mb", "devices"),
        ),
    ),
    Group(
        "Ops",
        "scenario=ops: what a jvp and a vjp cost against the primal, as the geometric mean over the "
        "trial's ops (one bar per trial: framework, execution, dtype, threads), and every op and shape in the "
        "table.",
        (
            bar(
                "jvp / primal, vjp / primal (geometric mean over ops)",
                geomean_key("jvp_over_primal"),
                geomean_key("vjp_over_primal"),
                grouped=False,
            ),
            Panel("table", "ops, one row per op and shape", (OPS_TABLE,)),
        ),
    ),
    Group(
        "What fits",
        "The capacity search's probes (python -m bench capacity): each a trial under a memory "
        "budget, ok or oom. A probe's peak against its budget: the points under the diagonal fitted; the "
        "batch (or sequence length) against the budget shows how far each mode gets.",
        (
            scatter("peak memory (MiB) vs budget (MiB), per probe", "peak_mem_mb", "budget_mb"),
            scatter("batch vs budget (MiB), per probe", "batch_size", "budget_mb"),
            scatter("sequence length vs budget (MiB), per probe", "seq_len", "budget_mb"),
        ),
        needs=("budget_mb",),
    ),
    Group(
        "Sweeps",
        "Each sweep's rows as its summary table shows them (the sweep-level run), and the report's "
        "plots (`make report` with W&B on).",
        (
            Panel("table", "the sweep's rows", (SWEEP_TABLE,)),
            Panel("media", "the report's plots", (REPORT_PLOTS,)),
        ),
    ),
)


# ------------------------------------------------------------------------------------------- keys, checked


def declared_summary(key: str, columns: Sequence[str]) -> bool:
    """Whether the suite logs a summary key: a column of a scenario's CSV (`columns`: every scenario's), a
    device's column, an ops ratio's geometric mean, or one of its Tables and media."""
    parts = key.split("/")
    if len(parts) == 3 and parts[0] == DEVICES and parts[1].isdigit():
        return parts[2] in columns
    ratios = [c for c in columns if c.endswith("_over_primal")]
    return key in (*columns, *map(geomean_key, ratios), SWEEP_TABLE, OPS_TABLE, REPORT_PLOTS)


def ready(columns: Sequence[str], sections=SECTIONS) -> tuple[tuple[Group, ...], list[dict]]:
    """(the sections whose columns exist among `columns`, the others with the columns they wait for)."""
    built = tuple(s for s in sections if set(s.needs) <= set(columns))
    waiting = [
        {"section": s.name, "needs": [c for c in s.needs if c not in columns]} for s in sections if s not in built
    ]
    return built, waiting


def check_sections(columns: Sequence[str], sections=SECTIONS) -> None:
    """Raise ValueError naming every panel key the suite never logs: a panel can never point at such a name.
    Sections still waiting for their columns (ready) are not built, so not checked."""
    bad = []
    for s in ready(columns, sections)[0]:
        for p in s.panels:
            ok = HISTORY_KEYS.__contains__ if p.where() == "history" else lambda k: declared_summary(k, columns)
            bad += [f"{s.name} / {p.title}: {p.where()} key {k}" for k in p.keys if not ok(k)]
            bad += [
                f"{s.name} / {p.title}: summary key {k}" for k in p.measured_x() if not declared_summary(k, columns)
            ]
            bad += [
                f"{s.name} / {p.title}: config key {k}" for k in p.config_keys() if k not in (*columns, *DERIVED_CONFIG)
            ]
    if bad:
        raise ValueError("panels name keys the runs never carry: " + "; ".join(bad))


def keys_of(runs: list[dict]) -> dict[str, set[str]]:
    """Every summary, history and config key the runs carry, with a value."""
    found: dict[str, set[str]] = {"summary": set(), "history": set(), "config": set()}
    for r in runs:
        found["summary"] |= {k for k, v in r["summary"].items() if v is not None}
        found["history"] |= {k for row in r["history"] for k, v in row.items() if v is not None}
        found["config"] |= {k for k, v in r["config"].items() if v not in (None, "")}
    return found


def panel_status(runs: list[dict], sections=SECTIONS) -> list[dict]:
    """One entry per panel: its keys by where they live, the ones these runs lack, and whether it is filled (some
    plotted key and every config key present); "filled" is None where no run was read (nothing to check)."""
    found = keys_of(runs) if runs else None
    out = []
    for s in sections:
        for p in s.panels:
            entry = {
                "section": s.name,
                "title": p.title,
                "kind": p.kind,
                p.where(): list(p.keys),
                "config": list(p.config_keys()),
                "missing": [],
                "filled": None,
            }
            if found is not None:
                missing = [k for k in p.keys if k not in found[p.where()]]
                missing_config = [k for k in p.config_keys() if k not in found["config"]]
                missing_x = [k for k in p.measured_x() if k not in found["summary"]]
                entry["missing"] = missing + missing_x + missing_config
                entry["filled"] = len(missing) < len(p.keys) and not missing_x and not missing_config
            out.append(entry)
    return out


# ------------------------------------------------------------------------------------------ the W&B objects


def wandb_panel(p: Panel):
    import wandb_workspaces.reports.v2 as wr  # lazily: wandb's import is seconds, and only this needs it

    group = {"groupby": wr.Config(GROUP_BY), "groupby_aggfunc": "mean", "groupby_rangefunc": "minmax"}
    group = group if p.grouped else {}
    if p.kind == "bar":
        return wr.BarPlot(title=p.title, metrics=list(p.keys), orientation="v", max_runs_to_show=MAX_RUNS, **group)
    if p.kind == "line":
        return wr.LinePlot(title=p.title, x="Step", y=list(p.keys), max_runs_to_show=MAX_RUNS, **group)
    if p.kind == "scatter":
        x_axis = wr.SummaryMetric(p.x) if p.x_measured else wr.Config(p.x)
        return wr.ScatterPlot(title=p.title, x=x_axis, y=wr.SummaryMetric(p.keys[0]), log_y=p.log_y or None)
    if p.kind == "table":
        return wr.WeavePanelSummaryTable(table_name=p.keys[0], layout=wr.Layout(w=24, h=12))
    if p.kind == "media":
        return wr.MediaBrowser(
            title=p.title, media_keys=list(p.keys), gallery_axis="step", layout=wr.Layout(w=24, h=12)
        )
    raise ValueError(f"panel {p.title!r}: kind={p.kind}; accepted bar | line | scatter | table | media")


def run_filters(sweeps: list[str], experiment: str | None) -> list:
    from wandb_workspaces import expr

    filters = []
    if sweeps:  # a sweep is its runs' W&B group
        filters.append(expr.Metric("Group") == sweeps[0] if len(sweeps) == 1 else expr.Metric("Group").isin(sweeps))
    if experiment:
        filters.append(expr.Config("experiment") == experiment)
    return filters


def build_workspace(
    entity: str, project: str, title: str, sweeps: list[str], experiment: str | None, sections=SECTIONS
):
    import wandb_workspaces.workspaces as ws

    return ws.Workspace(
        entity=entity,
        project=project,
        name=title,
        sections=[ws.Section(name=s.name, panels=[wandb_panel(p) for p in s.panels], is_open=True) for s in sections],
        settings=ws.WorkspaceSettings(x_axis="Step", max_runs=MAX_RUNS),
        runset_settings=ws.RunsetSettings(
            filters=run_filters(sweeps, experiment),
            pinned_columns=[f"summary:{k}" for k in ("status", "excess_mem_mb", "peak_mem_mb", "step_time_median_s")],
        ),
    )


def build_wandb_report(
    entity: str,
    project: str,
    title: str,
    sweeps: list[str],
    experiment: str | None,
    online: bool = False,
    sections=SECTIONS,
):
    """The report: an introduction, then per section a heading, what to read, and its panels over the filtered
    runs. Offline its run sets name no project (resolving one asks the server); the report's own is theirs."""
    import wandb_workspaces.reports.v2 as wr

    where = {"entity": entity, "project": project} if online else {}
    scope = ", ".join([*(f"sweep {s}" for s in sweeps), *([f"experiment {experiment}"] if experiment else [])])
    blocks: list = [
        wr.P(
            f"JAX vs PyTorch automatic differentiation on BERT ({scope or 'every run of the project'}): one run "
            "per trial, named by its label, grouped by sweep. Built by `python -m bench dashboard`."
        ),
        wr.TableOfContents(),
    ]
    for s in sections:
        runset = wr.Runset(name=s.name, filters=run_filters(sweeps, experiment), **where)
        blocks += [
            wr.H2(s.name),
            wr.P(s.read),
            wr.PanelGrid(runsets=[runset], panels=[wandb_panel(p) for p in s.panels]),
        ]
    return wr.Report(
        entity=entity,
        project=project,
        title=title,
        width="fluid",
        blocks=blocks,
        description="Memory, time, training and scaling of every way of differentiating.",
    )


def specification(workspace, report) -> dict[str, Any]:
    """The workspace's and the report's W&B specifications, as their save() would send them (JSON)."""
    return {
        "workspace": json.loads(workspace._model.model_dump_json(by_alias=True, exclude_none=True)),
        "report": json.loads(report._to_model().model_dump_json(by_alias=True, exclude_none=True)),
    }


# ------------------------------------------------------------------------------------------------------ CLI


class DashboardError(ConfigError):
    """Bad input for the dashboard: one line naming the option, the value and what is accepted."""


def select_runs(runs: list[dict], sweeps: list[str], experiment: str | None) -> list[dict]:
    """The runs a view shows: those of the sweeps (W&B groups) and the experiment asked for, all by default."""
    return [
        r
        for r in runs
        if (not sweeps or r["run"].get("group") in sweeps)
        and (not experiment or r["config"].get("experiment") == experiment)
    ]


def parse(argv: list[str] | None):
    parser = OneLineParser(
        "dashboard",
        "python -m bench dashboard [--results DIR] [--sweep ID ...] [--experiment NAME] [--title TEXT] "
        "[--entity E] [--project P] [--dry-run [SPEC.json]] [--online]",
        description="A W&B workspace and report of the suite's runs: saved online, or their spec written offline.",
    )
    parser.add_argument(
        "--results",
        default=str(DEFAULT_RESULTS),
        metavar="DIR",
        help=f"results folder whose wandb/ holds the offline runs (default: {DEFAULT_RESULTS})",
    )
    parser.add_argument(
        "--sweep",
        action="append",
        default=[],
        metavar="ID",
        help="only this sweep's runs (its sweep_id, the runs' W&B group); repeat for several",
    )
    parser.add_argument("--experiment", metavar="NAME", help="only runs of +experiment=NAME")
    parser.add_argument("--title", help="the workspace's and the report's title (default: bench and the filters)")
    parser.add_argument("--entity", help="W&B entity (default: the runs' logger.entity, WANDB_ENTITY, your own)")
    parser.add_argument("--project", help="W&B project (default: the offline runs' project, else bench)")
    parser.add_argument(
        "--dry-run",
        nargs="?",
        const="",
        default=None,
        metavar="SPEC.json",
        help=f"never touch the network: write the spec only (default file: <results>/{SPEC_NAME})",
    )
    parser.add_argument("--online", action="store_true", help="save to W&B (also with WANDB_MODE=online)")
    args = parser.parse_args(argv)
    for name in ("sweep", "experiment", "title", "entity", "project"):
        values = getattr(args, name) if name == "sweep" else [getattr(args, name)]
        for v in values:
            if v is not None and not v.strip():
                parser.error(f"--{name}={v!r}: empty; accepted a non-empty name")
    if args.title is not None and len(args.title) > TITLE_MAX:
        parser.error(f"--title: {len(args.title)} characters; accepted at most {TITLE_MAX} (W&B's limit)")
    if args.online and args.dry_run is not None:
        parser.error("--online with --dry-run: accepted one of them")
    return args


def default_title(sweeps: list[str], experiment: str | None) -> str:
    scope = [*(f"sweep {s}" for s in sweeps), *([experiment] if experiment else [])]
    return ("bench: " + ", ".join(scope) if scope else "bench: JAX vs PyTorch autodiff")[:TITLE_MAX]


def wandb_mode(args) -> str:
    """online (--online, or WANDB_MODE=online without --dry-run) or offline; DashboardError when W&B is off."""
    mode = resolve_wandb_mode("online" if args.online else "offline")
    if args.online and mode == "disabled":
        raise DashboardError("--online: WANDB_MODE=disabled turns W&B off; accepted: unset it, or --dry-run")
    return "online" if mode == "online" and args.dry_run is None else "offline"


def build(args, mode: str, columns: Sequence[str]) -> tuple[dict[str, Any], Any, Any]:
    """Read the offline runs, build the workspace and the report, and say which panels these runs fill: (spec,
    workspace, report). DashboardError when there is nothing to show. Online, building the report asks W&B for
    the project's id (its run sets name it)."""
    results = Path(args.results)
    if results.exists() and not results.is_dir():
        raise DashboardError(f"--results={results}: is a file; accepted a results folder")
    runs = offline_runs(results)
    if not runs and not (args.sweep or args.experiment):
        raise DashboardError(
            f"no W&B runs under {results / 'wandb'} and nothing to filter on; accepted: a "
            "sweep run with logger=wandb first, or --sweep ID / --experiment NAME for runs on W&B"
        )
    shown = select_runs(runs, args.sweep, args.experiment)
    project = args.project or most_common([r["run"].get("project") for r in shown or runs]) or "bench"
    entity = (
        args.entity
        or most_common([r["run"].get("entity") for r in shown or runs])
        or os.environ.get("WANDB_ENTITY")
        or ""
    )
    title = args.title or default_title(args.sweep, args.experiment)
    check_sections(columns)
    sections, waiting = ready(columns)
    online = mode == "online"
    if online and not entity:
        import wandb

        entity = wandb.Api().default_entity or ""
    workspace = build_workspace(entity, project, title, args.sweep, args.experiment, sections)
    report = build_wandb_report(entity, project, title, args.sweep, args.experiment, online, sections)
    spec = {
        "format": SPEC_FORMAT,
        "mode": mode,
        "entity": entity or None,
        "project": project,
        "title": title,
        "filters": {"sweeps": args.sweep, "experiment": args.experiment},
        "runs": {
            "dir": str(results / "wandb"),
            "read": len(runs),
            "shown": len(shown),
            "groups": sorted({r["run"].get("group") or "" for r in shown}),
        },
        "panels": panel_status(shown, sections),
        "waiting": waiting,
        **specification(workspace, report),
    }
    return spec, workspace, report


def most_common(values: list) -> str | None:
    values = [v for v in values if v]
    return max(set(values), key=values.count) if values else None


def first_line(e: Exception) -> str:
    return (str(e).strip().splitlines() or [""])[0]


def outcome_lines(spec: dict, path: Path, args) -> list[str]:
    """What the command says: where the spec went, which panels these runs fill, and the URLs or the way on."""
    empty = [f"{p['section']} / {p['title']}" for p in spec["panels"] if p["filled"] is False]
    n, shown = len(spec["panels"]), spec["runs"]["shown"]
    checked = (
        f"{n - len(empty)} of {n} panels filled by these {shown} runs"
        if shown
        else f"{n} panels, not checked: no run under {spec['runs']['dir']} matches"
    )
    lines = [f"workspace and report '{spec['title']}' -> {path} ({checked})"]
    if empty:
        lines.append(f"not filled by these runs: {'; '.join(empty)}")
    if spec["waiting"]:
        lines.append(
            "waiting for columns: " + "; ".join(f"{w['section']} ({', '.join(w['needs'])})" for w in spec["waiting"])
        )
    if spec["mode"] == "online":
        lines += [f"workspace {spec['saved']['workspace']}", f"report {spec['saved']['report']}"]
    else:
        again = ["--results", str(args.results)] if Path(args.results) != DEFAULT_RESULTS else []
        again += [a for s in args.sweep for a in ("--sweep", s)]
        again += ["--experiment", args.experiment] if args.experiment else []
        lines.append(
            f"to save them: wandb sync {shlex.quote(str(Path(args.results) / 'wandb'))}/offline-run-* && "
            + shlex.join(["python", "-m", "bench", "dashboard", "--online", *again])
        )
    return [f"bench dashboard: {line}" for line in lines]


def main(argv: list[str] | None, columns: Sequence[str]) -> int:
    """`python -m bench dashboard`; `columns`: every scenario's CSV columns (the keys a run can carry)."""
    return run("dashboard", lambda: dashboard(parse(argv), columns), interrupted="no spec was written")


def dashboard(args, columns: Sequence[str]) -> int:
    mode = wandb_mode(args)
    try:
        spec, workspace, report = build(args, mode, columns)
        if mode == "online":
            workspace.save()
            report.save()
            spec["saved"] = {"workspace": workspace.url, "report": report.url}
    except DashboardError:
        raise
    except Exception as e:  # online: W&B refused or could not be reached; offline nothing here talks to it
        if mode != "online":
            raise
        print(f"bench dashboard: error: W&B: {type(e).__name__}: {first_line(e)}", file=sys.stderr)
        return 1
    path = Path(args.dry_run) if args.dry_run else Path(args.results) / SPEC_NAME
    path.parent.mkdir(parents=True, exist_ok=True)
    text = json.dumps(spec, indent=1, default=str)
    key = os.environ.get("WANDB_API_KEY")
    if key:  # the spec holds only names, but a key pasted into --title or --entity must not reach a file either
        text = text.replace(key, REDACTED)
    path.write_text(text, encoding="utf-8")
    print("\n".join(outcome_lines(spec, path, args)))
    return 0
