"""PyTorch training steps, one per mode. Mirror image of jax_impl/steps.py: same names, same order.

Every mode is split into a *gradient* (compute, never update) and an *apply* (the optimizer update), so tests can
compare gradients across modes and frameworks, and the runner times `step = gradient + apply`.

    inference  forward only, no autograd state                                    (the memory baseline)
    backprop   loss.backward() over the trainable parameters (remat: per-layer checkpointing)
    jvp        forward gradient (Baydin et al. 2022): K tangents v ~ N(0, I), d_k = grad.v_k by one forward-mode
               pass each, estimate g = 1/K sum_k d_k v_k
    jacfwd     exact gradient by forward mode: vmapped jvp over chunks of the standard basis
    mezo       SPSA (Malladi et al. 2023): in-place seeded perturbation +eps, -2eps, +eps, two forward passes,
               g = (L+ - L-)/(2 eps) z with z regenerated from its seed

Beyond one device (bench/torch_impl/parallel.py): each device computes its rows of the global batch; what the
devices exchange is either their framework's (DDP's gradient all-reduce, FSDP2's all-gathers and reduce-scatters)
or passed in as `reduce` (the mean over devices, identity on one): the loss with any scalars the mode needs (jvp's
K directional derivatives, MeZO's projection) or jacfwd's whole gradient, one exchange per step. The seeded
directions are the same on every device, so every replica takes the same update; under FSDP2 each device draws
the whole direction and keeps the rows of each parameter it holds.

Forward-mode and zeroth-order estimates are sums of seeded random directions, `g = sum_k c_k z_k`. They are never
materialised whole: `SeededGradient` regenerates each tensor's directions when the optimizer reaches that tensor,
so besides the optimizer state at most one parameter tensor of gradient exists at a time (MeZO's memory trick,
applied to forward gradients too). The exception is jvp with one tangent: the tangent had to be whole for the
forward-mode pass, so the update reuses it (`TangentGradient`) rather than paying to draw it again.
"""

from __future__ import annotations

from collections import defaultdict
from contextlib import contextmanager, nullcontext

import numpy as np
import torch
import torch.autograd.forward_ad as fwAD
import torch.nn.functional as F
from torch.func import functional_call, jvp, vmap

from bench import estimators
from bench.spec import HEAD_ONLY, JVP_IMPLS, BertSpec, StepSpec, is_trainable, jacfwd_chunk_for, keeps_tangent
from bench.torch_impl.device import resolve_device, use_fp32
from bench.torch_impl.directions import (
    SeededGradient,
    SeededTangent,
    TangentGradient,
    direction_seed,
    observe,
    perturb,
    sample_tangent,
)
from bench.torch_impl.model import build_model, export_weights, hf_name
from bench.torch_impl.parallel import World, accumulating, like_param, local, sharded

INPUT_KEYS = ("input_ids", "token_type_ids", "attention_mask")


def identity(values):
    """`reduce` on one device: its values are already the whole batch's."""
    return values


# ---------------------------------------------------------------------------------------------------------------
# loss


def loss_fn(model, batch, params=None):
    """Mean cross-entropy of the classifier; `params` (name -> tensor) override the module's own parameters.
    The loss is computed in fp32 whatever the model computes in (bf16: autocast's logits are bf16)."""
    inputs = {k: batch[k] for k in INPUT_KEYS}
    if params is None:
        logits = model(**inputs).logits
    else:
        logits = functional_call(model, params, args=(), kwargs=inputs).logits
    return F.cross_entropy(logits.float(), batch["labels"])  # (B, C) -> scalar


def features(model, batch):
    """The trunk (embeddings + encoder) -> last hidden state (B, T, H): for trainable=head, where it is frozen."""
    return model.bert(**{k: batch[k] for k in INPUT_KEYS}).last_hidden_state


def head_loss(model, hidden, batch, params):
    """The loss from the trunk's output through pooler, dropout and classifier; `params` (HF names) are the
    head's parameters, passed functionally as loss_fn does."""
    sub = lambda prefix: {k.removeprefix(prefix): v for k, v in params.items() if k.startswith(prefix)}
    pooled = functional_call(model.bert.pooler, sub("bert.pooler."), (hidden,))  # (B, H)
    logits = functional_call(model.classifier, sub("classifier."), (model.dropout(pooled),))  # (B, C)
    return F.cross_entropy(logits.float(), batch["labels"])


# ---------------------------------------------------------------------------------------------------------------
# gradients: compute, never update


