"""jvp in JAX: the forward gradient (Baydin et al. 2022), K seeded tangents v_k, d_k = grad . v_k by one jax.jvp
each (along t -> theta + t v_k, v_k drawn where the pass uses it), the estimate g = 1/K sum_k d_k v_k. Mirror of
torch_impl/estimators/jvp.py.

The timed step is two programs, the coefficients then an update that regenerates the tangents from their keys:
in one program XLA:CPU materialised the regenerated tangent, the estimate and the update of every leaf at once
(docs/memory.md), while apart each program holds what it must. With one kept tangent (keeps_tangent) the
update reads the pass's own tangent instead, donated so that the estimate is written over it.
"""

from __future__ import annotations

from functools import partial

import jax
import jax.numpy as jnp
import numpy as np
import optax

from bench.estimators.jvp import keeps_tangent
from bench.jax_impl.directions import displaced, sample_tangent, seeded_gradient, seeded_update, tangent_gradient
from bench.jax_impl.estimators import Held
from bench.jax_impl.loss import dropout_key, whole


def memory(trainer, micro_batches, temp) -> Held:
    directions = sum(x.nbytes for x in jax.tree.leaves(trainer.params))
    if keeps_tangent(trainer.spec, "jax"):  # the tangent is the pass's output, whole, beside its temporaries
        return Held(directions=directions, beside=directions)
    directions = min(directions, temp)  # XLA draws each leaf's tangent where the pass reaches it: within its temps
    return Held(directions=directions, inside=directions)


def gradient(trainer, params, micro_batches, step, tangents=None):
    s, settings = trainer.spec, trainer.estimator.settings_of(trainer.spec)
    return params, *forward_gradient(
        trainer.loss_of,
        params,
        micro_batches,
        dropout_key(s.seed, step),
        num_tangents=settings.num_tangents,
        seed=s.seed,
        step=step,
        tangents=tangents,
        kind=s.directions,
        keep=keeps_tangent(s, "jax"),
    )


def prepare(trainer, shardings) -> None:
    sh, kept = shardings, keeps_tangent(trainer.spec, "jax")
    trainer._coeffs = trainer.jit(
        partial(coefficients, trainer),
        (),
        (sh.frozen, sh.params, sh.batch, sh.scalar),
        (sh.scalar, sh.scalar, sh.params) if kept else (sh.scalar, sh.scalar),
    )
    # the kept tangent is donated: the estimate is written over it
    trainer._update = trainer.jit(
        partial(update, trainer),
        (0, 1, 3) if kept else (0, 1),
        (sh.params, sh.opt, sh.scalar, sh.params if kept else sh.scalar),
        (sh.params, sh.opt),
    )


def lower(trainer, micro_batches) -> dict:
    step, params = np.int32(0), trainer.params
    opt_state = jax.eval_shape(trainer.optimizer.init, params)
    last = params if keeps_tangent(trainer.spec, "jax") else step  # the kept tangent has the parameters' shapes
    coeffs = np.zeros(trainer.estimator.settings_of(trainer.spec).num_tangents, np.float32)
    return {
        "_coeffs": trainer._coeffs.lower(trainer.frozen, params, micro_batches, step),
        "_update": trainer._update.lower(params, opt_state, coeffs, last),
    }


def programs(trainer) -> list[tuple]:
    return [(trainer._coeffs, 1), (trainer._update, 1)]


def step(trainer, micro_batches):
    step = np.int32(trainer.step_count)
    loss, coeffs, *kept = trainer._coeffs(trainer.frozen, trainer.params, micro_batches, step)
    # the update redraws the tangents from the step, or reads the kept one
    trainer.params, trainer.opt_state = trainer._update(trainer.params, trainer.opt_state, coeffs, *(kept or [step]))
    return loss


def coefficients(trainer, frozen, params, micro_batches, step):
    """(loss, c) of the forward gradient sum_k c_k v_k, the update regenerating the v_k (kept: also v)."""
    s, settings = trainer.spec, trainer.estimator.settings_of(trainer.spec)
    return forward_gradient_coeffs(
        trainer.on(frozen).loss_of,
        params,
        micro_batches,
        dropout_key(s.seed, step),
        num_tangents=settings.num_tangents,
        seed=s.seed,
        step=step,
        kind=s.directions,
        keep=keeps_tangent(s, "jax"),
        gather=trainer.gather,
    )


