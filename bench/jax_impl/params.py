"""HF weights <-> NNX parameters: one table, read in both directions.

The shared weights are a flat {hf_name: float32 numpy} dict in torch layout (bench/weights.py). The NNX model
mirrors HF's module names (model.py), so a parameter's NNX path is its HF name with the leaf renamed after the
flax module that owns it, and Linear weights transposed:

    torch nn.Linear.weight (out, in)   <->  nnx.Linear.kernel (in, out)    transpose
    torch nn.Embedding.weight (n, H)   <->  nnx.Embed.embedding (n, H)     identity
    torch nn.LayerNorm.weight / .bias  <->  nnx.LayerNorm.scale / .bias    identity
    PEFT lora_A.weight (rank, in)      <->  nnx.LoRA.lora_a (in, rank)     transpose
    PEFT lora_B.weight (out, rank)     <->  nnx.LoRA.lora_b (rank, out)    transpose

Both transforms are their own inverse, so export applies the same one. With scan_layers (model.BertEncoder) the
encoder's parameters are stacked: bert.encoder.stacks.S.<path in a layer> holds layers S, S+1, ... along a leading
axis, slice i being HF's bert.encoder.layer.{S+i}.<name>, transformed as that layer's alone.

No torch here: a JAX trial never imports it (bench.torch_impl.model.weights_from_state_dict turns an in-memory
torch state_dict into the same dict).
"""

from __future__ import annotations

import re

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from bench.models.bert import LORA_TARGETS, is_trainable, lora_module, param_shapes
from bench.weights import WeightsError, check_weights


def identity(w: np.ndarray) -> np.ndarray:
    return w


def transpose(w: np.ndarray) -> np.ndarray:
    return np.ascontiguousarray(w.T)


# (HF name, NNX path, transform); {L} is an encoder layer index on both sides. Buffers HF keeps in checkpoints
# (embeddings.position_ids, token_type_ids) are no parameters: bench.weights drops them before they get here.
_L = "bert.encoder.layer.{L}."
_E = "bert.embeddings."
TABLE: tuple[tuple[str, str, object], ...] = (
    (_E + "word_embeddings.weight", _E + "word_embeddings.embedding", identity),
    (_E + "position_embeddings.weight", _E + "position_embeddings.embedding", identity),
    (_E + "token_type_embeddings.weight", _E + "token_type_embeddings.embedding", identity),
    (_E + "LayerNorm.weight", _E + "LayerNorm.scale", identity),
    (_E + "LayerNorm.bias", _E + "LayerNorm.bias", identity),
    (_L + "attention.self.query.weight", _L + "attention.self.query.kernel", transpose),
    (_L + "attention.self.query.bias", _L + "attention.self.query.bias", identity),
    (_L + "attention.self.key.weight", _L + "attention.self.key.kernel", transpose),
    (_L + "attention.self.key.bias", _L + "attention.self.key.bias", identity),
    (_L + "attention.self.value.weight", _L + "attention.self.value.kernel", transpose),
    (_L + "attention.self.value.bias", _L + "attention.self.value.bias", identity),
    (_L + "attention.output.dense.weight", _L + "attention.output.dense.kernel", transpose),
    (_L + "attention.output.dense.bias", _L + "attention.output.dense.bias", identity),
    (_L + "attention.output.LayerNorm.weight", _L + "attention.output.LayerNorm.scale", identity),
    (_L + "attention.output.LayerNorm.bias", _L + "attention.output.LayerNorm.bias", identity),
    (_L + "intermediate.dense.weight", _L + "intermediate.dense.kernel", transpose),
    (_L + "intermediate.dense.bias", _L + "intermediate.dense.bias", identity),
    (_L + "output.dense.weight", _L + "output.dense.kernel", transpose),
    (_L + "output.dense.bias", _L + "output.dense.bias", identity),
    (_L + "output.LayerNorm.weight", _L + "output.LayerNorm.scale", identity),
    (_L + "output.LayerNorm.bias", _L + "output.LayerNorm.bias", identity),
    ("bert.pooler.dense.weight", "bert.pooler.dense.kernel", transpose),
    ("bert.pooler.dense.bias", "bert.pooler.dense.bias", identity),
    ("classifier.weight", "classifier.kernel", transpose),
    ("classifier.bias", "classifier.bias", identity),
) + tuple(  # trainable=lora's adapters (model.LoRALinear): the wrapped layer's path, then PEFT's / nnx.LoRA's
    (_L + f"{lora_module(t)}.lora_{m.upper()}.weight", _L + f"{lora_module(t)}.lora.lora_{m}", transpose)
    for t in LORA_TARGETS
    for m in ("a", "b")
)


