"""BERT (Devlin et al. 2019) for sequence classification: the framework-neutral facts of the family.

The architecture both frameworks build (BertSpec, HF BertConfig semantics), its parameters by HF's names for
BertForSequenceClassification in torch layout ("bert.encoder.layer.3.output.dense.weight", "classifier.bias", ...:
param_shapes), what each trainable scope selects of them (SCOPES, is_trainable), the linear layers a LoRA adapter
may wrap (LORA_TARGETS: BERT's names are the suite's roles, bench.spec.LORA_ROLES), and HF's initialisation.
torch_impl/models/bert.py builds it through transformers, jax_impl/models/bert.py as our own Flax NNX model;
neither defines its own copy of these.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, fields

import numpy as np

from bench.models import Activations, Heads, Matmul, Matmuls, normal_init, setting
from bench.spec import LORA_DEFAULT_ROLES, LORA_ROLES, LoraSpec, Scopes, StepSpec, count_trained

# trainable=lora: the linear layers of each encoder layer an adapter may wrap, named by their path inside the layer
# (HF's module names); lora.targets=all_linear wraps all six. BERT's names are the roles every family reads.
LORA_TARGETS = LORA_ROLES
LORA_DEFAULT_TARGETS = LORA_DEFAULT_ROLES  # the LoRA paper's choice (Hu et al. 2021, section 7.1)


@dataclass(frozen=True)
class BertSettings:
    """BERT's own model.* fields (HF BertConfig's), beside those every family shares (bench.config.ModelConfig);
    every trial's identity carries them, as it did before families declared their own fields."""

    type_vocab_size: int = setting(2, "token type (segment) vocabulary, integer >= 1", recorded=True)
    layer_norm_eps: float = setting(1e-12, "LayerNorm epsilon, > 0 (HF BertConfig's default)", recorded=True)


@dataclass(frozen=True)
class BertSpec(Heads):
    """BERT for sequence classification: the architecture both frameworks build (HF BertConfig semantics)."""

    vocab_size: int = 30522
    hidden_size: int = 768
    num_layers: int = 12
    num_heads: int = 12
    intermediate_size: int = 3072
    max_position_embeddings: int = 512
    type_vocab_size: int = BertSettings.type_vocab_size
    num_labels: int = 4
    dropout: float = 0.1  # hidden dropout and attention-probability dropout, as in HF's BertConfig defaults
    layer_norm_eps: float = BertSettings.layer_norm_eps
    initializer_range: float = 0.02  # std of the normal init (HF BertConfig default)
    pad_token_id: int = 0  # [PAD] in the bert-base-uncased vocab


NAME, SPEC, SETTINGS = "bert", BertSpec, BertSettings
INPUT_KEYS = ("input_ids", "token_type_ids", "attention_mask")
HEAD_KEYS = ()  # the pooler reads the first token's hidden state: nothing of the batch
HEAD_TOKEN = "first"  # the one row of the trunk's output the head reads (bench.models: cached evaluation)
MODELLED = frozenset({"memory", "flops"})
POOLER = "bert.pooler.dense"  # the head's matmul before the classifier
EMBEDDINGS = ("bert.embeddings.",)  # the embedding tables (and their LayerNorm): no matmul reads them
# Buffers HF keeps in checkpoints that are not parameters.
CHECKPOINT_BUFFERS = ("bert.embeddings.position_ids", "bert.embeddings.token_type_ids")
# Keys a BertModel (encoder-only) checkpoint may lack, the classification head and the pooler: they are
# initialised from the seed instead.
CHECKPOINT_OPTIONAL = ("classifier.weight", "classifier.bias", "bert.pooler.dense.weight", "bert.pooler.dense.bias")


def lora_shapes(spec: BertSpec, lora: LoraSpec) -> dict[str, tuple[int, ...]]:
    """The adapters' parameters with their torch-layout shapes, named as the wrapped layer plus PEFT's
    lora_A/lora_B (its ".default" adapter name dropped): bert.encoder.layer.0.attention.self.query.lora_A.weight
    (rank, in), ...lora_B.weight (out, rank)."""
    H, I = spec.hidden_size, spec.intermediate_size  # noqa: E741
    dims = {
        "query": (H, H),
        "key": (H, H),
        "value": (H, H),
        "attention.output.dense": (H, H),
        "intermediate.dense": (H, I),
        "output.dense": (I, H),
    }  # (in, out)
    shapes = {}
    for i in range(spec.num_layers):
        for target in LORA_TARGETS:  # HF's order, whatever order the targets were given in
            if target in lora.targets:
                n_in, n_out = dims[target]
                name = f"bert.encoder.layer.{i}.{lora_module(target)}"
                shapes[name + ".lora_A.weight"] = (lora.rank, n_in)
                shapes[name + ".lora_B.weight"] = (n_out, lora.rank)
    return shapes


