"""jvp in torch: the forward gradient (Baydin et al. 2022), K seeded tangents v_k, d_k = grad . v_k by one
forward-mode pass each, the estimate g = 1/K sum_k d_k v_k. Mirror of jax_impl/estimators/jvp.py.

The estimate is never materialised whole: `SeededGradient` regenerates a unit of the directions (directions.py)
when the optimizer reaches it, so besides the optimizer state at most one unit of gradient exists at a time (MeZO's
memory trick, applied to forward gradients). The exception is one kept tangent: it had to be whole for the
forward-mode pass, so the update reuses it (`TangentGradient`), scaled in place a unit at a time, rather than
paying to draw it again.
"""

from __future__ import annotations

from collections import defaultdict
from contextlib import contextmanager
from functools import partial

import torch
import torch.autograd.forward_ad as fwAD
import torch.nn.functional as F
from torch.func import jvp

from bench.estimators.jvp import IMPLS, keeps_tangent
from bench.torch_impl.directions import SeededGradient, SeededTangent, TangentGradient, draw_direction, units_of
from bench.torch_impl.loss import identity, loss_fn

# The passes built on forward_ad's dual tensors, where torch runs the model's own modules (func's torch.func.jvp
# wraps every op in functorch's interpreter instead, and a custom rule costs it more than it saves)
DUAL_PASSES = ("dual", "lazy")


def prepare(trainer) -> None:
    if trainer.estimator.settings_of(trainer.spec).impl in DUAL_PASSES:
        with_layer_norm_rule(trainer.model)


def with_layer_norm_rule(model) -> None:
    """Every nn.LayerNorm of `model` computes its forward as before (F.layer_norm) and its tangent by
    LayerNormJvp's rule: torch's own forward-mode rule for layer norm runs a Python decomposition (torch._refs), the
    most host time of a dual pass at small shapes (docs/time.md)."""
    for m in model.modules():
        if isinstance(m, torch.nn.LayerNorm):
            m.forward = partial(_layer_norm, m)


def _layer_norm(m, x):
    return LayerNormJvp.apply(x, m.weight, m.bias, tuple(m.normalized_shape), m.eps)


class LayerNormJvp(torch.autograd.Function):
    """Layer norm whose tangent is computed by native ops: with x^ = (x - mean) / std over the normalized dims,
    d(x^ w + b) = (dx - mean(dx) - x^ mean(dx x^)) w / std + x^ dw + db. Its backward is torch's own kernel, for
    the reverse passes the same model still runs (the gradient a run's cosine is measured against)."""

    @staticmethod
    def forward(x, weight, bias, shape, eps):
        return F.layer_norm(x, shape, weight, bias, eps)

    @staticmethod
    def setup_context(ctx, inputs, output):
        x, weight, bias, shape, eps = inputs
        ctx.save_for_forward(x, weight)
        ctx.save_for_backward(x, weight, bias)
        ctx.shape, ctx.dims, ctx.eps, ctx.dtype = shape, tuple(range(-len(shape), 0)), eps, output.dtype

    @staticmethod
    def backward(ctx, grad):
        x, w, b = ctx.saved_tensors
        x = x.to(ctx.dtype)
        var, mean = torch.var_mean(x, ctx.dims, keepdim=True, correction=0)
        dx, dw, db = torch.ops.aten.native_layer_norm_backward(
            grad, x, list(ctx.shape), mean, torch.rsqrt(var + ctx.eps), w, b, list(ctx.needs_input_grad[:3])
        )
        return dx, dw, db, None, None

    @staticmethod
    def jvp(ctx, dx, dweight, dbias, _shape, _eps):
        x, w = ctx.saved_tensors
        x = x.to(ctx.dtype)  # under autocast layer norm computes in fp32, and so does its tangent here
        var, mean = torch.var_mean(x, ctx.dims, keepdim=True, correction=0)
        rstd = torch.rsqrt(var + ctx.eps)
        normed = (x - mean) * rstd
        out = None
        if dx is not None:
            dx = dx.to(ctx.dtype)
            centred = dx - dx.mean(ctx.dims, keepdim=True) - normed * (dx * normed).mean(ctx.dims, keepdim=True)
            out = centred * rstd if w is None else centred * (rstd * w)
        if dweight is not None:
            out = normed * dweight if out is None else out.addcmul_(normed, dweight)
        if dbias is not None:
            out = dbias.expand_as(normed).contiguous() if out is None else out.add_(dbias)
        return torch.zeros_like(normed) if out is None else out


