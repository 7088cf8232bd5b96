"""The JAX Trainer: one estimator on one model. Mirror image of torch_impl/steps.py: same names, same order.

Every estimator is split into a *gradient* (compute, never update) and an *apply* (the optax update); the gradients
live in bench/jax_impl/estimators/<name>.py (one module per `mode=<name>`), and the Trainer holds the parameters,
the frozen state and the optimizer, and delegates. The runner times `step`: one jitted program doing both, or the
estimator's own split into several (jvp, MeZO: their modules say why), with the parameters and optimizer state
donated so XLA updates them in place as torch does (without donation the old and new parameters would coexist:
+1x parameter memory).

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
from functools import partial
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
import optax
from flax import nnx

from bench import estimators, models
from bench.jax_impl import models as model_modules
from bench.jax_impl.device import cache_counts, cache_status, resolve_device, use_fp32
from bench.jax_impl.estimators import implementation
from bench.jax_impl.estimators.backprop import backprop_gradient
from bench.jax_impl.loss import dropout_key, make_loss_fn, make_trunk_head_fns, whole
from bench.jax_impl.memory import per_device_bytes
from bench.jax_impl.models.common import head_rows, layer_stacks
from bench.spec import HEAD_ONLY, StepSpec

# ---------------------------------------------------------------------------------------------------------------
# optimizer


def make_optimizer(opt) -> optax.GradientTransformation:
    """optax with the same hyperparameters torch.optim gets (torch_impl.steps.make_optimizer), its numeric ones
    values in its state (optax.inject_hyperparams), not constants of the compiled programs: a trial at another
    learning rate, weight decay, momentum or epsilon runs the same programs (the persistent compilation cache's
    hit, docs/speed.md). Static: what changes the program (momentum or weight decay off: no buffer, no term) and
    AdamW's betas, which optax uses as 1 - beta: computed in float32 from a traced beta, in double from a constant
    as torch does, so a traced beta would move AdamW's moments by ~1e-5 relative."""
    if opt.name == "sgd":
        return optax.inject_hyperparams(_sgd)(opt.lr, opt.momentum or None, opt.weight_decay or None)
    if opt.name == "adamw":
        return optax.inject_hyperparams(optax.adamw, static_args=("b1", "b2", "eps_root"))(
            opt.lr, b1=opt.beta1, b2=opt.beta2, eps=opt.eps, weight_decay=opt.weight_decay
        )
    if opt.name == "signsgd":
        return optax.inject_hyperparams(_signsgd)(opt.lr, opt.weight_decay or None)
    raise ValueError(f"optimizer={opt.name!r}: accepted sgd, adamw, signsgd")


def _sgd(learning_rate, momentum, weight_decay) -> optax.GradientTransformation:
    # torch.optim.SGD's weight decay is coupled (added to the gradient before momentum)
    return optax.chain(
        optax.add_decayed_weights(weight_decay) if weight_decay is not None else optax.identity(),
        optax.sgd(learning_rate, momentum=momentum),
    )


def _signsgd(learning_rate, weight_decay) -> optax.GradientTransformation:
    # torch_impl.steps.SignSGD: weight decay coupled, then the elementwise sign (Liu et al. 2019, not ZO-Bench's)
    return optax.chain(
        optax.add_decayed_weights(weight_decay) if weight_decay is not None else optax.identity(),
        optax.sign_sgd(learning_rate),
    )


# optax's names of the injected hyper-parameters -> OptimizerSpec's
INJECTED = {"learning_rate": "lr", "momentum": "momentum", "weight_decay": "weight_decay", "eps": "eps"}


def hyperparams_of(opt, optimizer: optax.GradientTransformation, params) -> dict[str, np.ndarray]:
    """OptimizerSpec `opt`'s injected hyper-parameters, as `optimizer.init` would put them in its state (in the
    parameters' widest float dtype), computed on the host: the program that makes the state takes them as
    arguments (init_with)."""
    like = jax.eval_shape(optimizer.init, params).hyperparams
    return {k: np.asarray(jnp.asarray(getattr(opt, INJECTED[k]), x.dtype)) for k, x in like.items()}


def init_with(optimizer: optax.GradientTransformation, params, hyperparams: dict):
    """optimizer.init with its hyper-parameters given as arguments, not constants: one program at any
    learning rate."""
    return optimizer.init(params)._replace(hyperparams=hyperparams)


