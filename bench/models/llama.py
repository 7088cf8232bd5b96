"""LLaMA (Touvron et al. 2023) for sequence classification: the framework-neutral facts of the family.

The architecture both frameworks build (HF LlamaConfig semantics: pre-RMSNorm decoder layers, rotary position
embeddings in HF's rotate_half layout, a SwiGLU MLP, grouped-query attention, no biases anywhere), its parameters by
HF's names for LlamaForSequenceClassification in torch layout, which of them each trainable scope selects, PEFT's
LLaMA LoRA targets, and HF's initialisation. torch_impl/models/llama.py builds it through transformers,
jax_impl/models/llama.py as our own Flax NNX model; neither defines its own copy of these.

What a trainer must know beyond OPT: positions are 0..T-1 whatever the mask (HF's default position_ids: right
padding leaves every real token's position as it would be alone); the score is read at the last token that is not
pad_token_id, so batches are right-padded with it; there is no hidden dropout, only on the attention probabilities.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, fields

import numpy as np

from bench.models import Activations, Heads, Matmul, Matmuls, normal_init, setting
from bench.spec import LoraSpec, Scopes, StepSpec, count_trained


@dataclass(frozen=True)
class LlamaSettings:
    """LLaMA's own model.* fields (HF LlamaConfig's, with its defaults), beside those every family shares."""

    num_key_value_heads: int | None = setting(
        None, "key-value heads of grouped-query attention, dividing num_heads (null: num_heads, multi-head)"
    )
    rope_theta: float = setting(10000.0, "rotary embeddings' base, > 0 (HF LlamaConfig's default)")
    rms_norm_eps: float = setting(1e-6, "RMSNorm epsilon, > 0 (HF LlamaConfig's default)")
    initializer_range: float = setting(0.02, "std of the normal init, > 0 (HF LlamaConfig's default)")


@dataclass(frozen=True)
class LlamaSpec(Heads):
    """LLaMA for sequence classification: the architecture both frameworks build (HF LlamaConfig semantics, with
    SiLU, attention_bias=mlp_bias=False, head_dim = hidden_size / num_heads, default rope)."""

    vocab_size: int = 32000
    hidden_size: int = 4096
    num_layers: int = 32
    num_heads: int = 32
    num_key_value_heads: int | None = LlamaSettings.num_key_value_heads
    intermediate_size: int = 11008
    max_position_embeddings: int = 2048
    num_labels: int = 4  # the suite's classification task (every family's default)
    dropout: float = 0.0  # on the attention probabilities: LLaMA's only dropout (HF's attention_dropout)
    rope_theta: float = LlamaSettings.rope_theta
    rms_norm_eps: float = LlamaSettings.rms_norm_eps
    initializer_range: float = LlamaSettings.initializer_range
    # [PAD] in the corpus's WordPiece vocabulary and <|endoftext|> in SmolLM2's: the corpus pads with it already
    pad_token_id: int = 0

    @property
    def kv_heads(self) -> int:
        return self.num_heads if self.num_key_value_heads is None else self.num_key_value_heads


NAME, SPEC, SETTINGS = "llama", LlamaSpec, LlamaSettings
INPUT_KEYS = ("input_ids", "attention_mask")  # no segments
HEAD_KEYS = ("input_ids",)  # the score reads the last token that is not padding
HEAD_TOKEN = "last"  # the one row of the trunk's output the head reads: the last that is not padding
MODELLED = frozenset({"memory", "flops"})
POOLER = None  # no pooler: the score reads the last token's hidden state
EMBEDDINGS = ("model.embed_tokens.",)  # no matmul reads it
CHECKPOINT_BUFFERS = ("lm_head.weight",)  # LlamaForCausalLM's head (tied to embed_tokens in SmolLM2): no classifier's
CHECKPOINT_OPTIONAL = ("score.weight",)  # a causal LM or LlamaModel checkpoint: the score is seeded instead

# trainable=lora: the linear layers of a decoder layer an adapter may wrap (HF's module names inside a layer).
LORA_TARGETS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
LORA_DEFAULT_TARGETS = ("q_proj", "v_proj")  # PEFT's default targets for LLaMA (TRANSFORMERS_MODELS_TO_LORA_...)
# BERT's target names (bench.spec.LORA_ROLES) for the same roles: the MLP's input projection is SwiGLU's two
# (gate and up), so all_linear wraps all seven.
_BERT_ROLES = {
    "query": ("q_proj",),
    "key": ("k_proj",),
    "value": ("v_proj",),
    "attention.output.dense": ("o_proj",),
    "intermediate.dense": ("gate_proj", "up_proj"),
    "output.dense": ("down_proj",),
}

SMOLLM2_135M = LlamaSpec(  # HuggingFaceTB/SmolLM2-135M's config.json
    vocab_size=49152,
    hidden_size=576,
    num_layers=30,
    num_heads=9,
    num_key_value_heads=3,
    intermediate_size=1536,
    max_position_embeddings=8192,
    rope_theta=100000.0,
    rms_norm_eps=1e-5,
    initializer_range=0.041666666666666664,
)
# 2 layers, hidden 32, 4 heads over 2 key-value heads, an odd MLP width so a transposed projection cannot pass for
# the right one: tests only.
LLAMA_TINY = LlamaSpec(
    vocab_size=1000, hidden_size=32, num_layers=2, num_heads=4, num_key_value_heads=2, intermediate_size=37
)


def lora_targets(lora: LoraSpec) -> tuple[str, ...]:
    """The LLaMA layers `lora` wraps, in HF's order: its targets as LLaMA names, BERT's names read as their roles."""
    named = set()
    for t in lora.targets:
        if t not in LORA_TARGETS and t not in _BERT_ROLES:
            raise ValueError(f"lora.targets: {t!r} is no LLaMA layer; accepted {', '.join(LORA_TARGETS)}")
        named.update(_BERT_ROLES.get(t, (t,)))
    return tuple(t for t in LORA_TARGETS if t in named)


def lora_module(target: str) -> str:
    """A LORA_TARGETS name as the module's path inside a decoder layer (HF naming)."""
    return f"self_attn.{target}" if target in ("q_proj", "k_proj", "v_proj", "o_proj") else f"mlp.{target}"


