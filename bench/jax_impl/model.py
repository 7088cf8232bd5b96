"""JAX BERT: a Flax NNX BertForSequenceClassification, loaded from the shared numpy weights.

The mirror image of torch_impl/model.py. transformers 5.x ships no Flax models, so this is HF's
modeling_bert.py rewritten in NNX, op for op: same module tree (attribute names are HF's module names, so a
parameter's NNX path reads like its HF name, see params.py), same post-LN layer, exact erf GELU, HF eager
attention's additive padding mask, and the same order of additions wherever float32 rounding could tell the
two apart. tests/frameworks/test_parity.py holds every hidden state, the logits, and the trainers' loss
(bench/jax_impl/steps.py) and every gradient against HF.

Dropout draws from the `rngs` passed to __call__ (nnx.Rngs(dropout=key)); the model itself holds only Params,
so its state splits cleanly into trainable and frozen parameters.

trainable=lora: the targeted linear layers are LoRALinear, an nnx.Linear with Flax's own nnx.LoRA beside it,
computing what HF PEFT's lora.Linear computes in torch (same parameters, same order of operations).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from bench.jax_impl.params import load_weights
from bench.models import with_adapters
from bench.models.bert import BertSpec
from bench.spec import LoraSpec

# HF eager attention adds finfo(dtype).min at padded keys (masking_utils.eager_mask); the same constant here
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


class BertOutput(NamedTuple):
    """What __call__ returns with output_hidden_states=True (a NamedTuple, so it is a pytree under jit)."""

    logits: jax.Array  # (B, num_labels)
    pooled: jax.Array  # (B, H) pooler output, before the classifier dropout
    hidden_states: tuple[jax.Array, ...]  # (embeddings output, layer 1, ..., layer L), each (B, T, H)


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


def _linear(
    n_in: int, n_out: int, spec: BertSpec, rngs: nnx.Rngs, p: Precision, lora: LoraSpec | None = None, target: str = ""
) -> nnx.Linear:
    """An nnx.Linear, or a LoRALinear where `lora` targets it (`target`: its name in LORA_TARGETS)."""
    # HF's _init_weights: N(0, initializer_range) weights, zero biases. build_model overwrites them with the
    # shared weights anyway; this only makes a model built directly start from the same distribution.
    init = nnx.initializers.normal(spec.initializer_range)
    if lora is not None and target in lora.targets:
        return LoRALinear(n_in, n_out, lora, kernel_init=init, rngs=rngs, p=p)
    return nnx.Linear(n_in, n_out, kernel_init=init, dtype=p.linear, param_dtype=p.params, rngs=rngs)


def project(linear: nnx.Linear, x, deterministic, rngs):
    """A linear layer's output; a LoRALinear is also told the mode, for its adapter's dropout."""
    if isinstance(linear, LoRALinear):
        return linear(x, deterministic=deterministic, rngs=rngs)
    return linear(x)


def layer_norm(spec: BertSpec, rngs: nnx.Rngs, p: Precision) -> nnx.LayerNorm:
    # use_fast_variance=False: E[x^2] - E[x]^2 loses digits against torch's two-pass variance when |mean| >>
    # std.
    return nnx.LayerNorm(
        spec.hidden_size,
        epsilon=spec.layer_norm_eps,
        use_fast_variance=False,
        dtype=p.norm,
        param_dtype=p.params,
        rngs=rngs,
    )


def _embed(n: int, spec: BertSpec, rngs: nnx.Rngs, p: Precision) -> nnx.Embed:
    init = nnx.initializers.normal(spec.initializer_range)
    return nnx.Embed(n, spec.hidden_size, embedding_init=init, param_dtype=p.params, rngs=rngs)


class BertEmbeddings(nnx.Module):
    def __init__(self, spec: BertSpec, *, rngs: nnx.Rngs, p: Precision = FP32):
        self.word_embeddings = _embed(spec.vocab_size, spec, rngs, p)
        self.position_embeddings = _embed(spec.max_position_embeddings, spec, rngs, p)
        self.token_type_embeddings = _embed(spec.type_vocab_size, spec, rngs, p)
        self.LayerNorm = layer_norm(spec, rngs, p)
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
        self.LayerNorm = layer_norm(spec, rngs, p)
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
        self.LayerNorm = layer_norm(spec, rngs, p)
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


def _layer_forward(layer, x, mask_bias, rngs, deterministic):
    return layer(x, mask_bias, deterministic=deterministic, rngs=rngs)


def _remat_layer_forward(layer, x, mask_bias, rngs, deterministic):
    """Activation checkpointing per encoder layer: only each layer's input is kept for the backward pass, the rest
    is recomputed. A pure function under jax.checkpoint, the layer and the dropout streams passed in as state and
    the streams' advanced counters passed out: nnx.remat wrote the layer's Params back after the call, which fails
    when some are frozen (closed over from another trace level: trainable=bias|head|last_k). Dropout keys come
    from the streams inside the checkpointed function, so the recomputation draws the very same masks."""
    graphdef, state = nnx.split((layer, rngs))

    def pure(state, x, mask_bias):
        layer, rngs = nnx.merge(graphdef, state)
        y = _layer_forward(layer, x, mask_bias, rngs, deterministic)
        return y, None if rngs is None else nnx.state(rngs)

    y, streams = jax.checkpoint(pure)(state, x, mask_bias)
    if rngs is not None:
        nnx.update(rngs, streams)
    return y


def layer_stacks(num_layers: int, trainable: str = "all", last_k: int = 1) -> tuple[int, ...]:
    """scan_layers: how many consecutive encoder layers each stack holds. One stack of every layer, except under
    trainable=last_k: a stacked tensor is trained or frozen whole, so the frozen layers are one stack and the
    trained ones another (two scans, two compiled layer bodies)."""
    if trainable == "last_k" and last_k < num_layers:
        return (num_layers - last_k, last_k)
    return (num_layers,)


def _stacked_layers(n: int, spec: BertSpec, rngs: nnx.Rngs, p: Precision, lora: LoraSpec | None) -> BertLayer:
    """n BertLayers as one, every parameter with a leading layer axis of n (Flax NNX's scan-over-layers recipe:
    nnx.vmap of the constructor, each layer initialised from its own split of the streams)."""

    @nnx.split_rngs(splits=n)
    @nnx.vmap(in_axes=(0,), out_axes=0)
    def make(rngs):
        return BertLayer(spec, rngs=rngs, p=p, lora=lora)

    return make(rngs)


# layer_hook(stack name, a layer's parameters (its nnx.State), the layer's index in the stack) -> the parameters the
# layer runs with: how something drawn per layer enters the scan where that layer runs (a forward gradient's
# tangent, bench/jax_impl/directions.py), rather than whole before it.
LayerHook = Callable[[str, nnx.State, jax.Array], nnx.State]


def scan_stack(
    stack: BertLayer,
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


class BertEncoder(nnx.Module):
    """The encoder layers, unrolled (`layer`: one per layer, HF's structure) or, with `stacks` (scan_layers, see
    layer_stacks), as stacks of layers whose parameters carry a leading layer axis, each run by one lax.scan
    (`stacks`: {index of its first layer: the stack}; bench/jax_impl/params.py maps each slice to its HF names)."""

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
        if sum(stacks) != spec.num_layers:
            raise ValueError(f"layer stacks {stacks} do not add up to the model's {spec.num_layers} layers")
        starts = np.cumsum((0, *stacks[:-1]))
        self.stacks = nnx.Dict({str(s): _stacked_layers(n, spec, rngs, p, lora) for s, n in zip(starts, stacks)})

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
            forward = _remat_layer_forward if self.remat else _layer_forward
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
    `stacks`, the encoder's layers are stacked and scanned (BertEncoder, layer_stacks)."""

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
        self.lora = lora  # the same: which adapters the model has (params.py reads their names)
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


