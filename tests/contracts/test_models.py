"""The model families as plug-ins: every family module declares what the registry's docstring lists, each has a
model module per framework with the same functions, and a spec finds its family."""

from __future__ import annotations

import ast
import dataclasses
import importlib
import re

import numpy as np
import pytest

from bench import models
from bench.config import default, from_dict, model_preset, model_spec, options, to_dict
from bench.errors import ConfigError
from bench.scenarios import SCENARIOS
from tests.support import REPO, composed

NEUTRAL = models.REQUIRED["neutral"]
FRAMEWORK = {fw: models.REQUIRED[fw] for fw in ("torch", "jax")}


@pytest.mark.parametrize("name", models.FAMILIES)
def test_every_family_declares_what_the_registry_reads(name):
    family = models.get(name)
    missing = [attr for attr in NEUTRAL if not hasattr(family, attr)]
    assert not missing, f"bench/models/{name}.py lacks {missing}"
    assert family.NAME == name and set(family.HEAD_KEYS) <= set(family.INPUT_KEYS)
    for framework, functions in FRAMEWORK.items():
        module = importlib.import_module(models.module_of(name, framework))
        missing = [f for f in functions if not callable(getattr(module, f, None))]
        assert not missing, f"bench/{framework}_impl/models/{name}.py lacks {missing}"


@pytest.mark.parametrize(
    ("preset", "family"),
    [("tiny", "bert"), ("minilm_l6", "bert"), ("opt_tiny", "opt"), ("llama_tiny", "llama"), ("smollm2_135m", "llama")],
)
def test_a_preset_names_its_family_and_its_spec_finds_it(preset, family):
    spec, _ = model_preset(preset)
    assert models.of(spec).NAME == family and isinstance(spec, models.get(family).SPEC)
    shapes = models.of(spec).param_shapes(spec)
    assert models.of(spec).count_params(spec) == sum(int(np.prod(s)) for s in shapes.values())


def test_an_unknown_family_names_the_accepted_ones():
    with pytest.raises(ValueError, match=rf"^model.family=gpt: accepted {re.escape(' | '.join(models.FAMILIES))}$"):
        models.get("gpt")
    with pytest.raises(TypeError, match="not the spec of a model family"):
        models.of(object())


def test_the_docs_recipe_names_what_a_family_defines():
    """docs/models.md's "Adding a family" names each thing the contract above checks, in the step of its module."""
    text = (REPO / "docs" / "models.md").read_text().split("## Adding a family")[1]
    steps = re.split(r"^\d\. ", text, flags=re.M)[1:4]  # the neutral module, torch's, JAX's
    for step, names in zip(steps, (NEUTRAL, FRAMEWORK["torch"], FRAMEWORK["jax"])):
        missing = [n for n in names if f"`{n}" not in step]
        assert not missing, missing


BERT_MODULES = ("bench/models/bert.py", "bench/torch_impl/models/bert.py", "bench/jax_impl/models/bert.py")


def bert_names() -> set[str]:
    """What only BERT's modules may name: the classes they define or import from transformers, the prefix of
    its parameters' HF names and the module path of its attention's projections (bench.models.bert)."""
    from bench.models import bert

    names = {"attention.self" if bert.lora_module("query").startswith("attention.self.") else ""}
    names |= {n.split(".")[0] + "." for n in bert.param_shapes(bert.BertSpec()) if not n.startswith("classifier.")}
    for path in BERT_MODULES:
        tree = ast.parse((REPO / path).read_text())
        names |= {node.name for node in ast.walk(tree) if isinstance(node, ast.ClassDef)}
        imported = [n for node in ast.walk(tree) if isinstance(node, ast.ImportFrom) for n in node.names]
        names |= {n.name for n in imported if n.name.startswith("Bert")}
    return names - {""}


def test_no_bert_name_outside_berts_modules():
    """A family lives in its own modules: no other module of bench/ names a BERT class or a BERT parameter (what
    families share is in bench/{torch,jax}_impl/models/common.py, with no family's name in it)."""
    names = bert_names()
    assert {"bert.", "attention.self", "BertSpec", "BertForSequenceClassification", "BertLayer"} <= names
    pattern = re.compile("|".join(rf"(?<![\w./]){re.escape(n)}" + ("" if n.endswith(".") else r"\b") for n in names))
    found = [
        f"{path.relative_to(REPO)}:{i}: {line.strip()}"
        for path in sorted((REPO / "bench").rglob("*.py"))
        if str(path.relative_to(REPO)) not in BERT_MODULES
        for i, line in enumerate(path.read_text().splitlines(), 1)
        if pattern.search(line)
    ]
    assert not found, "\n".join(found)


def test_a_familys_own_fields_join_model_and_others_refuse_them():
    """A family declares its own config fields (SETTINGS, bench.models.setting): they are model.<field> options
    with their help and default, read by their family alone; another family's preset refuses one off its default
    in one line, and a family's own check refuses a bad value."""
    own = models.settings()
    assert {name: family for name, (family, _, _) in own.items()} == {
        name: family for family in models.FAMILIES if models.get(family).SETTINGS for name in _fields(family)
    }
    listed = {option: help for option, help, _ in options()}
    for name, (family, f, _) in own.items():
        assert listed[f"model.{name}"] == f"{family}: {f.metadata['help']}"
        assert default(f"model.{name}") == f.default
    with pytest.raises(ConfigError, match=r"^model.layer_norm_eps=1e-05: a field of model.family=bert, not of opt$"):
        model_preset("opt_tiny", layer_norm_eps=1e-5)
    with pytest.raises(ConfigError, match=r"^model.type_vocab_size=0: accepted an integer >= 1$"):
        model_preset("tiny", type_vocab_size=0)
    with pytest.raises(ConfigError, match=r"^model.family=null: a preset names it"):
        model_spec({"name": "mine", "family": None})


def _fields(family: str) -> list[str]:
    return [f.name for f in dataclasses.fields(models.get(family).SETTINGS)]


def test_a_config_saved_before_families_reads_its_presets_family():
    """A saved config (a results folder's configs/, `rerun`) from before model.family existed reads as its preset's
    family, and every trial keeps its recorded identity: a family's `recorded` fields stay in another family's."""
    saved = to_dict(composed("model=tiny"))
    del saved["model"]["family"]
    assert from_dict(saved).model.family == composed("model=tiny").model.family
    opt = SCENARIOS["model"].identity(composed("model=opt_tiny"))["model"]
    recorded = [name for name, (_, f, _) in models.settings().items() if f.metadata["recorded"]]
    assert recorded and set(recorded) <= set(opt)
