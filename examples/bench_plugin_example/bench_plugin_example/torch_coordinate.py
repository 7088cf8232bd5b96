"""coordinate in torch: the central difference along the step's coordinate (coordinate.py has the rule), the
parameter moved in place and put back to its exact value. Mirror of jax_coordinate.py."""

from __future__ import annotations

import torch

from bench.torch_impl.loss import identity, loss_fn
from bench_plugin_example.coordinate import coordinate


def gradient(trainer, micro_batches, tangents=None, in_step=False):
    if tangents is not None:
        raise ValueError("mode=coordinate differentiates along its own coordinate: accepted no given tangents")
    s, settings = trainer.spec, trainer.estimator.settings_of(trainer.spec)
    return coordinate_gradient(
        lambda batch: loss_fn(trainer.module, batch),
        trainer.params,
        micro_batches,
        eps=settings.eps,
        seed=s.seed,
        step=trainer.step_count,
        reduce=trainer.reduce,
    )


@torch.no_grad()
def coordinate_gradient(loss_of, params, micro_batches, *, eps: float, seed: int, step: int, reduce=identity):
    """(mean of the L+ and L-, the estimate n (L+ - L-) / (2 eps) e_i as a dict like `params`), with `loss_of(batch)`
    reading `params` (name -> tensor) in place; i indexes the parameters flattened in their order."""
    n = sum(p.numel() for p in params.values())
    name, j = locate(params, coordinate(seed, step, n))
    x = params[name].view(-1)
    kept = x[j].clone()
    total, proj, m = 0.0, 0.0, len(micro_batches)
    for batch in micro_batches:
        x[j] = kept + eps
        loss_plus = loss_of(batch)
        x[j] = kept - eps
        loss_minus = loss_of(batch)
        x[j] = kept
        proj = proj + (loss_plus - loss_minus) / (2 * eps) / m
        total = total + (loss_plus + loss_minus) / 2 / m
    total, proj = reduce(torch.stack([torch.as_tensor(v) for v in (total, proj)]))
    grads = {k: torch.zeros_like(p) for k, p in params.items()}
    grads[name].view(-1)[j] = n * proj
    return total, grads


def locate(params, i: int) -> tuple[str, int]:
    """The tensor of `params` that flat index i falls in, and i's index within it."""
    for name, p in params.items():
        if i < p.numel():
            return name, i
        i -= p.numel()
    raise IndexError(i)
