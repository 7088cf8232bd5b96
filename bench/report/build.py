"""The report: report.md and its plots from a results folder, put together from the scenarios' sections.

    python -m bench report [RESULTS ...] [--out DIR] [--benchmarks DIR]
    (`make report`: results/ -> results/report.md, and a dated copy in benchmarks/)

RESULTS is a results folder (its runs.csv and every other scenario's file beside it: ops.csv, capacity.csv,
overhead.csv, history/) or a runs CSV (the files beside it are read too); the default is `results`. Each section
(bench/report/section.py; the list and its order: bench/scenarios/__init__.py) reads what it needs, draws its plots
into DIR/plots/ and returns its markdown. The results are only ever read. With W&B on (the results hold its
offline runs), a `report` run keeps report.md and every plot it shows. With --benchmarks, report.md is also
kept as DIR/<date>_<host>_<sha>.md with where and how it was measured: the dated record every number in README
and docs/ cites.
"""

from __future__ import annotations

import re
import shlex
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import date
from pathlib import Path

from bench.harness.command import OneLineParser, run
from bench.measure.system import cpu_name, cuda_gpu_names, git_sha, gpu_slug, host_facts, host_slug
from bench.report.section import PLOT_DIR, RUNS_CSV, Results, Section
from bench.report.tables import num
from bench.store.read import ReadError
from bench.store.wandb import log_report

DEFAULT_RESULTS = Path("results")


@dataclass
class Report:
    path: Path  # report.md
    plots: list[Path]  # the plots it shows
    text: str


def results_of(paths: Sequence[str | Path]) -> Results:
    """The results a report reads: each path a results folder (its runs.csv, if any) or a runs CSV, which must
    exist (ReadError, one line)."""
    runs = []
    for p in map(Path, paths or [DEFAULT_RESULTS]):
        if not p.is_dir() and not p.is_file():
            raise ReadError(
                f"csv={p}: no such file (accepted: a results folder, or a results CSV written by "
                "`python -m bench`, e.g. results/runs.csv; `make bench` writes one)"
            )
        runs.append(p / RUNS_CSV if p.is_dir() else p)
    return Results(runs)


def build(sections: Sequence[Section], results: Results, out_dir: str | Path) -> Report:
    """Write out_dir/report.md, every section in order, and their plots into out_dir/plots/."""
    out_dir = Path(out_dir)
    if out_dir.exists() and not out_dir.is_dir():
        raise ReadError(f"--out={out_dir}: is a file (accepted: a folder, created if missing)")
    report_path = out_dir / "report.md"
    for p in results.runs:
        if p.resolve() == report_path.resolve():
            raise ReadError(f"--out={out_dir}: report.md would overwrite csv={p} (accepted: another folder)")
    lines = ["# bench report", ""]
    # the folder is made once the sections have read their files: a runs CSV the first section cannot read stops
    # the report (ReadError) before anything is written
    for section in sections:
        lines += section.render(results, out_dir / PLOT_DIR)
    if len(lines) == 2:
        lines += [f"No results in {', '.join(f'`{f}`' for f in results.folders)}: `make bench` writes some.", ""]
    text = "\n".join(lines)
    out_dir.mkdir(parents=True, exist_ok=True)
    report_path.write_text(text, encoding="utf-8")
    shown = sorted(set(re.findall(rf"\]\(({PLOT_DIR}/[^)]+\.png)\)", text)))
    return Report(report_path, [out_dir / p for p in shown], text)


