"""BERT (Devlin et al. 2019) in JAX: a Flax NNX BertForSequenceClassification, loaded from the shared numpy
weights by HF name. Mirror of torch_impl/models/bert.py; bench/models/bert.py holds the family's framework-neutral
facts.

transformers 5.x ships no Flax models, so this is HF's modeling_bert.py rewritten in NNX, op for op: same module
tree (attribute names are HF's module names, so a parameter's NNX path reads like its HF name, see TABLE), same
post-LN layer, exact erf GELU, HF eager attention's additive padding mask, and the same order of additions wherever
float32 rounding could tell the two apart. tests/frameworks/test_parity.py holds every hidden state, the logits,
and the trainers' loss (bench/jax_impl/steps.py) and every gradient against HF. The layers, LoRA, the scan over
layers and the weights' transforms are every family's (bench/jax_impl/models/common.py).

Dropout draws from the `rngs` passed to __call__ (nnx.Rngs(dropout=key)); the model itself holds only Params,
so its state splits cleanly into trainable and frozen parameters.

Weights: TABLE maps each HF name to its NNX path and transform. With scan_layers (BertEncoder) the encoder's
parameters are stacked: bert.encoder.stacks.S.<path in a layer> holds layers S, S+1, ... along a leading axis,
slice i being HF's bert.encoder.layer.{S+i}.<name>.
"""

from __future__ import annotations

import re
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from bench.jax_impl.models import common
from bench.jax_impl.models.common import (
    FP32,
    MASK_VALUE,
    LayerHook,
    Precision,
    embed,
    identity,
    keys_of,
    layer_forward,
    layer_norm,
    linear,
    project,
    remat_layer_forward,
    require_rngs,
    scan_stack,
    stack_starts,
    stacked_layers,
    transpose,
)
from bench.models.bert import LORA_TARGETS, BertSpec, is_trainable, lora_module
from bench.spec import LoraSpec


class BertOutput(NamedTuple):
    """What __call__ returns with output_hidden_states=True (a NamedTuple, so it is a pytree under jit)."""

    logits: jax.Array  # (B, num_labels)
    pooled: jax.Array  # (B, H) pooler output, before the classifier dropout
    hidden_states: tuple[jax.Array, ...]  # (embeddings output, layer 1, ..., layer L), each (B, T, H)


def _linear(
    n_in: int, n_out: int, spec: BertSpec, rngs: nnx.Rngs, p: Precision, lora: LoraSpec | None = None, target: str = ""
) -> nnx.Linear:
    """An nnx.Linear, or a LoRALinear where `lora` targets it (`target`: its name in LORA_TARGETS)."""
    adapted = lora is not None and target in lora.targets
    return linear(n_in, n_out, spec.initializer_range, rngs, p, lora if adapted else None)


def _layer_norm(spec: BertSpec, rngs: nnx.Rngs, p: Precision) -> nnx.LayerNorm:
    return layer_norm(spec.hidden_size, spec.layer_norm_eps, rngs, p)


def _embed(n: int, spec: BertSpec, rngs: nnx.Rngs, p: Precision) -> nnx.Embed:
    return embed(n, spec.hidden_size, spec.initializer_range, rngs, p)


class BertEmbeddings(nnx.Module):
    def __init__(self, spec: BertSpec, *, rngs: nnx.Rngs, p: Precision = FP32):
        self.word_embeddings = _embed(spec.vocab_size, spec, rngs, p)
        self.position_embeddings = _embed(spec.max_position_embeddings, spec, rngs, p)
        self.token_type_embeddings = _embed(spec.type_vocab_size, spec, rngs, p)
        self.LayerNorm = _layer_norm(spec, rngs, p)
        self.dropout = nnx.Dropout(spec.dropout)

    def __call__(self, input_ids, token_type_ids, *, deterministic, rngs):
        T = input_ids.shape[1]
        position_ids = jnp.arange(T, dtype=jnp.int32)[None, :]  # (1, T), HF's position_ids buffer sliced to T
        # HF's order of additions: (word + token_type) + position.
        x = self.word_embeddings(input_ids) + self.token_type_embeddings(token_type_ids)  # (B, T, H)
        x = x + self.position_embeddings(position_ids)  # (B, T, H)
        x = self.LayerNorm(x)
        return self.dropout(x, deterministic=deterministic, rngs=rngs)