def require_rngs(dropout: float, deterministic: bool, rngs) -> None:
    """A training forward pass with dropout needs its keys: the models hold no random state of their own."""
    if not deterministic and dropout > 0 and rngs is None:
        raise ValueError(
            f"deterministic=False with dropout={dropout} needs rngs=nnx.Rngs(dropout=key) "
            "(the model holds no random state of its own)"
        )


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
    """BertForSequenceClassification with exactly `weights` (HF names, torch layout; cast to bf16 for
    dtype=bf16_pure), computing as `dtype` says (PRECISIONS); see params.py. With `lora`, nnx.LoRA adapters on its
    targets, A and B from `weights` where it has them, else drawn from `seed` (bench.models.with_adapters).
    scan_layers: the encoder's layers stacked and scanned, in `stacks` (layer_stacks; None: one stack of all);
    false: unrolled, one module per layer as in HF."""
    # Build abstractly (shapes only, like torch's meta device): a random init would be thrown away
    # immediately.
    p = PRECISIONS[dtype]
    stacks = (stacks or (spec.num_layers,)) if scan_layers else None
    model = nnx.eval_shape(
        lambda: BertForSequenceClassification(spec, rngs=nnx.Rngs(0), remat=remat, p=p, lora=lora, stacks=stacks)
    )
    load_weights(model, with_adapters(weights, spec, lora, seed))
    return model