def backprop_gradient(model, params, micro_batches, reduce=identity):
    """Reverse mode: loss.backward() (not torch.func.grad, which keeps more memory alive). Under DDP or FSDP2
    the backward itself exchanges the gradient, in the last micro-batch's backward only."""
    total = 0.0
    for i, batch in enumerate(micro_batches):
        with accumulating(model, skip_sync=i < len(micro_batches) - 1):
            loss = loss_fn(model, batch) / len(micro_batches)
            loss.backward()
        total = total + loss.detach()
    return reduce(total), {n: p.grad for n, p in params.items()}


def directional_derivative(model, params, batch, tangent, impl: str = "func"):
    """(loss, d) with d = grad(loss) . tangent, by one forward-mode pass.

    func   torch.func.jvp over a functional call; params must not require grad (else autograd records the
           whole dual computation for a backward that never comes: the UMass forward-AD study's pathology,
           impl="naive").
    dual   torch.autograd.forward_ad dual tensors (make_dual / unpack_dual): the study's "approach 2".
    naive  func, with params that require grad: reproduces the pathology on purpose.
    lazy   dual tensors made module by module as the forward pass reaches them (lazy_duals): a module's tangent
           is drawn just before it runs and dropped after, so the tangent is never resident whole.
    Only the loss leaves the function (not the logits): nothing else is kept alive.
    """
    if impl in ("func", "naive"):
        loss, d = jvp(lambda p: loss_fn(model, batch, p), (params,), (tangent,))
        return loss.detach(), d.detach()
    if impl == "dual":
        with fwAD.dual_level():
            duals = {n: fwAD.make_dual(p, tangent[n]) for n, p in params.items()}
            primal, d = fwAD.unpack_dual(loss_fn(model, batch, duals))
        return primal, d
    if impl == "lazy":
        # no_grad: nothing here needs a backward pass, and FSDP2 then registers none on the units' outputs (an
        # autograd.Function without a forward-mode rule, which a dual would reach)
        with torch.no_grad(), fwAD.dual_level(), lazy_duals(model, params, tangent):
            primal, d = fwAD.unpack_dual(loss_fn(model, batch))
        return primal, d
    raise ValueError(f"jvp_impl={impl!r}: accepted {', '.join(JVP_IMPLS)}")


@contextmanager
def lazy_duals(model, params: dict[str, torch.Tensor], tangent):
    """Within a dual_level: each module owning parameters of `params` swaps them for dual tensors (parameter,
    tangent[name]) in a forward pre-hook and back in a forward hook. Forward mode keeps no graph, so once the
    module has run its tangents are garbage: the pass holds one module's tangent (BERT: at most the word
    embeddings') instead of every layer's.

    The dual is made from the parameter the module holds when it runs: under FSDP2 that is the whole parameter
    its unit's forward pre-hook has just gathered (forward-mode AD through FSDP2's sharded DTensors fails in
    torch, through the gathered plain tensor it works), so the forward gradient runs under fsdp too."""
    owned = defaultdict(list)
    for prefix, module in model.named_modules():
        for attr, _ in module.named_parameters(recurse=False):
            name = f"{prefix}.{attr}" if prefix else attr
            if name in params:
                owned[module].append((attr, name))
    held: dict = {}  # (module, attr) -> the parameter the module held before its dual

    def swap_in(module, args):
        for attr, name in owned[module]:
            held[module, attr] = current = module._parameters[attr]
            module._parameters[attr] = fwAD.make_dual(current, tangent[name])

    def swap_out(module, args, output=None):
        for attr, _ in owned[module]:
            module._parameters[attr] = held.pop((module, attr), module._parameters[attr])

    handles = [h for m in owned for h in (m.register_forward_pre_hook(swap_in), m.register_forward_hook(swap_out))]
    try:
        yield
    finally:
        for h in handles:
            h.remove()
        for module in owned:  # an exception mid-pass must not leave a dual behind
            swap_out(module, ())