def keep_benchmark(report: Report, folder: Path, command: str, rows: Sequence[dict] = ()) -> Path:
    """report.md as folder/<date>_<host>_<sha>.md, headed by where, when and how it was measured. Its plots are
    named, not linked: benchmarks/ holds text, and the PNGs stay in the report's folder. `rows`: the runs the
    report read, which name the commit and the device they were measured on: a GPU's rows brought back and
    reported on this host are named by the lease's newest row (the rows kept from earlier leases are older): its
    GPU, its commit and its versions, with this host as the writer."""
    sha = git_sha() or "nogit"
    recorded = sorted({r.get("git_sha") or "unknown" for r in rows})
    facts, slug, hardware = host_facts(), host_slug(), ", ".join(cuda_gpu_names()) or cpu_name()
    gpu_rows = [r for r in rows if r.get("device") == "cuda" and r.get("device_name")]
    if gpu_rows and not cuda_gpu_names():
        newest = max(gpu_rows, key=lambda r: r.get("started_at") or "")
        facts = {k: newest.get(k) or "?" for k in facts}
        hardware = ", ".join(sorted({r["device_name"] for r in gpu_rows}))
        slug = gpu_slug(newest["device_name"], max(int(num(r, "devices") or 1) for r in gpu_rows))
        sha = newest.get("git_sha") or sha
    # the rows name the card and the commit: as a file name, only what a slug or a sha holds, so a row edited to
    # name a path ("../x") cannot put the kept copy outside `folder`
    path = Path(folder) / f"{date.today():%Y-%m-%d}_{file_word(slug)}_{file_word(sha)}.md"
    header = [
        f"# Measured {date.today():%Y-%m-%d} on {slug} at git {sha}",
        "",
        f"- host: {hardware}; Python {facts['python_version']}; torch {facts['torch_version']}, jax "
        f"{facts['jax_version']}, flax {facts['flax_version']}, transformers {facts['transformers_version']}",
        *([f"- the rows were measured at git {', '.join(recorded)}"] if recorded else []),
        *(
            [f"- the report was written on {host_slug()} from the rows the device brought back"]
            if slug != host_slug()
            else []
        ),
        f"- written by: `{command}` from the rows below (each table names the experiment or sweep that "
        "recorded it: `python -m bench -m +experiment=NAME`)",
        "",
    ]
    body = report.text.replace("# bench report\n", "", 1)
    body = re.sub(rf"!\[([^]]*)\]\(({PLOT_DIR}/[^)]+)\)", rf"*(plot: {report.path.parent}/\2)*", body)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("\n".join(header) + body, encoding="utf-8")
    return path


def file_word(text: str) -> str:
    return re.sub(r"[^A-Za-z0-9_+-]+", "-", text).strip("-") or "unknown"


def parse(argv: list[str] | None):
    parser = OneLineParser(
        "report",
        "python -m bench report [RESULTS ...] [--out DIR] [--benchmarks DIR]",
        description="Tables and plots from bench's results -> DIR/report.md and DIR/plots/*.png.",
    )
    parser.add_argument(
        "results", nargs="*", metavar="RESULTS", help=f"results folders or runs CSVs (default: {DEFAULT_RESULTS})"
    )
    parser.add_argument(
        "--out",
        default=str(DEFAULT_RESULTS),
        metavar="DIR",
        help=f"folder for report.md and plots/ (default: {DEFAULT_RESULTS})",
    )
    parser.add_argument(
        "--benchmarks",
        metavar="DIR",
        help="also keep report.md as DIR/<date>_<host>_<sha>.md (make report: benchmarks)",
    )
    return parser.parse_args(argv)


def main(argv: list[str] | None, sections: Sequence[Section]) -> int:
    """`python -m bench report`."""
    args = parse(argv)

    def body() -> int:
        results = results_of(args.results)
        report = build(sections, results, args.out)
        log_report(report.path, report.plots)
        print(f"bench report: {report.path} ({len(report.plots)} plots)")
        if args.benchmarks:
            command = shlex.join(["python", "-m", "bench", "report", *(argv or [])])
            kept = keep_benchmark(report, Path(args.benchmarks), command, results.rows(RUNS_CSV))
            print(f"bench report: kept as {kept}")
        return 0

    return run("report", body, interrupted="report.md was not (re)written; the plots drawn so far are kept")
