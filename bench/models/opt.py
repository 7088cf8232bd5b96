"""OPT (Zhang et al. 2022) for sequence classification: the framework-neutral facts of the family.

The architecture both frameworks build (HF OPTConfig semantics, the pre-LayerNorm variant of opt-125m and every
size from 1.3b up), its parameters by HF's names for OPTForSequenceClassification in torch layout, which of them
each trainable scope selects, PEFT's OPT LoRA targets, and HF's initialisation. torch_impl/models/opt.py builds
it through transformers, jax_impl/models/opt.py as our own Flax NNX model; neither defines its own copy of these.

What a trainer must know beyond BERT: no token_type_ids; positions come from the attention mask (HF: cumsum - 1,
plus an offset of 2, so embed_positions has max_position_embeddings + 2 rows); the logits are read at the last
token that is not pad_token_id (transformers 5.x: the rightmost such token), so batches are right-padded with
pad_token_id, not 0.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, fields

import numpy as np

from bench.models import Activations, Heads, Matmul, Matmuls, normal_init
from bench.spec import LoraSpec, Scopes, StepSpec, count_trained

NAME = "opt"
SETTINGS = None  # no fields beyond those every family shares: OPT's own (ffn_dim: model.intermediate_size) map to them
INPUT_KEYS = ("input_ids", "attention_mask")  # no segments
HEAD_KEYS = ("input_ids",)  # the score reads the last token that is not padding
HEAD_TOKEN = "last"  # the one row of the trunk's output the head reads: the last that is not padding
MODELLED = frozenset({"memory", "flops"})
POOLER = None  # no pooler: the score reads the last token's hidden state
EMBEDDINGS = ("model.decoder.embed_tokens.", "model.decoder.embed_positions.")  # no matmul reads them
CHECKPOINT_BUFFERS = ("lm_head.weight",)  # OPTForCausalLM's head: tied to embed_tokens, not a classifier's
CHECKPOINT_OPTIONAL = ("score.weight",)  # an OPTModel (decoder-only) checkpoint: the score is seeded instead

# trainable=lora: the linear layers of a decoder layer an adapter may wrap (HF's module names inside a layer).
LORA_TARGETS = ("q_proj", "k_proj", "v_proj", "out_proj", "fc1", "fc2")
LORA_DEFAULT_TARGETS = ("q_proj", "v_proj")  # PEFT's default targets for OPT (TRANSFORMERS_MODELS_TO_LORA_...)
# BERT's target names (bench.spec.LORA_ROLES) for the same roles: a LoraSpec written for BERT (its default,
# query and value; all_linear) picks the same layers of OPT, so one lora config serves both families.
_BERT_ROLES = {
    "query": "q_proj",
    "key": "k_proj",
    "value": "v_proj",
    "attention.output.dense": "out_proj",
    "intermediate.dense": "fc1",
    "output.dense": "fc2",
}


@dataclass(frozen=True)
class OptSpec(Heads):
    """OPT for sequence classification: the architecture both frameworks build (HF OPTConfig semantics, with
    do_layer_norm_before=True, ReLU, word_embed_proj_dim == hidden_size, elementwise-affine LayerNorms)."""

    vocab_size: int = 50272
    hidden_size: int = 768
    num_layers: int = 12
    num_heads: int = 12
    ffn_dim: int = 3072
    max_position_embeddings: int = 2048
    num_labels: int = 4  # the suite's classification task (every family's default)
    dropout: float = 0.1  # residual dropout after attention and after the MLP (HF OPTConfig default)
    attention_dropout: float = 0.0  # on the attention probabilities (HF OPTConfig default)
    init_std: float = 0.02  # std of the normal init (HF OPTConfig default)
    pad_token_id: int = 1  # <pad> in OPT's GPT-2 BPE vocab (HF OPTConfig default)
    enable_bias: bool = True  # biases of q/k/v/out_proj, fc1 and fc2 (LayerNorms always have theirs)


# HF's OPT builds nn.LayerNorm without eps, so torch's default; not a config field there, nor here.
LAYER_NORM_EPS = 1e-5


OPT_125M = OptSpec()  # facebook/opt-125m's shapes (OPTConfig's defaults are that model's)
# 2 layers, hidden 32, an odd ffn_dim so a transposed fc1/fc2 cannot pass for the right one: tests only.
OPT_TINY = OptSpec(vocab_size=1000, hidden_size=32, num_layers=2, num_heads=4, ffn_dim=37, max_position_embeddings=512)

# HF OPTLearnedPositionalEmbedding: positions (cumsum of the mask - 1) are shifted by 2 rows, a fairseq legacy.
SPEC = OptSpec
POSITION_OFFSET = 2


def lora_targets(lora: LoraSpec) -> tuple[str, ...]:
    """The OPT layers `lora` wraps, in HF's order: its targets as OPT names, BERT's names read as their roles."""
    named = set()
    for t in lora.targets:
        if t not in LORA_TARGETS and t not in _BERT_ROLES:
            raise ValueError(f"lora.targets: {t!r} is no OPT layer; accepted {', '.join(LORA_TARGETS)}")
        named.add(_BERT_ROLES.get(t, t))
    return tuple(t for t in LORA_TARGETS if t in named)


def lora_module(target: str) -> str:
    """A LORA_TARGETS name as the module's path inside a decoder layer (HF naming)."""
    return f"self_attn.{target}" if target.endswith("_proj") else target