# scan_layers (model.BertEncoder): the encoder's layers stacked, every parameter with a leading layer axis, under
# bert.encoder.stacks.{S}, S the index of the stack's first layer: slice i of a stacked tensor is layer S + i's.
_S = "bert.encoder.stacks.{S}."


def _compile(template: str) -> re.Pattern:
    pattern = re.escape(template)
    for field in ("L", "S"):
        pattern = pattern.replace(re.escape("{" + field + "}"), rf"(?P<{field}>\d+)")
    return re.compile(pattern + r"\Z")


_FROM_NNX = [(_compile(nnx_path), hf, t) for hf, nnx_path, t in TABLE] + [
    (_compile(nnx_path.replace(_L, _S)), hf, t) for hf, nnx_path, t in TABLE if nnx_path.startswith(_L)
]


def _key(k) -> str:
    # Accept NNX paths (str / int keys) and jax.tree_util key paths (DictKey, GetAttrKey, SequenceKey) alike,
    # so hf_name works on paths from nnx.split filters, State.flat_state() and
    # jax.tree_util.tree_map_with_path.
    for attr in ("key", "name", "idx"):
        if hasattr(k, attr):
            return str(getattr(k, attr))
    return str(k)


def _lookup(path: tuple) -> tuple[str, object, int | None]:
    """(HF name, transform, first layer) of an NNX path: for a stacked parameter (first layer not None) the HF
    name of its first layer, `layer_names` giving the others."""
    dotted = ".".join(keys_of(path))  # tree_util paths end inside the Variable: keys_of drops its `value`
    for pattern, hf, transform in _FROM_NNX:
        m = pattern.match(dotted)
        if m:
            first = int(m.group("S")) if "S" in pattern.groupindex else None
            layer = m.group("L") if "L" in pattern.groupindex else first
            return (hf.format(L=layer) if "{L}" in hf else hf), transform, first
    raise KeyError(f"NNX path {dotted!r} is no BERT parameter (see bench.jax_impl.params.TABLE)")


def hf_name(path: tuple) -> str:
    """The HF parameter name of an NNX state path, e.g. ('bert', 'encoder', 'layer', 0, 'attention', 'self',
    'query', 'kernel') -> 'bert.encoder.layer.0.attention.self.query.weight'. For a stacked parameter
    (bert.encoder.stacks.S...), its first layer's: the layers of a stack are trained or frozen together
    (model.layer_stacks), so a trainable scope reads this name for all of them."""
    return _lookup(path)[0]


def is_stacked(path: tuple) -> bool:
    """Whether an NNX path (or a tree_util path through one, e.g. an optimizer state's) is a stacked parameter,
    whose leading axis counts layers."""
    return "stacks" in [_key(k) for k in path]


def keys_of(path: tuple) -> tuple[str, ...]:
    """An NNX or tree_util path as plain keys, without the Variable's own trailing `value`."""
    keys = tuple(_key(k) for k in path)
    return keys[:-1] if keys and keys[-1] in ("value", "raw_value") else keys


def stack_of(path: tuple) -> tuple[str, tuple[str, ...]] | None:
    """(the stack's name, the parameter's path inside one layer) of a stacked parameter's path, else None:
    ('bert', 'encoder', 'stacks', '0', 'attention', 'self', 'query', 'kernel') -> ('0', ('attention', 'self',
    'query', 'kernel')), the path the parameter has in the layer the scan runs (model._scan_stack)."""
    keys = keys_of(path)
    for i in range(len(keys) - 1):
        if keys[i] == "stacks":
            return keys[i + 1], keys[i + 2 :]
    return None


def layer_names(path: tuple, n: int = 1) -> list[str]:
    """The HF names of a parameter: one, or for a stacked one the n layers it stacks, in order."""
    name, _, first = _lookup(path)
    if first is None:
        return [name]
    rest = name.removeprefix(f"bert.encoder.layer.{first}.")
    return [f"bert.encoder.layer.{first + i}.{rest}" for i in range(n)]


