"""The layout holds: the import contracts (layers, no cycles, no framework in the parent process) pass, no module
is too long to read, no private name crosses a module boundary, bench modules are imported at the top of a module,
the two framework packages implement the same interface, and scenarios and frameworks are found by name."""

from __future__ import annotations

import ast
import inspect
import re
import subprocess
import sys
from pathlib import Path

import pytest

from bench import estimators, plugins, scenarios
from bench.config import model_preset
from bench.errors import ConfigError
from bench.harness.scenario import Scenario, scenario_of
from bench.spec import FRAMEWORKS, IMPL_MODULES, StepSpec, Trainer, World, implementation
from bench.weights import build_weights
from tests.support import REPO

BENCH = REPO / "bench"
# A module past ~600 lines is usually two modules: past that, one reading no longer holds what it does (nanoGPT's
# whole trainer is 336 lines).
MAX_LINES = 600
# What the runner and the scenarios call on each framework module (bench/<framework>_impl/<module>.py); the two
# must agree on names and parameters. Helpers particular to a framework (torch's lazy duals, JAX's key folding)
# may differ.
IMPL_API = {
    "device": (
        "resolve_device",
        "device_kind",
        "device_name",
        "use_fp32",
        "deterministic",
        "num_threads",
        "limit_memory",
        "memory_trackers",
    ),
    "estimators": ("implementation",),
    "parallel": ("start",),
    "directions": ("sample_tangent", "perturb"),
    "steps": ("make_trainer", "make_optimizer"),
    "memory": ("breakdown",),
    "ops": ("setup", "sync", "to_device", "to_numpy", "functions", "build"),
    "plain": ("plain_loop",),
    "profile": ("record", "classify"),
    "flops": ("count", "matmul_peak"),
    "kernels": ("count",),
}


def modules(root: Path):
    return sorted(p for p in root.rglob("*.py") if "__pycache__" not in p.parts)


def test_import_contracts_hold():
    """pyproject.toml's [tool.importlinter] contracts, as `make lint` checks them."""
    exe = Path(sys.executable).with_name("lint-imports")
    proc = subprocess.run([str(exe)], cwd=REPO, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-2000:]
    assert "0 broken" in proc.stdout


def test_a_command_and_a_trial_start_without_scipy_stats():
    """Every `python -m bench` and every trial process imports the report's modules; scipy.stats is slow to import
    (benchmarks/2026-11-27_2core-xeon_41b971c41bd2.md) and only the curve's exponent interval needs it: imported
    where it is used."""
    code = "import sys, bench.cli, bench.scenarios.__main__; print(sorted(m for m in sys.modules if 'scipy' in m))"
    proc = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0 and proc.stdout.strip() == "[]", proc.stdout + proc.stderr


@pytest.mark.parametrize("command", [["format", "--check"], ["check"]], ids=["ruff-format", "ruff-check"])
def test_code_is_formatted_and_passes_the_linter(command):
    """`make lint`'s ruff, here too, so CI (make test) holds the code to it: ruff format's layout, no markers."""
    proc = subprocess.run(
        [sys.executable, "-m", "ruff", *command, "bench", "tests"],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-2000:]


@pytest.mark.parametrize("path", modules(BENCH), ids=lambda p: str(p.relative_to(REPO)))
def test_no_module_is_too_long(path):
    assert len(path.read_text().splitlines()) <= MAX_LINES


