"""The classifier's loss, for every estimator: whole, or in two halves when only the head trains, and the dropout
key of a step. Mirror of torch_impl/loss.py. A batch on the device holds the model's inputs and its labels
(Trainer.to_device keeps its family's INPUT_KEYS), so the loss passes the model what the batch holds."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import optax
from flax import nnx

from bench import models


def whole(tree):
    return tree


def make_loss_fn(graphdef, frozen, train: bool, gather=whole):
    """loss_of(params, batch, key[, layer_hook]): mean cross-entropy of the classifier; frozen state closed over
    (constants to every transformation, so they get no tangent and no gradient). `key` drives dropout when `train`.
    `gather`: the parameters whole from what a device holds (parallel=fsdp: World.gather_whole)."""

    def loss_of(params, batch, key, layer_hook=None):
        model = nnx.merge(graphdef, *gather((params, frozen)))
        logits = model(
            **{k: v for k, v in batch.items() if k != "labels"},  # the family's inputs (Trainer.to_device)
            deterministic=not train,
            rngs=nnx.Rngs(dropout=key) if train else None,
            layer_hook=layer_hook,  # directions.displaced's, for a stack's tangents
        )  # (B, C)
        logits = logits.astype(jnp.float32)  # the loss in fp32 whatever the model computes in (as torch_impl)
        return optax.softmax_cross_entropy_with_integer_labels(logits, batch["labels"]).mean()

    return loss_of


def make_trunk_head_fns(graphdef, frozen, train: bool, gather=whole):
    """(features_of, head_loss_of): the loss in two halves, for trainable=head where the trunk (embeddings +
    encoder) is frozen: features_of(params, batch, key) -> (B, T, H); head_loss_of(params, hidden, batch, key)."""

    def features_of(params, batch, key):
        model = nnx.merge(graphdef, *gather((params, frozen)))
        return model.features(
            **{k: v for k, v in batch.items() if k != "labels"},
            deterministic=not train,
            rngs=nnx.Rngs(dropout=key) if train else None,
        )

    def head_loss_of(params, hidden, batch, key):
        model = nnx.merge(graphdef, *gather((params, frozen)))
        logits = model.head(
            hidden,
            **{k: batch[k] for k in models.of(model.spec).HEAD_KEYS},  # OPT's: the last token that is not padding
            deterministic=not train,
            rngs=nnx.Rngs(dropout=jax.random.fold_in(key, 1)) if train else None,
        )
        return optax.softmax_cross_entropy_with_integer_labels(logits.astype(jnp.float32), batch["labels"]).mean()

    return features_of, head_loss_of


# ---------------------------------------------------------------------------------------------------------------
# keys


def dropout_key(seed: int, step):
    return jax.random.fold_in(jax.random.fold_in(jax.random.key(seed), step), 2**32 - 1)