class BertSelfAttention(nnx.Module):
    def __init__(self, spec: BertSpec, *, rngs: nnx.Rngs, p: Precision = FP32, lora: LoraSpec | None = None):
        H = spec.hidden_size
        self.num_heads = spec.num_heads
        self.head_dim = spec.head_dim
        self.query = _linear(H, H, spec, rngs, p, lora, "query")
        self.key = _linear(H, H, spec, rngs, p, lora, "key")
        self.value = _linear(H, H, spec, rngs, p, lora, "value")
        self.dropout = nnx.Dropout(spec.dropout)

    def __call__(self, x, mask_bias, *, deterministic, rngs):
        B, T, H = x.shape
        nh, hd = self.num_heads, self.head_dim

        def heads(t):  # (B, T, H) -> (B, nh, T, hd)
            return t.reshape(B, T, nh, hd).transpose(0, 2, 1, 3)

        split = lambda linear: heads(project(linear, x, deterministic, rngs))
        q, k, v = split(self.query), split(self.key), split(self.value)
        # HF eager attention: scale after the matmul, add the mask, softmax in float32, dropout on the
        # probabilities.
        scores = jnp.einsum("bhqd,bhkd->bhqk", q, k) * (hd**-0.5)  # (B, nh, T, T)
        scores = scores + mask_bias  # (B, 1, 1, T) broadcast over heads and queries
        with jax.named_scope("softmax"):  # named in the compiled program: the trace's attention (jax_impl/profile)
            probs = jax.nn.softmax(scores, axis=-1).astype(q.dtype)  # fp32 softmax, back to the matmuls' dtype
        probs = self.dropout(probs, deterministic=deterministic, rngs=rngs)
        out = jnp.einsum("bhqk,bhkd->bhqd", probs, v)  # (B, nh, T, hd)
        return out.transpose(0, 2, 1, 3).reshape(B, T, H)  # (B, T, H)


class BertSelfOutput(nnx.Module):
    """Attention output projection + dropout + residual + LayerNorm (post-LN)."""

    def __init__(self, spec: BertSpec, *, rngs: nnx.Rngs, p: Precision = FP32, lora: LoraSpec | None = None):
        self.dense = _linear(spec.hidden_size, spec.hidden_size, spec, rngs, p, lora, "attention.output.dense")
        self.LayerNorm = _layer_norm(spec, rngs, p)
        self.dropout = nnx.Dropout(spec.dropout)

    def __call__(self, x, residual, *, deterministic, rngs):
        x = self.dropout(project(self.dense, x, deterministic, rngs), deterministic=deterministic, rngs=rngs)
        return self.LayerNorm(x + residual)  # (B, T, H)


class BertAttention(nnx.Module):
    def __init__(self, spec: BertSpec, *, rngs: nnx.Rngs, p: Precision = FP32, lora: LoraSpec | None = None):
        # HF's name, so the path reads attention.self.query
        self.self = BertSelfAttention(spec, rngs=rngs, p=p, lora=lora)
        self.output = BertSelfOutput(spec, rngs=rngs, p=p, lora=lora)

    def __call__(self, x, mask_bias, *, deterministic, rngs):
        a = self.self(x, mask_bias, deterministic=deterministic, rngs=rngs)
        return self.output(a, x, deterministic=deterministic, rngs=rngs)


class BertIntermediate(nnx.Module):
    def __init__(self, spec: BertSpec, *, rngs: nnx.Rngs, p: Precision = FP32, lora: LoraSpec | None = None):
        self.dense = _linear(spec.hidden_size, spec.intermediate_size, spec, rngs, p, lora, "intermediate.dense")

    def __call__(self, x, *, deterministic, rngs):
        # (B, T, I); BERT's exact erf GELU (HF "gelu")
        return jax.nn.gelu(project(self.dense, x, deterministic, rngs), approximate=False)


