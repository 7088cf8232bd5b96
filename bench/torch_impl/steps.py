"""The PyTorch Trainer: one estimator on one model. Mirror image of jax_impl/steps.py: same names, same order.

Every estimator is split into a *gradient* (compute, never update) and an *apply* (the optimizer update), so tests
can compare gradients across estimators and frameworks, and the runner times `step = gradient + apply`. The
gradients live in bench/torch_impl/estimators/<name>.py (one module per `mode=<name>`); the Trainer holds the
model, the parameters and the optimizer, and delegates.

Beyond one device (bench/torch_impl/parallel.py): each device computes its rows of the global batch; what the
devices exchange is either their framework's (DDP's gradient all-reduce, FSDP2's all-gathers and reduce-scatters)
or passed in as `reduce` (the mean over devices, identity on one): the loss with any scalars the estimator needs
(jvp's K directional derivatives, MeZO's projection) or jacfwd's whole gradient, one exchange per step. The seeded
directions are the same on every device, so every replica takes the same update; under FSDP2 each device draws
the whole direction and keeps the rows of each parameter it holds.
"""

from __future__ import annotations

from contextlib import nullcontext

import numpy as np
import torch
import torch.nn.functional as F

from bench import estimators, models
from bench.spec import HEAD_ONLY, StepSpec
from bench.torch_impl import models as model_modules
from bench.torch_impl.device import resolve_device, use_fp32
from bench.torch_impl.directions import Units, materialize
from bench.torch_impl.estimators import implementation
from bench.torch_impl.estimators.backprop import backprop_gradient
from bench.torch_impl.loss import identity
from bench.torch_impl.models.common import head_rows
from bench.torch_impl.parallel import World, like_param, local, sharded

# ---------------------------------------------------------------------------------------------------------------
# optimizer


def make_optimizer(params: dict[str, torch.Tensor], opt) -> torch.optim.Optimizer:
    """torch.optim with the same hyperparameters optax gets (jax_impl.steps.make_optimizer), its multi-tensor
    (foreach) implementation: one call updates every tensor that has a gradient (torch picks it by itself on CUDA
    only; on the CPU its default is a Python loop over the tensors)."""
    ps = list(params.values())
    if opt.name == "sgd":
        return torch.optim.SGD(ps, lr=opt.lr, momentum=opt.momentum, weight_decay=opt.weight_decay, foreach=True)
    if opt.name == "adamw":
        return torch.optim.AdamW(
            ps, lr=opt.lr, betas=(opt.beta1, opt.beta2), eps=opt.eps, weight_decay=opt.weight_decay, foreach=True
        )
    if opt.name == "signsgd":
        return SignSGD(ps, lr=opt.lr, weight_decay=opt.weight_decay)
    raise ValueError(f"optimizer={opt.name!r}: accepted sgd, adamw, signsgd")


class SignSGD(torch.optim.Optimizer):
    """The elementwise sign of the gradient or its estimate, each entry moved by lr (ZO-SignSGD, Liu et al. 2019,
    "signSGD via Zeroth-Order Oracle"), weight decay coupled as torch.optim.SGD's; no state. Not ZO-Bench's
    ZO-SGD-Sign, which steps along sign(projection) z (docs/estimators.md#references). torch has none; optax's
    sign_sgd after add_decayed_weights is the mirror (jax_impl.steps.make_optimizer)."""

    def __init__(self, params, lr: float, weight_decay: float = 0.0):
        super().__init__(params, {"lr": lr, "weight_decay": weight_decay})

    @torch.no_grad()
    def step(self, closure=None):
        for group in self.param_groups:
            params = [p for p in group["params"] if p.grad is not None]
            if not params:
                continue
            grads = [p.grad for p in params]
            if group["weight_decay"]:
                grads = torch._foreach_add(grads, params, alpha=group["weight_decay"])
            torch._foreach_add_(params, torch._foreach_sign(grads), alpha=-group["lr"])


# ---------------------------------------------------------------------------------------------------------------
# trainer


