"""`python -m bench rerun RUN_ID [--results DIR]`: run a recorded trial again from the config it ran with, and
say whether it repeated its losses.

Every trial keeps its resolved config beside its row (<results>/configs/<run_id>.json, runner.save_config). The
rerun is a new trial of that config (a new row, a new run_id) through the same harness; its per-step losses are
compared with the recorded ones, bit for bit. Exit 0 when they are identical, 1 when they differ or the rerun did
not end ok, 2 for a run_id that is not recorded or whose config is missing or damaged (nothing is run then). A
tuning sweep's or a target's trial is rerun as tuning=rerun (as_rerun): the cost report keeps it apart from the
search and the winner's seeds.
What is bit-identical and where it ends: docs/reproducibility.md.
"""

from __future__ import annotations

import json
from pathlib import Path

from bench.config import default, from_dict
from bench.errors import ConfigError
from bench.harness.command import OneLineParser, run
from bench.harness.launch import stop_descendants
from bench.harness.runner import config_path, run_job
from bench.harness.scenario import RUNNER_FOLDERS, Registry, validate
from bench.harness.trust import check_data
from bench.store.csv import check_folders, check_results_file
from bench.store.read import is_run_id, read_rows


def parse(argv: list[str] | None):
    p = OneLineParser("rerun", "python -m bench rerun RUN_ID [--results DIR]", description=__doc__.splitlines()[0])
    p.add_argument("run_id", help="a recorded trial's run_id (the runs.csv column)")
    p.add_argument("--results", default="results", metavar="DIR", help="its results folder (default results)")
    return p.parse_args(argv)


def recorded(results: Path, run_id: str, scenarios: Registry):
    """(scenario, row) of a recorded run_id; ConfigError naming it when no results file of the folder has it."""
    if not is_run_id(run_id):
        raise ConfigError(
            f"run_id={run_id}: not a run_id (a file name, never a path); accepted: a run_id of "
            f"{results}'s rows, e.g. 20260101-120000-torch-backprop-1a2b3c"
        )
    for scenario in scenarios.values():
        rows = [r for r in read_rows(results / scenario.results_file) if r.get("run_id") == run_id]
        if rows:
            return scenario, rows[0]
    files = ", ".join(s.results_file for s in scenarios.values())
    raise ConfigError(f"run_id={run_id}: not recorded in {results} ({files}); accepted: a run_id of its rows")


def saved_config(results: Path, run_id: str):
    path = config_path(results, run_id)
    if not path.is_file():
        raise ConfigError(
            f"run_id={run_id}: its config {path} is missing (a trial recorded before configs were "
            "kept, or the file was removed); nothing was run"
        )
    try:
        data = json.loads(path.read_text())
    except Exception as e:  # noqa: BLE001 (not text, not JSON: either way the config is not usable)
        raise damaged(run_id, path, e) from None
    # a results folder may come from someone else: its values are read as written, never resolved or instantiated
    check_data(data, f"run_id={run_id}: its config {path}", "a saved config")
    try:
        return from_dict(data)
    except Exception as e:  # noqa: BLE001 (a schema error: the config is not usable)
        raise damaged(run_id, path, e) from None


def damaged(run_id: str, path: Path, e: Exception) -> ConfigError:
    first = (str(e).strip().splitlines() or [type(e).__name__])[0]
    return ConfigError(f"run_id={run_id}: its config {path} is damaged ({first}); nothing was run")


def as_rerun(cfg):
    """The recorded config as a rerun runs it. A trial of a tuning sweep, or one run to a target, is rerun as its
    own kind (tuning=rerun; tune_group kept, so the report shows it beside its group): never a search trial or a
    repeat, so it cannot join the search, change its winner or count as one of the winner's seeds."""
    if cfg.tuning or cfg.target.metric:
        cfg.tuning = "rerun"
    return cfg


def compare(old: list[float], new: list[float]) -> tuple[bool, str]:
    """Whether two loss series are identical, bit for bit, and one line saying so or where they part."""
    if old == new:
        return True, f"losses identical, bit for bit, over {len(old)} steps"
    if len(old) != len(new):
        return False, f"losses differ: {len(old)} steps recorded, {len(new)} in the rerun"
    step = next(i for i, (a, b) in enumerate(zip(old, new)) if a != b)
    worst = max(abs(a - b) for a, b in zip(old, new))
    return False, f"losses differ from step {step} ({old[step]!r} vs {new[step]!r}); largest |difference| {worst:.3g}"


def main(argv: list[str] | None, scenarios: Registry) -> int:
    args = parse(argv)
    results = Path(args.results)

    def body() -> int:
        scenario, _ = recorded(results, args.run_id, scenarios)
        old = scenario.losses(results, args.run_id)
        if old is None:
            raise ConfigError(
                f"run_id={args.run_id}: a scenario={scenario.name} trial records no losses to "
                "compare; accepted: a run of runs.csv"
            )
        cfg = as_rerun(saved_config(results, args.run_id))
        cfg.results_dir, cfg.resume = str(results), False
        # XLA loads compiled programs from its cache folder as they are: machine code, so never a folder a saved
        # config (data, perhaps someone else's) names; the cache is not what the rerun repeats
        cfg.compile_cache_dir = default("compile_cache_dir")
        validate(scenario, cfg)
        check_results_file(results / scenario.results_file, scenario.columns)
        check_folders(results, (*RUNNER_FOLDERS, *scenario.folders))
        outcome = run_job(cfg, {scenario.name: scenario})
        if outcome["status"] != "ok":
            print(f"bench rerun: {args.run_id}: the rerun {outcome['run_id']} ended {outcome['status']}")
            return 1
        same, line = compare(old, scenario.losses(results, outcome["run_id"]) or [])
        print(f"bench rerun: {args.run_id} -> {outcome['run_id']}: {line}")
        return 0 if same else 1

    return run("rerun", body, first=stop_descendants, interrupted="the rerun was stopped and nothing recorded for it")