class BertFeedForwardOutput(nnx.Module):
    """HF's BertOutput module (renamed here: BertOutput is this file's return type). FFN down-projection +
    dropout + residual + LayerNorm."""

    def __init__(self, spec: BertSpec, *, rngs: nnx.Rngs, p: Precision = FP32, lora: LoraSpec | None = None):
        self.dense = _linear(spec.intermediate_size, spec.hidden_size, spec, rngs, p, lora, "output.dense")
        self.LayerNorm = _layer_norm(spec, rngs, p)
        self.dropout = nnx.Dropout(spec.dropout)

    def __call__(self, x, residual, *, deterministic, rngs):
        x = self.dropout(project(self.dense, x, deterministic, rngs), deterministic=deterministic, rngs=rngs)
        return self.LayerNorm(x + residual)  # (B, T, H)


class BertLayer(nnx.Module):
    def __init__(self, spec: BertSpec, *, rngs: nnx.Rngs, p: Precision = FP32, lora: LoraSpec | None = None):
        self.attention = BertAttention(spec, rngs=rngs, p=p, lora=lora)
        self.intermediate = BertIntermediate(spec, rngs=rngs, p=p, lora=lora)
        self.output = BertFeedForwardOutput(spec, rngs=rngs, p=p, lora=lora)

    def __call__(self, x, mask_bias, *, deterministic, rngs):
        kw = dict(deterministic=deterministic, rngs=rngs)
        a = self.attention(x, mask_bias, **kw)  # (B, T, H)
        return self.output(self.intermediate(a, **kw), a, **kw)  # (B, T, H)


class BertEncoder(nnx.Module):
    """The encoder layers, unrolled (`layer`: one per layer, HF's structure) or, with `stacks` (scan_layers, see
    common.layer_stacks), as stacks of layers whose parameters carry a leading layer axis, each run by one lax.scan
    (`stacks`: {index of its first layer: the stack}; TABLE maps each slice to its HF names)."""

    def __init__(
        self,
        spec: BertSpec,
        *,
        rngs: nnx.Rngs,
        remat: bool = False,
        p: Precision = FP32,
        lora: LoraSpec | None = None,
        stacks: tuple[int, ...] | None = None,
    ):
        self.remat = remat
        self.scan = stacks is not None
        if stacks is None:
            self.layer = nnx.List([BertLayer(spec, rngs=rngs, p=p, lora=lora) for _ in range(spec.num_layers)])
            return
        make = lambda rngs: BertLayer(spec, rngs=rngs, p=p, lora=lora)
        starts = stack_starts(stacks, spec.num_layers)
        self.stacks = nnx.Dict({str(s): stacked_layers(make, n, rngs) for s, n in zip(starts, stacks)})

    def __call__(
        self, x, mask_bias, *, deterministic, rngs, all_hidden: bool = False, layer_hook: LayerHook | None = None
    ):
        """(last hidden state (B, T, H), the L + 1 hidden states of HF's output_hidden_states, or () unless
        `all_hidden`). `layer_hook`: see LayerHook (stacked layers only; unrolled layers have no use for one)."""
        hidden_states = [x]
        if self.scan:
            for name, stack in self.stacks.items():  # in layer order (built in that order)
                x, ys = scan_stack(stack, x, mask_bias, rngs, deterministic, self.remat, all_hidden, layer_hook, name)
                hidden_states += ys
        else:
            forward = remat_layer_forward if self.remat else layer_forward
            for layer in self.layer:
                x = forward(layer, x, mask_bias, rngs, deterministic)  # (B, T, H)
                hidden_states.append(x)
        return x, (tuple(hidden_states) if all_hidden else ())


class BertPooler(nnx.Module):
    def __init__(self, spec: BertSpec, *, rngs: nnx.Rngs, p: Precision = FP32):
        self.dense = _linear(spec.hidden_size, spec.hidden_size, spec, rngs, p)

    def __call__(self, x):
        return jnp.tanh(self.dense(x[:, 0]))  # (B, H), from the [CLS] position


