"""W&B runs: one per trial, a view on the same numbers as the CSV row (bench/sinks.py, the record of truth). Knows
nothing of BERT. A W&B failure never costs the CSV row: WandbSink warns in one line and returns None. No API key
is ever written: scrub_secrets redacts anything that looks like one before it reaches a run.

What a run carries, so that a view can be built on it (bench/dashboard.py): config keys named as the CSV's columns
(run_config), per-device numbers under devices/<i>/<column> (device_summary), W&B Tables of rows. Beside the
trials' runs: one sweep-level run per sweep (log_sweep: the sweep's rows as a Table) and one per report (log_report:
the report's plots and markdown).

Reading an offline run back (read_wandb_offline, offline_runs) is for the tests and the dashboard: wandb no longer
ships a reader.
"""

from __future__ import annotations

import json
import os
import re
import struct
import time
import warnings
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any


def flatten(d: Mapping[str, Any], sep: str = ".", prefix: str = "") -> dict[str, Any]:
    """{"model": {"num_layers": 2}} -> {"model.num_layers": 2}. "." because that is how the key is written as
    a Hydra override, so a W&B config key is exactly the option that reproduces it."""
    out: dict[str, Any] = {}
    for k, v in d.items():
        key = f"{prefix}{sep}{k}" if prefix else str(k)
        if isinstance(v, Mapping):
            out.update(flatten(v, sep, key))
        elif v is None or isinstance(v, (bool, int, float, str)):
            out[key] = v
        elif isinstance(v, (list, tuple)):
            out[key] = [x if x is None or isinstance(x, (bool, int, float, str)) else str(x) for x in v]
        else:
            out[key] = str(v)  # Paths, enums, dtypes: W&B config values must be JSON
    return out


REDACTED = "<redacted>"
# Whole words of a key name that mark a secret ("wandb.api_key", "hf_token"; not "tokens_per_s", "tokenizer").
_SECRET_WORDS = {
    "key",
    "apikey",
    "token",
    "secret",
    "password",
    "passwd",
    "credential",
    "credentials",
    "auth",
}
# A W&B API key is 40 hex characters (local servers prefix it, e.g. "local-<40 hex>"). So is a git SHA-1:
# values under a name that says hash/sha/digest/commit keep them.
_KEY_VALUE = re.compile(r"^(?:[a-z]+-)?[0-9a-f]{40}$")
_HASH_WORDS = {"sha", "hash", "digest", "commit"}


def _words(name: str) -> set[str]:
    return {w for w in re.split(r"[^a-z0-9]+", name.lower()) if w}


def scrub_secrets(d: Mapping[str, Any]) -> dict[str, Any]:
    """A copy of a flat dict with anything that looks like a credential replaced by "<redacted>": keys named
    like one, values shaped like a W&B API key, and any value containing this process's WANDB_API_KEY."""
    env_key = os.environ.get("WANDB_API_KEY") or None
    out: dict[str, Any] = {}
    for k, v in d.items():
        words = _words(k)
        secret = bool(words & _SECRET_WORDS)
        if isinstance(v, str):
            if env_key and env_key in v:
                secret = True
            elif _KEY_VALUE.match(v.strip().lower()) and not words & _HASH_WORDS:
                secret = True
        out[k] = REDACTED if secret else v
    return out


def resolve_wandb_mode(mode: str = "offline", env: Mapping[str, str] | None = None) -> str:
    """The W&B mode to run in. Offline unless online was asked for explicitly, by the `mode` argument or by
    the user's WANDB_MODE=online; disabled, asked for either way, always wins (the user's off switch)."""
    env = os.environ if env is None else env
    accepted = ("offline", "online", "disabled")
    if mode not in accepted:
        raise ValueError(f"wandb mode={mode!r}: accepted {', '.join(accepted)}")
    env_mode = env.get("WANDB_MODE", "").strip().lower()
    if "disabled" in (mode, env_mode):
        return "disabled"
    if mode == "online" or env_mode == "online":
        return "online"
    return mode


FLUSH_TIMEOUT_S = 10.0  # the run's flush to disk takes milliseconds; 10 s allows for a loaded machine


