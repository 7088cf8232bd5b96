"""Every command README and docs/ show parses: `make` targets exist, `python -m bench ...` trials and sweeps pass
preflight's checks (the first trial of a sweep composed and validated, nothing run: every trial of every
experiment is test_config.py's), and each subcommand's arguments parse as its own parser reads them. A page that
shows a command the suite no longer takes fails here."""

from __future__ import annotations

import importlib
import re
import shlex
from pathlib import Path

import pytest

from bench.cli import COMMANDS
from bench.config import resolve
from bench.errors import ConfigError
from bench.harness import rerun
from bench.harness.launch import check_launch
from bench.harness.preflight import compose_trials, launcher_of
from bench.harness.scenario import scenario_of, validate
from bench.measure.system import cuda_device_count
from bench.report import build, dashboard
from bench.scenarios import SCENARIOS
from bench.scenarios.capacity import run as capacity
from bench.scenarios.gpu import check as gpu_check
from bench.scenarios.model.report import targets
from bench.scenarios.overhead import run as overhead

REPO = Path(__file__).resolve().parents[2]
PAGES = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]
PLACEHOLDER = re.compile(r"\.\.\.|<|NAME\b|RUN_ID|ID\b|DIR\b|MiB\b|\[|\$")  # a template, not a command to run


def shown_commands() -> list[tuple[str, str]]:
    """(page, command) of every `python -m bench` or `make` line in a ```bash block; a command shown on several
    pages is checked once."""
    found = []
    for page in PAGES:
        fenced = False
        text = page.read_text().replace("\\\n", " ")  # a command continued on the next line is one command
        for line in text.splitlines():
            if line.startswith("```"):
                fenced = line.strip() == "```bash"
                continue
            for part in line.split("  #")[0].split("&&"):
                part = " ".join(part.split())
                if fenced and part.startswith(("python -m bench", "make ")) and not PLACEHOLDER.search(part):
                    found.append((page.name, part))
    return list({command: (page, command) for page, command in reversed(found)}.values())


def make_targets() -> set[str]:
    return set(re.findall(r"^([a-z][a-z-]*):", (REPO / "Makefile").read_text(), flags=re.M))


def check(command: str, tmp_path: Path) -> None:
    words = shlex.split(command)
    if words[0] == "make":
        assert all(w in make_targets() or "=" in w for w in words[1:]), command
        return
    args = words[3:]
    if words[2] != "bench":  # python -m bench.<module> ...: a module with a command line of its own
        importlib.import_module(words[2]).parse(args)
        return
    if args and args[0] in COMMANDS:
        name, rest = args[0], args[1:]
        parsed = {
            "capacity": capacity.parse,
            "overhead": overhead.parse,
            "report": build.parse,
            "targets": targets.parse,
            "dashboard": dashboard.parse,
            "gpu-check": gpu_check.parse,
            "rerun": rerun.parse,
        }.get(name, lambda a: a)(rest)
        if name == "capacity" and cuda_device_count():
            capacity.prepare(parsed)
        elif name == "capacity":
            try:
                capacity.prepare(parsed)
            except ConfigError as e:  # a GPU host's command (its budget the GPU's memory): refused here, in one line
                assert "no GPU here" in str(e) and "\n" not in str(e), e
        return
    multirun = any(a in ("-m", "--multirun") for a in args)
    overrides = [a for a in args if not a.startswith("-")]
    if "device=cuda" in overrides and not cuda_device_count():  # a GPU host's command: refused here, in one line
        with pytest.raises(ConfigError, match="device=cuda: this host has no CUDA GPU"):
            first_trial([*overrides, f"results_dir={tmp_path}"], multirun)
        return
    first_trial([*overrides, f"results_dir={tmp_path}"], multirun)


def first_trial(overrides: list[str], multirun: bool) -> None:
    """What preflight checks of a command line's first trial: it composes and validates, and the host and the
    launcher can start it."""
    ((combo, composed),), _ = compose_trials(overrides, multirun, limit=1)
    cfg = resolve(composed)
    validate(scenario_of(SCENARIOS, cfg.scenario), cfg)
    hydra = [o for o in overrides if o.lstrip("+~").startswith("hydra")]
    check_launch(cfg, launcher_of(combo + hydra) if multirun else {}, cuda_device_count())


def test_pages_show_commands():
    assert len(shown_commands()) > 20


# a cost experiment composes each scope to place its points by d, a capacity ladder each rung: seconds a command
SLOW_COMMANDS = ("cost_to_target", "what_fits", "shapes")


@pytest.mark.parametrize(
    "page,command",
    [
        pytest.param(*pc, marks=pytest.mark.slow) if any(s in pc[1] for s in SLOW_COMMANDS) else pc
        for pc in shown_commands()
    ],
    ids=lambda x: x if "/" not in x else None,
)
def test_every_command_shown_parses(page, command, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # results folders a command names are checked, never written, here
    check(command, tmp_path)