def lora_shapes(spec: OptSpec, lora: LoraSpec) -> dict[str, tuple[int, ...]]:
    """The adapters' parameters with their torch-layout shapes, as PEFT names them (its ".default" adapter name
    dropped): model.decoder.layers.0.self_attn.q_proj.lora_A.weight (rank, in), ...lora_B.weight (out, rank)."""
    H, F = spec.hidden_size, spec.ffn_dim
    dims = {"q_proj": (H, H), "k_proj": (H, H), "v_proj": (H, H), "out_proj": (H, H), "fc1": (H, F), "fc2": (F, H)}
    shapes = {}
    for i in range(spec.num_layers):
        for target in lora_targets(lora):
            n_in, n_out = dims[target]
            name = f"model.decoder.layers.{i}.{lora_module(target)}"
            shapes[name + ".lora_A.weight"] = (lora.rank, n_in)
            shapes[name + ".lora_B.weight"] = (n_out, lora.rank)
    return shapes


def param_shapes(spec: OptSpec, lora: LoraSpec | None = None) -> dict[str, tuple[int, ...]]:
    """Every parameter of HF OPTForSequenceClassification, in HF's order, with its torch-layout shape; with
    `lora`, the adapters' parameters after them (lora_shapes)."""
    H, F = spec.hidden_size, spec.ffn_dim
    d = "model.decoder."
    shapes: dict[str, tuple[int, ...]] = {
        d + "embed_tokens.weight": (spec.vocab_size, H),
        d + "embed_positions.weight": (spec.max_position_embeddings + POSITION_OFFSET, H),
        d + "final_layer_norm.weight": (H,),  # HF's OPTDecoder registers it before its layers
        d + "final_layer_norm.bias": (H,),
    }
    for i in range(spec.num_layers):
        p = f"{d}layers.{i}."
        linears = {"self_attn.k_proj": (H, H), "self_attn.v_proj": (H, H), "self_attn.q_proj": (H, H)}
        linears["self_attn.out_proj"] = (H, H)
        for name, shape in linears.items():  # HF builds k, v, q, out in that order
            shapes[p + name + ".weight"] = shape
            if spec.enable_bias:
                shapes[p + name + ".bias"] = shape[:1]
        shapes[p + "self_attn_layer_norm.weight"] = (H,)
        shapes[p + "self_attn_layer_norm.bias"] = (H,)
        for name, shape in (("fc1", (F, H)), ("fc2", (H, F))):
            shapes[p + name + ".weight"] = shape
            if spec.enable_bias:
                shapes[p + name + ".bias"] = shape[:1]
        shapes[p + "final_layer_norm.weight"] = (H,)
        shapes[p + "final_layer_norm.bias"] = (H,)
    shapes["score.weight"] = (spec.num_labels, H)  # no bias in HF's score head
    return shapes if lora is None else {**shapes, **lora_shapes(spec, lora)}


