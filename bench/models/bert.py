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

from bench.models import Matmul, Matmuls, normal_init
from bench.spec import (
    LORA_TARGETS,
    BertSpec,
    LoraSpec,
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
