"""Beyond one device, framework-neutral: the strategies, what each framework supports, how a trial's global batch
is split over devices, how many processes a trial is, and how many bytes each way of differentiating should
exchange per step. The engines are each framework's own (bench/torch_impl/parallel.py: torch.distributed, DDP and
FSDP2; bench/jax_impl/parallel.py: a Mesh, NamedShardings, jax.distributed); nothing here imports them.

    parallel=none   one device (devices must be 1)
    parallel=ddp    data parallel: parameters replicated, the global batch split over devices
    parallel=fsdp   fully sharded data parallel: parameters (and gradients, optimizer state) sharded too;
                    fsdp_reshard_after_forward=false (SHARD_GRAD_OP) keeps the gathered parameters from the forward
                    for the backward pass, so in modes without one (inference, jvp, MeZO) it is FULL_SHARD

`devices` is the number of devices per node, `nodes` the number of nodes: world_size = devices x nodes. The trial's
`batch_size` is the per-device micro-batch; a step's global batch is exactly the single-device batch of size
batch_size x world_size, the same examples in the same order, device d taking rows [d*B, (d+1)*B) of it. So a
data-parallel trial and a single-device trial of the global batch compute the same loss, step by step.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np

from bench import estimators, models
from bench.config import BenchConfig, model_spec, step_spec
from bench.estimators.base import CommContext
from bench.spec import Batch

STRATEGIES = ("none", "ddp", "fsdp")
FP32_BYTES = 4


def world_size(cfg: BenchConfig) -> int:
    return cfg.devices * cfg.nodes


def global_batch_size(cfg: BenchConfig) -> int:
    return cfg.batch_size * world_size(cfg)


def timed_steps(cfg: BenchConfig) -> int:
    """How many timed steps a trial runs (at most): `steps`; with `epochs` set, that many passes over
    data.num_train (in global batches: batch_size x every device); with a target, its step cap less the warm-up."""
    if cfg.target.metric is not None:
        return cfg.target.max_steps - cfg.warmup_steps
    if cfg.epochs is None:
        return cfg.steps
    return cfg.epochs * (cfg.data.num_train // global_batch_size(cfg)) // cfg.grad_accum


def shard_rows(batch: Batch, index: int, count: int) -> Batch:
    """Rows [index*B, (index+1)*B) of a global batch of count*B rows: what device `index` of `count` feeds."""
    b = len(batch["labels"]) // count
    return {k: np.ascontiguousarray(v[index * b : (index + 1) * b]) for k, v in batch.items()}


def shard_batches(micro_batches: Sequence[Batch], index: int, count: int) -> list[Batch]:
    return [shard_rows(b, index, count) for b in micro_batches]


def expected_comm_bytes(cfg: BenchConfig, n_trainable: int, n_sharded: int) -> int | None:
    """What the way of differentiating should exchange per step per device, in bytes, by its definition (fp32;
    bf16_pure: 2-byte parameters and gradients, the scalars still fp32):
    the size of each collective's buffer (all-reduce: the tensor; all-gather: the gathered output; reduce-scatter:
    the input), summed over the step. `n_sharded` is how many parameters the strategy shards. Every step also
    all-reduces its loss (4 bytes) so each device reports the global batch's loss.

      ddp   inference 4; backprop 4n + 4 (one all-reduce of the gradient per update); jacfwd 4n + 4;
            jvp 4(K + 1) (the K directional derivatives and the loss); mezo 8 (the loss and the projection)
      fsdp  + an all-gather of the sharded parameters per forward pass, and the gradient reduce-scattered (4n)
            instead of all-reduced. torch (FSDP2) pads each tensor's first axis to a multiple of the devices
            (its gathers and reduce-scatters carry the padding), gathers per forward pass and again in the
            backward pass when parameters are resharded after the forward (FULL_SHARD; with trainable other than
            all its backward reaches fewer units, so this is an upper bound), mezo's two passes twice, jvp once per
            tangent. XLA gathers once per compiled program: the backward pass uses the forward's gathered
            parameters, jvp gathers once for all K tangents, each device draws its tangent whole from the seed (no
            tangent is gathered); mezo's two losses are two programs.
    With grad_accum > 1: torch's DDP and FSDP2 reduce the gradient once per update (no_sync), FSDP2 still gathers
    per micro-batch; JAX exchanges everything per micro-batch. A world of one device exchanges nothing. Measured
    against these (tests/frameworks/test_parallel_*.py): XLA's backprop all-reduces 4(P - T)H bytes less than 4n
    (the position embeddings' rows past seq_len have no gradient, which it knows). Each mode's exchanges are its
    estimator's terms (bench/estimators/); None where it has none."""
    if cfg.parallel == "none" or world_size(cfg) == 1:
        return 0
    ga, torch = cfg.grad_accum, cfg.framework == "torch"
    p = 2 if cfg.dtype == "bf16_pure" else FP32_BYTES  # a parameter's (and its gradient's) bytes
    fsdp = cfg.parallel == "fsdp"
    context = CommContext(
        step=step_spec(cfg),
        framework=cfg.framework,
        parallel=cfg.parallel,
        scalar=FP32_BYTES,  # the loss and the directional derivatives stay fp32 in every dtype
        gather=p * (padded_params(cfg) if torch else n_sharded) if fsdp else 0,
        gradient=p * (padded_params(cfg, trainable=True) if torch and fsdp else n_trainable),
        regathers=torch and fsdp and cfg.fsdp_reshard_after_forward,
    )
    terms = estimators.get(cfg.mode).comm(context)
    if terms is None:
        return None
    per_micro, per_update = terms.per_micro, terms.per_update
    return ga * per_micro + per_update if torch else ga * (per_micro + per_update)


def padded_params(cfg: BenchConfig, trainable: bool = False) -> int:
    """Parameters as FSDP2 gathers them: each tensor's first axis padded up to a multiple of the devices (the
    trainable scope's alone with `trainable`, as its reduce-scatter carries them)."""
    spec = model_spec(cfg.model)
    n = world_size(cfg)
    total = 0
    family = models.of(spec)
    for name, shape in family.param_shapes(spec).items():
        if trainable and not family.is_trainable(name, cfg.trainable, spec.num_layers, cfg.last_k):
            continue
        rows = -(-shape[0] // n) * n
        total += rows * (math.prod(shape) // shape[0])
    return total
