"""A sweep's plan, shared through a small JSON file in the sweep directory (shared storage on SLURM): its id, how
many trials it runs, the configurations it runs (their hashes), and the trials a sweeper added once it knew them
(the tuning sweeper's repeats of each winner). The launching process writes it; each job reads its total there."""

from __future__ import annotations

import json
import os
from pathlib import Path

SWEEP_FILE = "bench_sweep.json"


def read_plan(sweep_dir) -> dict:
    path = Path(sweep_dir) / SWEEP_FILE
    return json.loads(path.read_text()) if path.exists() else {"sweep_id": Path(sweep_dir).name, "total": None}


def write_plan(sweep_dir, plan: dict) -> None:
    """Written whole, then renamed: a job starting meanwhile reads the old plan or the new, never half of one."""
    path = Path(sweep_dir) / SWEEP_FILE
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f"{SWEEP_FILE}.{os.getpid()}.tmp")
    tmp.write_text(json.dumps(plan))
    tmp.replace(path)


def add_trials(sweep_dir, trials: list[list[str]], total: int) -> None:
    """A sweeper's trials known only now (their override lists) and the sweep's total, now exact."""
    plan = read_plan(sweep_dir)
    write_plan(sweep_dir, {**plan, "total": total, "added": [*plan.get("added", []), *trials]})
