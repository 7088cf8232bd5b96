"""Model families, as plug-ins: one framework-neutral module each (bench/models/<family>.py: its spec, parameter
names and shapes as HF names them, what each trainable scope selects, its LoRA targets, its initialisation, the
batch keys it reads), beside one model module per framework (bench/torch_impl/models/<family>.py,
bench/jax_impl/models/<family>.py), and those installed packages declare as entry points in the group `bench.models`
(bench/plugins.py; a plug-in's module names its model modules in IMPLEMENTATIONS, {framework: module}).
`model.family=NAME` selects one; a preset (conf/model/) names its family.

What a family module defines (the same names in each; tests/contracts/test_models.py checks):

    NAME, SPEC                      its name and its spec's dataclass
    INPUT_KEYS, HEAD_KEYS           the batch keys the model reads, and those its head reads beside the trunk's
                                    output (OPT's head finds the last token that is not padding)
    HEAD_TOKEN (optional)           the one row of the trunk's output its head reads: "first" (BERT's pooler) or
                                    "last" (the last token that is not padding); with it, evaluation at the head
                                    scopes runs the frozen trunk once per held-out batch and keeps only that row
    LORA_TARGETS                    the linear layers an adapter may wrap (lora.targets)
    MODELLED                        the models that have its terms ({"memory", "flops"}): another's cells of its
                                    rows are empty, with a note
    matmuls(spec, ...) -> [Matmul]  every matmul of its forward pass, for the FLOP model; POOLER, the head's matmul
                                    before the classifier (or None)
    activations(spec, step, ...)    what its forward pass keeps for a backward pass, per token (Activations), for
                                    the memory model; EMBEDDINGS, the prefixes of its embedding tables
    spec_from(values) -> SPEC       its spec from the config's model.* values
    SETTINGS                        its own config fields (a dataclass of `setting`s, or None): they join model.*
                                    beside those every family shares (bench.config.ModelConfig)
    param_shapes, lora_shapes, is_trainable, count_params, init_weights (HF's: normal_init)
    SCOPES                          what each trainable scope selects of its parameters (bench.spec.Scopes)
"""

from __future__ import annotations

import importlib
import pkgutil
import zlib
from dataclasses import Field, asdict, dataclass, field, fields
from types import ModuleType
from typing import Any, Protocol, get_type_hints

import numpy as np

from bench import plugins
from bench.errors import PluginError
from bench.spec import FRAMEWORKS

GROUP = "bench.models"
# Every module of this package is a family, and every installed package's entry point in GROUP: one more module is
# one more family, with no list to edit.
FOUND = plugins.found(GROUP, {m.name: f"{__name__}.{m.name}" for m in pkgutil.iter_modules(__path__) if not m.ispkg})
FAMILIES = tuple(sorted(FOUND))
# What a family's modules define, by where (the docstring above and docs/models.md's recipe say what each is): a
# plug-in's are refused at load without one; tests/contracts/test_models.py holds every family to it.
REQUIRED = {
    "neutral": (
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
        "SETTINGS",
        "refuses",
        "checkpoint_name",
        "param_shapes",
        "is_trainable",
        "count_params",
        "init_weights",
        "lora_shapes",
        "matmuls",
        "activations",
    ),
    "torch": ("build_model", "load_weights", "export_weights", "hf_name", "features", "head_logits", "layers"),
    "jax": ("build_model", "load_weights", "export_weights", "hf_name", "is_trained", "to_hf", "from_hf"),
}


class ModelSpec(Protocol):
    """A family's spec (its SPEC) as code of no family reads it: the fields every family's has;
    what else it holds is its family's to read (of(spec))."""

    vocab_size: int
    hidden_size: int
    num_layers: int
    num_heads: int
    num_labels: int
    dropout: float
    pad_token_id: int

    def to_dict(self) -> dict[str, Any]: ...


class Heads:
    """What every family's spec (a frozen dataclass) inherits: its heads divide its width, checked as it is made,
    each head's width, and its fields as a plain dict."""

    hidden_size: int
    num_heads: int

    def __post_init__(self):
        if self.hidden_size % self.num_heads:
            raise ValueError(
                f"model.hidden_size={self.hidden_size} must be divisible by model.num_heads={self.num_heads}"
            )

    @property
    def head_dim(self) -> int:
        return self.hidden_size // self.num_heads

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(frozen=True)
class Matmul:
    """One matmul of a family's forward pass: its FLOPs, and how many of its operands carry a derivative (0, 1, 2);
    what the FLOP model (bench/measure/flop_model.py) sums."""

    name: str
    flops: int  # 2 M N K
    carrying: int  # operands that are a trainable weight or an activation downstream of one
    layer: int | None  # its layer; None for the head's (pooler, classifier)