# trainable=head: OPT has no pooler. What stands between the last decoder layer and the score is the decoder's
# final LayerNorm, applied once on top of the stack as BERT's pooler is: the head is that LayerNorm and the score.
# It keeps BERT's contract for head-only scopes (nothing before the head trains, so the trunk runs once,
# untangented) and last_k's (the last k layers and everything after them). bias: the score has no bias of its own,
# and trains with the biases as BERT's classifier does.
SCOPES = Scopes(re.compile(r"model\.decoder\.layers\.(\d+)\."), ("model.decoder.final_layer_norm.", "score."), "score.")


def is_trainable(name: str, scope: str, num_layers: int, last_k: int = 1) -> bool:
    """Whether OPT's parameter `name` (HF naming) is trained under `scope` (bench.spec.Scopes: the head is the final
    LayerNorm + score, the classifier the score)."""
    return SCOPES.selects(name, scope, num_layers, last_k)


def count_params(spec: OptSpec, scope: str = "all", last_k: int = 1, lora: LoraSpec | None = None) -> int:
    """The parameters `scope` trains (trainable=lora: over the adapters `lora` describes, LoraSpec() if None)."""
    shapes = param_shapes(spec, (lora or LoraSpec()) if scope == "lora" else None)
    return count_trained(shapes, is_trainable, scope, spec.num_layers, last_k)


def init_weights(spec: OptSpec, seed: int, names: list[str] | None = None) -> dict[str, np.ndarray]:
    """HF OPT's init (PreTrainedModel._init_weights with init_std): Linear and Embedding weights ~ N(0, init_std)
    (embed_positions included), biases 0, LayerNorm weight 1 / bias 0, the pad_token_id row of embed_tokens 0
    (nn.Embedding(padding_idx=pad_token_id))."""
    pad = ("model.decoder.embed_tokens.weight", spec.pad_token_id)
    return normal_init(param_shapes(spec), seed, spec.init_std, "layer_norm.", pad, names)


def checkpoint_name(name: str) -> str:
    """A checkpoint's key spelt as OPTForSequenceClassification names it (an OPTModel's keys lack "model.")."""
    return "model." + name if name.startswith("decoder.") else name


def refuses(framework: str, parallel: str, scan_layers: bool) -> str | None:
    """Why OPT cannot run a trial so set up (None: it can: every strategy and layout is measured)."""
    return None


def spec_from(values: dict) -> OptSpec:
    """OptSpec from the config's model.* values: intermediate_size is OPT's ffn_dim; other families' own fields
    are not OPT's and are not read."""
    values = {("ffn_dim" if k == "intermediate_size" else k): v for k, v in values.items()}
    names = {f.name for f in fields(OptSpec)}
    return OptSpec(**{k: v for k, v in values.items() if k in names})


