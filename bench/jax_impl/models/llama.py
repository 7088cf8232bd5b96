"""LLaMA in JAX: our own Flax NNX model of HF's LlamaForSequenceClassification (bench/models/llama.py holds the
family's facts): token embeddings, pre-RMSNorm decoder layers with rotary position embeddings (HF's rotate_half
layout) and grouped-query attention, a SwiGLU MLP, no biases, the final RMSNorm, and the score read at the last
token that is not pad_token_id. The decoder layers are stacked and run as one scan (common.scan_stack, every
family's): XLA compiles one layer whatever the depth. Attention dropout draws from the `rngs` passed to __call__.

Weights: {hf_name: numpy, torch layout} <-> NNX parameters by one table of leaf renames (_LEAVES), with stacked
layers model.stacks.S.<path in a layer> holding HF's model.layers.{S+i}.<name> along axis 0.
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
    linear,
    project,
    require_rngs,
    scan_stack,
    stack_starts,
    stacked_layers,
    transpose,
)
from bench.models.llama import LlamaSpec, is_trainable, lora_targets
from bench.spec import LoraSpec


def _linear(n_in: int, n_out: int, spec: LlamaSpec, rngs, p: Precision, lora=None, target="") -> nnx.Linear:
    """A bias-free nnx.Linear, or a LoRALinear where `lora` targets it (`target`: its name in LORA_TARGETS)."""
    adapted = lora is not None and target in lora_targets(lora)
    return linear(n_in, n_out, spec.initializer_range, rngs, p, lora if adapted else None, bias=False)


def _rms_norm(spec: LlamaSpec, rngs, p: Precision) -> nnx.RMSNorm:
    # HF's LlamaRMSNorm: x * rsqrt(mean(x^2) + eps) in fp32, times the weight; p.norm keeps it in fp32 under bf16
    return nnx.RMSNorm(spec.hidden_size, epsilon=spec.rms_norm_eps, dtype=p.norm, param_dtype=p.params, rngs=rngs)


def rotary(spec: LlamaSpec, T: int, dtype) -> tuple[jax.Array, jax.Array]:
    """HF's default rotary embedding at positions 0..T-1: (cos, sin), each (T, head_dim), the frequencies repeated
    over both halves (rotate_half's layout), computed in fp32 and cast to the activations' dtype as HF does."""
    d = spec.head_dim
    inv_freq = 1.0 / (np.float32(spec.rope_theta) ** (np.arange(0, d, 2, dtype=np.float32) / np.float32(d)))
    freqs = jnp.arange(T, dtype=jnp.float32)[:, None] * jnp.asarray(inv_freq, jnp.float32)  # (T, d/2)
    emb = jnp.concatenate([freqs, freqs], axis=-1)  # (T, d)
    return jnp.cos(emb).astype(dtype), jnp.sin(emb).astype(dtype)


def rotate_half(x):
    half = x.shape[-1] // 2
    return jnp.concatenate([-x[..., half:], x[..., :half]], axis=-1)


class LlamaAttention(nnx.Module):
    def __init__(self, spec: LlamaSpec, *, rngs: nnx.Rngs, p: Precision = FP32, lora: LoraSpec | None = None):
        H, KV = spec.hidden_size, spec.kv_heads * spec.head_dim
        self.num_heads, self.num_kv_heads, self.head_dim = spec.num_heads, spec.kv_heads, spec.head_dim
        self.q_proj = _linear(H, H, spec, rngs, p, lora, "q_proj")  # HF's order of construction
        self.k_proj = _linear(H, KV, spec, rngs, p, lora, "k_proj")
        self.v_proj = _linear(H, KV, spec, rngs, p, lora, "v_proj")
        self.o_proj = _linear(H, H, spec, rngs, p, lora, "o_proj")
        self.dropout = nnx.Dropout(spec.dropout)

    def __call__(self, x, context, *, deterministic, rngs):
        mask_bias, cos, sin = context
        B, T, H = x.shape
        hd = self.head_dim

        def heads(t, n):  # (B, T, n * hd) -> (B, n, T, hd)
            return t.reshape(B, T, n, hd).transpose(0, 2, 1, 3)

        proj = lambda linear, t: project(linear, t, deterministic, rngs)
        q = heads(proj(self.q_proj, x), self.num_heads)
        k, v = heads(proj(self.k_proj, x), self.num_kv_heads), heads(proj(self.v_proj, x), self.num_kv_heads)
        q, k = q * cos + rotate_half(q) * sin, k * cos + rotate_half(k) * sin  # cos, sin (T, hd) broadcast
        # HF's repeat_kv: each key-value head serves num_heads / num_kv_heads consecutive query heads
        groups = self.num_heads // self.num_kv_heads
        k, v = jnp.repeat(k, groups, axis=1), jnp.repeat(v, groups, axis=1)  # (B, nh, T, hd)
        # HF scales the scores after the matmul (LLaMA's eager attention): the same order of rounding
        scores = jnp.einsum("bhqd,bhkd->bhqk", q, k) * (hd**-0.5) + mask_bias  # (B, nh, T, T), mask (B, 1, T, T)
        with jax.named_scope("softmax"):  # named in the compiled program: the trace's attention (jax_impl/profile)
            probs = jax.nn.softmax(scores.astype(jnp.float32), axis=-1).astype(q.dtype)  # fp32 softmax, as HF
        probs = self.dropout(probs, deterministic=deterministic, rngs=rngs)
        out = jnp.einsum("bhqk,bhkd->bhqd", probs, v).transpose(0, 2, 1, 3).reshape(B, T, H)  # (B, T, H)
        return proj(self.o_proj, out)


class LlamaMLP(nnx.Module):
    """SwiGLU: down(silu(gate(x)) * up(x))."""

    def __init__(self, spec: LlamaSpec, *, rngs: nnx.Rngs, p: Precision = FP32, lora: LoraSpec | None = None):
        H, F = spec.hidden_size, spec.intermediate_size
        self.gate_proj = _linear(H, F, spec, rngs, p, lora, "gate_proj")
        self.up_proj = _linear(H, F, spec, rngs, p, lora, "up_proj")
        self.down_proj = _linear(F, H, spec, rngs, p, lora, "down_proj")

    def __call__(self, x, *, deterministic, rngs):
        proj = lambda linear, t: project(linear, t, deterministic, rngs)
        return proj(self.down_proj, jax.nn.silu(proj(self.gate_proj, x)) * proj(self.up_proj, x))  # (B, T, H)


class LlamaDecoderLayer(nnx.Module):
    """Pre-RMSNorm: x + attn(norm(x)), then x + mlp(norm(x)); no dropout on the residual stream (HF's LLaMA)."""

    def __init__(self, spec: LlamaSpec, *, rngs: nnx.Rngs, p: Precision = FP32, lora: LoraSpec | None = None):
        self.self_attn = LlamaAttention(spec, rngs=rngs, p=p, lora=lora)
        self.mlp = LlamaMLP(spec, rngs=rngs, p=p, lora=lora)
        self.input_layernorm = _rms_norm(spec, rngs, p)
        self.post_attention_layernorm = _rms_norm(spec, rngs, p)

    def __call__(self, x, context, *, deterministic, rngs):
        kw = dict(deterministic=deterministic, rngs=rngs)
        x = x + self.self_attn(self.input_layernorm(x), context, **kw)  # (B, T, H)
        return x + self.mlp(self.post_attention_layernorm(x), **kw)  # (B, T, H)


class LlamaModel(nnx.Module):
    """Embeddings, the decoder layers as stacks run by one scan each (`stacks`: layer counts, see
    common.layer_stacks), and the final RMSNorm (applied by the head, see LlamaForSequenceClassification.head)."""

    def __init__(self, spec: LlamaSpec, *, rngs, remat=False, p: Precision = FP32, lora=None, stacks=None):
        stacks = stacks or (spec.num_layers,)
        starts = stack_starts(stacks, spec.num_layers)
        self.spec, self.remat = spec, remat
        self.embed_tokens = embed(spec.vocab_size, spec.hidden_size, spec.initializer_range, rngs, p)
        make = lambda rngs: LlamaDecoderLayer(spec, rngs=rngs, p=p, lora=lora)
        self.stacks = nnx.Dict({str(s): stacked_layers(make, n, rngs) for s, n in zip(starts, stacks)})
        self.norm = _rms_norm(spec, rngs, p)

    def __call__(self, input_ids, attention_mask, *, deterministic, rngs, all_hidden=False, layer_hook=None):
        """(the last layer's output (B, T, H), before the final RMSNorm; (embeddings, layer 1, ..., layer L) if
        `all_hidden`, else ())."""
        x = self.embed_tokens(input_ids)  # (B, T, H)
        # HF's eager causal mask: 0 where a query may attend (key not after it, key not padded), float32 min else.
        T = input_ids.shape[1]
        causal = jnp.tril(jnp.ones((T, T), bool))[None, None]  # (1, 1, T, T)
        keep = causal & (attention_mask[:, None, None, :] != 0)  # (B, 1, T, T)
        mask_bias = jnp.where(keep, 0.0, MASK_VALUE).astype(jnp.float32)
        context = (mask_bias, *rotary(self.spec, T, x.dtype))  # positions 0..T-1, as HF's default position_ids
        hidden = [x]
        for name, stack in self.stacks.items():  # in layer order (built in that order)
            x, ys = scan_stack(stack, x, context, rngs, deterministic, self.remat, all_hidden, layer_hook, name)
            hidden += ys
        return x, (tuple(hidden) if all_hidden else ())


class LlamaForSequenceClassification(nnx.Module):
    """HF LlamaForSequenceClassification in NNX. Inputs are int32 (B, T); returns float32 logits (B, num_labels)
    read at each row's last token that is not pad_token_id, or (logits, hidden states) with
    output_hidden_states=True (embeddings, then each layer's output; the last before the final RMSNorm)."""

    def __init__(self, spec: LlamaSpec, *, rngs, remat=False, p: Precision = FP32, lora=None, stacks=None):
        self.spec = spec  # static metadata of the graph, not state
        self.lora = lora  # the same: which adapters the model has (load_weights reads their names)
        self.model = LlamaModel(spec, rngs=rngs, remat=remat, p=p, lora=lora, stacks=stacks)
        self.score = _linear(spec.hidden_size, spec.num_labels, spec, rngs, p)

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
        last, hidden = self.model(
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
    # the head (final RMSNorm + score, bench.models.llama.is_trainable) is pushed forward.
    def features(self, input_ids, attention_mask, *, deterministic=True, rngs=None, layer_hook=None):
        """The trunk: embeddings + decoder layers -> the last layer's output (B, T, H), before the final RMSNorm."""
        kw = dict(deterministic=deterministic, rngs=rngs, layer_hook=layer_hook)
        return self.model(input_ids, attention_mask, **kw)[0]

    def head(self, hidden, input_ids, *, deterministic=True, rngs=None):
        """The head: final RMSNorm + score at each row's last token that is not pad_token_id, (B, T, H) -> logits
        (B, num_labels). `deterministic`/`rngs` are BERT's head's arguments: LLaMA's head has no dropout."""
        B, T = input_ids.shape
        last = common.last_token(input_ids, self.spec.pad_token_id)  # (B,)
        # RMSNorm and score act per token, so reading the row first computes HF's pooled logits on B rows, not B*T
        pooled = hidden[jnp.arange(B), last]  # (B, H)
        return self.score(self.model.norm(pooled))  # (B, num_labels)


def build_model(
    spec: LlamaSpec,
    weights: dict[str, np.ndarray],
    *,
    remat: bool = False,
    dtype: str = "fp32",
    lora: LoraSpec | None = None,
    seed: int = 0,
    scan_layers: bool = True,
    stacks: tuple[int, ...] | None = None,
) -> LlamaForSequenceClassification:
    """LlamaForSequenceClassification with exactly `weights` (HF names, torch layout), computing as `dtype` says
    (common.PRECISIONS); with `lora`, adapters on its targets, A and B from `weights` where it has them, else drawn
    from `seed`. The layers are stacked and scanned in `stacks` (layer_stacks; None: one stack); scan_layers=false
    unrolls them: each layer a stack of its own, whose one-trip scan XLA inlines."""
    if not scan_layers:
        stacks = (1,) * spec.num_layers
    kw = dict(remat=remat, stacks=stacks)
    return common.build(
        LlamaForSequenceClassification, spec, weights, load_weights, dtype=dtype, lora=lora, seed=seed, **kw
    )


# NNX leaf (the end of a parameter's path) -> HF leaf, with the transform from torch layout (its own inverse).
_LEAVES = (
    ("kernel", "weight", transpose),  # nn.Linear.weight (out, in) <-> nnx.Linear.kernel (in, out)
    ("scale", "weight", identity),  # LlamaRMSNorm.weight <-> nnx.RMSNorm.scale
    ("embedding", "weight", identity),  # nn.Embedding.weight <-> nnx.Embed.embedding, both (n, H)
    ("lora.lora_a", "lora_A.weight", transpose),  # PEFT (rank, in) <-> nnx.LoRA (in, rank)
    ("lora.lora_b", "lora_B.weight", transpose),  # PEFT (out, rank) <-> nnx.LoRA (rank, out)
)


def _entry(path: tuple, n: int) -> tuple[list[str], bool, object]:
    """(HF names, stacked, transform) of the parameter at an NNX path: one name, or for a stacked parameter one per
    layer of its leading axis (`n` layers): model.stacks.S.<rest> is model.layers.{S+i}.<rest>."""
    keys = keys_of(path)
    dotted = ".".join(keys)
    match = next((leaf for leaf in _LEAVES if dotted == leaf[0] or dotted.endswith("." + leaf[0])), None)
    if match is None:
        raise KeyError(f"NNX path {dotted!r} is no LLaMA parameter (see bench.jax_impl.models.llama._LEAVES)")
    nnx_leaf, hf_leaf, transform = match
    name = dotted.removesuffix(nnx_leaf) + hf_leaf
    if "stacks" not in keys:
        return [name], False, transform
    i = keys.index("stacks")
    first, rest = int(keys[i + 1]), name.removeprefix(".".join(keys[: i + 2]) + ".")
    return [f"model.layers.{first + i}.{rest}" for i in range(n)], True, transform


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
    """Whether the parameter `x` at `path` is trained under `scope` (bench.models.llama.is_trainable)."""
    return common.is_trained(path, x, scope, num_layers, last_k, _entry, is_trainable)


def to_hf(tree) -> dict[str, np.ndarray]:
    """A pytree of parameter-shaped arrays as {hf_name: numpy, torch layout} (common.to_hf)."""
    return common.to_hf(tree, _entry)


def from_hf(tree, arrays: dict[str, np.ndarray]):
    """The inverse of to_hf: a pytree like `tree` whose leaves come from {hf_name: array in torch layout}."""
    return common.from_hf(tree, arrays, _entry)
