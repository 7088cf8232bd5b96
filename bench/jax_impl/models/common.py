"""What every family's Flax NNX model shares: the precisions, the layers (linear with or without a LoRA adapter,
LayerNorm, embeddings), the layer stack run as one scan, and the weights by HF name in both directions. A family's
module (bench/jax_impl/models/<family>.py) builds its model from these and names its own parameters; nothing here
knows a family. Mirror of torch_impl/models/common.py.

HF weights <-> NNX parameters: the shared weights are a flat {hf_name: float32 numpy} dict in torch layout
(bench/weights.py). A family's NNX model mirrors HF's module names, so a parameter's NNX path is its HF name with
the leaf renamed after the flax module that owns it, and Linear weights transposed:

    torch nn.Linear.weight (out, in)   <->  nnx.Linear.kernel (in, out)    transpose
    torch nn.Embedding.weight (n, H)   <->  nnx.Embed.embedding (n, H)     identity
    torch nn.LayerNorm.weight / .bias  <->  nnx.LayerNorm.scale / .bias    identity
    PEFT lora_A.weight (rank, in)      <->  nnx.LoRA.lora_a (in, rank)     transpose
    PEFT lora_B.weight (out, rank)     <->  nnx.LoRA.lora_b (rank, out)    transpose

Both transforms are their own inverse, so export applies the same one. With scan_layers the layers' parameters are
stacked: <...>.stacks.S.<path in a layer> holds layers S, S+1, ... along a leading axis, slice i being that layer's
HF name, transformed as that layer's alone. A family maps a path to its names by an `entry(path, n)` -> (HF names:
one, or the n layers of a stack; stacked; transform), which the functions here take.

No torch here: a JAX trial never imports it.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from bench import models
from bench.models import with_adapters
from bench.spec import LoraSpec
from bench.weights import WeightsError, check_weights

# HF eager attention adds finfo(dtype).min at masked keys (masking_utils.eager_mask); the same constant here
# keeps padded batches equal to HF at every position, padded rows included.
MASK_VALUE = float(np.finfo(np.float32).min)


class Precision(NamedTuple):
    """What the layers compute in and keep their parameters in, per dtype (bench.spec.DTYPES), mirroring torch:
    `bf16` is torch.autocast's recipe (Linear layers and the attention matmuls in bf16 on fp32 parameters,
    LayerNorm in fp32, softmax in fp32 and cast back, embeddings in their parameters' fp32, sums promoted to
    fp32); `bf16_pure` keeps the parameters in bf16 and computes in bf16 (softmax in fp32, as HF's eager
    attention does, and reductions accumulate in fp32 in both frameworks)."""

    linear: Any  # nnx.Linear's computation dtype (None: its inputs' and parameters' promoted dtype)
    norm: Any  # nnx.LayerNorm's computation and output dtype
    params: Any  # every parameter's dtype


PRECISIONS = {
    "fp32": Precision(None, None, jnp.float32),
    "bf16": Precision(jnp.bfloat16, jnp.float32, jnp.float32),
    "bf16_pure": Precision(None, None, jnp.bfloat16),
}
FP32 = PRECISIONS["fp32"]


class LoRALinear(nnx.Linear):
    """A linear layer with a LoRA adapter (Flax's nnx.LoRA: lora_a (in, rank), lora_b (rank, out)), computing
    PEFT's lora.Linear: y = W x + b + (lora_b^T lora_a^T dropout(x)) * alpha / rank."""

    def __init__(self, n_in: int, n_out: int, lora: LoraSpec, *, rngs: nnx.Rngs, p: Precision, **kw):
        super().__init__(n_in, n_out, dtype=p.linear, param_dtype=p.params, rngs=rngs, **kw)
        self.lora = nnx.LoRA(n_in, lora.rank, n_out, dtype=p.linear, param_dtype=p.params, rngs=rngs)
        self.lora_dropout = nnx.Dropout(lora.dropout)
        self.scaling = lora.scaling

    def __call__(self, x, *, deterministic=True, rngs=None):
        y = super().__call__(x)
        return y + self.lora(self.lora_dropout(x, deterministic=deterministic, rngs=rngs)) * self.scaling


def linear(
    n_in: int, n_out: int, std: float, rngs: nnx.Rngs, p: Precision, lora: LoraSpec | None = None, bias: bool = True
) -> nnx.Linear:
    """An nnx.Linear, or a LoRALinear with `lora` (None: the layer is not adapted)."""
    # HF's _init_weights: N(0, std) weights, zero biases. build_model overwrites them with the shared weights
    # anyway; this only makes a model built directly start from the same distribution.
    kw = dict(kernel_init=nnx.initializers.normal(std), use_bias=bias, rngs=rngs)
    if lora is not None:
        return LoRALinear(n_in, n_out, lora, p=p, **kw)
    return nnx.Linear(n_in, n_out, dtype=p.linear, param_dtype=p.params, **kw)


def project(layer: nnx.Linear, x, deterministic, rngs):
    """A linear layer's output; a LoRALinear is also told the mode, for its adapter's dropout."""
    if isinstance(layer, LoRALinear):
        return layer(x, deterministic=deterministic, rngs=rngs)
    return layer(x)


def layer_norm(width: int, eps: float, rngs: nnx.Rngs, p: Precision) -> nnx.LayerNorm:
    # use_fast_variance=False: E[x^2] - E[x]^2 loses digits against torch's two-pass variance when |mean| >> std.
    return nnx.LayerNorm(width, epsilon=eps, use_fast_variance=False, dtype=p.norm, param_dtype=p.params, rngs=rngs)


def embed(n: int, width: int, std: float, rngs: nnx.Rngs, p: Precision) -> nnx.Embed:
    return nnx.Embed(n, width, embedding_init=nnx.initializers.normal(std), param_dtype=p.params, rngs=rngs)


def require_rngs(dropout: float, deterministic: bool, rngs) -> None:
    """A training forward pass with dropout needs its keys: the models hold no random state of their own."""
    if not deterministic and dropout > 0 and rngs is None:
        raise ValueError(
            f"deterministic=False with dropout={dropout} needs rngs=nnx.Rngs(dropout=key) "
            "(the model holds no random state of its own)"
        )


# ---------------------------------------------------------------------------------------------------------------
# the layers: unrolled, or stacks each run by one scan


def layer_forward(layer, x, mask_bias, rngs, deterministic):
    return layer(x, mask_bias, deterministic=deterministic, rngs=rngs)


def remat_layer_forward(layer, x, mask_bias, rngs, deterministic):
    """Activation checkpointing per layer: only each layer's input is kept for the backward pass, the rest is
    recomputed. A pure function under jax.checkpoint, the layer and the dropout streams passed in as state and
    the streams' advanced counters passed out: nnx.remat wrote the layer's Params back after the call, which fails
    when some are frozen (closed over from another trace level: trainable=bias|head|last_k). Dropout keys come
    from the streams inside the checkpointed function, so the recomputation draws the very same masks."""
    graphdef, state = nnx.split((layer, rngs))

    def pure(state, x, mask_bias):
        layer, rngs = nnx.merge(graphdef, state)
        y = layer_forward(layer, x, mask_bias, rngs, deterministic)
        return y, None if rngs is None else nnx.state(rngs)

    y, streams = jax.checkpoint(pure)(state, x, mask_bias)
    if rngs is not None:
        nnx.update(rngs, streams)
    return y


def layer_stacks(num_layers: int, trainable: str = "all", last_k: int = 1) -> tuple[int, ...]:
    """scan_layers: how many consecutive layers each stack holds. One stack of every layer, except under
    trainable=last_k: a stacked tensor is trained or frozen whole, so the frozen layers are one stack and the
    trained ones another (two scans, two compiled layer bodies)."""
    if trainable == "last_k" and last_k < num_layers:
        return (num_layers - last_k, last_k)
    return (num_layers,)


def stack_starts(stacks: tuple[int, ...], num_layers: int) -> list[int]:
    """The index of each stack's first layer (its name in the model: stacks.S), the stacks checked to add up."""
    if sum(stacks) != num_layers:
        raise ValueError(f"layer stacks {stacks} do not add up to the model's {num_layers} layers")
    return [int(s) for s in np.cumsum((0, *stacks[:-1]))]


def stacked_layers(make_layer: Callable[[nnx.Rngs], nnx.Module], n: int, rngs: nnx.Rngs) -> nnx.Module:
    """n layers as one, every parameter with a leading layer axis of n (Flax NNX's scan-over-layers recipe:
    nnx.vmap of the constructor, each layer initialised from its own split of the streams)."""

    @nnx.split_rngs(splits=n)
    @nnx.vmap(in_axes=(0,), out_axes=0)
    def make(rngs):
        return make_layer(rngs)

    return make(rngs)


# layer_hook(stack name, a layer's parameters (its nnx.State), the layer's index in the stack) -> the parameters the
# layer runs with: how something drawn per layer enters the scan where that layer runs (a forward gradient's
# tangent, bench/jax_impl/directions.py), rather than whole before it.
LayerHook = Callable[[str, nnx.State, jax.Array], nnx.State]


def scan_stack(
    stack: nnx.Module,
    x,
    mask_bias,
    rngs,
    deterministic,
    remat: bool,
    all_hidden: bool,
    hook: LayerHook | None = None,
    name: str = "",
):
    """Run a stack of layers as one jax.lax.scan over its parameters' leading axis: XLA compiles the layer once,
    whatever the depth. (last hidden state (B, T, H), each layer's output or [] unless `all_hidden`).

    The layer is a pure function of its slice of the stack (nnx.merge in the body, nothing written back), so
    frozen parameters closed over by a transformation's caller pass through as constants, as in the unrolled model.
    Dropout: one key from the caller's stream, split into one per layer, each layer drawing from its own stream.
    remat: jax.checkpoint around the body, so the scan keeps each layer's input alone and recomputes the rest.
    `hook`: applied to each layer's slice of the parameters in the body, with the stack's `name`."""
    graphdef, params = nnx.split(stack)
    n = jax.tree.leaves(params)[0].shape[0]
    keys = None if rngs is None else jax.random.split(rngs.dropout(), n)

    def body(x, slice_):
        params, key, i = slice_
        layer = nnx.merge(graphdef, params if hook is None else hook(name, params, i))
        y = layer(x, mask_bias, deterministic=deterministic, rngs=None if key is None else nnx.Rngs(dropout=key))
        return y, (y if all_hidden else None)  # (B, T, H)

    x, ys = jax.lax.scan(jax.checkpoint(body) if remat else body, x, (params, keys, jnp.arange(n)))
    return x, (list(ys) if all_hidden else [])


def build(make_model: Callable[..., nnx.Module], spec, weights, load, *, dtype: str, lora, seed: int, **kw):
    """A family's model with exactly `weights` (HF names, torch layout), computing as `dtype` says (PRECISIONS):
    `make_model(spec, rngs=, p=, lora=, **kw)` built abstractly (shapes only, like torch's meta device: a random
    init would be thrown away at once), then `load`ed; with `lora`, A and B from `weights` where it has them, else
    drawn from `seed` (bench.models.with_adapters)."""
    p = PRECISIONS[dtype]
    model = nnx.eval_shape(lambda: make_model(spec, rngs=nnx.Rngs(0), p=p, lora=lora, **kw))
    load(model, with_adapters(weights, spec, lora, seed))
    return model


# ---------------------------------------------------------------------------------------------------------------
# weights by HF name: a family's entry(path, n) -> (HF names, stacked, transform)

Entry = Callable[[tuple, int], tuple[list[str], bool, Any]]


def identity(w: np.ndarray) -> np.ndarray:
    return w


def transpose(w: np.ndarray) -> np.ndarray:
    return np.ascontiguousarray(w.T)


def key_of(k) -> str:
    # Accept NNX paths (str / int keys) and jax.tree_util key paths (DictKey, GetAttrKey, SequenceKey) alike,
    # so hf_name works on paths from nnx.split filters, State.flat_state() and jax.tree_util.tree_map_with_path.
    for attr in ("key", "name", "idx"):
        if hasattr(k, attr):
            return str(getattr(k, attr))
    return str(k)


def keys_of(path: tuple) -> tuple[str, ...]:
    """An NNX or tree_util path as plain keys, without the Variable's own trailing `value`."""
    keys = tuple(key_of(k) for k in path)
    return keys[:-1] if keys and keys[-1] in ("value", "raw_value") else keys


def is_stacked(path: tuple) -> bool:
    """Whether an NNX path (or a tree_util path through one, e.g. an optimizer state's) is a stacked parameter,
    whose leading axis counts layers."""
    return "stacks" in [key_of(k) for k in path]


def stack_of(path: tuple) -> tuple[str, tuple[str, ...]] | None:
    """(the stack's name, the parameter's path inside one layer) of a stacked parameter's path, else None:
    (..., 'stacks', '0', 'attention', 'self', 'query', 'kernel') -> ('0', ('attention', 'self', 'query',
    'kernel')), the path the parameter has in the layer the scan runs (scan_stack)."""
    keys = keys_of(path)
    for i in range(len(keys) - 1):
        if keys[i] == "stacks":
            return keys[i + 1], keys[i + 2 :]
    return None


def stack_size(path: tuple, x) -> int:
    """The layers a parameter-shaped leaf holds: its leading axis where it is stacked, else one."""
    return x.shape[0] if is_stacked(path) else 1


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


def params(model, entry: Entry) -> list[tuple[nnx.Variable, list[str], bool, Any]]:
    """(Param, HF names, stacked, transform) of every parameter of the model."""
    flat = nnx.to_flat_state(nnx.state(model, nnx.Param))
    return [(var, *entry(path, stack_size(path, var))) for path, var in flat]


def load_weights(model, weights: dict[str, np.ndarray], entry: Entry) -> None:
    """Copy the numpy weights into the model (strict: every missing, unexpected and mis-shaped key is reported
    together in one WeightsError). Works on an abstract model from nnx.eval_shape too (build)."""
    spec, lora = model.spec, model.lora
    check_weights(weights, spec, lora=lora)
    family = models.of(spec)
    found, shapes = params(model, entry), family.param_shapes(spec, lora)
    # The model's own parameters must be exactly the spec's; anything else is a bug in the family's modules, not
    # in the weights.
    names = {n for _, ns, _, _ in found for n in ns}
    if names != set(shapes):
        raise WeightsError(
            f"JAX's {family.NAME} and bench.models.{family.NAME} disagree: {sorted(names ^ set(shapes))}"
        )
    for var, ns, stacked, transform in found:
        w = stacked_from(ns, stacked, transform, weights)
        if w.shape != tuple(var.shape):  # unreachable while the entry and the model agree; cheap to be sure
            raise WeightsError(f"{ns[0]}: {w.shape} after transform != NNX {tuple(var.shape)}")
        var.set_value(jnp.asarray(w, dtype=var.dtype))


def export_weights(model, entry: Entry) -> dict[str, np.ndarray]:
    """The model's parameters as the shared {hf_name: numpy} dict in torch layout and HF order (the inverse of
    load_weights; mirror of torch_impl's export_weights)."""
    out = {}
    for var, ns, stacked, transform in params(model, entry):
        # np.array copies: never aliases the model's arrays; bf16 parameters leave as fp32, as torch_impl's do
        out.update(stacked_to(ns, stacked, transform, np.array(var.get_value(), dtype=np.float32)))
    return {name: out[name] for name in models.of(model.spec).param_shapes(model.spec, model.lora)}


def is_trained(path: tuple, x, scope: str, num_layers: int, last_k: int, entry: Entry, is_trainable) -> bool:
    """Whether the parameter `x` at `path` is trained under `scope` (the family's is_trainable on its HF names). A
    stacked parameter is trained or frozen whole: a stack whose layers the scope splits is an error (build the
    model with layer_stacks of the scope)."""
    names = entry(path, stack_size(path, x))[0]
    picks = {is_trainable(n, scope, num_layers, last_k) for n in names}
    if len(picks) > 1:
        raise ValueError(
            f"trainable={scope} (last_k={last_k}) trains some layers of the stack {names[0]}.. and "
            "not others: stack the layers with bench.jax_impl.models.common.layer_stacks"
        )
    return picks.pop()


def to_hf(tree, entry: Entry) -> dict[str, np.ndarray]:
    """A pytree of parameter-shaped arrays (parameters, gradients, tangents; an nnx.State or a split of one) as
    {hf_name: numpy array in torch layout}: the form in which the tests compare JAX with PyTorch (a stacked
    array gives one entry per layer)."""
    out = {}
    for path, x in jax.tree_util.tree_flatten_with_path(tree)[0]:
        out.update(stacked_to(*entry(path, stack_size(path, x)), x))
    return out


def from_hf(tree, arrays: dict[str, np.ndarray], entry: Entry):
    """The inverse of to_hf: a pytree like `tree` whose leaves come from {hf_name: array in torch layout}."""

    def leaf(path, x):
        return jnp.asarray(stacked_from(*entry(path, stack_size(path, x)), arrays), dtype=x.dtype)

    return jax.tree_util.tree_map_with_path(leaf, tree)


def last_token(input_ids: jax.Array, pad_token_id: int) -> jax.Array:
    """Each row's last token that is not padding, (B,): transformers 5.x's rule for a decoder's score, the rightmost
    non-pad token ((arange * (ids != pad)).argmax; row 0 where all are pad). Mirror of torch_impl's last_token."""
    positions = jnp.arange(input_ids.shape[-1], dtype=jnp.int32)
    return jnp.argmax(positions * (input_ids != pad_token_id), axis=-1)


def head_rows(token: str, hidden: jax.Array, batch: dict, pad_token_id: int) -> tuple[jax.Array, dict]:
    """The one row of the trunk's output (B, T, H) a head reads, (B, 1, H), and the batch keys the head reads as
    they point at it: "first" (BERT's pooler, nothing of the batch) or "last" (a decoder's score at the last token
    that is not padding: that token's id alone, which is then the last of one). What evaluation keeps of a frozen
    trunk's pass (Trainer.evaluate). Mirror of torch_impl's head_rows."""
    if token == "first":
        return hidden[:, :1], {}
    ids = batch["input_ids"]
    rows, last = jnp.arange(ids.shape[0]), last_token(ids, pad_token_id)
    return hidden[rows, last][:, None], {"input_ids": ids[rows, last][:, None]}
