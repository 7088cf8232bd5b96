"""Plug-ins from installed packages (bench/plugins.py): a package on the path whose metadata declares an entry point
in bench.estimators or bench.models is found by the registries, and one that breaks its contract is refused in one
line naming the package. The packages here are written as pip leaves one (its modules and a dist-info folder with
its entry_points.txt), so discovery runs through importlib.metadata as it does for an installed one; their modules
are the contract's inputs and never run a trial (tests/scenarios/test_plugin_example.py installs and runs a real
one)."""

from __future__ import annotations

import importlib
import re
import sys
import textwrap

import pytest

from bench import estimators, models, plugins
from bench.errors import PluginError
from bench.jax_impl import estimators as jax_estimators
from bench.torch_impl import estimators as torch_estimators
from tests.support import REPO, bench

ESTIMATOR_MODULE = """
from bench.estimators.base import Estimator

class Plugged(Estimator):
    name, label, summary, passes = {name!r}, {name!r}, "a plug-in under test", "2 forward"
    implementations = {implementations!r}

ESTIMATOR = Plugged()
"""


def clear_registries() -> None:
    for cached in (estimators.found, estimators.names, estimators._load):
        cached.cache_clear()


@pytest.fixture
def install(tmp_path, monkeypatch):
    """install(dist, {group: {name: module}}, {module: source}): a package on sys.path, its entry points declared
    in its dist-info; the registries forget what they found before and after."""
    site = tmp_path / "site"
    site.mkdir()
    monkeypatch.syspath_prepend(str(site))
    added = []

    def install(dist: str, entries: dict[str, dict[str, str]], modules: dict[str, str]) -> None:
        info = site / f"{dist.replace('-', '_')}-0.1.dist-info"
        info.mkdir()
        (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {dist}\nVersion: 0.1\n")
        (info / "entry_points.txt").write_text(
            "".join(f"[{g}]\n" + "".join(f"{n} = {m}\n" for n, m in e.items()) for g, e in entries.items())
        )
        for module, source in modules.items():
            (site / f"{module}.py").write_text(textwrap.dedent(source))
            added.append(module)
        importlib.invalidate_caches()
        clear_registries()

    clear_registries()
    yield install
    for module in added:
        sys.modules.pop(module, None)
    clear_registries()


def estimator_package(install, dist: str, name: str, torch_source: str, jax_source: str, **kw) -> None:
    """A package whose module `<dist>_est` declares estimator `name`, its gradient in `<dist>_torch`, `<dist>_jax`."""
    prefix = dist.replace("-", "_")
    implementations = kw.get("implementations", {"torch": f"{prefix}_torch", "jax": f"{prefix}_jax"})
    est = ESTIMATOR_MODULE.format(name=kw.get("declared", name), implementations=implementations)
    install(
        dist,
        {estimators.GROUP: {name: f"{prefix}_est"}},
        {f"{prefix}_est": est, f"{prefix}_torch": torch_source, f"{prefix}_jax": jax_source},
    )


TORCH_OK = "def gradient(trainer, micro_batches, tangents=None, in_step=False):\n    return trainer.gradient_of()\n"
JAX_OK = TORCH_OK.replace("micro_batches,", "params, micro_batches, step,") + (
    "def memory(trainer, micro_batches, temp):\n    return trainer.held()\n"
)


def test_an_installed_estimator_is_found_after_the_ranked_ones(install):
    estimator_package(install, "good-plugin", "plugged", TORCH_OK, JAX_OK)
    assert estimators.names()[-1] == "plugged" and estimators.get("plugged").name == "plugged"
    assert str(estimators.found()["plugged"]) == "package good-plugin (bench.estimators: plugged = good_plugin_est)"
    assert estimators.module_of("plugged", "jax") == "good_plugin_jax"
    assert estimators.module_of("mezo", "jax") == "bench.jax_impl.estimators.mezo"
    for package in (torch_estimators, jax_estimators):  # what each framework's contract requires, all there
        assert package.implementation("plugged").__name__.startswith("good_plugin_")


def test_a_name_taken_is_refused_naming_both_packages(install):
    estimator_package(install, "clash-plugin", "mezo", TORCH_OK, JAX_OK)
    message = "package clash-plugin (bench.estimators: mezo = clash_plugin_est): the name mezo is taken by bench"
    with pytest.raises(PluginError, match="^" + re.escape(message)):
        estimators.names()
    install("twin-b", {estimators.GROUP: {"twin": "twin_b_est"}}, {})
    install("twin-a", {estimators.GROUP: {"twin": "twin_a_est"}}, {})
    with pytest.raises(PluginError, match=r"^package twin-. .*: the name twin is taken by package twin-."):
        plugins.found(estimators.GROUP, {})


@pytest.mark.parametrize(
    ("kw", "message"),
    [
        ({"declared": "other"}, "ESTIMATOR must be an instance of bench.estimators.base.Estimator named broken"),
        ({"implementations": {"torch": "x"}}, "ESTIMATOR.implementations={'torch': 'x'}: accepted a module for each"),
        ({"implementations": {"torch": "broken_torch", "jax": "no_such"}}, "no module no_such"),
    ],
)
def test_an_estimator_module_that_breaks_the_contract_is_refused(install, kw, message):
    estimator_package(install, "broken", "broken", TORCH_OK, JAX_OK, **kw)
    with pytest.raises(PluginError, match=r"^package broken \(bench.estimators: broken = broken_est\): .*"):
        estimators.names()
    with pytest.raises(PluginError, match=re.escape(message)):
        estimators.get("broken")


def test_a_module_without_an_estimator_is_refused(install):
    install("empty", {estimators.GROUP: {"empty": "empty_est"}}, {"empty_est": '"""No ESTIMATOR here."""\n'})
    with pytest.raises(PluginError, match="^package empty .*: ESTIMATOR must be an instance"):
        estimators.get("empty")
    install("gone", {estimators.GROUP: {"gone": "gone_est"}}, {})
    with pytest.raises(PluginError, match="^package gone .*: its module does not import"):
        estimators.get("gone")


def test_a_framework_module_lacking_a_required_function_is_refused(install):
    # before anything runs, from the module's source: the launching process imports no framework
    no_memory = JAX_OK.split("def memory")[0]
    estimator_package(install, "forgetful", "forgetful", TORCH_OK, no_memory)
    with pytest.raises(PluginError, match=r"^package forgetful .*: its jax module forgetful_jax lacks memory \("):
        estimators.get("forgetful")
    estimator_package(install, "bare", "bare", "x = 1\n", JAX_OK)
    with pytest.raises(PluginError, match=r"^package bare .*: its torch module bare_torch lacks gradient \("):
        estimators.get("bare")
    # as a trial loads it: a name bound to no function, a split step in part
    not_callable = JAX_OK.replace(
        "def memory(trainer, micro_batches, temp):\n    return trainer.held()", "memory = None"
    )
    estimator_package(install, "unbound", "unbound", TORCH_OK, not_callable)
    assert estimators.get("unbound").name == "unbound"
    assert torch_estimators.implementation("unbound").__name__ == "unbound_torch"
    with pytest.raises(PluginError, match=r"^package unbound .*: its jax module unbound_jax lacks memory \("):
        jax_estimators.implementation("unbound")
    half_split = JAX_OK + "def prepare(trainer, shardings):\n    trainer.prepared = True\n"
    estimator_package(install, "halved", "halved", TORCH_OK, half_split)
    with pytest.raises(PluginError, match=r"^package halved .*: its jax module halved_jax lacks lower, programs, step"):
        jax_estimators.implementation("halved")


def test_the_docs_list_what_each_framework_module_must_define():
    """docs/estimators.md's table of the functions a framework module defines is the registry's REQUIRED."""
    text = (REPO / "docs" / "estimators.md").read_text()
    rows = dict(re.findall(r"^ *\| (torch|JAX) \| (.+) \|$", text, re.M))
    for framework, required in estimators.REQUIRED.items():
        cells = rows["JAX" if framework == "jax" else framework].split(" | ")
        for cell, updates in zip(cells, (True, False)):
            assert re.findall(r"`(\w+)\(", cell) == list(required[updates]), (framework, updates)


FAMILY_MODULE = """
{names}
NAME = {name!r}
IMPLEMENTATIONS = {implementations!r}
"""
WHOLE = "from bench.models.opt import *  # every name a family defines: OPT's, under another NAME"
OPT_MODULES = {"torch": "bench.torch_impl.models.opt", "jax": "bench.jax_impl.models.opt"}


def family_package(install, dist: str, name: str, monkeypatch, **kw) -> None:
    prefix = dist.replace("-", "_")
    implementations = kw.get("implementations", OPT_MODULES)
    names = kw.get("names", WHOLE)
    family = FAMILY_MODULE.format(names=names, name=kw.get("declared", name), implementations=implementations)
    install(dist, {models.GROUP: {name: f"{prefix}_family"}}, {f"{prefix}_family": family})
    builtin = {n: p.module for n, p in models.FOUND.items() if p.package == plugins.BUILTIN}
    found = plugins.found(models.GROUP, builtin)  # as the registry finds them on import
    monkeypatch.setattr(models, "FOUND", found)
    monkeypatch.setattr(models, "FAMILIES", tuple(sorted(found)))


def test_an_installed_family_is_found_and_refused_when_it_breaks_the_contract(install, monkeypatch):
    family_package(install, "fam-plugin", "gpt", monkeypatch)
    assert (
        "gpt" in models.FAMILIES
        and models.get("gpt").NAME == "gpt"
        and models.module_of("gpt", "torch") == OPT_MODULES["torch"]
    )
    assert models.module_of("bert", "jax") == "bench.jax_impl.models.bert"
    family_package(install, "misnamed", "falcon", monkeypatch, declared="mistral")
    with pytest.raises(PluginError, match=r"^package misnamed \(bench.models: falcon = misnamed_family\): NAME must"):
        models.get("falcon")
    family_package(install, "half", "t5", monkeypatch, implementations={"torch": "json", "jax": "no_such"})
    with pytest.raises(PluginError, match=r"^package half .*: IMPLEMENTATIONS names no installed module for jax;"):
        models.get("t5")
    family_package(install, "bare", "gemma", monkeypatch, names="")
    with pytest.raises(PluginError, match=r"^package bare .*: its module lacks SPEC, INPUT_KEYS, .*activations; a"):
        models.get("gemma")
    family_package(install, "thin", "phi", monkeypatch, implementations={**OPT_MODULES, "jax": "json"})
    with pytest.raises(
        PluginError, match=r"^package thin .*: json \(jax\) lacks build_model, load_weights, .*from_hf;"
    ):
        models.get("phi")
    with pytest.raises(PluginError, match=r"^package clash .*: the name bert is taken by bench.models.bert"):
        family_package(install, "clash", "bert", monkeypatch)


@pytest.mark.slow  # a process that imports the command line: 1.5-3 s on 2 shared cores
def test_the_command_line_refuses_a_broken_plugin_in_one_line(install, tmp_path):
    estimator_package(install, "clash-plugin", "jvp", TORCH_OK, JAX_OK)
    proc = bench("mode=jvp", env={"PYTHONPATH": f"{tmp_path / 'site'}:{REPO}"}, check=False)
    assert proc.returncode == 2 and proc.stdout == ""
    assert proc.stderr.splitlines() == [
        "bench: error: package clash-plugin (bench.estimators: jvp = clash_plugin_est): the name jvp is taken by "
        "bench.estimators.jvp; accepted a name not in use"
    ]
