"""JAX OPT: a Flax NNX OPTForSequenceClassification, loaded from the shared numpy weights. Mirror of
torch_impl/models/opt.py.

HF's modeling_opt.py rewritten in NNX, op for op: the same module tree (attribute names are HF's module names, so
a parameter's NNX path reads like its HF name), pre-LayerNorm decoder layers with causal self-attention (the query
scaled before the matmul, as HF does), ReLU MLP, learned positions from the attention mask's cumulative sum with
HF's offset of 2, the decoder's final LayerNorm, and the score read at the last token that is not pad_token_id.
The decoder layers are stacked and run as one scan (common.scan_stack, every family's): XLA compiles one layer
whatever the depth. Dropout draws from the `rngs` passed to __call__, as BERT's does.

Weights: {hf_name: numpy, torch layout} <-> NNX parameters by one table of leaf renames (_LEAVES), with stacked
layers model.decoder.stacks.S.<path in a layer> holding HF's model.decoder.layers.{S+i}.<name> along axis 0.
"""

from __future__ import annotations

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
    layer_norm,
    linear,
    project,
    require_rngs,
    scan_stack,
    stack_starts,
    stacked_layers,
    transpose,
)
from bench.models.opt import LAYER_NORM_EPS, POSITION_OFFSET, OptSpec, is_trainable, lora_targets
from bench.spec import LoraSpec


def _linear(n_in: int, n_out: int, spec: OptSpec, rngs, p: Precision, lora=None, target="", bias=True) -> nnx.Linear:
    """An nnx.Linear, or a LoRALinear where `lora` targets it (`target`: its name in opt.LORA_TARGETS)."""
    adapted = lora is not None and target in lora_targets(lora)
    return linear(n_in, n_out, spec.init_std, rngs, p, lora if adapted else None, bias)


def _layer_norm(spec: OptSpec, rngs, p: Precision) -> nnx.LayerNorm:
    return layer_norm(spec.hidden_size, LAYER_NORM_EPS, rngs, p)


def _embed(n: int, spec: OptSpec, rngs, p: Precision) -> nnx.Embed:
    return embed(n, spec.hidden_size, spec.init_std, rngs, p)


class OPTAttention(nnx.Module):
    def __init__(self, spec: OptSpec, *, rngs: nnx.Rngs, p: Precision = FP32, lora: LoraSpec | None = None):
        H, b = spec.hidden_size, spec.enable_bias
        self.num_heads = spec.num_heads
        self.head_dim = spec.head_dim
        self.k_proj = _linear(H, H, spec, rngs, p, lora, "k_proj", b)  # HF's order of construction
        self.v_proj = _linear(H, H, spec, rngs, p, lora, "v_proj", b)
        self.q_proj = _linear(H, H, spec, rngs, p, lora, "q_proj", b)
        self.out_proj = _linear(H, H, spec, rngs, p, lora, "out_proj", b)
        self.dropout = nnx.Dropout(spec.attention_dropout)

    def __call__(self, x, mask_bias, *, deterministic, rngs):
        B, T, H = x.shape
        nh, hd = self.num_heads, self.head_dim

        def heads(t):  # (B, T, H) -> (B, nh, T, hd)
            return t.reshape(B, T, nh, hd).transpose(0, 2, 1, 3)

        proj = lambda linear, t: project(linear, t, deterministic, rngs)
        # HF scales the query before the matmul (and the attention itself by 1.0): the same order of rounding.
        q = heads(proj(self.q_proj, x) * (hd**-0.5))
        k, v = heads(proj(self.k_proj, x)), heads(proj(self.v_proj, x))
        scores = jnp.einsum("bhqd,bhkd->bhqk", q, k) + mask_bias  # (B, nh, T, T), mask (B, 1, T, T)
        with jax.named_scope("softmax"):  # named in the compiled program: the trace's attention (jax_impl/profile)
            probs = jax.nn.softmax(scores, axis=-1).astype(q.dtype)  # fp32 softmax, back to the matmuls' dtype
        probs = self.dropout(probs, deterministic=deterministic, rngs=rngs)
        out = jnp.einsum("bhqk,bhkd->bhqd", probs, v).transpose(0, 2, 1, 3).reshape(B, T, H)  # (B, T, H)
        return proj(self.out_proj, out)