class WandbSink:
    """One W&B run per trial. `write(row, history)` creates the run, logs the history and the summary, and
    finishes it, all after the measurements: W&B's service process never runs during a timed step.

    config   the trial's config, flattened ("model.num_layers") and scrubbed of anything secret-looking
    summary  the result row (its CSV columns), scrubbed the same way
    history  per-step series, e.g. {"loss": [...], "step_time_s": [...]}, logged with explicit step=i
    group    the sweep, so W&B groups a sweep's trials (default: the row's sweep_id); name defaults to the
             row's run_id, job_type to the row's mode

    Offline by default (see resolve_wandb_mode); runs land under `dir`/wandb/offline-run-*, and `wandb sync`
    uploads them later. No API key is ever written: it is not in config, and metadata collection (which
    records the command line, where a key could be passed as an override) is off.
    """

    def __init__(
        self,
        project: str,
        group: str | None,
        name: str | None,
        config: Mapping[str, Any],
        mode: str = "offline",
        dir: str | os.PathLike[str] = "results",
        entity: str | None = None,
        tags: Sequence[str] = (),
        job_type: str | None = None,
    ):
        self.project = project
        self.group = group
        self.name = name
        self.config = scrub_secrets(flatten(config))
        self.mode = resolve_wandb_mode(mode)
        self.dir = Path(dir)
        self.entity = entity
        self.tags = list(tags)
        self.job_type = job_type
        self.run_dir: Path | None = None

    def write(
        self,
        row: Mapping[str, Any],
        history: Mapping[str, Sequence[float]] | None = None,
        summary: Mapping[str, Any] | None = None,
        tables: Mapping[str, Sequence[Mapping[str, Any]]] | None = None,
        images: Mapping[str, Sequence[str | os.PathLike[str]]] | None = None,
        artifacts: Mapping[str, Sequence[str | os.PathLike[str]]] | None = None,
    ) -> Path | None:
        """Log one trial; returns its run directory (None when disabled, or when W&B failed: one warning).
        `summary`: further summary keys beside the row's columns (devices/<i>/<column>); `tables`: W&B Tables
        of rows (a list of dicts; the columns are their keys, first seen first), logged once after the history;
        `images`: lists of image files, each list one media key, one image a step (the file's stem its caption);
        `artifacts`: files, each list one artifact of the run's job_type (each file named by its path under
        the list's common folder)."""
        if self.mode == "disabled":
            return None
        try:
            import wandb  # lazily: trial processes that never log do not pay for it

            self.dir.mkdir(parents=True, exist_ok=True)
            run = wandb.init(
                project=self.project,
                entity=self.entity,
                group=self.group if self.group is not None else row.get("sweep_id"),
                name=self.name if self.name is not None else row.get("run_id"),
                job_type=self.job_type if self.job_type is not None else row.get("mode"),
                tags=self.tags or None,
                config=self.config,
                dir=str(self.dir),
                mode=self.mode,
                settings=wandb.Settings(
                    silent=True,
                    console="off",  # the trial's stdout is not W&B's business
                    x_disable_stats=True,  # no system-metrics sampler next to a measurement
                    x_disable_meta=True,  # no command line / environment capture (could carry secrets)
                    save_code=False,
                    reinit="create_new",  # never touch a run the caller may have open
                ),
            )
        except Exception as e:
            _warn_wandb(self.name, "init", e)
            return None
        try:
            self.run_dir = Path(run.settings.sync_dir)
            steps = _history_rows(history or {})
            for step, metrics in enumerate(steps):
                run.log(metrics, step=step)
            step = len(steps)  # tables and images after the per-step series: the history's steps stay the trial's
            if tables:
                run.log({name: _table(wandb, rs) for name, rs in tables.items()}, step=step)
                step += 1
            for name, paths in (images or {}).items():  # one image a step: plots of different sizes stay apart
                for p in paths:
                    run.log({name: wandb.Image(str(p), caption=Path(p).stem)}, step=step)
                    step += 1
            for name, paths in (artifacts or {}).items():
                artifact = wandb.Artifact(name, type=self.job_type or "files")
                root = Path(os.path.commonpath([Path(p).parent for p in paths])) if paths else Path()
                for p in paths:  # named by their place under the files' common folder (a trace's rank<r>/...)
                    artifact.add_file(str(p), name=str(Path(p).relative_to(root)))
                run.log_artifact(artifact)
            extra = {k: v for k, v in (summary or {}).items() if v is not None}
            run.summary.update(scrub_secrets({**{k: v for k, v in row.items() if v is not None}, **extra}))
        except Exception as e:
            _warn_wandb(self.name, "log", e)
        finally:
            try:
                run.finish()
            except Exception as e:
                _warn_wandb(self.name, "finish", e)
        # wandb 0.31 can return from finish() before its service process has written the run to disk (seen:
        # the .wandb file still 7 bytes long just after). Wait for the final "exit" record, so that a returned
        # run directory is complete, as a written CSV row is.
        if self.run_dir is not None and not wait_for_wandb_run(self.run_dir, FLUSH_TIMEOUT_S):
            warnings.warn(
                f"W&B run {self.run_dir} not complete on disk after {FLUSH_TIMEOUT_S:g} s",
                RuntimeWarning,
                stacklevel=2,
            )
        return self.run_dir