# ---------------------------------------------------------------------------------------------------------------
# trainer


class Shardings(NamedTuple):
    """Where a program's arguments and results live in a world (None everywhere on one device: where the data is)."""

    frozen: Any = None
    params: Any = None
    opt: Any = None
    batch: Any = None
    scalar: Any = None


class Trainer:
    """One estimator on one model: `step(update)` = gradient + apply; the runner only uses this class.

    With a world (parallel=ddp|fsdp, bench.jax_impl.parallel) the same programs run over its mesh, jitted with
    explicit shardings: parameters, frozen state and optimizer state where World.sharding puts them, batches
    split over `data`, scalars replicated. XLA partitions each program and inserts the collectives it needs.
    Every program that evaluates the loss takes the frozen state as its first argument. On one device that
    argument is unused (the loss closes over the frozen state, as it always has) and jit drops it; in a world the
    loss is rebuilt on it (`on`), since a closed-over array is folded into the program whole, on every device,
    and cannot span processes."""

    def __init__(self, model, step_spec: StepSpec, device=None, world=None):
        self.device = device or jax.devices()[0]
        self.world = world if world is not None and world.mesh is not None else None  # None: this device alone
        self.estimator, self.impl = estimators.get(step_spec.mode), implementation(step_spec.mode)
        # the estimator's settings resolved for this device (jacfwd.chunk=auto): what its module and the models read
        platform = "cuda" if self.device.platform == "gpu" else "cpu"
        self.spec = s = self.estimator.resolved(step_spec, "jax", platform)
        # the model's family: its parameters' HF names, the batch keys it reads (bench/models/)
        self.family = model_modules.of(model)
        self.inputs = (*models.of(model.spec).INPUT_KEYS, "labels")
        is_trained = self.family.is_trained
        trainable = lambda path, x: (
            isinstance(x, nnx.Param) and is_trained(path, x, s.trainable, model.spec.num_layers, s.last_k)
        )
        # Frozen parameters live in `frozen`, closed over by the loss (in a world: passed to it, see on): no
        # tangent, no gradient, no optimizer state.
        self.graphdef, params, frozen = nnx.split(model, trainable, ...)
        # Both as trees of plain arrays, the model's own Params (nnx.merge rebuilds the Variables from the
        # graphdef): an nnx Variable is a pytree node of its own, flattened and rebuilt in Python at every program
        # call, tensor by tensor, where a tree of arrays is flattened in C++ (docs/speed.md).
        params, frozen = (nnx.State(nnx.to_pure_dict(x)) for x in (params, frozen))
        if self.world is None:
            self.params, self.frozen = jax.device_put((params, frozen), self.device)
        else:
            self.params, self.frozen = self.world.place((params, frozen))
        count = lambda t: sum(int(np.prod(x.shape)) for x in jax.tree.leaves(t))
        every_param = (self.params, self.frozen)
        self.n_trainable, self.n_params = count(self.params), count(every_param)
        self.n_sharded = count([x for x in jax.tree.leaves(every_param) if not x.sharding.is_fully_replicated])
        # Dropout where the estimator trains with it; inference and MeZO run deterministic (as torch_impl).
        self.train = self.estimator.dropout
        self.gather = whole if self.world is None else self.world.gather_whole  # parameters whole, in a program
        self.loss_of, self.trunk = self._loss_fns(self.frozen)
        self.optimizer = make_optimizer(s.optimizer) if self.estimator.updates else None
        # Created by the first update, as torch.optim creates its state lazily: in both frameworks the optimizer
        # state is part of a trial's excess memory, not of its baseline.
        self.opt_state = None
        # The estimator's own state across steps (HiZOO's Hessian estimate), made by the first step that needs it,
        # as the optimizer's is (an argument of the programs that read it, never closed over)
        self.state = None
        self.step_count = 0
        self.compile_cache = None  # compile(): hit | miss | partial | off (device.cache_status)
        # At the head scopes on one device the trunk is frozen: evaluation runs it once per held-out batch and keeps
        # the one row the head reads (the family's HEAD_TOKEN, a few KiB a batch), so looking costs the head alone
        family = models.of(model.spec)
        head = getattr(family, "HEAD_TOKEN", None) if s.trainable in HEAD_ONLY and self.world is None else None
        self.head_token, self.head_keys, self._head_inputs = head, family.HEAD_KEYS, {}
        self.micro_batches = s.grad_accum  # per update: how often MeZO's perturbation and loss run in a step

        sh = Shardings()
        if self.world is not None:
            w = self.world
            opt = w.shardings(jax.eval_shape(self.optimizer.init, self.params)) if self.optimizer else None
            sh = Shardings(w.shardings(self.frozen), w.shardings(self.params), opt, w.batch_sharding, w.replicated)
        if self.optimizer is not None:  # the optimizer state's program, its hyper-parameters arguments
            self.opt_hyperparams = hyperparams_of(s.optimizer, self.optimizer, self.params)
            self._init_opt = self.jit(partial(init_with, self.optimizer), (), (sh.params, sh.scalar), sh.opt)
        # The timed step: the estimator's own programs, or gradient and update fused in one
        self.split = hasattr(self.impl, "step")
        if self.split:
            self.impl.prepare(self, sh)
        else:
            self._step = self.jit(
                self._step_fn,
                (1, 2),
                (sh.frozen, sh.params, sh.opt, sh.batch, sh.scalar),
                (sh.params, sh.opt, sh.scalar),
            )
        self._gradient = jax.jit(self._gradient_program)  # tests and gradient quality: shardings as XLA sees fit

    def jit(self, fn, donate: tuple[int, ...], arguments: tuple, results):
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

    def on(self, frozen, state=None) -> Trainer:
        """This trainer computing on `frozen` (and the estimator's `state`), a program's arguments: a shallow copy
        whose loss is built on the argument and whose state is the argument. Never a loss closed over the trainer's
        own frozen state inside a program: jit would fold every frozen weight into the executable as a constant (a
        copy of the model in each program, and seconds more compiling)."""
        if frozen is self.frozen and state is None:
            return self
        on = copy.copy(self)
        if frozen is not self.frozen:
            on.loss_of, on.trunk = self._loss_fns(frozen)
        if state is not None:
            on.state = state
        return on

    # -- data ------------------------------------------------------------------------------------------------
    def to_device(self, micro_batches):
        """numpy micro-batches -> device arrays (int32 ids); in a world, this process's rows of global arrays."""
        micro_batches = [{k: v for k, v in b.items() if k in self.inputs} for b in micro_batches]  # what it reads
        if self.world is not None:
            return self.world.place_batches(micro_batches)
        return jax.device_put([{k: np.asarray(v, np.int32) for k, v in b.items()} for b in micro_batches], self.device)

    def sync(self, value=None) -> None:
        jax.block_until_ready(value if value is not None else self.params)

    def compile(self, micro_batches) -> None:
        """Compile the timed programs ahead of time for these batch shapes. The runner calls this before it
        records the memory baseline, so what the compiler leaves resident (code, caches) is not counted as the
        step's memory; torch_impl's eager trainer has nothing to compile. A step of several programs has them
        traced one after the other and compiled at the same time, on threads (XLA compiles without the GIL: on
        hosts with more cores than XLA:CPU's kernels use, the programs' sequential HLO passes overlap).
        compile_cache: whether they came from the persistent compilation cache (device.cache_status)."""
        lowered = self.lower(micro_batches)
        before = cache_counts()
        with ThreadPoolExecutor(len(lowered)) as pool:
            for name, program in zip(lowered, pool.map(lambda program: program.compile(), lowered.values())):
                setattr(self, name, program)
        self.compile_cache = cache_status(before, cache_counts())

    def lower(self, micro_batches) -> dict:
        """{attribute: jax.stages.Lowered} of the programs compile() compiles for these batch shapes: the timed
        step's and the optimizer state's (made by the first step). Their text is what a trial compiles, the key of
        the persistent compilation cache (bench.jax_impl.device): the same at any value of the hyper-parameters
        that are the programs' arguments (make_optimizer, the estimators' eps)."""
        self.micro_batches = len(micro_batches)
        if self.split:
            lowered = self.impl.lower(self, micro_batches)
        else:
            opt_state = jax.eval_shape(self.optimizer.init, self.params)
            lowered = {"_step": self._step.lower(self.frozen, self.params, opt_state, micro_batches, np.int32(0))}
        if self.optimizer is not None and self.opt_state is None:  # made by the first step, compiled here
            lowered["_init_opt"] = self._init_opt.lower(self.params, self.opt_hyperparams)
        return lowered

    def programs(self) -> list[tuple]:
        """(compiled program, runs per step) for every program one timed step runs, after compile(): what
        bench.jax_impl.parallel reads communication and per-device memory from."""
        return self.impl.programs(self) if self.split else [(self._step, 1)]

    # -- the estimator ---------------------------------------------------------------------------------------
    def _step_fn(self, frozen, params, opt_state, micro_batches, step):
        params, loss, grads = self.impl.gradient(self.on(frozen), params, micro_batches, step)
        updates, opt_state = self.optimizer.update(grads, opt_state, params)
        return optax.apply_updates(params, updates), opt_state, loss

    def _gradient_program(self, frozen, params, state, micro_batches, step, tangents=None):
        return self.impl.gradient(self.on(frozen, state), params, micro_batches, step, tangents)

    def gradient(self, micro_batches, tangents=None):
        """(loss before the update, gradient or estimate over the trainable parameters); for tests and gradient
        quality, not on the timed path. MeZO's perturbation round trip is applied to the parameters here too."""
        self._ensure_state()
        step = jnp.int32(self.step_count)
        self.params, loss, grads = self._gradient(self.frozen, self.params, self.state, micro_batches, step, tangents)
        return loss, grads

    def _ensure_state(self) -> None:
        if self.state is None and hasattr(self.impl, "init_state"):
            self.state = self.impl.init_state(self)

    def _ensure_opt_state(self) -> None:
        if self.opt_state is None:
            self.opt_state = self._init_opt(self.params, self.opt_hyperparams)

    def apply(self, grads) -> None:
        self._ensure_opt_state()
        updates, self.opt_state = self.optimizer.update(grads, self.opt_state, self.params)
        self.params = optax.apply_updates(self.params, updates)
        self.step_count += 1

    def step(self, micro_batches):
        if self.optimizer is None:  # nothing to update (inference)
            return self.impl.step(self, micro_batches)
        self._ensure_opt_state()
        self._ensure_state()
        if self.split:
            loss = self.impl.step(self, micro_batches)
        else:
            args = (self.frozen, self.params, self.opt_state, micro_batches, np.int32(self.step_count))
            self.params, self.opt_state, loss = self._step(*args)
        self.step_count += 1
        return loss

    def state_bytes(self) -> dict[str, int]:
        """Parameters and optimizer state held by one device (the fullest), from the arrays' own shards; the
        estimator's own state (HiZOO's Hessian estimate) counts with the optimizer's."""
        return {
            "params": per_device_bytes((self.params, self.frozen)),
            "optimizer": per_device_bytes((self.opt_state, self.state)),
        }

    def weights(self) -> dict[str, np.ndarray]:
        return self.family.export_weights(nnx.merge(self.graphdef, self.params, self.frozen))

    # -- after the measurements: accuracy and gradient quality (never on the timed path) ----------------------
    def evaluate(self, micro_batches) -> tuple[float, float]:
        """(mean loss, accuracy) over held-out device batches, dropout off. One compiled program per batch shape:
        the whole model, or at the head scopes the head on the trunk's row kept from the batch's first evaluation
        (the same arithmetic on the same row: the trunk's weights never change)."""
        self._eval_programs()
        loss_sum, correct, n = 0.0, 0, 0
        for b in micro_batches:
            if self.head_token is None:
                loss, right = self._eval_batch(self.params, self.frozen, b)
            else:
                loss, right = self._eval_head(self.params, self.frozen, *self._kept(b), b["labels"])
            loss_sum, correct, n = loss_sum + float(loss), correct + int(right), n + int(b["labels"].shape[0])
        return loss_sum / n, correct / n

    def _kept(self, b) -> tuple[jax.Array, dict]:
        """The head's inputs of held-out batch `b`, from its first evaluation on: (rows, batch keys)."""
        kept = self._head_inputs.get(id(b))
        if kept is None or kept[0] is not b:  # keyed by the batch itself: it stays alive as long as its entry
            kept = self._head_inputs[id(b)] = (b, *self._head_inputs_of(b))
        return kept[1], kept[2]

    def _head_inputs_of(self, b) -> tuple[jax.Array, dict]:
        self._eval_programs()
        return self._eval_rows(self.params, self.frozen, b)

    def _eval_programs(self) -> None:
        """evaluate's programs (jit traces each at its first call): the whole model's scores; the trunk's row the
        head reads; the head's scores on it."""
        if hasattr(self, "_eval_batch"):
            return
        graphdef, head_keys, token = self.graphdef, self.head_keys, self.head_token

        def scored(labels, logits):
            logits = logits.astype(jnp.float32)
            loss = optax.softmax_cross_entropy_with_integer_labels(logits, labels).sum()
            return loss, (logits.argmax(-1) == labels).sum()

        def eval_batch(params, frozen, batch):
            model = nnx.merge(graphdef, params, frozen)
            inputs = {k: v for k, v in batch.items() if k != "labels"}
            return scored(batch["labels"], model(**inputs, deterministic=True, rngs=None))

        def head_inputs(params, frozen, batch):
            model = nnx.merge(graphdef, params, frozen)
            inputs = {k: v for k, v in batch.items() if k != "labels"}
            hidden = model.features(**inputs, deterministic=True, rngs=None)
            return head_rows(token, hidden, batch, model.spec.pad_token_id)

        def eval_head(params, frozen, rows, keys, labels):
            model = nnx.merge(graphdef, params, frozen)
            logits = model.head(rows, **{k: keys[k] for k in head_keys}, deterministic=True, rngs=None)
            return scored(labels, logits)

        self._eval_batch, self._eval_rows, self._eval_head = map(jax.jit, (eval_batch, head_inputs, eval_head))

    def gradient_check(self, micro_batches) -> tuple[list[np.ndarray], list[np.ndarray]]:
        """(the estimator's gradient, the exact gradient by reverse mode), leaf by leaf as numpy, on the same
        batches at the current weights, dropout off as in torch_impl (the same function for both). The estimate
        goes through the estimator's own gradient over the deterministic loss, on a shallow copy of the trainer so
        the timed step's compiled program and loss are untouched; the weights are not changed."""
        probe = copy.copy(self)
        probe.train = False  # its losses, built on each program's frozen argument (on), deterministic
        step = jnp.int32(self.step_count)
        # fresh lambdas: new jit cache entries, traced with probe's losses
        gradient = jax.jit(lambda p, f, mb, st: self.impl.gradient(probe.on(f), p, mb, st))
        _, _, estimate = gradient(self.params, self.frozen, micro_batches, step)
        key = dropout_key(self.spec.seed, step)  # unused by the deterministic loss
        exact = jax.jit(lambda p, f, mb: backprop_gradient(probe.on(f).loss_of, p, mb, key)[1])
        exact = exact(self.params, self.frozen, micro_batches)
        leaves = lambda t: [np.asarray(x) for x in jax.tree.leaves(t)]
        return leaves(estimate), leaves(exact)