class OPTDecoderLayer(nnx.Module):
    """Pre-LN: x + dropout(attn(LN(x))), then x + dropout(fc2(relu(fc1(LN(x)))))."""

    def __init__(self, spec: OptSpec, *, rngs: nnx.Rngs, p: Precision = FP32, lora: LoraSpec | None = None):
        H, F, b = spec.hidden_size, spec.ffn_dim, spec.enable_bias
        self.self_attn = OPTAttention(spec, rngs=rngs, p=p, lora=lora)
        self.self_attn_layer_norm = _layer_norm(spec, rngs, p)
        self.fc1 = _linear(H, F, spec, rngs, p, lora, "fc1", b)
        self.fc2 = _linear(F, H, spec, rngs, p, lora, "fc2", b)
        self.final_layer_norm = _layer_norm(spec, rngs, p)
        self.dropout = nnx.Dropout(spec.dropout)

    def __call__(self, x, mask_bias, *, deterministic, rngs):
        kw = dict(deterministic=deterministic, rngs=rngs)
        a = self.self_attn(self.self_attn_layer_norm(x), mask_bias, **kw)  # (B, T, H)
        x = x + self.dropout(a, **kw)
        h = jax.nn.relu(project(self.fc1, self.final_layer_norm(x), deterministic, rngs))  # (B, T, F)
        return x + self.dropout(project(self.fc2, h, deterministic, rngs), **kw)  # (B, T, H)


class OPTDecoder(nnx.Module):
    """Embeddings, the decoder layers as stacks run by one scan each (`stacks`: layer counts, see
    common.layer_stacks), and the final LayerNorm (applied by the head, see
    OPTForSequenceClassification.head)."""

    def __init__(self, spec: OptSpec, *, rngs, remat=False, p: Precision = FP32, lora=None, stacks=None):
        stacks = stacks or (spec.num_layers,)
        starts = stack_starts(stacks, spec.num_layers)
        self.remat = remat
        self.embed_tokens = _embed(spec.vocab_size, spec, rngs, p)
        self.embed_positions = _embed(spec.max_position_embeddings + POSITION_OFFSET, spec, rngs, p)
        self.final_layer_norm = _layer_norm(spec, rngs, p)
        make = lambda rngs: OPTDecoderLayer(spec, rngs=rngs, p=p, lora=lora)
        self.stacks = nnx.Dict({str(s): stacked_layers(make, n, rngs) for s, n in zip(starts, stacks)})

    def __call__(self, input_ids, attention_mask, *, deterministic, rngs, all_hidden=False, layer_hook=None):
        """(the last layer's output (B, T, H), before the final LayerNorm; (embeddings, layer 1, ..., layer L) if
        `all_hidden`, else ())."""
        mask = attention_mask.astype(jnp.int32)
        # HF: positions count the attended tokens (cumsum - 1); padded ones get -1, all then shifted by the offset.
        positions = jnp.cumsum(mask, axis=1) * mask - 1 + POSITION_OFFSET  # (B, T)
        x = self.embed_tokens(input_ids) + self.embed_positions(positions)  # (B, T, H), no dropout here (HF)
        # HF's eager causal mask: 0 where a query may attend (key not after it, key not padded), float32 min else.
        T = input_ids.shape[1]
        causal = jnp.tril(jnp.ones((T, T), bool))[None, None]  # (1, 1, T, T)
        keep = causal & (mask[:, None, None, :] != 0)  # (B, 1, T, T)
        mask_bias = jnp.where(keep, 0.0, MASK_VALUE).astype(jnp.float32)
        hidden = [x]
        for name, stack in self.stacks.items():  # in layer order (built in that order)
            x, ys = scan_stack(stack, x, mask_bias, rngs, deterministic, self.remat, all_hidden, layer_hook, name)
            hidden += ys
        return x, (tuple(hidden) if all_hidden else ())