def update(trainer, params, opt_state, coeffs, last):
    """Optimizer update with g = sum_k coeffs[k] z_k, the z_k regenerated inside from `last`, the step (XLA fuses
    g into the update, a stack's one layer at a time), or with a kept tangent `last`: g = coeffs[0] * last."""
    s = trainer.spec
    if not keeps_tangent(s, "jax"):
        return seeded_update(trainer.optimizer, params, opt_state, coeffs, s.seed, last, s.directions, trainer.gather)
    updates, opt_state = trainer.optimizer.update(tangent_gradient([last], coeffs), opt_state, params)
    return optax.apply_updates(params, updates), opt_state


def directional_derivative(loss_of, params, batch, tangent, key):
    """(loss, d) with d = grad(loss) . tangent, by one jax.jvp; only the loss leaves the function."""
    return jax.jvp(lambda p: loss_of(p, batch, key), (params,), (tangent,))


def forward_gradient(
    loss_of, params, micro_batches, key, *, num_tangents, seed, step, tangents=None, kind="gaussian", keep=False
):
    """Forward gradient: K tangents in a fori_loop (sequential: memory does not grow with K); each tangent is
    dropped after its pass and regenerated from its key when the update needs it. `keep` (one tangent,
    keeps_tangent): the pass's own tangent makes the estimate instead, drawn once (held whole: +4n bytes)."""
    if tangents is None:
        loss, coeffs, *kept = forward_gradient_coeffs(
            loss_of, params, micro_batches, key, num_tangents=num_tangents, seed=seed, step=step, kind=kind, keep=keep
        )
        return loss, tangent_gradient(kept, coeffs) if keep else seeded_gradient(params, coeffs, seed, step, kind)
    K = len(tangents)
    losses, ds = zip(*(_dir_deriv(loss_of, params, micro_batches, key, v) for v in tangents))
    return losses[0], tangent_gradient(tangents, [d / K for d in ds])


def _dir_deriv(loss_of, params, micro_batches, key, v):
    loss, d = 0.0, 0.0
    for batch in micro_batches:  # grad of the mean loss = mean of the micro-batch grads
        l_b, d_b = directional_derivative(loss_of, params, batch, v, key)
        loss, d = loss + l_b / len(micro_batches), d + d_b / len(micro_batches)
    return loss, d


def _seeded_dir_deriv(loss_of, params, micro_batches, key, seed, step, k, kind):
    """(loss, grad . z_k) by one jax.jvp per micro-batch along t -> theta + t z_k (directions.displaced): each
    tensor's tangent drawn where the pass uses it, a stack's layer by layer inside the scan, never whole."""
    loss, d = 0.0, 0.0
    for batch in micro_batches:

        def along(t, batch=batch):
            moved, hook = displaced(params, t, seed, step, k, kind)
            return loss_of(moved, batch, key, hook)

        l_b, d_b = jax.jvp(along, (jnp.float32(0),), (jnp.float32(1),))
        loss, d = loss + l_b / len(micro_batches), d + d_b / len(micro_batches)
    return loss, d


def forward_gradient_coeffs(
    loss_of, params, micro_batches, key, *, num_tangents, seed, step, kind="gaussian", keep=False, gather=whole
):
    """(loss, c) with c_k = (grad . v_k) / K for the K seeded tangents: the forward gradient is sum_k c_k v_k,
    built by `seeded_gradient` where the update needs it (the timed step runs the two as separate programs);
    `keep` (one tangent): (loss, c, v), v for an update that reads it rather than redraws it."""
    if keep:
        v = sample_tangent(params, seed, step, 0, kind, gather)
        loss, d = _dir_deriv(loss_of, params, micro_batches, key, v)
        return loss, jnp.reshape(d, (1,)).astype(jnp.float32), v

    def body(k, carry):
        loss, ds = carry
        l_k, d_k = _seeded_dir_deriv(loss_of, params, micro_batches, key, seed, step, k, kind)
        return jnp.where(k == 0, l_k, loss), ds.at[k].set(d_k)

    loss, ds = jax.lax.fori_loop(0, num_tangents, body, (jnp.float32(0), jnp.zeros(num_tangents, jnp.float32)))
    return loss, ds / num_tangents