@dataclass(frozen=True)
class Activations:
    """What a family's forward pass keeps for a backward pass, and works in, in bytes per token of the micro-batch,
    for the step a StepSpec describes (its trainable scope, LoRA, dropout); the memory model
    (bench/measure/memory_model.py) multiplies the per-layer terms by the layers the step trains."""

    layer: int  # one trained layer's saved activations
    layer_input: int  # what checkpointing (remat) keeps of a trained layer: its input
    embeddings: int  # the embeddings' saved activations (0 where the step trains none of them)
    head: int  # what follows the layers saves: the head's input (0 where nothing at or before the head trains)
    forward_temp: int  # one layer's working memory in a forward pass, whichever of its blocks needs more


class Matmuls(list):
    """A family's forward pass as its matmuls, listed in order (its `matmuls`): `linear` appends a linear layer's
    and, where it is adapted, its LoRA adapter's two."""

    def __init__(self, train, adapted: set[str], rank: int):
        super().__init__()
        self.train, self.adapted, self.rank = train, adapted, rank  # train(name): whether a parameter trains

    def linear(self, name: str, rows: int, n_in: int, n_out: int, x_carries: bool, layer: int | None) -> bool:
        """Y = X W^T + b (+ B A X); returns whether Y carries a derivative."""
        w = self.train(name + ".weight")
        self.append(Matmul(name, 2 * rows * n_in * n_out, x_carries + w, layer))
        if name in self.adapted:  # A x, then B (A x): both carry, A and B being trained
            self.append(Matmul(name + ".lora_A", 2 * rows * n_in * self.rank, x_carries + 1, layer))
            self.append(Matmul(name + ".lora_B", 2 * rows * self.rank * n_out, 2, layer))
            return True
        return x_carries or w or self.train(name + ".bias")


def get(name: str) -> ModuleType:
    """The family `model.family=name` builds (ValueError naming the accepted ones for another name; PluginError
    for a plug-in's module that is not the family of its name, or names no module for a framework)."""
    if name not in FAMILIES:
        raise ValueError(f"model.family={name}: accepted {' | '.join(FAMILIES)}")
    plugin = FOUND[name]
    family = plugin.load()
    if getattr(family, "NAME", None) != name:
        raise PluginError(f"{plugin}: NAME must be {name!r}")
    if plugin.package != plugins.BUILTIN:
        declared = getattr(family, "IMPLEMENTATIONS", {})
        absent = [fw for fw in FRAMEWORKS if fw not in declared or plugins.missing(declared[fw])]
        if absent:
            raise PluginError(
                f"{plugin}: IMPLEMENTATIONS names no installed module for {' | '.join(absent)}; accepted "
                f"{{framework: module}} for each of {' | '.join(FRAMEWORKS)}"
            )
        lacking = [n for n in REQUIRED["neutral"] if not hasattr(family, n)]
        if lacking:
            raise PluginError(f"{plugin}: its module lacks {', '.join(lacking)}; a family defines each of REQUIRED")
        for fw in FRAMEWORKS:  # read from source: a framework's module is not imported before a trial needs it
            bound = plugins.top_level_names(declared[fw])
            lacking = [n for n in REQUIRED[fw] if bound is not None and n not in bound]
            if lacking:
                raise PluginError(
                    f"{plugin}: {declared[fw]} ({fw}) lacks {', '.join(lacking)}; accepted a module "
                    f"defining each of {', '.join(REQUIRED[fw])}"
                )
    return family


def module_of(name: str, framework: str) -> str:
    """The framework's model module of family `name`: bench.<framework>_impl.models.<family>, or the module a
    plug-in's IMPLEMENTATIONS names."""
    return getattr(get(name), "IMPLEMENTATIONS", {}).get(framework, f"bench.{framework}_impl.models.{name}")


def of(spec) -> ModuleType:
    """The family whose spec `spec` is."""
    for name in FAMILIES:
        if isinstance(spec, get(name).SPEC):
            return get(name)
    raise TypeError(f"{type(spec).__name__}: not the spec of a model family ({' | '.join(FAMILIES)})")


def implementation(framework: str, spec) -> ModuleType:
    """The framework's model module of `spec`'s family (module_of)."""
    return importlib.import_module(module_of(of(spec).NAME, framework))


