"""What each way of differentiating should cost in memory, on paper: one framework-neutral model from the shapes.

A trial's memory is split into the categories both frameworks report (bench/<framework>_impl/memory.py measures
them; docs/memory.md has the formulas with their derivation):

    params      every parameter (trainable + frozen): resident before the step, part of the baseline
    grads       gradient buffers the optimizer reads (backprop: 4n; jacfwd: its 4n exchange buffer; the seeded
                estimates of jvp and MeZO are built in the direction's own buffer, so they count as directions)
    optimizer   optimizer state (SGD with momentum: 4n; AdamW: 8n), created by the first update: in the excess;
                with it, what an estimator keeps across steps (HiZOO's Hessian estimate, 4n)
    directions  random directions / tangents resident at once (jvp: one whole tangent, 4n, in torch; one
                parameter tensor's with jvp.impl=lazy, and in MeZO; in JAX's jvp about the largest tensor's and one
                layer's; jacfwd: the (chunk, n) basis block)
    saved       activations kept for a backward pass (zero for every mode without one)
    temp        transient working memory of the computation itself (a layer's live intermediates)

and `excess`, what the step adds over the baseline at its peak: the optimizer state plus every category of the step,
summed. Summed even where a category is freed before another peaks (backprop frees a layer's saved activations as it
makes that layer's gradients; MeZO draws its direction between its forward passes), because the memory freed is of
other sizes than what comes next: XLA's buffer assignment for backprop holds both (BERT-base, 4 layers: a 491 MiB
program for 201 MiB of gradients and ~290 of activations), and on the CPU the heap keeps what was freed in pieces
the next buffers do not fit. Measured on the CPU, the sum is within 10 % where the max would miss by 40 %.

Shapes: B x T tokens per device micro-batch, H hidden, I intermediate, A heads, L layers, V vocabulary, n
trainable parameters; 4 bytes per fp32 number (dtype=bf16: 2 per activation, with fp32 parameters, gradients and
optimizer state and bf16 copies of the weights; bf16_pure: 2 for everything); masks of m bytes (torch's dropout
on CPU multiplies by a float mask, m = 4; JAX and torch on CUDA keep a bool mask, m = 1).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

import numpy as np

from bench import estimators, models
from bench.estimators.base import MemoryContext
from bench.spec import StepSpec, draw_units

FP32 = 4


@dataclass(frozen=True)
class Memory:
    """Bytes per category on one device (see the module docstring), and the step's predicted excess."""

    params: int
    grads: int
    optimizer: int
    directions: int
    saved: int
    temp: int
    excess: int

    def mib(self) -> dict[str, float]:
        return {k: v / 2**20 for k, v in asdict(self).items()}


def mask_bytes(framework: str, device: str) -> int:
    """Bytes per element of a dropout mask kept for the backward pass: torch's CPU dropout keeps a float mask."""
    return FP32 if (framework, device) == ("torch", "cpu") else 1


def predict(
    spec,
    s: StepSpec,
    batch_size: int,
    seq_len: int,
    *,
    framework: str,
    device: str = "cpu",
    world: int = 1,
    sharded: bool = False,
) -> Memory | None:
    """The model's bytes per category on one device, for a step of `s` on a `batch_size` x `seq_len` micro-batch;
    `sharded`: parameters, gradients and optimizer state split over `world` devices (parallel=fsdp).

    One set of formulas; where the frameworks keep different buffers for the same maths, `framework` and `device`
    say which (each such fact is named where it is used): the dropout mask's bytes, and how a forward-mode pass
    holds its tangent (torch's make_dual copies each tangent onto its parameter; XLA draws each where it is used).
    The mode's own categories are its estimator's terms (bench/estimators/); None where it has none."""
    family = models.of(spec)
    if "memory" not in family.MODELLED:  # a family without its terms: its cells stay empty
        return None
    estimator = estimators.get(s.mode)
    mask = mask_bytes(framework, device)
    # bytes of a parameter (and of its gradient, direction and optimizer moments) and of an activation
    P = 2 if s.dtype == "bf16_pure" else FP32
    X = 2 if s.dtype in ("bf16", "bf16_pure") else FP32
    L, tokens = spec.num_layers, batch_size * seq_len
    shapes = family.param_shapes(spec, s.adapters)  # trainable=lora: the adapters too
    trainable = {k: v for k, v in shapes.items() if family.is_trainable(k, s.trainable, L, s.last_k)}
    n = sum(int(np.prod(v)) for v in trainable.values())
    n_all = sum(int(np.prod(v)) for v in shapes.values())
    largest = max((int(np.prod(v)) for v in trainable.values()), default=0) * P
    sizes = [int(np.prod(v)) for v in trainable.values()]
    unit = max((sum(sizes[i] for i in r) for r in draw_units(sizes)), default=0) * P
    layer_params = sum(int(np.prod(v)) for k, v in trainable.items() if family.SCOPES.layer_of(k) == 0)
    share = world if sharded else 1

    # activations per token, the family's (dropout where the estimator trains with it)
    act = family.activations(spec, s, seq_len, X=X, mask=mask, dropout=estimator.dropout, framework=framework)
    trained_layers = {"all": L, "bias": L, "lora": L, "last_k": min(s.last_k, L), "head": 0, "classifier": 0}[
        s.trainable
    ]
    # bf16 copies of the Linear weights (not the embedding tables'), which autocast keeps for a backward pass
    linear = sum(int(np.prod(v)) for k, v in trainable.items() if len(v) == 2 and not k.startswith(family.EMBEDDINGS))

    opt = s.optimizer
    state = {"adamw": 2 * P * n, "sgd": P * n if opt.momentum else 0, "signsgd": 0}[opt.name]
    optimizer = state // share if estimator.updates else 0
    params = P * n_all // share
    context = MemoryContext(
        step=s,
        framework=framework,
        param_bytes=P,
        activation_bytes=X,
        hidden=spec.hidden_size,
        batch_size=batch_size,
        n=n,
        share=share,
        largest=largest,
        unit=unit,
        layer_params=layer_params,
        forward_temp=tokens * act.forward_temp,
        one_layer=tokens * act.layer * bool(trained_layers),
        saved=tokens * (trained_layers * act.layer + act.embeddings + act.head),
        layer_inputs=tokens * (trained_layers * act.layer_input + act.embeddings + act.head),
        bf16_weight_copies=2 * linear // share,
    )
    terms = estimator.memory(context)
    if terms is None:
        return None
    grads, directions, saved, temp = terms.grads, terms.directions, terms.saved, terms.temp
    optimizer += terms.state  # kept across steps and made by the first, as the optimizer's own state
    return Memory(params, grads, optimizer, directions, saved, temp, optimizer + grads + directions + saved + temp)