def matmuls(
    spec: OptSpec,
    trainable: str,
    batch_size: int,
    seq_len: int,
    last_k: int = 1,
    lora: LoraSpec | None = None,
    framework: str | None = None,
) -> list[Matmul]:
    """Every matmul of one forward pass of OPT for sequence classification, in the order the pass runs them; with
    `lora`, each adapted layer's two adapter matmuls after its own. The attention's scores and context are full
    T x T, as HF's eager attention computes them before the causal mask. The score reads one token a row in JAX
    (jax_impl gathers it first); HF's torch model scores every token and picks one after (`framework="torch"`)."""
    H, F, C, L = spec.hidden_size, spec.ffn_dim, spec.num_labels, spec.num_layers
    B, T = batch_size, seq_len
    tokens = B * T
    train = lambda name: is_trainable(name, trainable, L, last_k)
    norm = lambda prefix: train(prefix + ".weight") or train(prefix + ".bias")  # a LayerNorm's scale or shift
    flows = train("model.decoder.embed_tokens.weight") or train("model.decoder.embed_positions.weight")
    targets = lora_targets(lora) if lora else ()
    adapted = {f"model.decoder.layers.{i}.{lora_module(t)}" for i in range(L) for t in targets}
    out = Matmuls(train, adapted, lora.rank if lora else 0)
    linear = out.linear

    for i in range(L):
        p = f"model.decoder.layers.{i}."
        x = flows or norm(p + "self_attn_layer_norm")  # pre-LayerNorm: the attention reads the normed input
        q, k, v = (linear(p + f"self_attn.{n}", tokens, H, H, x, i) for n in ("q_proj", "k_proj", "v_proj"))
        out.append(Matmul(p + "self_attn.scores", 2 * B * T * T * H, q + k, i))  # Q K^T, (B, A, T, T)
        probs = q or k
        out.append(Matmul(p + "self_attn.context", 2 * B * T * T * H, probs + v, i))  # probs @ V
        o = linear(p + "self_attn.out_proj", tokens, H, H, probs or v, i)
        a = o or flows  # the residual carries the layer's input
        g = linear(p + "fc1", tokens, H, F, a or norm(p + "final_layer_norm"), i)
        y = linear(p + "fc2", tokens, F, H, g, i)
        flows = y or a
    head = flows or norm("model.decoder.final_layer_norm")
    linear("score", tokens if framework == "torch" else B, H, C, head, None)
    return out


def activations(spec: OptSpec, s: StepSpec, seq_len: int, *, X: int, mask: int, dropout: bool, framework: str):
    """What OPT's forward pass keeps for the backward pass of step `s`, per token (bench.models.Activations;
    docs/memory.md): `X` bytes per activation, `mask` per dropout-mask element, `dropout` whether the step trains
    with dropout. A pre-LayerNorm layer keeps both LayerNorms' inputs and outputs (4H), Q, K, V and the context
    (4H), fc1's output, which ReLU keeps and fc2 reads (F, once), the attention probabilities (A T), and the
    dropout masks (residual: two of H; attention_dropout, 0 in OPT's config: its probabilities' mask and copy).
    The LayerNorms' statistics (two numbers a token each) are left out, as BERT's are."""
    H, F, A, T = spec.hidden_size, spec.ffn_dim, spec.num_heads, seq_len
    d = 1 if spec.dropout > 0 and dropout else 0
    da = 1 if spec.attention_dropout > 0 and dropout else 0
    layer = X * (8 * H + F + (1 + da) * A * T) + mask * (da * A * T + d * 2 * H)
    if s.trainable in ("bias", "lora"):  # frozen weights: Q, K, V's, out_proj's and fc1's inputs are not saved;
        layer -= X * 3 * H  # fc2's is ReLU's output, which ReLU's own backward keeps
    if s.trainable == "lora":  # an adapted layer's input is saved for its A, and A x (r per token) for its B
        inputs = {"qkv": H, "out_proj": H, "fc1": H, "fc2": 0}  # fc2's input is kept already (ReLU's)
        targets = lora_targets(s.lora)
        read = {"qkv" if t in ("q_proj", "k_proj", "v_proj") else t for t in targets}  # Q, K, V: one input
        layer += X * (sum(inputs[g] for g in read) + s.lora.rank * len(targets))
    # The head: the final LayerNorm's input and, where the score trains, its input. torch's HF model scores every
    # token and picks the last one after; JAX gathers that token first, so its score's input is (B, H) only.
    score_input = X * H if framework == "torch" else 0
    head = {"classifier": score_input}.get(s.trainable, X * H + score_input)
    return Activations(
        layer=layer,
        layer_input=X * H,
        embeddings=0,  # no embedding dropout, no LayerNorm: the tables' gradients need only the token indices
        head=head,
        # the attention scores and probabilities beside Q, K, V and the context, or fc1's output and ReLU's beside
        # the layer's input and output
        forward_temp=X * max(2 * A * T + 4 * H, 2 * F + 2 * H),
    )
