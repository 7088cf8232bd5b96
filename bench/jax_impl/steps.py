"""JAX training steps, one per mode. Mirror image of torch_impl/steps.py: same names, same order.

Every mode is split into a *gradient* (compute, never update) and an *apply* (the optax update); the runner times
`step`, one jitted function doing both (jvp and MeZO: the directional derivatives, then a jitted update that
regenerates the directions), with the parameters and optimizer state donated so XLA updates them in place as
torch does (without donation the old and new parameters would coexist: +1x parameter memory).

    inference  forward only
    backprop   jax.value_and_grad (remat: jax.checkpoint per encoder layer, in the model)
    jvp        forward gradient (Baydin et al. 2022): K tangents v ~ N(0, I), d_k = grad.v_k by jax.jvp each
               (along t -> theta + t v_k, v_k drawn where the pass uses it), estimate g = 1/K sum_k d_k v_k
    jacfwd     exact gradient by forward mode: vmapped jvp over chunks of the standard basis (lax.map batch_size)
    mezo       SPSA (Malladi et al. 2023): perturbation +eps, -2eps, +eps, two forward passes,
               g = (L+ - L-)/(2 eps) z with z regenerated from its key

Random directions are regenerated from their keys rather than stored (bench/jax_impl/directions.py, as in the
torch mirror), so a K-tangent loop holds one tangent at a time, a scanned stack's one layer of it, and the estimate
is built and applied tensor by tensor, a stack's layer by layer.

On several devices (a World from bench.jax_impl.parallel) the programs are the same, jitted with shardings: XLA
splits each over the devices and adds the collectives the maths needs (the batch mean of the loss and of each
directional derivative: an all-reduce of a scalar; backprop's gradient; fsdp's parameter gathers).
"""

from __future__ import annotations

import copy
from concurrent.futures import ThreadPoolExecutor

import jax
import jax.numpy as jnp
import numpy as np
import optax
from flax import nnx
from jax.flatten_util import ravel_pytree

from bench import estimators
from bench.jax_impl.device import resolve_device, use_fp32
from bench.jax_impl.directions import (
    displaced,
    perturb,
    sample_tangent,
    seeded_gradient,
    seeded_update,
    tangent_gradient,
)
from bench.jax_impl.model import build_model, layer_stacks
from bench.jax_impl.params import export_weights, is_trained
from bench.spec import HEAD_ONLY, BertSpec, StepSpec, jacfwd_chunk_for, keeps_tangent

INPUT_KEYS = ("input_ids", "token_type_ids", "attention_mask")


# ---------------------------------------------------------------------------------------------------------------
# loss


def whole(tree):
    return tree


def make_loss_fn(graphdef, frozen, train: bool, gather=whole):
    """loss_of(params, batch, key[, layer_hook]): mean cross-entropy of the classifier; frozen state closed over
    (constants to every transformation, so they get no tangent and no gradient). `key` drives dropout when `train`.
    `gather`: the parameters whole from what a device holds (parallel=fsdp: World.gather_whole)."""

    def loss_of(params, batch, key, layer_hook=None):
        model = nnx.merge(graphdef, *gather((params, frozen)))
        logits = model(
            *(batch[k] for k in INPUT_KEYS),
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
            *(batch[k] for k in INPUT_KEYS), deterministic=not train, rngs=nnx.Rngs(dropout=key) if train else None
        )

    def head_loss_of(params, hidden, batch, key):
        model = nnx.merge(graphdef, *gather((params, frozen)))
        logits = model.head(
            hidden, deterministic=not train, rngs=nnx.Rngs(dropout=jax.random.fold_in(key, 1)) if train else None
        )
        return optax.softmax_cross_entropy_with_integer_labels(logits.astype(jnp.float32), batch["labels"]).mean()

    return features_of, head_loss_of


# ---------------------------------------------------------------------------------------------------------------
# keys


def dropout_key(seed: int, step):
    return jax.random.fold_in(jax.random.fold_in(jax.random.key(seed), step), 2**32 - 1)


# ---------------------------------------------------------------------------------------------------------------
# gradients: compute, never update


