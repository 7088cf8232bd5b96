"""inference in JAX: the forward pass alone (the memory baseline), one jitted program. Mirror of
torch_impl/estimators/inference.py."""

from __future__ import annotations

from bench.jax_impl.estimators import Held
from bench.jax_impl.loss import dropout_key


def memory(trainer, micro_batches, temp) -> Held:
    return Held()


def prepare(trainer, shardings) -> None:
    sh = shardings
    trainer._inference = trainer.jit(
        lambda *args: _inference(trainer, *args), (), (sh.frozen, sh.params, sh.batch), sh.scalar
    )


def lower(trainer, micro_batches) -> dict:
    return {"_inference": trainer._inference.lower(trainer.frozen, trainer.params, micro_batches)}


def programs(trainer) -> list[tuple]:
    return [(trainer._inference, 1)]


def step(trainer, micro_batches):
    return trainer._inference(trainer.frozen, trainer.params, micro_batches)


def _inference(trainer, frozen, params, micro_batches):
    key, loss_of = dropout_key(trainer.spec.seed, 0), trainer.on(frozen).loss_of
    return sum(loss_of(params, b, key) for b in micro_batches) / len(micro_batches)