class OPTModel(nnx.Module):
    def __init__(self, spec: OptSpec, *, rngs, remat=False, p: Precision = FP32, lora=None, stacks=None):
        self.decoder = OPTDecoder(spec, rngs=rngs, remat=remat, p=p, lora=lora, stacks=stacks)


class OPTForSequenceClassification(nnx.Module):
    """HF OPTForSequenceClassification in NNX. Inputs are int32 (B, T); returns float32 logits (B, num_labels)
    read at each row's last token that is not pad_token_id, or (logits, hidden states) with
    output_hidden_states=True (embeddings, then each layer's output; the last before the final LayerNorm)."""

    def __init__(self, spec: OptSpec, *, rngs, remat=False, p: Precision = FP32, lora=None, stacks=None):
        self.spec = spec  # static metadata of the graph, not state
        self.lora = lora  # the same: which adapters the model has (load_weights reads their names)
        self.model = OPTModel(spec, rngs=rngs, remat=remat, p=p, lora=lora, stacks=stacks)
        self.score = _linear(spec.hidden_size, spec.num_labels, spec, rngs, p, bias=False)

    def __call__(
        self,
        input_ids,
        attention_mask,
        *,
        deterministic: bool = True,
        rngs: nnx.Rngs | None = None,
        output_hidden_states: bool = False,
        layer_hook: LayerHook | None = None,
    ):
        require_rngs(self.spec.dropout, deterministic, rngs)
        last, hidden = self.model.decoder(
            input_ids,
            attention_mask,
            deterministic=deterministic,
            rngs=rngs,
            all_hidden=output_hidden_states,
            layer_hook=layer_hook,
        )
        logits = self.head(last, input_ids)
        return (logits, hidden) if output_hidden_states else logits

    # The same forward in two halves, for jacfwd on trainable=head: the frozen trunk runs once per batch and only
    # the head (final LayerNorm + score, bench.models.opt.is_trainable) is pushed forward.
    def features(self, input_ids, attention_mask, *, deterministic=True, rngs=None, layer_hook=None):
        """The trunk: embeddings + decoder layers -> the last layer's output (B, T, H), before the final LayerNorm."""
        kw = dict(deterministic=deterministic, rngs=rngs, layer_hook=layer_hook)
        return self.model.decoder(input_ids, attention_mask, **kw)[0]

    def head(self, hidden, input_ids, *, deterministic=True, rngs=None):
        """The head: final LayerNorm + score at each row's last token that is not pad_token_id, (B, T, H) ->
        logits (B, num_labels). `deterministic`/`rngs` are BERT's head's arguments: OPT's head has no dropout."""
        B, T = input_ids.shape
        last = common.last_token(input_ids, self.spec.pad_token_id)  # (B,)
        # LayerNorm and score act per token, so reading the row first computes HF's pooled logits on B rows, not B*T
        pooled = hidden[jnp.arange(B), last]  # (B, H)
        return self.score(self.model.decoder.final_layer_norm(pooled))  # (B, num_labels)