def backprop_gradient(loss_of, params, micro_batches, key):
    """Reverse mode: jax.value_and_grad, accumulated over micro-batches."""
    total, grads = 0.0, jax.tree.map(jnp.zeros_like, params)
    for batch in micro_batches:
        loss, g = jax.value_and_grad(loss_of)(params, batch, key)
        total = total + loss / len(micro_batches)
        grads = jax.tree.map(lambda a, b: a + b / len(micro_batches), grads, g)
    return total, grads


def directional_derivative(loss_of, params, batch, tangent, key):
    """(loss, d) with d = grad(loss) . tangent, by one jax.jvp; only the loss leaves the function."""
    return jax.jvp(lambda p: loss_of(p, batch, key), (params,), (tangent,))


def forward_gradient(loss_of, params, micro_batches, key, *, num_tangents, seed, step, tangents=None,
                     kind="gaussian", keep=False):  # fmt: skip
    """Forward gradient: K tangents in a fori_loop (sequential: memory does not grow with K); each tangent is
    dropped after its pass and regenerated from its key when the update needs it. `keep` (one tangent,
    spec.keeps_tangent): the pass's own tangent makes the estimate instead, drawn once (held whole: +4n bytes)."""
    if tangents is None:
        loss, coeffs, *kept = forward_gradient_coeffs(loss_of, params, micro_batches, key, num_tangents=num_tangents,
                                                      seed=seed, step=step, kind=kind, keep=keep)  # fmt: skip
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


def forward_gradient_coeffs(loss_of, params, micro_batches, key, *, num_tangents, seed, step, kind="gaussian",
                            keep=False, gather=whole):  # fmt: skip
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


def jacfwd_gradient(loss_of, params, micro_batches, key, *, chunk: int, trunk=None):
    """Exact gradient by forward mode: d(loss)/d(theta_i) for every basis direction e_i of the flattened trainable
    parameters, `chunk` directions per vmapped jvp (lax.map with batch_size). ceil(n / chunk) forward passes;
    the (chunk, n) basis block is the method's memory cost. One dropout key for every direction.

    `trunk` = (features_of, head_loss_of) when nothing before the head is trainable (trainable=head): the trunk
    has no tangent, so it runs once per batch outside the basis loop and only the head is pushed forward (XLA
    does not hoist the loop-invariant trunk out of the loop by itself; torch_impl does the same split)."""
    flat, unravel = ravel_pytree(params)
    n = flat.shape[0]
    total, grad_flat = 0.0, jnp.zeros_like(flat)
    for batch in micro_batches:
        if trunk is None:
            f = lambda x: loss_of(unravel(x), batch, key)  # noqa: B023 (used immediately)
        else:
            features_of, head_loss_of = trunk
            hidden = features_of(params, batch, key)  # (B, T, H), once
            f = lambda x: head_loss_of(unravel(x), hidden, batch, key)  # noqa: B023
        basis_derivative = lambda i: jax.jvp(f, (flat,), (jax.nn.one_hot(i, n, dtype=flat.dtype),))  # noqa: B023
        losses, d = jax.lax.map(basis_derivative, jnp.arange(n), batch_size=min(chunk, n))
        total, grad_flat = total + losses[0] / len(micro_batches), grad_flat + d / len(micro_batches)
    return total, unravel(grad_flat.astype(flat.dtype))  # the loss's fp32 derivatives, in the parameters' dtype


def spsa_projection(loss_of, perturb_fn, params, micro_batches, key, *, eps: float, restore: bool = True):
    """MeZO's two forward passes: (restored parameters, mean of L+ and L-, projected gradient
    (L(theta + eps z) - L(theta - eps z)) / (2 eps)), perturbing by +eps, -2eps, +eps with `perturb_fn(params,
    scale)` (the restored parameters carry the same rounding as torch's in-place round trip). restore=False: the
    last +eps is left to the update (seeded_update's shift), which draws z anyway: the parameters come back at
    theta - eps z."""
    proj, total = 0.0, 0.0
    for n, batch in enumerate(micro_batches):
        params = perturb_fn(params, +eps)
        loss_plus = loss_of(params, batch, key)
        params = perturb_fn(params, -2 * eps)
        loss_minus = loss_of(params, batch, key)
        if restore or n < len(micro_batches) - 1:
            params = perturb_fn(params, +eps)
        proj = proj + (loss_plus - loss_minus) / (2 * eps) / len(micro_batches)
        total = total + (loss_plus + loss_minus) / 2 / len(micro_batches)
    return params, total, proj