def is_trained(path: tuple, x, scope: str, num_layers: int, last_k: int = 1) -> bool:
    """Whether the parameter `x` at `path` is trained under `scope` (bert.is_trainable on its HF names). A stacked
    parameter is trained or frozen whole: a stack whose layers the scope splits is an error (build the model with
    model.layer_stacks of the scope)."""
    names, _, _ = _entry(path, x)
    picks = {is_trainable(n, scope, num_layers, last_k) for n in names}
    if len(picks) > 1:
        raise ValueError(
            f"trainable={scope} (last_k={last_k}) trains some layers of the stack {names[0]}.. and "
            "not others: stack the layers with bench.jax_impl.model.layer_stacks"
        )
    return picks.pop()


def _entry(path: tuple, x) -> tuple[list[str], bool, object]:
    """(HF names, stacked, transform) of the parameter-shaped leaf `x` at `path`: one name, or one per slice of a
    stacked leaf's leading axis."""
    _, transform, first = _lookup(path)
    stacked = first is not None
    return layer_names(path, x.shape[0] if stacked else 1), stacked, transform


def stacked_from(names: list[str], stacked: bool, transform, arrays) -> np.ndarray:
    """One parameter from {hf_name: array in torch layout}: stacked along a new leading axis where it is."""
    if not stacked:
        return transform(np.asarray(arrays[names[0]]))
    return np.stack([transform(np.asarray(arrays[n])) for n in names])


def stacked_to(names: list[str], stacked: bool, transform, x) -> dict[str, np.ndarray]:
    """The inverse of stacked_from: {hf_name: array in torch layout}, one per slice of a stacked parameter."""
    x = np.asarray(x)
    if not stacked:
        return {names[0]: transform(x)}
    return {n: transform(x[i]) for i, n in enumerate(names)}


def _params(model) -> list[tuple[nnx.Variable, list[str], bool, object]]:
    """(Param, *_entry) of every parameter of the model."""
    return [(var, *_entry(path, var)) for path, var in nnx.to_flat_state(nnx.state(model, nnx.Param))]


def load_weights(model, weights: dict[str, np.ndarray]) -> None:
    """Copy the numpy weights into the model (strict: every missing, unexpected and mis-shaped key is reported
    together in one WeightsError). Works on an abstract model from nnx.eval_shape too (build_model)."""
    spec, lora = model.spec, model.lora
    check_weights(weights, spec, lora=lora)
    params, shapes = _params(model), param_shapes(spec, lora)
    # The model's own parameters must be exactly the spec's; anything else is a bug in model.py, not the
    # weights.
    names = {n for _, ns, _, _ in params for n in ns}
    if names != set(shapes):
        raise WeightsError(f"model.py and bert.param_shapes disagree: {sorted(names ^ set(shapes))}")
    for var, ns, stacked, transform in params:
        w = stacked_from(ns, stacked, transform, weights)
        if w.shape != tuple(var.shape):  # unreachable while the table and model.py agree; cheap to be sure
            raise WeightsError(f"{ns[0]}: {w.shape} after transform != NNX {tuple(var.shape)}")
        var.set_value(jnp.asarray(w, dtype=var.dtype))


def export_weights(model) -> dict[str, np.ndarray]:
    """The model's parameters as the shared {hf_name: numpy} dict in torch layout and HF order (the inverse of
    load_weights; mirror of bench.torch_impl.model.export_weights)."""
    out = {}
    for var, ns, stacked, transform in _params(model):
        # np.array copies: never aliases the model's arrays; bf16 parameters leave as fp32, as torch_impl's do
        out.update(stacked_to(ns, stacked, transform, np.array(var.get_value(), dtype=np.float32)))
    return {name: out[name] for name in param_shapes(model.spec, model.lora)}


def to_hf(tree) -> dict[str, np.ndarray]:
    """A pytree of parameter-shaped arrays (parameters, gradients, tangents; an nnx.State or a split of one) as
    {hf_name: numpy array in torch layout}: the form in which the tests compare JAX with PyTorch (a stacked
    array gives one entry per layer)."""
    out = {}
    for path, x in jax.tree_util.tree_flatten_with_path(tree)[0]:
        out.update(stacked_to(*_entry(path, x), x))
    return out


def from_hf(tree, arrays: dict[str, np.ndarray]):
    """The inverse of to_hf: a pytree like `tree` whose leaves come from {hf_name: array in torch layout}."""

    def leaf(path, x):
        return jnp.asarray(stacked_from(*_entry(path, x), arrays), dtype=x.dtype)

    return jax.tree_util.tree_map_with_path(leaf, tree)