def _table(wandb, rows: Sequence[Mapping[str, Any]]):
    """A W&B Table of result rows, scrubbed as the summary is; cells as the CSV holds them (None: empty)."""
    columns = list(dict.fromkeys(k for r in rows for k in r))
    data = [[_cell(scrub_secrets(r).get(c)) for c in columns] for r in rows]
    return wandb.Table(columns=columns, data=data, allow_mixed_types=True)


def _cell(v: Any) -> Any:
    return v if v is None or isinstance(v, (bool, int, float, str)) else str(v)


def _history_rows(history: Mapping[str, Sequence[float]]) -> list[dict[str, float]]:
    n = max((len(v) for v in history.values()), default=0)
    return [{k: float(v[i]) for k, v in history.items() if i < len(v) and v[i] is not None} for i in range(n)]


def _warn_wandb(name: str | None, what: str, e: Exception) -> None:
    msg = (str(e).strip().splitlines() or [""])[0]
    warnings.warn(
        f"W&B {what} failed for run {name!r} (the CSV row is unaffected): {type(e).__name__}: {msg}",
        RuntimeWarning,
        stacklevel=3,
    )


# --- what a run carries for the views (bench/dashboard.py)

SWEEP_TABLE = "sweep_rows"  # the sweep-level run's Table: the sweep's rows, as its summary table shows them
REPORT_PLOTS = "report_plots"  # the report run's images: the report's PNG plots
DEVICES = "devices"  # per-device numbers: devices/<i>/<column>, i the device's place in the trial's list
OPS_TABLE = "ops_rows"  # an ops trial's Table: its rows, one per op and shape


def geomean_key(column: str) -> str:
    """The summary key of a column's geometric mean over a trial's rows (an ops trial's cost ratios)."""
    return f"{column}_geomean"


def run_config(config: Mapping[str, Any], columns: Mapping[str, Any]) -> dict[str, Any]:
    """A run's config: `config` flattened under its dotted names (model.num_layers: the override that reproduces
    it), and `columns`, the result row's configuration columns, under the CSV's own names (what views group and
    filter by: config and summary then name a thing alike). A top-level config key that a column of the same name
    gives another value (device=auto that ran on cpu) keeps what was asked as requested.<name> (not when nothing
    was: null)."""
    flat = flatten(config)
    out = dict(flat)
    for k, v in columns.items():
        if k in flat and flat[k] is not None and flat[k] != v:
            out[f"requested.{k}"] = flat[k]
        out[k] = v
    return out