def spsa_gradient(loss_of, params, micro_batches, key, *, eps: float, seed: int, step, kind: str = "gaussian"):
    """MeZO (Malladi et al. 2023): the projection along one seeded z, and the estimate proj * z regenerated from
    its keys. Returns the restored parameters, the step's loss and the estimate."""
    params, total, proj = spsa_projection(
        loss_of, lambda p, scale: perturb(p, scale, seed, step, kind), params, micro_batches, key, eps=eps
    )
    return params, total, seeded_gradient(params, jnp.reshape(proj, (1,)), seed, step, kind)


# ---------------------------------------------------------------------------------------------------------------
# optimizer


def make_optimizer(opt) -> optax.GradientTransformation:
    """optax with the same hyperparameters torch.optim gets (torch_impl.steps.make_optimizer)."""
    if opt.name == "sgd":
        # torch.optim.SGD's weight decay is coupled (added to the gradient before momentum)
        return optax.chain(
            optax.add_decayed_weights(opt.weight_decay) if opt.weight_decay else optax.identity(),
            optax.sgd(opt.lr, momentum=opt.momentum or None),
        )
    if opt.name == "adamw":
        return optax.adamw(opt.lr, b1=opt.beta1, b2=opt.beta2, eps=opt.eps, weight_decay=opt.weight_decay)
    raise ValueError(f"optimizer={opt.name!r}: accepted sgd, adamw")


# ---------------------------------------------------------------------------------------------------------------
# trainer


def per_device_bytes(tree) -> int:
    """Bytes of `tree`'s arrays on the device that holds the most of them, from their own shards."""
    held: dict = {}
    for x in jax.tree.leaves(tree):
        for shard in x.addressable_shards:
            held[shard.device] = held.get(shard.device, 0) + shard.data.nbytes
    return max(held.values(), default=0)