def spec(values: dict) -> ModelSpec:
    """The spec the config's model.* `values` describe, by their family's spec_from. ValueError in one line for no
    family, another family's own field off its default (its family would read it, this one does not), or a value
    the family refuses."""
    family = values.get("family")
    if family is None:
        raise ValueError(f"model.family=null: a preset names it (model=NAME); accepted {' | '.join(FAMILIES)}")
    for name, (owner, f, _) in settings().items():
        if owner != family and values.get(name, f.default) != f.default:
            raise ValueError(f"model.{name}={values[name]}: a field of model.family={owner}, not of {family}")
    return get(family).spec_from(values)


def setting(default, help: str, recorded: bool = False):  # noqa: A002 (as bench.config's fields)
    """A field of a family's own config (its SETTINGS): its default and its help (--help and docs/options.md show
    both, as model.<field>). `recorded`: every trial's identity carries it, whatever its family, as rows recorded
    before families declared their own fields did; another family's field counts only off its default."""
    return field(default=default, metadata={"help": help, "recorded": recorded})


def settings() -> dict[str, tuple[str, Field, type]]:
    """{field: (its family, its dataclass field, its type)} of every family's own config fields (SETTINGS). A
    field two families declare is one option: they must agree on its type and default."""
    out: dict[str, tuple[str, Field, type]] = {}
    for name in FAMILIES:
        node = get(name).SETTINGS
        types = get_type_hints(node) if node is not None else {}
        for f in fields(node) if node is not None else ():
            if f.name in out and (out[f.name][1].default, out[f.name][2]) != (f.default, types[f.name]):
                raise TypeError(
                    f"bench/models/{name}.py: model.{f.name} is also {out[f.name][0]}'s, of another type or default"
                )
            out.setdefault(f.name, (name, f, types[f.name]))
    return out


def draw(seed: int, name: str) -> np.random.Generator:
    """The generator of one tensor, seeded by (seed, crc32(name)): a tensor's values do not depend on which others
    are drawn (a checkpoint can supply the rest), and are the same on every platform, for every family."""
    return np.random.default_rng([seed, zlib.crc32(name.encode())])


def normal_init(
    shapes: dict[str, tuple[int, ...]],
    seed: int,
    std: float,
    norm: str,
    padding: tuple[str, int],
    names: list[str] | None = None,
) -> dict[str, np.ndarray]:
    """HF's `_init_weights` for every family: Linear and Embedding weights ~ N(0, std), biases 0, LayerNorm weight 1
    and bias 0 (a name containing `norm`), the padding row of the embedding `padding` = (name, row) 0; each tensor
    drawn alone (draw). `names`: only those of `shapes`."""
    out = {}
    for name in names if names is not None else shapes:
        shape = shapes[name]
        if norm in name:
            out[name] = (np.ones if name.endswith(".weight") else np.zeros)(shape, np.float32)
        elif name.endswith(".bias"):
            out[name] = np.zeros(shape, np.float32)
        else:
            w = draw(seed, name).standard_normal(shape, dtype=np.float32)
            w *= np.float32(std)
            if name == padding[0]:
                w[padding[1]] = 0.0
            out[name] = w
    return out


def adapter_weights(spec, lora, seed: int) -> dict[str, np.ndarray]:
    """LoRA adapters as PEFT initialises them (LoraConfig's init_lora_weights=True): A ~ kaiming_uniform(a=sqrt(5)),
    i.e. U(-1/sqrt(in), 1/sqrt(in)), B = 0, so the adapted model computes exactly its base at the start; the names
    and shapes `spec`'s family's (lora_shapes), the same numbers for both frameworks."""
    out = {}
    for name, shape in of(spec).lora_shapes(spec, lora).items():
        if ".lora_B." in name:
            out[name] = np.zeros(shape, np.float32)
        else:
            bound = 1.0 / np.sqrt(shape[1])  # fan_in of A (rank, in)
            out[name] = draw(seed, name).uniform(-bound, bound, shape).astype(np.float32)
    return out


def with_adapters(weights: dict[str, np.ndarray], spec, lora, seed: int) -> dict[str, np.ndarray]:
    """`weights` with the adapters of `lora` added where it lacks them (drawn by adapter_weights; a test may give
    its own), or unchanged without adapters."""
    if lora is None or all(k in weights for k in of(spec).lora_shapes(spec, lora)):
        return weights
    return {**weights, **{k: v for k, v in adapter_weights(spec, lora, seed).items() if k not in weights}}