class BertModel(nnx.Module):
    def __init__(
        self,
        spec: BertSpec,
        *,
        rngs: nnx.Rngs,
        remat: bool = False,
        p: Precision = FP32,
        lora: LoraSpec | None = None,
        stacks: tuple[int, ...] | None = None,
    ):
        self.embeddings = BertEmbeddings(spec, rngs=rngs, p=p)
        self.encoder = BertEncoder(spec, rngs=rngs, remat=remat, p=p, lora=lora, stacks=stacks)
        self.pooler = BertPooler(spec, rngs=rngs, p=p)


class BertForSequenceClassification(nnx.Module):
    """HF BertForSequenceClassification in NNX. Inputs are int32 (B, T); returns float32 logits
    (B, num_labels), or a BertOutput with the pooled output and HF's hidden_states tuple when
    output_hidden_states=True. With `lora`, the targeted linear layers carry adapters (LoRALinear); with
    `stacks`, the encoder's layers are stacked and scanned (BertEncoder, common.layer_stacks)."""

    def __init__(
        self,
        spec: BertSpec,
        *,
        rngs: nnx.Rngs,
        remat: bool = False,
        p: Precision = FP32,
        lora: LoraSpec | None = None,
        stacks: tuple[int, ...] | None = None,
    ):
        self.spec = spec  # frozen dataclass: static metadata of the graph, not state
        self.lora = lora  # the same: which adapters the model has (load_weights reads their names)
        self.bert = BertModel(spec, rngs=rngs, remat=remat, p=p, lora=lora, stacks=stacks)
        self.dropout = nnx.Dropout(spec.dropout)
        self.classifier = _linear(spec.hidden_size, spec.num_labels, spec, rngs, p)

    def __call__(
        self,
        input_ids,
        token_type_ids,
        attention_mask,
        *,
        deterministic: bool = True,
        rngs: nnx.Rngs | None = None,
        output_hidden_states: bool = False,
        layer_hook: LayerHook | None = None,
    ):
        require_rngs(self.spec.dropout, deterministic, rngs)
        # Additive padding mask, exactly HF's eager mask: 0 where attended, float32 min at padded keys.
        keep = attention_mask[:, None, None, :] != 0  # (B, 1, 1, T)
        mask_bias = jnp.where(keep, 0.0, MASK_VALUE).astype(jnp.float32)  # (B, 1, 1, T)
        kw = dict(deterministic=deterministic, rngs=rngs)
        x = self.bert.embeddings(input_ids, token_type_ids, **kw)  # (B, T, H)
        last, hidden_states = self.bert.encoder(
            x, mask_bias, **kw, all_hidden=output_hidden_states, layer_hook=layer_hook
        )  # (B, T, H)
        pooled = self.bert.pooler(last)  # (B, H)
        logits = self.classifier(self.dropout(pooled, **kw))  # (B, num_labels)
        if output_hidden_states:
            return BertOutput(logits, pooled, hidden_states)
        return logits

    # The same forward in two halves, for jacfwd on trainable=head: the frozen trunk runs once per batch and only
    # the head is pushed forward along every basis direction (steps.jacfwd_gradient).
    def features(self, input_ids, token_type_ids, attention_mask, *, deterministic=True, rngs=None):
        """The trunk: embeddings + encoder -> last hidden state (B, T, H)."""
        keep = attention_mask[:, None, None, :] != 0  # (B, 1, 1, T)
        mask_bias = jnp.where(keep, 0.0, MASK_VALUE).astype(jnp.float32)
        kw = dict(deterministic=deterministic, rngs=rngs)
        return self.bert.encoder(self.bert.embeddings(input_ids, token_type_ids, **kw), mask_bias, **kw)[0]

    def head(self, hidden, *, deterministic=True, rngs=None):
        """The head: pooler + dropout + classifier, (B, T, H) -> logits (B, num_labels)."""
        return self.classifier(self.dropout(self.bert.pooler(hidden), deterministic=deterministic, rngs=rngs))