def forward_gradient(
    model, params, micro_batches, *, num_tangents, seed, step, impl="func", tangents=None, reduce=identity,
    kind="gaussian", keep=False,
):
    """Forward gradient: K tangents looped (memory does not grow with K); each tangent is dropped after its pass
    and regenerated from its seed when the update needs it. `keep` (one tangent, spec.keeps_tangent): it is kept
    for the update instead, drawn once: func's pass holds it whole anyway (the step's peak), and regenerating n
    normals with torch's CPU generator costs ~15% of a MiniLM step. impl="lazy" never holds a tangent whole.
    `reduce` averages [loss, d_1..d_K] over devices: the step's one exchange."""
    if tangents is not None:
        K = len(tangents)
        losses, ds = zip(*(_dir_deriv(model, params, micro_batches, v, impl) for v in tangents))
        loss, *ds = reduce(torch.stack([losses[0], *ds]))
        return loss, TangentGradient(tangents, [float(d) / K for d in ds])
    if keep:
        v = sample_tangent(params, seed, step, 0, kind)
        loss, d = reduce(torch.stack(_dir_deriv(model, params, micro_batches, v, impl)))
        return loss, TangentGradient([v], [float(d)], in_place=True)
    loss, coeffs = forward_gradient_coeffs(model, params, micro_batches, num_tangents=num_tangents, seed=seed,
                                           step=step, impl=impl, reduce=reduce, kind=kind)  # fmt: skip
    return loss, SeededGradient(params, coeffs, seed, step, kind)


def _dir_deriv(model, params, micro_batches, v, impl):
    loss, d = 0.0, 0.0
    for batch in micro_batches:  # grad of the mean loss = mean of the micro-batch grads
        l_b, d_b = directional_derivative(model, params, batch, v, impl)
        loss, d = loss + l_b / len(micro_batches), d + d_b / len(micro_batches)
    return loss, d


def forward_gradient_coeffs(model, params, micro_batches, *, num_tangents, seed, step, impl="func", reduce=identity,
                            kind="gaussian"):  # fmt: skip
    """(loss, c) with c_k = (grad . v_k) / K for the K seeded tangents: the forward gradient is sum_k c_k v_k,
    built by `SeededGradient` where the update needs it. Each tangent is dropped after its pass (lazy: drawn
    tensor by tensor as the pass reaches it, never whole). `reduce` averages [loss, d_1..d_K] over devices."""
    loss, ds = 0.0, []
    for k in range(num_tangents):
        lazy = impl == "lazy"
        v = SeededTangent(params, seed, step, k, kind) if lazy else sample_tangent(params, seed, step, k, kind)
        l_k, d_k = _dir_deriv(model, params, micro_batches, v, impl)
        del v  # before the next tangent is drawn: one resident at a time
        loss = l_k if k == 0 else loss
        ds.append(d_k)
    loss, *ds = reduce(torch.stack([loss, *ds]))
    return loss, [float(d) / num_tangents for d in ds]


