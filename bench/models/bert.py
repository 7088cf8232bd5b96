"""BERT (Devlin et al. 2019) for sequence classification: the framework-neutral facts of the family.

The architecture (bench.spec.BertSpec, HF BertConfig semantics), its parameters by HF's names for
BertForSequenceClassification (bench.spec.param_shapes) and what each trainable scope selects
(bench.spec.is_trainable) still live in bench/spec.py, where every layer reads them; this module is the family's
face to the registry, and holds HF's initialisation. torch_impl/model.py builds it through transformers,
jax_impl/model.py as our own Flax NNX model.
"""

from __future__ import annotations

from dataclasses import fields

import numpy as np

from bench.models import Activations, Matmul, Matmuls, normal_init
from bench.spec import (
    BERT_SCOPES,
    LORA_TARGETS,
    BertSpec,
    LoraSpec,
    StepSpec,
    count_params,
    is_trainable,
    lora_module,
    lora_shapes,
    param_shapes,
)

NAME, SPEC = "bert", BertSpec
INPUT_KEYS = ("input_ids", "token_type_ids", "attention_mask")
HEAD_KEYS = ()  # the pooler reads the first token's hidden state: nothing of the batch
MODELLED = frozenset({"memory", "flops"})
POOLER = "bert.pooler.dense"  # the head's matmul before the classifier
SCOPES = BERT_SCOPES
EMBEDDINGS = ("bert.embeddings.",)  # the embedding tables (and their LayerNorm): no matmul reads them
# Buffers HF keeps in checkpoints that are not parameters.
CHECKPOINT_BUFFERS = ("bert.embeddings.position_ids", "bert.embeddings.token_type_ids")
# Keys a BertModel (encoder-only) checkpoint may lack, the classification head and the pooler: they are
# initialised from the seed instead.
CHECKPOINT_OPTIONAL = ("classifier.weight", "classifier.bias", "bert.pooler.dense.weight", "bert.pooler.dense.bias")

__all__ = [
    "LORA_TARGETS",
    "count_params",
    "is_trainable",
    "param_shapes",
    "spec_from",
    "refuses",
    "checkpoint_name",
    "matmuls",
    "activations",
    "init_weights",
    "lora_shapes",
]


def refuses(framework: str, parallel: str, scan_layers: bool) -> str | None:
    """Why BERT cannot run a trial so set up (None: it can: every strategy and layout is measured)."""
    return None


def spec_from(values: dict) -> BertSpec:
    """BertSpec from the config's model.* values (the keys it has; family, name and checkpoint are not its)."""
    names = {f.name for f in fields(BertSpec)}
    return BertSpec(**{k: v for k, v in values.items() if k in names})


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