def device_summary(devices: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """Each device's numbers (a trial's history["devices"]: one dict per device, not per step) as summary keys
    devices/<i>/<column>: W&B history is per step, so a list per device has no place there."""
    return {
        f"{DEVICES}/{i}/{k}": v
        for i, d in enumerate(devices)
        for k, v in d.items()
        if v is None or isinstance(v, (bool, int, float, str))
    }


def run_tags(*tags: Any) -> list[str]:
    """Tags without the empty ones and repeats, in order: a run's framework, mode, experiment, strategy..."""
    return list(dict.fromkeys(str(t) for t in tags if t not in (None, "")))


def log_sweep(
    config: Mapping[str, Any], rows: Sequence[Mapping[str, Any]], columns: Sequence[str], sweep_id: str
) -> Path | None:
    """The sweep-level run, when a sweep ends (logger=wandb): the sweep's rows as one W&B Table (SWEEP_TABLE,
    `columns` in the CSV's order) and its trials counted by status, in the sweep's group, job_type "sweep".
    `config` is the sweep's (Hydra) config: its logger and results_dir say where the run goes."""
    lg = config["logger"]
    if lg["name"] != "wandb" or not rows:
        return None
    experiment = next((r.get("experiment") for r in rows if r.get("experiment")), "")
    statuses = Counter(f"trials_{r.get('status') or 'unknown'}" for r in rows)
    table = [{c: r.get(c) for c in columns if c in r} for r in rows]
    sink = WandbSink(
        project=lg["project"],
        group=sweep_id,
        name=f"sweep {sweep_id}",
        mode=lg["mode"],
        dir=config["results_dir"],
        config={"sweep_id": sweep_id, "experiment": experiment, "scenario": config.get("scenario", "model")},
        entity=lg["entity"],
        tags=run_tags("sweep", experiment, *lg["tags"]),
        job_type="sweep",
    )
    return sink.write({"sweep_id": sweep_id, "rows": len(rows), **statuses}, tables={SWEEP_TABLE: table})


def log_report(
    report_path: str | os.PathLike[str],
    plot_paths: Sequence[str | os.PathLike[str]],
    results_dir: str | os.PathLike[str] | None = None,
) -> Path | None:
    """The report's PNG plots (REPORT_PLOTS) and its markdown (an artifact of type "report") as one run, job_type
    "report", when W&B is on for these results: their folder (default: the report's) holds offline runs
    (results/wandb/offline-run-*) and WANDB_MODE is not disabled. The run goes where the trials' runs went: their
    project, offline unless WANDB_MODE=online. Returns its run directory, or None when W&B is off."""
    results = Path(results_dir) if results_dir is not None else Path(report_path).parent
    found = offline_runs(results)
    if not found or resolve_wandb_mode("offline") == "disabled":
        return None
    project = Counter(r["run"].get("project") for r in found).most_common(1)[0][0] or "bench"
    entity = next((r["run"]["entity"] for r in reversed(found) if r["run"].get("entity")), None)
    sink = WandbSink(
        project=project,
        group="report",
        name=f"report {time.strftime('%Y%m%d-%H%M%S')}",
        config={"report": str(report_path)},
        dir=results,
        entity=entity,
        tags=["report"],
        job_type="report",
    )
    return sink.write(
        {"plots": len(plot_paths)},
        images={REPORT_PLOTS: list(plot_paths)},
        artifacts={"bench-report": [report_path, *plot_paths]},
    )


# --- reading an offline run back (tests, the dashboard, log_report)

LOG_BLOCK = 32768  # W&B's .wandb file is a LevelDB log: 32 KiB blocks of records with 7-byte headers
_LOG_HEADER = struct.Struct("<IHB")  # crc32, length, type
_FULL, _FIRST, _MIDDLE, _LAST = 1, 2, 3, 4


def _wandb_records(path: Path) -> Iterable[Any]:
    from wandb.proto import wandb_internal_pb2

    data = path.read_bytes()
    if data[:4] != b":W&B":
        raise ValueError(f"{path}: not a W&B datastore (no ':W&B' file header)")
    pos, chunks = 7, []  # file header: ident ":W&B", magic uint16, version uint8
    while pos + _LOG_HEADER.size <= len(data):
        room = LOG_BLOCK - pos % LOG_BLOCK
        if room < _LOG_HEADER.size:  # block trailer (zero padding)
            pos += room
            continue
        _, length, kind = _LOG_HEADER.unpack_from(data, pos)
        if kind == 0:  # zero padding up to the block end
            pos += room
            continue
        if pos + _LOG_HEADER.size + length > len(data):  # a record still being written
            return
        payload = data[pos + _LOG_HEADER.size : pos + _LOG_HEADER.size + length]
        pos += _LOG_HEADER.size + length
        if kind in (_FULL, _FIRST):
            chunks = [payload]
        else:
            chunks.append(payload)
        if kind in (_FULL, _LAST):
            rec = wandb_internal_pb2.Record()
            rec.ParseFromString(b"".join(chunks))
            yield rec


def _item_key(item: Any) -> str:
    return ".".join(item.nested_key) if item.nested_key else item.key


def _put(d: dict[str, Any], item: Any) -> None:
    """A summary or history item into d: a nested key (a Table's {"_type": "table-file", ...}, "_wandb") as the
    nested dict wandb logged, so d's keys are the names that were logged."""
    *outer, last = list(item.nested_key) or [item.key]
    for k in outer:
        d = d.setdefault(k, {})
    d[last] = json.loads(item.value_json)


def _datastore(run_dir: str | os.PathLike[str]) -> Path:
    found = sorted(Path(run_dir).glob("run-*.wandb"))
    if len(found) != 1:
        raise FileNotFoundError(f"{run_dir}: expected one run-*.wandb file, found {len(found)}")
    return found[0]


def wait_for_wandb_run(run_dir: str | os.PathLike[str], timeout_s: float = FLUSH_TIMEOUT_S) -> bool:
    """Whether the run's datastore holds its final "exit" record, waiting up to timeout_s for it."""
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            if any(r.WhichOneof("record_type") == "exit" for r in _wandb_records(_datastore(run_dir))):
                return True
        except (FileNotFoundError, ValueError):  # not created yet, or not even the file header written yet
            pass
        if time.monotonic() >= deadline:
            return False
        time.sleep(0.02)


def offline_runs(results_dir: str | os.PathLike[str]) -> list[dict[str, Any]]:
    """Every complete offline run under results_dir/wandb (read_wandb_offline's dict and its "dir"), by folder
    name (offline-run-<time>-<id>); a run still being written, or not a W&B datastore, is left out."""
    found = []
    for run_dir in sorted(Path(results_dir, "wandb").glob("offline-run-*")):
        try:
            run = read_wandb_offline(run_dir)
        except Exception:  # unreadable (OSError), not a datastore (ValueError), a damaged record (DecodeError)
            continue
        if run["complete"]:
            found.append({**run, "dir": run_dir})
    return found


def read_wandb_offline(run_dir: str | os.PathLike[str]) -> dict[str, Any]:
    """{"run", "config", "summary", "history", "complete"} of an offline run, read from its run-*.wandb file.
    "run" holds the run's identity (project, entity, name, group, job_type, tags); "complete" whether the final
    "exit" record is there (see wait_for_wandb_run). A nested summary or history value (a Table's
    {"_type": "table-file", "path": ...}) comes back as the nested dict that was logged.

    wandb 0.31 writes no files/wandb-summary.json or config.yaml for offline runs: everything is in the .wandb
    datastore (a LevelDB-format log of protobuf Records), which wandb no longer ships a Python reader for.
    W&B's own keys ("_step", "_runtime", "_timestamp", "_wandb") are left in.
    """
    path = _datastore(run_dir)
    complete = False
    run: dict[str, Any] = {}
    config: dict[str, Any] = {}
    summary: dict[str, Any] = {}
    history: list[dict[str, Any]] = []
    for rec in _wandb_records(path):
        kind = rec.WhichOneof("record_type")
        if kind == "run":
            r = rec.run
            run = {
                "project": r.project,
                "entity": r.entity,
                "name": r.display_name,
                "group": r.run_group,
                "job_type": r.job_type,
                "tags": list(r.tags),
            }
        if kind in ("run", "config"):
            cfg = rec.run.config if kind == "run" else rec.config
            for item in cfg.update:
                config[_item_key(item)] = json.loads(item.value_json)
        elif kind == "summary":
            for item in rec.summary.update:
                _put(summary, item)
            for item in rec.summary.remove:
                summary.pop(_item_key(item), None)
        elif kind == "history":
            step: dict[str, Any] = {}
            for item in rec.history.item:
                _put(step, item)
            history.append(step)
        elif kind == "exit":
            complete = True
    return {"run": run, "config": config, "summary": summary, "history": history, "complete": complete}