def build_model(
    spec: OptSpec,
    weights: dict[str, np.ndarray],
    *,
    remat: bool = False,
    dtype: str = "fp32",
    lora: LoraSpec | None = None,
    seed: int = 0,
    scan_layers: bool = True,
    stacks: tuple[int, ...] | None = None,
) -> OPTForSequenceClassification:
    """OPTForSequenceClassification with exactly `weights` (HF names, torch layout), computing as `dtype` says
    (common.PRECISIONS); with `lora`, adapters on its targets, A and B from `weights` where it has
    them, else drawn from `seed`. The layers are stacked and scanned in `stacks` (layer_stacks; None: one stack);
    scan_layers=false unrolls them: each layer a stack of its own, whose one-trip scan XLA inlines (the compiled
    step has no loop left), so each layer is compiled apart, as BERT's unrolled modules are."""
    if not scan_layers:
        stacks = (1,) * spec.num_layers
    kw = dict(remat=remat, stacks=stacks)
    return common.build(
        OPTForSequenceClassification, spec, weights, load_weights, dtype=dtype, lora=lora, seed=seed, **kw
    )


# NNX leaf (the end of a parameter's path) -> HF leaf, with the transform from torch layout (its own inverse).
_LEAVES = (
    ("kernel", "weight", transpose),  # nn.Linear.weight (out, in) <-> nnx.Linear.kernel (in, out)
    ("bias", "bias", identity),
    ("scale", "weight", identity),  # nn.LayerNorm.weight <-> nnx.LayerNorm.scale
    ("embedding", "weight", identity),  # nn.Embedding.weight <-> nnx.Embed.embedding, both (n, H)
    ("lora.lora_a", "lora_A.weight", transpose),  # PEFT (rank, in) <-> nnx.LoRA (in, rank)
    ("lora.lora_b", "lora_B.weight", transpose),  # PEFT (out, rank) <-> nnx.LoRA (rank, out)
)


def _entry(path: tuple, n: int) -> tuple[list[str], bool, object]:
    """(HF names, stacked, transform) of the parameter at an NNX path: one name, or for a stacked parameter one per
    layer of its leading axis (`n` layers): model.decoder.stacks.S.<rest> is model.decoder.layers.{S+i}.<rest>."""
    keys = keys_of(path)
    dotted = ".".join(keys)
    match = next((leaf for leaf in _LEAVES if dotted == leaf[0] or dotted.endswith("." + leaf[0])), None)
    if match is None:
        raise KeyError(f"NNX path {dotted!r} is no OPT parameter (see bench.jax_impl.models.opt._LEAVES)")
    nnx_leaf, hf_leaf, transform = match
    name = dotted.removesuffix(nnx_leaf) + hf_leaf
    if "stacks" not in keys:
        return [name], False, transform
    i = keys.index("stacks")
    first, rest = int(keys[i + 1]), name.removeprefix(".".join(keys[: i + 2]) + ".")
    return [f"model.decoder.layers.{first + i}.{rest}" for i in range(n)], True, transform


def hf_name(path: tuple) -> str:
    """The HF parameter name of an NNX path (a stacked parameter's: its first layer's, as the layers of a stack are
    trained or frozen together). Mirror of torch_impl's hf_name."""
    return _entry(path, 1)[0][0]


def load_weights(model, weights: dict[str, np.ndarray]) -> None:
    """Copy the numpy weights into the model (strict: every problem reported together; common.load_weights)."""
    common.load_weights(model, weights, _entry)


def export_weights(model) -> dict[str, np.ndarray]:
    """The model's parameters as the shared {hf_name: numpy} dict in torch layout and HF order."""
    return common.export_weights(model, _entry)


def is_trained(path: tuple, x, scope: str, num_layers: int, last_k: int = 1) -> bool:
    """Whether the parameter `x` at `path` is trained under `scope` (bench.models.opt.is_trainable)."""
    return common.is_trained(path, x, scope, num_layers, last_k, _entry, is_trainable)


def to_hf(tree) -> dict[str, np.ndarray]:
    """A pytree of parameter-shaped arrays as {hf_name: numpy, torch layout} (common.to_hf)."""
    return common.to_hf(tree, _entry)


def from_hf(tree, arrays: dict[str, np.ndarray]):
    """The inverse of to_hf: a pytree like `tree` whose leaves come from {hf_name: array in torch layout}."""
    return common.from_hf(tree, arrays, _entry)