def test_no_private_name_is_imported_across_modules():
    found = []
    for path in modules(BENCH) + modules(REPO / "tests"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("bench"):
                found += [
                    f"{path.name}: from {node.module} import {a.name}" for a in node.names if a.name.startswith("_")
                ]
    assert not found


def test_bench_modules_are_imported_at_the_top():
    """Function-local imports are for keeping a framework (or matplotlib) out of a process that does not need
    it; a bench module imported inside a function is a cycle being hidden."""
    found = []
    for path in modules(BENCH):
        for fn in ast.walk(ast.parse(path.read_text())):
            if isinstance(fn, (ast.FunctionDef, ast.AsyncFunctionDef)):
                for node in ast.walk(fn):
                    names = (
                        [node.module or ""]
                        if isinstance(node, ast.ImportFrom)
                        else [a.name for a in node.names]
                        if isinstance(node, ast.Import)
                        else []
                    )
                    found += [f"{path.name}:{node.lineno} {n}" for n in names if n.split(".")[0] == "bench"]
    assert not found


@pytest.mark.parametrize("module", IMPL_MODULES)
def test_both_frameworks_implement_the_same_interface(module):
    torch_mod, jax_mod = (implementation(fw, module) for fw in FRAMEWORKS)
    for name in IMPL_API[module]:
        t, j = getattr(torch_mod, name), getattr(jax_mod, name)
        # the gradients, optimizers and directions take each framework's own objects (a module, a pytree, JAX's
        # gather over a mesh); the rest agree
        if module not in ("steps", "directions") or name == "make_trainer":
            assert list(inspect.signature(t).parameters) == list(inspect.signature(j).parameters), name


@pytest.mark.parametrize("name", estimators.names())
def test_every_estimator_has_a_module_in_both_frameworks(name):
    """A mode= of the registry, this package's or an installed plug-in's, runs in both frameworks: each has its
    module, defining what the registry requires of it there (estimators.REQUIRED: a gradient wherever the
    estimator takes optimizer steps; in JAX the memory every trial's breakdown reads), and the method's function
    by one name in both (backprop_gradient, spsa_gradient), which the tests compare."""
    modules = {}
    for fw in FRAMEWORKS:
        package = implementation(fw, "estimators")
        modules[fw] = package.implementation(name)  # refuses a module that lacks what REQUIRED names
        required = estimators.REQUIRED[fw][estimators.get(name).updates]
        assert not plugins.lacking(modules[fw], required), fw
        assert set(required) <= plugins.top_level_names(modules[fw].__name__), fw  # what discovery reads, agreeing
    methods = {
        fw: {f for f, v in vars(m).items() if f.endswith("_gradient") and defined_in(v, m)} for fw, m in modules.items()
    }
    assert methods["torch"] == methods["jax"]


def defined_in(value, module) -> bool:
    """Whether `value` is a function `module` defines (not one it imports)."""
    return inspect.isfunction(value) and value.__module__ == module.__name__


def test_both_worlds_implement_the_whole_protocol():
    declared = [n for n in vars(World) if not n.startswith("_")] + list(World.__annotations__)
    for fw in FRAMEWORKS:
        cls = implementation(fw, "parallel").World
        missing = [n for n in declared if not hasattr(cls, n) and n not in getattr(cls, "__annotations__", {})]
        assert not missing, (fw, missing)


def test_both_trainers_implement_the_whole_protocol():
    declared = [n for n in vars(Trainer) if not n.startswith("_")] + list(Trainer.__annotations__)
    spec, _ = model_preset("tiny")
    weights = build_weights(spec, 0)
    for fw in FRAMEWORKS:
        trainer = implementation(fw, "steps").make_trainer(spec, weights, StepSpec(mode="backprop"), "cpu")
        missing = [n for n in declared if not hasattr(trainer, n)]
        assert not missing, (fw, missing)


def test_an_unknown_framework_or_scenario_is_an_error():
    with pytest.raises(ValueError, match=re.escape("framework=tensorflow: accepted torch | jax")):
        implementation("tensorflow", "steps")
    with pytest.raises(ValueError, match=re.escape("accepted " + " | ".join(IMPL_MODULES))):
        implementation("torch", "model")
    with pytest.raises(ConfigError, match=re.escape("scenario=serving: accepted model | ops")):
        scenario_of(scenarios.SCENARIOS, "serving")


def test_every_scenario_is_a_whole_scenario():
    files = [s.results_file for s in scenarios.SCENARIOS.values()]
    assert len(set(files)) == len(files)  # one results file each
    for name, s in scenarios.SCENARIOS.items():
        assert isinstance(s, Scenario) and s.name == name and not getattr(s, "__abstractmethods__", None)