class Trainer:
    """One mode on one model: `step(update)` = gradient + apply; the runner only uses this class.

    With a world (parallel=ddp|fsdp, bench.jax_impl.parallel) the same programs run over its mesh, jitted with
    explicit shardings: parameters, frozen state and optimizer state where World.sharding puts them, batches
    split over `data`, scalars replicated. XLA partitions each program and inserts the collectives it needs.
    Every program that evaluates the loss takes the frozen state as its first argument. On one device that
    argument is unused (the loss closes over the frozen state, as it always has) and jit drops it; in a world the
    loss is rebuilt on it (`_on`), since a closed-over array is folded into the program whole, on every device,
    and cannot span processes."""

    def __init__(self, model, step_spec: StepSpec, device=None, world=None):
        self.spec, self.device = step_spec, device or jax.devices()[0]
        self.world = world if world is not None and world.mesh is not None else None  # None: this device alone
        s = step_spec
        trainable = lambda path, x: (
            isinstance(x, nnx.Param) and is_trained(path, x, s.trainable, model.spec.num_layers, s.last_k)
        )
        # Frozen parameters live in `frozen`, closed over by the loss (in a world: passed to it, see _on): no
        # tangent, no gradient, no optimizer state.
        self.graphdef, params, frozen = nnx.split(model, trainable, ...)
        if self.world is None:
            self.params, self.frozen = jax.device_put((params, frozen), self.device)
        else:
            self.params, self.frozen = self.world.place((params, frozen))
        count = lambda t: sum(int(np.prod(x.shape)) for x in jax.tree.leaves(t))
        every_param = (self.params, nnx.filter_state(self.frozen, nnx.Param))
        self.n_trainable, self.n_params = count(self.params), count(every_param)
        self.n_sharded = count([x for x in jax.tree.leaves(every_param) if not x.sharding.is_fully_replicated])
        # Dropout where the estimator trains with it; inference and MeZO run deterministic (as torch_impl).
        estimator = estimators.get(s.mode)
        self.train = estimator.dropout
        self.gather = whole if self.world is None else self.world.gather_whole  # parameters whole, in a program
        self.loss_of, self.trunk = self._loss_fns(self.frozen)
        self.optimizer = make_optimizer(s.optimizer) if estimator.updates else None
        platform = "cuda" if self.device.platform == "gpu" else "cpu"
        self.jacfwd_chunk = jacfwd_chunk_for(s.jacfwd_chunk, "jax", platform)
        # Created by the first update, as torch.optim creates its state lazily: in both frameworks the optimizer
        # state is part of a trial's excess memory, not of its baseline.
        self.opt_state = None
        self.step_count = 0
        self.micro_batches = s.grad_accum  # per update: how often MeZO's perturbation and loss run in a step
        self.keeps_tangent = keeps_tangent(s, "jax")  # jvp: the pass hands its tangent to the update

        # Where the programs' arguments and results live in a world: frozen state, parameters, optimizer state,
        # batches, scalars (on one device, wherever the data is).
        fs = ps = os_ = bs = r = None
        if self.world is not None:
            w = self.world
            fs, ps, bs, r = w.shardings(self.frozen), w.shardings(self.params), w.batch_sharding, w.replicated
            os_ = w.shardings(jax.eval_shape(self.optimizer.init, self.params)) if self.optimizer else None
        self.opt_shardings = os_
        jit = self._jit
        self._step = jit(self._step_fn, (1, 2), (fs, ps, os_, bs, r), (ps, os_, r))
        if s.mode in ("jvp", "mezo"):
            # The step runs as separate jitted calls, the update regenerating the directions from their keys.
            # MeZO: each perturbation donates the parameters, so it overwrites them in place as torch's add_
            # does (inside one jit XLA cannot write theta + eps z over the donated input and holds a second
            # |theta| buffer). jvp: in one program XLA:CPU materialised the regenerated tangent, the estimate and
            # the update of every leaf at once (BERT-base: +126 MiB per layer against the 27 MiB of a layer's
            # tangent); apart, each program holds what it must.
            kept = self.keeps_tangent  # the update reads the pass's tangent (donated: g is written over it)
            self._update = jit(self._seeded_update_fn, (0, 1, 3) if kept else (0, 1), (ps, os_, r, ps if kept else r),
                               (ps, os_))  # fmt: skip
        if s.mode == "mezo":
            self._perturb = jit(lambda p, scale, step: perturb(p, scale, s.seed, step, s.directions, self.gather), (0,),
                                (ps, r, r), ps)  # fmt: skip
            self._loss = jit(self._loss_fn, (), (fs, ps, bs, r), r)
        if s.mode == "jvp":
            self._coeffs = jit(self._coeffs_fn, (), (fs, ps, bs, r), (r, r, ps) if self.keeps_tangent else (r, r))
        self._gradient = jax.jit(self._gradient_program)  # tests and gradient quality: shardings as XLA sees fit
        self._inference = jit(self._inference_fn, (), (fs, ps, bs), r)

    def _jit(self, fn, donate: tuple[int, ...], arguments: tuple, results):
        """jax.jit of one program, the donated arguments written over by its results; in a world with the
        arguments' and results' shardings given (a pytree prefix each)."""
        if self.world is None:
            return jax.jit(fn, donate_argnums=donate)
        return jax.jit(fn, donate_argnums=donate, in_shardings=arguments, out_shardings=results)

    def _loss_fns(self, frozen):
        """(loss_of, trunk) on `frozen`: the loss, and for trainable=head its two halves (jacfwd_gradient)."""
        loss_of = make_loss_fn(self.graphdef, frozen, self.train, self.gather)
        if self.spec.trainable not in HEAD_ONLY:
            return loss_of, None
        return loss_of, make_trunk_head_fns(self.graphdef, frozen, self.train, self.gather)

    def _on(self, frozen) -> Trainer:
        """This trainer computing on `frozen`, a program's argument: itself on one device (the loss closes over
        the frozen state; the argument goes unused and jit drops it), in a world a shallow copy whose loss is
        built on the argument."""
        if self.world is None:
            return self
        on = copy.copy(self)
        on.loss_of, on.trunk = self._loss_fns(frozen)
        return on

    # -- data ------------------------------------------------------------------------------------------------
    def to_device(self, micro_batches):
        """numpy micro-batches -> device arrays (int32 ids); in a world, this process's rows of global arrays."""
        if self.world is not None:
            return self.world.place_batches(micro_batches)
        return jax.device_put([{k: np.asarray(v, np.int32) for k, v in b.items()} for b in micro_batches], self.device)

    def sync(self, value=None) -> None:
        jax.block_until_ready(value if value is not None else self.params)

    def compile(self, micro_batches) -> None:
        """Compile the timed functions ahead of time for these batch shapes. The runner calls this before it
        records the memory baseline, so what the compiler leaves resident (code, caches) is not counted as the
        step's memory; torch_impl's eager trainer has nothing to compile. A step of several programs (jvp: the
        coefficients and the update; MeZO: perturb, loss, update) has them traced one after the other and compiled
        at the same time, on threads (XLA compiles without the GIL). On 2 cores that gains nothing measurable, since
        XLA:CPU compiles each program's kernels on every core already (benchmarks/, 7bc25c2's file); kept for hosts
        with more cores, where the programs' sequential HLO passes (0.2-0.35 s each) can overlap."""
        step, mode, frozen = np.int32(0), self.spec.mode, self.frozen
        self.micro_batches = len(micro_batches)
        opt_state = None if mode == "inference" else jax.eval_shape(self.optimizer.init, self.params)
        lowered = {}
        if mode == "inference":
            lowered["_inference"] = self._inference.lower(frozen, self.params, micro_batches)
        elif mode == "mezo":
            key = dropout_key(self.spec.seed, step)
            lowered["_perturb"] = self._perturb.lower(self.params, 0.0, step)
            lowered["_loss"] = self._loss.lower(frozen, self.params, micro_batches[0], key)
            lowered["_update"] = self._update.lower(self.params, opt_state, np.zeros(1, np.float32), step)
        elif mode == "jvp":
            coeffs = np.zeros(self.spec.num_tangents, np.float32)
            last = self.params if self.keeps_tangent else step  # the kept tangent has the parameters' shapes
            lowered["_coeffs"] = self._coeffs.lower(frozen, self.params, micro_batches, step)
            lowered["_update"] = self._update.lower(self.params, opt_state, coeffs, last)
        else:
            lowered["_step"] = self._step.lower(frozen, self.params, opt_state, micro_batches, step)
        with ThreadPoolExecutor(len(lowered)) as pool:
            for name, program in zip(lowered, pool.map(lambda program: program.compile(), lowered.values())):
                setattr(self, name, program)

    def programs(self) -> list[tuple]:
        """(compiled program, runs per step) for every program one timed step runs, after compile(): what
        bench.jax_impl.parallel reads communication and per-device memory from."""
        mode, m = self.spec.mode, self.micro_batches
        if mode == "inference":
            return [(self._inference, 1)]
        if mode == "mezo":
            return [(self._perturb, 3 * m - 1), (self._loss, 2 * m), (self._update, 1)]  # the last +eps: in _update
        if mode == "jvp":
            return [(self._coeffs, 1), (self._update, 1)]
        return [(self._step, 1)]

    # -- the mode --------------------------------------------------------------------------------------------
    def _gradient_fn(self, params, micro_batches, step, tangents=None):
        s = self.spec
        key = dropout_key(s.seed, step)
        if s.mode == "backprop":
            return params, *backprop_gradient(self.loss_of, params, micro_batches, key)
        if s.mode == "jvp":
            return params, *forward_gradient(
                self.loss_of,
                params,
                micro_batches,
                key,
                num_tangents=s.num_tangents,
                seed=s.seed,
                step=step,
                tangents=tangents,
                kind=s.directions,
                keep=self.keeps_tangent,
            )
        if s.mode == "jacfwd":
            return params, *jacfwd_gradient(
                self.loss_of, params, micro_batches, key, chunk=self.jacfwd_chunk, trunk=self.trunk
            )
        if s.mode == "mezo":
            return spsa_gradient(self.loss_of, params, micro_batches, key, eps=s.mezo_eps, seed=s.seed, step=step,
                                 kind=s.directions)  # fmt: skip
        raise ValueError(f"mode={s.mode!r} has no gradient")

    def _step_fn(self, frozen, params, opt_state, micro_batches, step):
        params, loss, grads = self._on(frozen)._gradient_fn(params, micro_batches, step)
        updates, opt_state = self.optimizer.update(grads, opt_state, params)
        return optax.apply_updates(params, updates), opt_state, loss

    def _coeffs_fn(self, frozen, params, micro_batches, step):
        """jvp: (loss, c) of the forward gradient sum_k c_k v_k, the update regenerating the v_k (keep: also v)."""
        s = self.spec
        return forward_gradient_coeffs(self._on(frozen).loss_of, params, micro_batches, dropout_key(s.seed, step),
                                       num_tangents=s.num_tangents, seed=s.seed, step=step, kind=s.directions,
                                       keep=self.keeps_tangent, gather=self.gather)  # fmt: skip

    def _seeded_update_fn(self, params, opt_state, coeffs, last):
        """Optimizer update with g = sum_k coeffs[k] z_k, the z_k regenerated inside from `last`, the step (XLA fuses
        g into the update), or with jvp_tangent=keep, `last` the pass's own tangent: g = coeffs[0] * last."""
        if not self.keeps_tangent:  # g one layer of a stack at a time; MeZO's last +eps z restored in it
            shift = self.spec.mezo_eps if self.spec.mode == "mezo" else 0.0
            return seeded_update(self.optimizer, params, opt_state, coeffs, self.spec.seed, last, self.spec.directions,
                                 self.gather, shift)  # fmt: skip
        updates, opt_state = self.optimizer.update(tangent_gradient([last], coeffs), opt_state, params)
        return optax.apply_updates(params, updates), opt_state

    def _loss_fn(self, frozen, params, batch, key):
        """MeZO: one forward pass (L+ or L-)."""
        return self._on(frozen).loss_of(params, batch, key)

    def _inference_fn(self, frozen, params, micro_batches):
        key, loss_of = dropout_key(self.spec.seed, 0), self._on(frozen).loss_of
        return sum(loss_of(params, b, key) for b in micro_batches) / len(micro_batches)

    def _gradient_program(self, frozen, params, micro_batches, step, tangents=None):
        return self._on(frozen)._gradient_fn(params, micro_batches, step, tangents)

    def gradient(self, micro_batches, tangents=None):
        """(loss before the update, gradient or estimate over the trainable parameters); for tests and gradient
        quality, not on the timed path. MeZO's perturbation round trip is applied to the parameters here too."""
        step = jnp.int32(self.step_count)
        self.params, loss, grads = self._gradient(self.frozen, self.params, micro_batches, step, tangents)
        return loss, grads

    def _ensure_opt_state(self) -> None:
        if self.opt_state is None:
            shardings = {} if self.world is None else {"out_shardings": self.opt_shardings}
            self.opt_state = jax.jit(self.optimizer.init, **shardings)(self.params)

    def apply(self, grads) -> None:
        self._ensure_opt_state()
        updates, self.opt_state = self.optimizer.update(grads, self.opt_state, self.params)
        self.params = optax.apply_updates(self.params, updates)
        self.step_count += 1

    def step(self, micro_batches):
        if self.spec.mode == "inference":
            return self._inference(self.frozen, self.params, micro_batches)
        self._ensure_opt_state()
        step = np.int32(self.step_count)
        if self.spec.mode == "mezo":
            self.params, loss, proj = spsa_projection(
                lambda p, batch, key: self._loss(self.frozen, p, batch, key),
                lambda p, scale: self._perturb(p, scale, step),
                self.params,
                micro_batches,
                dropout_key(self.spec.seed, step),
                eps=self.spec.mezo_eps,
                restore=False,  # the update restores the last +eps with the z it draws anyway (seeded_update)
            )
            self.params, self.opt_state = self._update(self.params, self.opt_state, jnp.reshape(proj, (1,)), step)
        elif self.spec.mode == "jvp":  # the update redraws the tangent from the step, or reads the kept one
            loss, coeffs, *kept = self._coeffs(self.frozen, self.params, micro_batches, step)
            self.params, self.opt_state = self._update(self.params, self.opt_state, coeffs, *(kept or [step]))
        else:
            args = (self.frozen, self.params, self.opt_state, micro_batches, step)
            self.params, self.opt_state, loss = self._step(*args)
        self.step_count += 1
        return loss

    def state_bytes(self) -> dict[str, int]:
        """Parameters and optimizer state held by one device (the fullest), from the arrays' own shards."""
        return {"params": per_device_bytes((self.params, nnx.filter_state(self.frozen, nnx.Param))),
                "optimizer": per_device_bytes(self.opt_state)}  # fmt: skip

    def weights(self) -> dict[str, np.ndarray]:
        return export_weights(nnx.merge(self.graphdef, self.params, self.frozen))

    # -- after the measurements: accuracy and gradient quality (never on the timed path) ----------------------
    def evaluate(self, micro_batches) -> tuple[float, float]:
        """(mean loss, accuracy) over held-out device batches, dropout off. One compiled program per batch shape."""
        if not hasattr(self, "_eval_batch"):
            graphdef, frozen = self.graphdef, self.frozen

            def eval_batch(params, batch):
                model = nnx.merge(graphdef, params, frozen)
                logits = model(*(batch[k] for k in INPUT_KEYS), deterministic=True, rngs=None).astype(jnp.float32)
                loss = optax.softmax_cross_entropy_with_integer_labels(logits, batch["labels"]).sum()
                return loss, (logits.argmax(-1) == batch["labels"]).sum()

            self._eval_batch = jax.jit(eval_batch)
        loss_sum, correct, n = 0.0, 0, 0
        for b in micro_batches:
            loss, right = self._eval_batch(self.params, b)
            loss_sum, correct, n = loss_sum + float(loss), correct + int(right), n + int(b["labels"].shape[0])
        return loss_sum / n, correct / n

    def gradient_check(self, micro_batches) -> tuple[list[np.ndarray], list[np.ndarray]]:
        """(the mode's gradient estimate, the exact gradient by reverse mode), leaf by leaf as numpy, on the same
        batches at the current weights, dropout off as in torch_impl (the same function for both). The estimate
        goes through the mode's own dispatch (_gradient_fn) over the deterministic loss, on a shallow copy of the
        trainer so the timed step's compiled program and loss are untouched; the weights are not changed."""
        probe = copy.copy(self)
        probe.loss_of = make_loss_fn(self.graphdef, self.frozen, train=False)
        probe.trunk = make_trunk_head_fns(self.graphdef, self.frozen, train=False) if self.trunk else None
        step = jnp.int32(self.step_count)
        # a fresh lambda: a new jit cache entry, traced with probe.loss_of
        _, _, estimate = jax.jit(lambda p, mb, st: probe._gradient_fn(p, mb, st))(self.params, micro_batches, step)
        key = dropout_key(self.spec.seed, step)  # unused by the deterministic loss
        exact = jax.jit(lambda p, mb: backprop_gradient(probe.loss_of, p, mb, key)[1])(self.params, micro_batches)
        leaves = lambda t: [np.asarray(x) for x in jax.tree.leaves(t)]
        return leaves(estimate), leaves(exact)


def make_trainer(
    spec: BertSpec, weights, step_spec: StepSpec, device="cpu", *, attn_implementation: str = "eager", world=None
) -> Trainer:
    """The one way to build a trainer, for the runner and the tests alike (torch_impl.steps.make_trainer mirrors
    it): the model with exactly `weights` on `device` (auto | cpu | cuda, or a jax.Device), fp32 numerics
    ("highest" matmul precision) or step_spec.dtype's bf16, on `world`'s devices (bench.jax_impl.parallel; None:
    this device alone).  attn_implementation: the keyword exists so both read the same."""
    if attn_implementation != "eager":  # the one formula jax has (the eager one)
        raise ValueError(f"attn_implementation={attn_implementation}: torch only; framework=jax accepts eager")
    device = resolve_device(device)
    use_fp32()
    s, remat = step_spec, step_spec.mode == "backprop" and step_spec.remat
    model = build_model(spec, weights, remat=remat, dtype=s.dtype, lora=s.adapters, seed=s.seed,
                        scan_layers=s.scan_layers, stacks=layer_stacks(spec.num_layers, s.trainable, s.last_k))
    return Trainer(model, step_spec, device, world)
