"""Plug-ins from installed packages: the estimators and model families a package declares through Python entry
points, found as pytest and Hydra find theirs, so `pip install` of the package makes `mode=NAME` or
`model.family=NAME` work with no edit here. A package's pyproject.toml declares one module per name:

    [project.entry-points."bench.estimators"]
    NAME = "its_package.its_module"

The registries (bench/estimators/__init__.py, bench/models/__init__.py) hold their built-in modules and these side
by side; what a module must define is the registry's contract, refused in one line naming the package (PluginError).
"""

from __future__ import annotations

import ast
import importlib
import importlib.util
from dataclasses import dataclass
from importlib.metadata import entry_points
from pathlib import Path
from types import ModuleType

from bench.errors import PluginError

BUILTIN = "bench"  # the package of the modules bench/ holds itself


@dataclass(frozen=True)
class Plugin:
    """One name of a registry: the module that defines it and the package that brought it."""

    group: str  # bench.estimators | bench.models
    name: str
    module: str
    package: str  # the distribution that declares it; BUILTIN for bench's own modules

    def __str__(self) -> str:
        if self.package == BUILTIN:
            return self.module
        return f"package {self.package} ({self.group}: {self.name} = {self.module})"

    def load(self) -> ModuleType:
        """Its module, imported (a plug-in's that does not import: PluginError naming the package)."""
        if self.package == BUILTIN:
            return importlib.import_module(self.module)
        try:
            return importlib.import_module(self.module)
        except ImportError as e:
            raise PluginError(f"{self}: its module does not import ({e})") from e


def found(group: str, builtin: dict[str, str]) -> dict[str, Plugin]:
    """{name: Plugin} of the built-in modules {name: module} and of every installed package's entry points in
    `group`; a name declared twice (a built-in's, or another package's) is refused."""
    out = {name: Plugin(group, name, module, BUILTIN) for name, module in builtin.items()}
    for ep in entry_points(group=group):
        plugin = Plugin(group, ep.name, ep.module, ep.dist.name if ep.dist is not None else ep.value)
        if ep.name in out:
            raise PluginError(f"{plugin}: the name {ep.name} is taken by {out[ep.name]}; accepted a name not in use")
        if ep.attr:
            raise PluginError(f"{plugin}: an entry point names a module, not {ep.value}")
        out[ep.name] = plugin
    return out


def missing(module: str) -> bool:
    """Whether no module `module` can be imported (found without importing it: a framework's stays unloaded)."""
    try:
        return importlib.util.find_spec(module) is None
    except ImportError:  # its parent package is missing
        return True


def top_level_names(module: str) -> set[str] | None:
    """The names the module `module` (one `missing` finds) binds at its top level (functions, classes,
    assignments, imports; inside an if or a try too), read from its source without importing it; None where its
    source cannot tell (compiled, a star import): its load checks it."""
    origin = importlib.util.find_spec(module).origin or ""
    if not origin.endswith(".py"):
        return None
    names, nodes = set(), list(ast.parse(Path(origin).read_text()).body)
    while nodes:
        node = nodes.pop()
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.add(node.name)
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            if any(a.name == "*" for a in node.names):
                return None
            names |= {a.asname or a.name.split(".")[0] for a in node.names}
        elif isinstance(node, (ast.Assign, ast.AnnAssign)):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            names |= {n.id for t in targets for n in ast.walk(t) if isinstance(n, ast.Name)}
        elif isinstance(node, (ast.If, ast.Try)):
            nodes += [*node.body, *node.orelse, *getattr(node, "finalbody", [])]
            nodes += [n for h in getattr(node, "handlers", []) for n in h.body]
    return names


def lacking(module: ModuleType, functions: tuple[str, ...]) -> list[str]:
    """The names of `functions` that `module` does not define as functions."""
    return [f for f in functions if not callable(getattr(module, f, None))]
