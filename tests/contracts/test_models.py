"""The model families as plug-ins: every family module declares what the registry's docstring lists, each has a
model module per framework with the same functions, and a spec finds its family."""

from __future__ import annotations

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
        module = importlib.import_module(models.module_of(name, framework))
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


def test_the_docs_recipe_names_what_a_family_defines():
    """docs/models.md's "Adding a family" names each thing the contract above checks, in the step of its module."""
    text = (REPO / "docs" / "models.md").read_text().split("## Adding a family")[1]
    steps = re.split(r"^\d\. ", text, flags=re.M)[1:4]  # the neutral module, torch's, JAX's
    for step, names in zip(steps, (NEUTRAL, FRAMEWORK["torch"], FRAMEWORK["jax"])):
        missing = [n for n in names if f"`{n}" not in step]
        assert not missing, missing