def jacfwd_gradient(
    model, params, micro_batches, *, chunk: int, seed: int, step: int, trunk: bool = False, reduce=identity
):
    """Exact gradient by forward mode: d(loss)/d(theta_i) for every basis direction e_i of the flattened trainable
    parameters, `chunk` directions per vmapped jvp. ceil(n / chunk) forward passes; the (chunk, n) basis block is
    the method's memory cost. Every chunk replays the same dropout masks (forked RNG, same seed), so all
    directions differentiate the same function, as jax.jvp does with one key.

    `trunk` when nothing before the head is trainable (trainable=head): the trunk has no tangent, so it runs once
    per batch outside the basis loop and only the head is pushed forward (jax_impl does the same split).
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
        if trunk:
            with torch.random.fork_rng(devices=devices):
                torch.manual_seed(direction_seed(seed, step, 0, 1))
                hidden = features(model, batch)  # (B, T, H), once
            f = lambda p, batch=batch, hidden=hidden: head_loss(model, hidden, batch, p)
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


@torch.no_grad()
def spsa_gradient(model, params, micro_batches, *, eps: float, seed: int, step: int, reduce=identity,
                  kind: str = "gaussian", restore: bool = True):  # fmt: skip
    """MeZO: projected gradient (L(theta + eps z) - L(theta - eps z)) / (2 eps) along one seeded z, two forward
    passes with in-place perturbations +eps, -2eps, +eps. Returns the mean of L+ and L- as the step's loss.
    `reduce` averages [loss, projection] over devices (each device's L+ - L- taken first: the cancellation loses
    no more than on one device). restore=False: the last +eps is left to the estimate, which restores each tensor
    with the z it draws anyway when the update reaches it (SeededGradient's shift): one draw of z fewer."""
    proj, total = 0.0, 0.0
    for n, batch in enumerate(micro_batches):
        perturb(params, +eps, seed, step, kind)
        loss_plus = loss_fn(model, batch)
        perturb(params, -2 * eps, seed, step, kind)
        loss_minus = loss_fn(model, batch)
        if restore or n < len(micro_batches) - 1:
            perturb(params, +eps, seed, step, kind)
        proj = proj + (loss_plus - loss_minus) / (2 * eps) / len(micro_batches)
        total = total + (loss_plus + loss_minus) / 2 / len(micro_batches)
    total, proj = reduce(torch.stack([total, proj]))
    return total, SeededGradient(params, [float(proj)], seed, step, kind, shift=0.0 if restore else eps)


# ---------------------------------------------------------------------------------------------------------------
# optimizer


def make_optimizer(params: dict[str, torch.Tensor], opt) -> torch.optim.Optimizer:
    """torch.optim with the same hyperparameters optax gets (jax_impl.steps.make_optimizer)."""
    ps = list(params.values())
    if opt.name == "sgd":
        return torch.optim.SGD(ps, lr=opt.lr, momentum=opt.momentum, weight_decay=opt.weight_decay)
    if opt.name == "adamw":
        return torch.optim.AdamW(
            ps, lr=opt.lr, betas=(opt.beta1, opt.beta2), eps=opt.eps, weight_decay=opt.weight_decay
        )
    raise ValueError(f"optimizer={opt.name!r}: accepted sgd, adamw")


# ---------------------------------------------------------------------------------------------------------------
# trainer


class Trainer:
    """One mode on one model: `step(update)` = gradient + apply; the runner only uses this class."""

    def __init__(self, model, step_spec: StepSpec, device: str | torch.device = "cpu", world: World | None = None):
        self.model, self.spec, self.device = model, step_spec, torch.device(device)
        s = step_spec
        num_layers = model.config.num_hidden_layers
        trainable = [n for n, _ in model.named_parameters() if is_trainable(hf_name(n), s.trainable, num_layers,
                                                                            s.last_k)]  # fmt: skip
        # Only a backward pass (and the naive jvp) needs autograd to track anything. Everything else runs with every
        # parameter detached, so no graph is ever recorded (frozen parameters never get a gradient either way).
        estimator = estimators.get(s.mode)
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
        if s.mode == "backprop" and s.remat:
            # per-encoder-layer activation checkpointing; non-reentrant is the recommended implementation
            # (transformers 5 renamed the method; 4.x has only the old name)
            if hasattr(model, "activation_checkpointing_enable"):
                model.activation_checkpointing_enable(activation_checkpointing_kwargs={"use_reentrant": False})
            else:
                model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
        if s.compile:  # torch.compile, in place: each call of the module runs inductor's graph (docs/speed.md)
            model.compile()
        # Beyond one device: `module` is what the forward pass runs (DDP around the model for backprop under
        # parallel=ddp; FSDP2 shards the model in place, its parameters becoming DTensors), and `reduce` what the
        # modes exchange (bench/torch_impl/parallel.py). On one device: the model, and nothing to exchange.
        self.module = model if world is None else world.distribute(model, backward=s.mode == "backprop")
        self.reduce = identity if world is None else world.all_reduce_mean
        named = dict(model.named_parameters())  # after sharding: the parameters the optimizer must see
        self.params = {n: named[n] for n in trainable}
        self.n_params = sum(p.numel() for p in named.values())
        self.n_trainable = sum(p.numel() for p in self.params.values())
        self.n_sharded = sum(p.numel() for p in named.values() if sharded(p))
        self.optimizer = make_optimizer(self.params, s.optimizer) if estimator.updates else None
        self.jacfwd_chunk = jacfwd_chunk_for(s.jacfwd_chunk, "torch", self.device.type)
        self.step_count = 0

    # -- data ------------------------------------------------------------------------------------------------
    def to_device(self, micro_batches):
        """numpy micro-batches -> device tensors (ids as int64, as HF expects)."""
        return [{k: torch.from_numpy(v).long().to(self.device) for k, v in b.items()} for b in micro_batches]

    def sync(self, value=None) -> None:
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)

    def compile(self, micro_batches) -> None:
        """Nothing to compile: the eager model runs as is (jax_impl compiles its step here, ahead of time)."""

    # -- the mode --------------------------------------------------------------------------------------------
    def gradient(self, micro_batches, tangents=None):
        """(loss before the update, gradient or estimate over the trainable parameters)."""
        return self._gradient(micro_batches, tangents)

    def _gradient(self, micro_batches, tangents=None, restore: bool = True):
        """gradient(); restore=False (the timed step): MeZO leaves its last +eps z to the estimate's application
        (spsa_gradient), as jax_impl's step leaves it to its update program."""
        s, step, model, reduce = self.spec, self.step_count, self.module, self.reduce
        if s.mode == "backprop":
            return backprop_gradient(model, self.params, micro_batches, reduce)
        if s.mode == "jvp":
            return forward_gradient(
                model,
                self.params,
                micro_batches,
                num_tangents=s.num_tangents,
                seed=s.seed,
                step=step,
                impl=s.jvp_impl,
                tangents=tangents,
                reduce=reduce,
                kind=s.directions,
                keep=keeps_tangent(s, "torch"),
            )
        if s.mode == "jacfwd":  # trainable=head runs the trunk and the head apart, outside model.forward
            with self.autocast():
                return jacfwd_gradient(model, self.params, micro_batches, chunk=self.jacfwd_chunk, seed=s.seed,
                                       step=step, trunk=s.trainable in HEAD_ONLY, reduce=reduce)  # fmt: skip
        if s.mode == "mezo":
            return spsa_gradient(model, self.params, micro_batches, eps=s.mezo_eps, seed=s.seed, step=step,
                                 reduce=reduce, kind=s.directions, restore=restore)  # fmt: skip
        raise ValueError(f"mode={s.mode!r} has no gradient")

    def apply(self, grads) -> None:
        """Optimizer update. Lazy estimates are applied tensor by tensor: torch.optim skips parameters whose
        .grad is None, so one step per tensor updates that tensor alone and frees its gradient at once."""
        if isinstance(grads, (SeededGradient, TangentGradient)):
            for name, g in grads:
                p = self.params[name]
                p.grad = like_param(g, p)
                self.optimizer.step()
                p.grad = None
        else:
            for name, g in grads.items():
                self.params[name].grad = g
            self.optimizer.step()
            self.optimizer.zero_grad(set_to_none=True)
        self.step_count += 1

    def step(self, micro_batches):
        if self.spec.mode == "inference":
            with torch.inference_mode():
                return self.reduce(sum(loss_fn(self.module, b) for b in micro_batches) / len(micro_batches))
        loss, grads = self._gradient(micro_batches, restore=False)
        self.apply(grads)
        return loss

    def weights(self) -> dict[str, np.ndarray]:
        return export_weights(self.model)  # FSDP2: a collective, every rank calls it

    def state_bytes(self) -> dict[str, int]:
        """Parameters and optimizer state held by this process's device, from the tensors themselves."""
        nbytes = lambda ts: sum(local(t).numel() * local(t).element_size() for t in ts)  # FSDP2: this shard
        states = [] if self.optimizer is None else self.optimizer.state.values()
        return {"params": nbytes(self.model.parameters()),
                "optimizer": nbytes(v for st in states for v in st.values() if torch.is_tensor(v))}  # fmt: skip

    # -- after the measurements: accuracy and gradient quality (never on the timed path) ----------------------
    def evaluate(self, micro_batches) -> tuple[float, float]:
        """(mean loss, accuracy) over held-out device batches, dropout off; the module's mode is restored."""
        was_training = self.model.training
        self.model.eval()
        loss_sum, correct, n = 0.0, 0, 0
        try:
            with torch.inference_mode():
                for b in micro_batches:
                    logits = self.model(**{k: b[k] for k in INPUT_KEYS}).logits.float()  # (B, C)
                    loss_sum += float(F.cross_entropy(logits, b["labels"], reduction="sum"))
                    correct += int((logits.argmax(-1) == b["labels"]).sum())
                    n += len(b["labels"])
        finally:
            self.model.train(was_training)
        return loss_sum / n, correct / n

    def gradient_check(self, micro_batches) -> tuple[list[np.ndarray], list[np.ndarray]]:
        """(the mode's gradient estimate, the exact gradient by reverse mode), tensor by tensor as numpy, on the
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
            est = est.materialize() if isinstance(est, (SeededGradient, TangentGradient)) else est
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
    spec: BertSpec, weights, step_spec: StepSpec, device="cpu", *, attn_implementation: str = "eager", world=None
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
    model = build_model(spec, weights, device, attn_implementation, step_spec.adapters, step_spec.seed)
    if step_spec.dtype == "bf16_pure":
        model = model.to(torch.bfloat16)
    return Trainer(model, step_spec, device, world)