def _linears(spec: LlamaSpec) -> dict[str, tuple[int, int]]:
    """Each linear layer of a decoder layer, in HF's order: (in, out)."""
    H, F, KV = spec.hidden_size, spec.intermediate_size, spec.kv_heads * spec.head_dim
    return {
        "q_proj": (H, H),
        "k_proj": (H, KV),
        "v_proj": (H, KV),
        "o_proj": (H, H),
        "gate_proj": (H, F),
        "up_proj": (H, F),
        "down_proj": (F, H),
    }


def lora_shapes(spec: LlamaSpec, lora: LoraSpec) -> dict[str, tuple[int, ...]]:
    """The adapters' parameters with their torch-layout shapes, as PEFT names them (its ".default" adapter name
    dropped): model.layers.0.self_attn.q_proj.lora_A.weight (rank, in), ...lora_B.weight (out, rank)."""
    dims, shapes = _linears(spec), {}
    for i in range(spec.num_layers):
        for target in lora_targets(lora):
            n_in, n_out = dims[target]
            name = f"model.layers.{i}.{lora_module(target)}"
            shapes[name + ".lora_A.weight"] = (lora.rank, n_in)
            shapes[name + ".lora_B.weight"] = (n_out, lora.rank)
    return shapes


def param_shapes(spec: LlamaSpec, lora: LoraSpec | None = None) -> dict[str, tuple[int, ...]]:
    """Every parameter of HF LlamaForSequenceClassification, in HF's order, with its torch-layout shape; with
    `lora`, the adapters' parameters after them (lora_shapes)."""
    H = spec.hidden_size
    shapes: dict[str, tuple[int, ...]] = {"model.embed_tokens.weight": (spec.vocab_size, H)}
    for i in range(spec.num_layers):
        p = f"model.layers.{i}."
        for target, (n_in, n_out) in _linears(spec).items():
            shapes[p + lora_module(target) + ".weight"] = (n_out, n_in)
        shapes[p + "input_layernorm.weight"] = (H,)
        shapes[p + "post_attention_layernorm.weight"] = (H,)
    shapes["model.norm.weight"] = (H,)
    shapes["score.weight"] = (spec.num_labels, H)  # no bias in HF's score head
    return shapes if lora is None else {**shapes, **lora_shapes(spec, lora)}