class Trainer:
    """One estimator on one model: `step(update)` = gradient + apply; the runner only uses this class."""

    def __init__(self, model, step_spec: StepSpec, device: str | torch.device = "cpu", world: World | None = None):
        self.model, self.device = model, torch.device(device)
        self.estimator, self.impl = estimators.get(step_spec.mode), implementation(step_spec.mode)
        # the estimator's settings resolved for this device (jacfwd.chunk=auto): what its module and the models read
        self.spec = s = self.estimator.resolved(step_spec, "torch", self.device.type)
        # the model's family: its parameters' HF names, the batch keys it reads (bench/models/)
        self.family = model_modules.of(model)
        neutral = models.get(model.config.model_type)  # HF's model_type is the family's name
        self.inputs = (*neutral.INPUT_KEYS, "labels")
        is_trainable = neutral.is_trainable
        num_layers = model.config.num_hidden_layers
        trainable = [
            n
            for n, _ in model.named_parameters()
            if is_trainable(self.family.hf_name(n), s.trainable, num_layers, s.last_k)
        ]
        # Only a backward pass (and the naive jvp) needs autograd to track anything. Everything else runs with every
        # parameter detached, so no graph is ever recorded (frozen parameters never get a gradient either way).
        estimator = self.estimator
        track = estimator.records_graph(s)
        for n, p in model.named_parameters():
            p.requires_grad_(track and n in trainable)
        # Dropout where the estimator trains with it; inference and MeZO run the model in eval mode (MeZO's
        # reference implementation does, so that the two perturbed passes see the same function).
        model.train(estimator.dropout)
        # dtype=bf16: torch.autocast around every forward pass (matmuls in bf16 on the fp32 parameters, LayerNorm
        # and softmax in fp32), never around a backward one, as torch's AMP recipe has it; jax_impl's model
        # mirrors the same casts. bf16_pure: the parameters themselves are bf16 (make_trainer).
        self.autocast = nullcontext
        if s.dtype == "bf16":
            self.autocast = lambda: torch.autocast(self.device.type, dtype=torch.bfloat16)
            model.forward = self.autocast()(model.forward)
        if hasattr(self.impl, "prepare"):
            self.impl.prepare(self)
        if s.compile:  # torch.compile, in place: each call of the module runs inductor's graph (docs/speed.md)
            model.compile()
        # Beyond one device: `module` is what the forward pass runs (DDP around the model for a backward pass under
        # parallel=ddp; FSDP2 shards the model in place, its parameters becoming DTensors), and `reduce` what the
        # estimators exchange (bench/torch_impl/parallel.py). On one device: the model, and nothing to exchange.
        self.module = model if world is None else world.distribute(model, backward=estimator.backward)
        self.reduce = identity if world is None else world.all_reduce_mean
        named = dict(model.named_parameters())  # after sharding: the parameters the optimizer must see
        self.params = {n: named[n] for n in trainable}
        self.units = Units(self.params)  # what the seeded directions are drawn and applied by (directions.py)
        self.n_params = sum(p.numel() for p in named.values())
        self.n_trainable = sum(p.numel() for p in self.params.values())
        self.n_sharded = sum(p.numel() for p in named.values() if sharded(p))
        self.optimizer = make_optimizer(self.params, s.optimizer) if estimator.updates else None
        # The estimator's own state across steps (HiZOO's Hessian estimate), made by the first step that needs it,
        # as the optimizer's is: part of a trial's excess memory, not of its baseline
        self.state = None
        self.step_count = 0
        # At the head scopes on one device the trunk is frozen: evaluation runs it once per held-out batch and keeps
        # the one row the head reads (the family's HEAD_TOKEN, a few KiB a batch), so looking costs the head alone
        alone = world is None or world.parallel == "none"
        head = getattr(neutral, "HEAD_TOKEN", None) if s.trainable in HEAD_ONLY and alone else None
        self.head_token, self._head_inputs = head, {}

    # -- data ------------------------------------------------------------------------------------------------
    def to_device(self, micro_batches):
        """numpy micro-batches -> device tensors (ids as int64, as HF expects)."""
        return [
            {k: torch.from_numpy(v).long().to(self.device) for k, v in b.items() if k in self.inputs}
            for b in micro_batches
        ]

    def sync(self, value=None) -> None:
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)

    def compile(self, micro_batches) -> None:
        """Nothing to compile: the eager model runs as is (jax_impl compiles its step here, ahead of time)."""

    # -- the estimator ---------------------------------------------------------------------------------------
    def gradient(self, micro_batches, tangents=None):
        """(loss before the update, gradient or estimate over the trainable parameters)."""
        self._ensure_state()
        return self.impl.gradient(self, micro_batches, tangents)

    def _ensure_state(self) -> None:
        if self.state is None and hasattr(self.impl, "init_state"):
            self.state = self.impl.init_state(self)

    def apply(self, grads) -> None:
        """Optimizer update. A lazy estimate is applied a unit at a time: its parts are the unit's tensors'
        gradients for one optimizer step (torch.optim skips the tensors whose .grad is None), then go, so the
        estimate exists a unit at a time."""
        if not isinstance(grads, dict):  # (unit, parts) drawn a unit at a time (directions.SeededGradient, ...)
            for unit, parts in grads:
                self._step_unit(unit, parts)
                del parts  # before the estimate draws its next unit
        else:
            for name, g in grads.items():
                self.params[name].grad = g
            self.optimizer.step()
            self.optimizer.zero_grad(set_to_none=True)
        self.step_count += 1

    def _step_unit(self, unit, parts) -> None:
        """One optimizer step with `parts` as the gradients of `unit`'s tensors, which keep none after it."""
        for p, g, shape in zip(unit.params, parts, unit.held_shapes):
            p.grad = like_param(g.view(shape), p)
        self.optimizer.step()
        for p in unit.params:
            p.grad = None

    def step(self, micro_batches):
        if hasattr(self.impl, "step"):
            return self.impl.step(self, micro_batches)
        self._ensure_state()
        loss, grads = self.impl.gradient(self, micro_batches, in_step=True)
        self.apply(grads)
        return loss

    def weights(self) -> dict[str, np.ndarray]:
        return self.family.export_weights(self.model)  # FSDP2: a collective, every rank calls it

    def state_bytes(self) -> dict[str, int]:
        """Parameters and optimizer state held by this process's device, from the tensors themselves; the
        estimator's own state (HiZOO's Hessian estimate) counts with the optimizer's."""
        nbytes = lambda ts: sum(local(t).numel() * local(t).element_size() for t in ts)  # FSDP2: this shard
        states = [] if self.optimizer is None else self.optimizer.state.values()
        kept = [] if self.state is None else list(self.state.values())
        return {
            "params": nbytes(self.model.parameters()),
            "optimizer": nbytes([*(v for st in states for v in st.values() if torch.is_tensor(v)), *kept]),
        }

    # -- after the measurements: accuracy and gradient quality (never on the timed path) ----------------------
    def evaluate(self, micro_batches) -> tuple[float, float]:
        """(mean loss, accuracy) over held-out device batches, dropout off; the module's mode is restored."""
        was_training = self.model.training
        self.model.eval()
        loss_sum, correct, n = 0.0, 0, 0
        try:
            with torch.inference_mode():
                for b in micro_batches:
                    logits = self._eval_logits(b).float()  # (B, C)
                    loss_sum += float(F.cross_entropy(logits, b["labels"], reduction="sum"))
                    correct += int((logits.argmax(-1) == b["labels"]).sum())
                    n += len(b["labels"])
        finally:
            self.model.train(was_training)
        return loss_sum / n, correct / n

    def _eval_logits(self, b) -> torch.Tensor:
        """A held-out batch's logits: the whole model, or at the head scopes the head on the trunk's row kept from
        the batch's first evaluation (the same arithmetic on the same row: the trunk's weights never change)."""
        if self.head_token is None:
            return self.model(**{k: v for k, v in b.items() if k != "labels"}).logits
        rows, keys = self._kept(b)
        with self.autocast():
            return self.family.head_logits(self.model, rows, keys, self.params)

    def _kept(self, b) -> tuple[torch.Tensor, dict]:
        """The head's inputs of held-out batch `b`, from its first evaluation on: (rows, batch keys)."""
        kept = self._head_inputs.get(id(b))
        if kept is None or kept[0] is not b:  # keyed by the batch itself: it stays alive as long as its entry
            kept = self._head_inputs[id(b)] = (b, *self._head_inputs_of(b))
        return kept[1], kept[2]

    def _head_inputs_of(self, b) -> tuple[torch.Tensor, dict]:
        with self.autocast():
            hidden = self.family.features(self.model, b)
        return head_rows(self.head_token, hidden, b, self.model.config.pad_token_id)

    def gradient_check(self, micro_batches) -> tuple[list[np.ndarray], list[np.ndarray]]:
        """(the estimator's gradient, the exact gradient by reverse mode), tensor by tensor as numpy, on the
        same batches at the current weights. Dropout is off for both, so both differentiate the same function
        (torch draws fresh masks per forward pass, so with dropout on no two passes would agree). Leaves no .grad
        and the autograd flags as they were; MeZO's perturbation round trip is applied to the weights, as in a step.
        """
        was_training = self.model.training
        tracked = {n: p.requires_grad for n, p in self.params.items()}
        self.model.eval()
        try:
            for p in self.params.values():
                p.grad = None
            _, est = self.gradient(micro_batches)
            est = est if isinstance(est, dict) else materialize(est)
            estimate = [est[n].detach().cpu().numpy().copy() for n in self.params]  # before backward reuses .grad
            del est
            for p in self.params.values():
                p.grad = None
                p.requires_grad_(True)
            _, exact = backprop_gradient(self.model, self.params, micro_batches)
            exact = [exact[n].detach().cpu().numpy().copy() for n in self.params]
        finally:
            for n, p in self.params.items():
                p.grad = None
                p.requires_grad_(tracked[n])
            self.model.train(was_training)
        return estimate, exact


def make_trainer(
    spec, weights, step_spec: StepSpec, device="cpu", *, attn_implementation: str = "eager", world=None
) -> Trainer:
    """The one way to build a trainer, for the runner and the tests alike (jax_impl.steps.make_trainer mirrors
    it): the model with exactly `weights` on `device` (auto | cpu | cuda, or a torch.device), fp32 numerics
    (true fp32: no TF32) or step_spec.dtype's bf16, on `world`'s devices (bench.torch_impl.parallel; None: this
    device alone)."""
    device = resolve_device(device)
    use_fp32()
    # Dropout draws from torch's global generator, which torch seeds at random in each process: seeded from the
    # trial's seed and the rank (each rank its own masks, as one device drawing them for the global batch would).
    torch.manual_seed(int(np.random.SeedSequence([step_spec.seed, world.rank if world else 0]).generate_state(1)[0]))
    build = models.implementation("torch", spec).build_model  # the model's family (bench/torch_impl/models/)
    model = build(spec, weights, device, attn_implementation, step_spec.adapters, step_spec.seed)
    if step_spec.dtype == "bf16_pure":
        model = model.to(torch.bfloat16)
    return Trainer(model, step_spec, device, world)