def make_trainer(
    spec, weights, step_spec: StepSpec, device="cpu", *, attn_implementation: str = "eager", world=None
) -> Trainer:
    """The one way to build a trainer, for the runner and the tests alike (torch_impl.steps.make_trainer mirrors
    it): the model with exactly `weights` on `device` (auto | cpu | cuda, or a jax.Device), fp32 numerics
    ("highest" matmul precision) or step_spec.dtype's bf16, on `world`'s devices (bench.jax_impl.parallel; None:
    this device alone).  attn_implementation: the keyword exists so both read the same."""
    if attn_implementation != "eager":  # the one formula jax has (the eager one)
        raise ValueError(f"attn_implementation={attn_implementation}: torch only; framework=jax accepts eager")
    device = resolve_device(device)
    use_fp32()
    s, remat = step_spec, estimators.get(step_spec.mode).backward and step_spec.remat
    model = models.implementation("jax", spec).build_model(  # the model's family (bench/jax_impl/models/)
        spec,
        weights,
        remat=remat,
        dtype=s.dtype,
        lora=s.adapters,
        seed=s.seed,
        scan_layers=s.scan_layers,
        stacks=layer_stacks(spec.num_layers, s.trainable, s.last_k),
    )
    return Trainer(model, step_spec, device, world)
