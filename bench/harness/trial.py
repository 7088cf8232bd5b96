"""The trial process: the one way a trial runs. The runner (bench/harness/runner.py) spawns
`python -m bench.scenarios PAYLOAD RESULT` in a fresh session (bench/scenarios/__main__.py finds the payload's
scenario and calls `main` here): read the trial's config, run the scenario's `measure`, turn every exception into a
status, and leave the result where the parent reads it.
"""

from __future__ import annotations

import faulthandler
import json
import signal
import sys
import traceback
from collections.abc import Callable
from pathlib import Path

from bench.config import BenchConfig, from_dict
from bench.harness.launch import adopt
from bench.harness.scenario import Registry, Scenario, scenario_of
from bench.harness.signals import classify, error_line


def main(scenarios: Registry, payload: str, result: str) -> None:
    adopt(signal.SIGKILL)  # this trial dies with the runner that watches it, however the runner ends
    faulthandler.enable()  # a segfault leaves a Python traceback in the log
    cfg = from_dict(json.loads(Path(payload).read_text()))
    # what is done so far, without a status, left where the parent reads it: it completes it if this process dies
    out = outcome(scenario_of(scenarios, cfg.scenario), cfg, lambda partial: write_result(result, partial))
    write_result(result, out)
    if out["status"] != "ok":
        sys.exit(1)  # the parent stops the trial's other processes: they would wait for this one in a collective


def outcome(scenario: Scenario, cfg: BenchConfig, on_progress: Callable[[dict], None]) -> dict:
    """The scenario's measurement with every exception turned into a status: what the trial leaves its parent."""
    progress: dict = {}

    def report(partial: dict) -> None:
        progress.clear()
        progress.update(partial)
        on_progress(partial)

    try:
        return scenario.measure(cfg, report)
    except BaseException as e:  # noqa: BLE001 (every failure becomes a row)
        traceback.print_exc()
        return {**progress, **getattr(e, "fields", {}), "status": classify(e), "error": error_line(e)}


def write_result(path: str, out: dict) -> None:
    tmp = Path(path).with_suffix(".tmp")
    tmp.write_text(json.dumps(out))
    tmp.replace(path)  # atomic: the parent sees a whole result or none