def lora_module(target: str) -> str:
    """A LORA_TARGETS name as the module's path inside an encoder layer (HF naming)."""
    return f"attention.self.{target}" if target in ("query", "key", "value") else target


def param_shapes(spec: BertSpec, lora: LoraSpec | None = None) -> dict[str, tuple[int, ...]]:
    """Every parameter of HF BertForSequenceClassification, in HF's order, with its torch-layout shape; with
    `lora`, the adapters' parameters after them (lora_shapes)."""
    H, I = spec.hidden_size, spec.intermediate_size  # noqa: E741
    shapes: dict[str, tuple[int, ...]] = {
        "bert.embeddings.word_embeddings.weight": (spec.vocab_size, H),
        "bert.embeddings.position_embeddings.weight": (spec.max_position_embeddings, H),
        "bert.embeddings.token_type_embeddings.weight": (spec.type_vocab_size, H),
        "bert.embeddings.LayerNorm.weight": (H,),
        "bert.embeddings.LayerNorm.bias": (H,),
    }
    for i in range(spec.num_layers):
        p = f"bert.encoder.layer.{i}."
        for name in ("query", "key", "value"):
            shapes[p + f"attention.self.{name}.weight"] = (H, H)
            shapes[p + f"attention.self.{name}.bias"] = (H,)
        shapes[p + "attention.output.dense.weight"] = (H, H)
        shapes[p + "attention.output.dense.bias"] = (H,)
        shapes[p + "attention.output.LayerNorm.weight"] = (H,)
        shapes[p + "attention.output.LayerNorm.bias"] = (H,)
        shapes[p + "intermediate.dense.weight"] = (I, H)
        shapes[p + "intermediate.dense.bias"] = (I,)
        shapes[p + "output.dense.weight"] = (H, I)
        shapes[p + "output.dense.bias"] = (H,)
        shapes[p + "output.LayerNorm.weight"] = (H,)
        shapes[p + "output.LayerNorm.bias"] = (H,)
    shapes["bert.pooler.dense.weight"] = (H, H)
    shapes["bert.pooler.dense.bias"] = (H,)
    shapes["classifier.weight"] = (spec.num_labels, H)
    shapes["classifier.bias"] = (spec.num_labels,)
    return shapes if lora is None else {**shapes, **lora_shapes(spec, lora)}


SCOPES = Scopes(re.compile(r"bert\.encoder\.layer\.(\d+)\."), ("bert.pooler.", "classifier."), "classifier.")


def is_trainable(name: str, scope: str, num_layers: int, last_k: int = 1) -> bool:
    """Whether BERT's parameter `name` (HF naming) is trained under `scope` (Scopes: the head is pooler +
    classifier)."""
    return SCOPES.selects(name, scope, num_layers, last_k)


def count_params(spec: BertSpec, scope: str = "all", last_k: int = 1, lora: LoraSpec | None = None) -> int:
    """The parameters `scope` trains (trainable=lora: over the adapters `lora` describes, LoraSpec() if None)."""
    shapes = param_shapes(spec, (lora or LoraSpec()) if scope == "lora" else None)
    return count_trained(shapes, is_trainable, scope, spec.num_layers, last_k)


def refuses(framework: str, parallel: str, scan_layers: bool) -> str | None:
    """Why BERT cannot run a trial so set up (None: it can: every strategy and layout is measured)."""
    return None


def spec_from(values: dict) -> BertSpec:
    """BertSpec from the config's model.* values (the keys it has; family, name and checkpoint are not its);
    ValueError in one line for a value of its own fields it cannot take."""
    names = {f.name for f in fields(BertSpec)}
    spec = BertSpec(**{k: v for k, v in values.items() if k in names})
    if isinstance(spec.type_vocab_size, bool) or not isinstance(spec.type_vocab_size, int) or spec.type_vocab_size < 1:
        raise ValueError(f"model.type_vocab_size={spec.type_vocab_size}: accepted an integer >= 1")
    if not (isinstance(spec.layer_norm_eps, (int, float)) and 0 < spec.layer_norm_eps < float("inf")):
        raise ValueError(f"model.layer_norm_eps={spec.layer_norm_eps}: accepted a finite number > 0")
    return spec


def checkpoint_name(name: str) -> str:
    """A checkpoint's key spelt as BertForSequenceClassification names it."""
    if name.startswith(("embeddings.", "encoder.", "pooler.")):  # a BertModel checkpoint (no "bert." prefix)
        name = "bert." + name
    # TF-converted BERT checkpoints spell LayerNorm parameters gamma/beta.
    return name.replace("LayerNorm.gamma", "LayerNorm.weight").replace("LayerNorm.beta", "LayerNorm.bias")