def build_model(
    spec: BertSpec,
    weights: dict[str, np.ndarray],
    *,
    remat: bool = False,
    dtype: str = "fp32",
    lora: LoraSpec | None = None,
    seed: int = 0,
    scan_layers: bool = True,
    stacks: tuple[int, ...] | None = None,
) -> BertForSequenceClassification:
    """BertForSequenceClassification with exactly `weights` (HF names, torch layout), computing as `dtype` says
    (common.PRECISIONS); with `lora`, nnx.LoRA adapters on its targets (common.build). scan_layers: the encoder's
    layers stacked and scanned, in `stacks` (common.layer_stacks; None: one stack of all); false: unrolled, one
    module per layer as in HF."""
    stacks = (stacks or (spec.num_layers,)) if scan_layers else None
    kw = dict(remat=remat, stacks=stacks)
    return common.build(
        BertForSequenceClassification, spec, weights, load_weights, dtype=dtype, lora=lora, seed=seed, **kw
    )


# ---------------------------------------------------------------------------------------------------------------
# weights by HF name

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
) + tuple(  # trainable=lora's adapters (common.LoRALinear): the wrapped layer's path, then PEFT's / nnx.LoRA's
    (_L + f"{lora_module(t)}.lora_{m.upper()}.weight", _L + f"{lora_module(t)}.lora.lora_{m}", transpose)
    for t in LORA_TARGETS
    for m in ("a", "b")
)


# scan_layers (BertEncoder): the encoder's layers stacked, every parameter with a leading layer axis, under
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
    raise KeyError(f"NNX path {dotted!r} is no BERT parameter (see bench.jax_impl.models.bert.TABLE)")


def hf_name(path: tuple) -> str:
    """The HF parameter name of an NNX state path, e.g. ('bert', 'encoder', 'layer', 0, 'attention', 'self',
    'query', 'kernel') -> 'bert.encoder.layer.0.attention.self.query.weight'. For a stacked parameter
    (bert.encoder.stacks.S...), its first layer's: the layers of a stack are trained or frozen together
    (common.layer_stacks), so a trainable scope reads this name for all of them."""
    return _lookup(path)[0]


def layer_names(path: tuple, n: int = 1) -> list[str]:
    """The HF names of a parameter: one, or for a stacked one the n layers it stacks, in order."""
    name, _, first = _lookup(path)
    if first is None:
        return [name]
    rest = name.removeprefix(f"bert.encoder.layer.{first}.")
    return [f"bert.encoder.layer.{first + i}.{rest}" for i in range(n)]


def _entry(path: tuple, n: int) -> tuple[list[str], bool, object]:
    """(HF names, stacked, transform) of the parameter at `path`, holding `n` layers (common.Entry)."""
    _, transform, first = _lookup(path)
    return layer_names(path, n), first is not None, transform


def load_weights(model, weights: dict[str, np.ndarray]) -> None:
    """Copy the numpy weights into the model (strict: every problem reported together; common.load_weights)."""
    common.load_weights(model, weights, _entry)


def export_weights(model) -> dict[str, np.ndarray]:
    """The model's parameters as the shared {hf_name: numpy} dict in torch layout and HF order."""
    return common.export_weights(model, _entry)


def is_trained(path: tuple, x, scope: str, num_layers: int, last_k: int = 1) -> bool:
    """Whether the parameter `x` at `path` is trained under `scope` (bench.models.bert.is_trainable)."""
    return common.is_trained(path, x, scope, num_layers, last_k, _entry, is_trainable)


def to_hf(tree) -> dict[str, np.ndarray]:
    """A pytree of parameter-shaped arrays as {hf_name: numpy, torch layout} (common.to_hf)."""
    return common.to_hf(tree, _entry)


def from_hf(tree, arrays: dict[str, np.ndarray]):
    """The inverse of to_hf: a pytree like `tree` whose leaves come from {hf_name: array in torch layout}."""
    return common.from_hf(tree, arrays, _entry)