def gradient(trainer, micro_batches, tangents=None, in_step=False):
    s, settings = trainer.spec, trainer.estimator.settings_of(trainer.spec)
    return forward_gradient(
        trainer.module,
        trainer.units,
        micro_batches,
        num_tangents=settings.num_tangents,
        seed=s.seed,
        step=trainer.step_count,
        impl=settings.impl,
        tangents=tangents,
        reduce=trainer.reduce,
        kind=s.directions,
        keep=keeps_tangent(s, "torch"),
    )


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
    raise ValueError(f"jvp.impl={impl!r}: accepted {', '.join(IMPLS)}")


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
    model,
    params,
    micro_batches,
    *,
    num_tangents,
    seed,
    step,
    impl="func",
    tangents=None,
    reduce=identity,
    kind="gaussian",
    keep=False,
):
    """Forward gradient: K tangents looped (memory does not grow with K); each tangent is dropped after its pass
    and regenerated from its seed when the update needs it. `keep` (one tangent, keeps_tangent): it is kept
    for the update instead, drawn once: func's pass holds it whole anyway (the step's peak), and regenerating n
    normals with torch's CPU generator is a visible part of a step (docs/speed.md). impl="lazy" never holds a
    tangent whole.
    `reduce` averages [loss, d_1..d_K] over devices: the step's one exchange. `params`: the trainer's Units, or a
    dict of tensors."""
    units = units_of(params)
    params = units.params
    if tangents is not None:
        K = len(tangents)
        losses, ds = zip(*(_dir_deriv(model, params, micro_batches, v, impl) for v in tangents))
        loss, *ds = reduce(torch.stack([losses[0], *ds]))
        return loss, TangentGradient(units, tangents, [float(d) / K for d in ds])
    if keep:
        v = draw_direction(units, seed, step, 0, kind)
        loss, d = reduce(torch.stack(_dir_deriv(model, params, micro_batches, v.tensors, impl)))
        return loss, TangentGradient(units, [v.tensors], [float(d)], kept=v)
    loss, coeffs = forward_gradient_coeffs(
        model,
        units,
        micro_batches,
        num_tangents=num_tangents,
        seed=seed,
        step=step,
        impl=impl,
        reduce=reduce,
        kind=kind,
    )
    return loss, SeededGradient(units, coeffs, seed, step, kind)


def _dir_deriv(model, params, micro_batches, v, impl):
    loss, d = 0.0, 0.0
    for batch in micro_batches:  # grad of the mean loss = mean of the micro-batch grads
        l_b, d_b = directional_derivative(model, params, batch, v, impl)
        loss, d = loss + l_b / len(micro_batches), d + d_b / len(micro_batches)
    return loss, d


def forward_gradient_coeffs(
    model, params, micro_batches, *, num_tangents, seed, step, impl="func", reduce=identity, kind="gaussian"
):
    """(loss, c) with c_k = (grad . v_k) / K for the K seeded tangents: the forward gradient is sum_k c_k v_k,
    built by `SeededGradient` where the update needs it. Each tangent is dropped after its pass (lazy: drawn
    a unit at a time as the pass reaches it, never whole). `reduce` averages [loss, d_1..d_K] over devices."""
    units = units_of(params)
    loss, ds = 0.0, []
    for k in range(num_tangents):
        lazy = impl == "lazy"
        v = SeededTangent(units, seed, step, k, kind) if lazy else draw_direction(units, seed, step, k, kind).tensors
        l_k, d_k = _dir_deriv(model, units.params, micro_batches, v, impl)
        del v  # before the next tangent is drawn: one resident at a time
        loss = l_k if k == 0 else loss
        ds.append(d_k)
    loss, *ds = reduce(torch.stack([loss, *ds]))
    return loss, [float(d) / num_tangents for d in ds]