def init_weights(spec: BertSpec, seed: int, names: list[str] | None = None) -> dict[str, np.ndarray]:
    """HF BERT's init (`BertPreTrainedModel._init_weights`): Linear/Embedding weights ~ N(0, initializer_range),
    biases 0, LayerNorm weight 1 / bias 0, the [PAD] row of the word embeddings 0.

    Each tensor draws from its own generator (bench.models.normal_init).
    """
    pad = ("bert.embeddings.word_embeddings.weight", spec.pad_token_id)
    shapes = param_shapes(spec)
    return normal_init(shapes, seed, spec.initializer_range, ".LayerNorm.", pad, names)


def matmuls(
    spec: BertSpec,
    trainable: str,
    batch_size: int,
    seq_len: int,
    last_k: int = 1,
    lora: LoraSpec | None = None,
    framework=None,
) -> list[Matmul]:
    """Every matmul of one forward pass of BERT for sequence classification, in the order the pass runs them;
    with `lora`, each adapted layer's two adapter matmuls after its own (A x, then B (A x): both carry, A and B
    being trained)."""
    H, I, C, L = spec.hidden_size, spec.intermediate_size, spec.num_labels, spec.num_layers  # noqa: E741
    B, T = batch_size, seq_len
    tokens = B * T
    train = lambda name: is_trainable(name, trainable, L, last_k)
    norm = lambda prefix: train(prefix + ".weight") or train(prefix + ".bias")  # a LayerNorm's scale or shift
    flows = any(train(n) for n in param_shapes(spec) if n.startswith("bert.embeddings."))  # the layers' input
    adapted = {f"bert.encoder.layer.{i}.{lora_module(t)}" for i in range(L) for t in (lora.targets if lora else ())}
    out = Matmuls(train, adapted, lora.rank if lora else 0)
    linear = out.linear

    for i in range(L):
        p = f"bert.encoder.layer.{i}."
        q, k, v = (linear(p + f"attention.self.{n}", tokens, H, H, flows, i) for n in ("query", "key", "value"))
        out.append(Matmul(p + "attention.scores", 2 * B * T * T * H, q + k, i))  # Q K^T, (B, A, T, T)
        probs = q or k
        out.append(Matmul(p + "attention.context", 2 * B * T * T * H, probs + v, i))  # probs @ V, (B, A, T, H/A)
        context = probs or v
        o = linear(p + "attention.output.dense", tokens, H, H, context, i)
        a = o or flows or norm(p + "attention.output.LayerNorm")  # the residual carries the layer's input
        g = linear(p + "intermediate.dense", tokens, H, I, a, i)
        y = linear(p + "output.dense", tokens, I, H, g, i)
        flows = y or a or norm(p + "output.LayerNorm")
    pooled = linear("bert.pooler.dense", B, H, H, flows, None)
    linear("classifier", B, H, C, pooled, None)
    return out


def activations(spec: BertSpec, s: StepSpec, seq_len: int, *, X: int, mask: int, dropout: bool, framework: str):
    """What BERT's forward pass keeps for the backward pass of step `s`, per token (bench.models.Activations;
    docs/memory.md derives each term): `X` bytes per activation, `mask` per dropout-mask element, `dropout` whether
    the step trains with dropout. A layer keeps Q, K, V's input, Q, K, V, the context, the attention output and its
    LayerNorm's input and output (8H), the intermediate and its GELU (2I), the attention probabilities (A T, and
    their dropped copy), and the dropout masks."""
    H, I, A, T = spec.hidden_size, spec.intermediate_size, spec.num_heads, seq_len  # noqa: E741
    d = 1 if spec.dropout > 0 and dropout else 0
    layer = X * (8 * H + 2 * I + (1 + d) * A * T) + d * mask * (A * T + 2 * H)
    if s.trainable in ("bias", "lora"):  # a frozen weight's gradient is never formed: its input is not saved
        layer -= X * (3 * H + I)
    if s.trainable == "lora":  # an adapted layer's input is saved for its A, and A x (r per token) for its B
        inputs = {"qkv": H, "attention.output.dense": H, "intermediate.dense": H, "output.dense": I}
        read = {"qkv" if t in ("query", "key", "value") else t for t in s.lora.targets}  # Q, K, V: one input
        layer += X * (sum(inputs[g] for g in read) + s.lora.rank * len(s.lora.targets))
    return Activations(
        layer=layer,
        layer_input=X * H,
        # the embeddings' LayerNorm input and dropout mask, where the trunk trains
        embeddings=(X * H + d * mask * H) if s.trainable in ("all", "bias") else 0,
        # the last hidden state the pooler slices; a linear probe (classifier) saves only the pooled output it
        # multiplies, (B, H): nothing per token
        head=0 if s.trainable == "classifier" else X * H,
        # the attention scores and probabilities beside Q, K, V and the context, or the intermediate and its GELU
        # beside the layer's input and output
        forward_temp=X * max(2 * A * T + 4 * H, 2 * I + 2 * H),
    )