# trainable=head: as OPT's, the final norm between the last layer and the score, and the score. bias: LLaMA has no
# bias at all, nor an RMSNorm shift, so BitFit trains the score alone.
SCOPES = Scopes(re.compile(r"model\.layers\.(\d+)\."), ("model.norm.", "score."), "score.")


def is_trainable(name: str, scope: str, num_layers: int, last_k: int = 1) -> bool:
    """Whether LLaMA's parameter `name` (HF naming) is trained under `scope` (bench.spec.Scopes: the head is the
    final RMSNorm + score, the classifier the score)."""
    return SCOPES.selects(name, scope, num_layers, last_k)


def count_params(spec: LlamaSpec, scope: str = "all", last_k: int = 1, lora: LoraSpec | None = None) -> int:
    """The parameters `scope` trains (trainable=lora: over the adapters `lora` describes, LoraSpec() if None)."""
    shapes = param_shapes(spec, (lora or LoraSpec()) if scope == "lora" else None)
    return count_trained(shapes, is_trainable, scope, spec.num_layers, last_k)


def init_weights(spec: LlamaSpec, seed: int, names: list[str] | None = None) -> dict[str, np.ndarray]:
    """HF LLaMA's init (PreTrainedModel._init_weights with initializer_range): Linear and Embedding weights
    ~ N(0, initializer_range), RMSNorm weights 1, the pad_token_id row of embed_tokens 0."""
    pad = ("model.embed_tokens.weight", spec.pad_token_id)
    return normal_init(param_shapes(spec), seed, spec.initializer_range, "norm.", pad, names)


def checkpoint_name(name: str) -> str:
    """A checkpoint's key spelt as LlamaForSequenceClassification names it (a LlamaModel's keys lack "model.")."""
    return "model." + name if name.startswith(("embed_tokens.", "layers.", "norm.")) else name


def refuses(framework: str, parallel: str, scan_layers: bool) -> str | None:
    """Why LLaMA cannot run a trial so set up (None: it can)."""
    return None


def _positive(name: str, value) -> None:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 < value < float("inf"):
        raise ValueError(f"model.{name}={value}: accepted a finite number > 0")


def spec_from(values: dict) -> LlamaSpec:
    """LlamaSpec from the config's model.* values (the keys it has); ValueError in one line for a value of its own
    fields it cannot take."""
    names = {f.name for f in fields(LlamaSpec)}
    spec = LlamaSpec(**{k: v for k, v in values.items() if k in names})
    kv = spec.num_key_value_heads
    if kv is not None and (isinstance(kv, bool) or not isinstance(kv, int) or kv < 1 or spec.num_heads % kv):
        raise ValueError(
            f"model.num_key_value_heads={kv}: accepted null or an integer >= 1 dividing "
            f"model.num_heads={spec.num_heads}"
        )
    if spec.head_dim % 2:  # rotary embeddings turn pairs of a head's dimensions
        raise ValueError(
            f"model.hidden_size={spec.hidden_size}: accepted a multiple of 2 * model.num_heads={spec.num_heads} "
            "(rotary embeddings need an even head width)"
        )
    for name in ("rope_theta", "rms_norm_eps", "initializer_range"):
        _positive(name, getattr(spec, name))
    return spec


