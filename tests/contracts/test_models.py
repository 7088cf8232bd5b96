"""The model families as plug-ins: every family module declares what the registry's docstring lists, each has a
model module per framework with the same functions, and a spec finds its family."""

from __future__ import annotations

import ast
import importlib
import re

import numpy as np
import pytest

from bench import models
from bench.config import model_preset
from tests.support import REPO

NEUTRAL = (
    "NAME",
    "SPEC",
    "INPUT_KEYS",
    "HEAD_KEYS",
    "LORA_TARGETS",
    "MODELLED",
    "SCOPES",
    "EMBEDDINGS",
    "CHECKPOINT_BUFFERS",
    "CHECKPOINT_OPTIONAL",
    "spec_from",
    "refuses",
    "checkpoint_name",
    "param_shapes",
    "is_trainable",
    "count_params",
    "init_weights",
    "lora_shapes",
    "matmuls",
    "activations",
)
FRAMEWORK = {
    "torch": ("build_model", "load_weights", "export_weights", "hf_name", "features", "head_logits", "layers"),
    "jax": ("build_model", "load_weights", "export_weights", "hf_name", "is_trained", "to_hf", "from_hf"),
}


@pytest.mark.parametrize("name", models.FAMILIES)
def test_every_family_declares_what_the_registry_reads(name):
    family = models.get(name)
    missing = [attr for attr in NEUTRAL if not hasattr(family, attr)]
    assert not missing, f"bench/models/{name}.py lacks {missing}"
    assert family.NAME == name and set(family.HEAD_KEYS) <= set(family.INPUT_KEYS)
    for framework, functions in FRAMEWORK.items():
        module = importlib.import_module(f"bench.{framework}_impl.models.{name}")
        missing = [f for f in functions if not callable(getattr(module, f, None))]
        assert not missing, f"bench/{framework}_impl/models/{name}.py lacks {missing}"


@pytest.mark.parametrize(("preset", "family"), [("tiny", "bert"), ("minilm_l6", "bert"), ("opt_tiny", "opt")])
def test_a_preset_names_its_family_and_its_spec_finds_it(preset, family):
    spec, _ = model_preset(preset)
    assert models.of(spec).NAME == family and isinstance(spec, models.get(family).SPEC)
    shapes = models.of(spec).param_shapes(spec)
    assert models.of(spec).count_params(spec) == sum(int(np.prod(s)) for s in shapes.values())


def test_an_unknown_family_names_the_accepted_ones():
    with pytest.raises(ValueError, match=r"^model.family=gpt: accepted bert \| opt$"):
        models.get("gpt")
    with pytest.raises(TypeError, match="not the spec of a model family"):
        models.of(object())


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
