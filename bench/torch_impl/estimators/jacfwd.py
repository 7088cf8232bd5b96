"""jacfwd in torch: the exact gradient by forward mode, a vmapped jvp over chunks of the standard basis. Mirror of
jax_impl/estimators/jacfwd.py."""

from __future__ import annotations

import torch
from torch.func import jvp, vmap

from bench.spec import HEAD_ONLY
from bench.torch_impl.directions import direction_seed, observe
from bench.torch_impl.loss import head_loss, identity, loss_fn


def gradient(trainer, micro_batches, tangents=None, in_step=False):
    s = trainer.spec
    with trainer.autocast():  # trainable=head runs the trunk and the head apart, outside model.forward
        return jacfwd_gradient(
            trainer.module,
            trainer.params,
            micro_batches,
            chunk=trainer.estimator.settings_of(s).chunk,
            seed=s.seed,
            step=trainer.step_count,
            trunk=trainer.family if s.trainable in HEAD_ONLY else None,
            reduce=trainer.reduce,
        )


def jacfwd_gradient(model, params, micro_batches, *, chunk: int, seed: int, step: int, trunk=None, reduce=identity):
    """Exact gradient by forward mode: d(loss)/d(theta_i) for every basis direction e_i of the flattened trainable
    parameters, `chunk` directions per vmapped jvp. ceil(n / chunk) forward passes; the (chunk, n) basis block is
    the method's memory cost. Every chunk replays the same dropout masks (forked RNG, same seed), so all
    directions differentiate the same function, as jax.jvp does with one key.

    `trunk`, the model's family module (its features and head_logits), when nothing before the head is trainable
    (trainable=head): the trunk has no tangent, so it runs once per batch outside the basis loop and only the head
    is pushed forward (jax_impl does the same split).
    `reduce` averages the gradient and the loss over devices, as one buffer: the step's one exchange."""
    names = list(params)
    sizes = [params[n].numel() for n in names]
    n = sum(sizes)
    ref = next(iter(params.values()))
    # the gradient, then the loss: fp32, as the loss's derivatives are (jax_impl accumulates in fp32 too)
    exchanged = observe("grads", torch.zeros(n + 1, device=ref.device, dtype=torch.float32))
    grad_flat, total = exchanged[:n], exchanged[n]
    devices = [ref.device.index or 0] if ref.device.type == "cuda" else []
    for batch in micro_batches:
        if trunk is not None:
            with torch.random.fork_rng(devices=devices):
                torch.manual_seed(direction_seed(seed, step, 0, 1))
                hidden = trunk.features(model, batch)  # (B, T, H), once
            f = lambda p, batch=batch, hidden=hidden: head_loss(trunk, model, hidden, batch, p)
        else:
            f = lambda p, batch=batch: loss_fn(model, batch, p)
        for start in range(0, n, chunk):
            c = min(chunk, n - start)
            basis = observe("directions", torch.zeros(c, n, device=ref.device, dtype=ref.dtype))  # (c, n)
            basis[torch.arange(c), torch.arange(start, start + c)] = 1.0
            tangent = {
                name: part.view(c, *params[name].shape) for name, part in zip(names, torch.split(basis, sizes, dim=1))
            }
            with torch.random.fork_rng(devices=devices):
                torch.manual_seed(direction_seed(seed, step, 0, 0))
                loss, d = vmap(lambda t, f=f: jvp(f, (params,), (t,)), randomness="same")(tangent)
            grad_flat[start : start + c] += d.detach() / len(micro_batches)
            del basis, tangent
        total += loss[0].detach() / len(micro_batches)
    exchanged = reduce(exchanged)
    grad_flat, total = exchanged[:n], exchanged[n].clone()  # the loss outlives the step: no view of the buffer
    grads = {nm: g.view_as(params[nm]).to(params[nm].dtype) for nm, g in zip(names, torch.split(grad_flat, sizes))}
    return total, grads