def matmuls(
    spec: LlamaSpec,
    trainable: str,
    batch_size: int,
    seq_len: int,
    last_k: int = 1,
    lora: LoraSpec | None = None,
    framework: str | None = None,
) -> list[Matmul]:
    """Every matmul of one forward pass of LLaMA for sequence classification, in the order the pass runs them; with
    `lora`, each adapted layer's two adapter matmuls after its own. Keys and values are repeated to every query head
    before the attention (HF's eager repeat_kv), whose scores and context are full T x T; rotary embeddings and
    SwiGLU's product are elementwise. The score reads one token a row in JAX, every token in HF's torch model."""
    H, C, L = spec.hidden_size, spec.num_labels, spec.num_layers
    B, T = batch_size, seq_len
    tokens = B * T
    train = lambda name: is_trainable(name, trainable, L, last_k)
    flows = train("model.embed_tokens.weight")
    targets = lora_targets(lora) if lora else ()
    adapted = {f"model.layers.{i}.{lora_module(t)}" for i in range(L) for t in targets}
    out = Matmuls(train, adapted, lora.rank if lora else 0)
    dims = _linears(spec)
    linear = lambda p, target, x, i: out.linear(p + lora_module(target), tokens, *dims[target], x, i)

    for i in range(L):
        p = f"model.layers.{i}."
        x = flows or train(p + "input_layernorm.weight")
        q, k, v = (linear(p, n, x, i) for n in ("q_proj", "k_proj", "v_proj"))
        out.append(Matmul(p + "self_attn.scores", 2 * B * T * T * H, q + k, i))  # Q K^T, (B, A, T, T)
        probs = q or k
        out.append(Matmul(p + "self_attn.context", 2 * B * T * T * H, probs + v, i))  # probs @ V
        a = linear(p, "o_proj", probs or v, i) or flows  # the residual carries the layer's input
        m = a or train(p + "post_attention_layernorm.weight")
        g, u = linear(p, "gate_proj", m, i), linear(p, "up_proj", m, i)
        flows = linear(p, "down_proj", g or u, i) or a
    head = flows or train("model.norm.weight")
    out.linear("score", tokens if framework == "torch" else B, H, C, head, None)
    return out


def activations(spec: LlamaSpec, s: StepSpec, seq_len: int, *, X: int, mask: int, dropout: bool, framework: str):
    """What LLaMA's forward pass keeps for the backward pass of step `s`, per token (bench.models.Activations;
    docs/memory.md): `X` bytes per activation, `mask` per dropout-mask element, `dropout` whether the step trains
    with dropout. A layer keeps, of each RMSNorm, its input (for x^2 and x * rsqrt), its 1/rms (one number) and its
    normalised output (for the weight's gradient) and the weighted output the projections read (4H + 1, twice);
    the rotated Q and the repeated K and V (3H: repeat_kv copies the shared heads), the attention probabilities (A T),
    the context o_proj reads (H); SwiGLU's gate output (SiLU's input), SiLU's output, up's output and their product
    down_proj reads (4F); attention dropout (0 in both presets): its mask and its output."""
    H, F, A, T = spec.hidden_size, spec.intermediate_size, spec.num_heads, seq_len
    da = 1 if spec.dropout > 0 and dropout else 0
    layer = X * (10 * H + 4 * F + (1 + da) * A * T + 2) + mask * da * A * T
    if s.trainable == "bias":  # no bias in LLaMA: BitFit trains the score alone, and nothing before it keeps anything
        layer = 0
    if s.trainable == "lora":
        # frozen weights: the RMSNorms' normalised and weighted outputs, o_proj's and down_proj's inputs are not saved;
        # an adapted layer's input is, for its A (once for projections reading one tensor), and A x (r) for its B
        layer -= X * (5 * H + F)
        targets = lora_targets(s.lora)
        inputs = {"q_proj": "y", "k_proj": "y", "v_proj": "y", "o_proj": "o", "gate_proj": "y2", "up_proj": "y2"}
        read = {inputs.get(t, t) for t in targets}
        layer += X * (sum(F if r == "down_proj" else H for r in read) + s.lora.rank * len(targets))
    # The head: the final RMSNorm's input, 1/rms and normalised output where the norm and what precedes it train, and
    # the score's input. torch's HF model scores every token and picks the last one after; JAX gathers that token
    # first, so per token its head keeps only the layers' output it gathers from (as OPT's).
    if framework != "torch":
        head = 0 if s.trainable in ("classifier", "bias") else X * H
    else:
        # last_k: the first trained layer's input comes from frozen layers, so its first RMSNorm keeps neither that
        # input nor its 1/rms (H + 1 less than the layers' term), counted here
        head = {"classifier": X * H, "bias": X * H, "head": 2 * X * H, "lora": X * (2 * H + 1), "last_k": 2 * X * H}
        head = head.get(s.trainable, X * (3 * H + 1))
    return Activations(
        layer=layer,
        layer_input=X * H,
        embeddings=0,  # no embedding dropout, no norm: the table's gradient needs only the token indices
        head=head,
        # the attention scores and probabilities beside Q, K, V and the context, or SwiGLU's four beside the layer's
        # input and output
        forward_temp=X * max(2 * A * T + 4 * H, 4 * F + 2 * H),
    )
