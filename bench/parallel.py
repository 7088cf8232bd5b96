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
from dataclasses import fields

import numpy as np

from bench.errors import ConfigError
from bench.spec import Batch, BertSpec, is_trainable, param_shapes

STRATEGIES = ("none", "ddp", "fsdp")
FP32_BYTES = 4

# (framework, parallel) -> the modes it runs, and why the others are refused.
SUPPORTED = {
    ("torch", "ddp"): ("inference", "backprop", "jvp", "jacfwd", "mezo"),
    # forward-mode AD through FSDP2's DTensor parameters fails in torch 2.x (aten._has_same_storage_numel has no
    # sharding strategy): jvp runs with its tangent attached module by module to the parameters each unit has
    # gathered (jvp_impl=lazy); jacfwd's vmapped jvp over the whole parameter set cannot, and is refused
    ("torch", "fsdp"): ("inference", "backprop", "jvp", "mezo"),
    ("jax", "ddp"): ("inference", "backprop", "jvp", "jacfwd", "mezo"),
    ("jax", "fsdp"): ("inference", "backprop", "jvp", "jacfwd", "mezo"),
}
REFUSED_WHY = {
    ("torch", "fsdp", "jacfwd"): "forward-mode AD through FSDP2's sharded (DTensor) parameters is not supported by "
    "torch (aten._has_same_storage_numel has no sharding strategy); use parallel=ddp, or framework=jax",
}


def validate(c: dict) -> None:
    """Raise ConfigError (one line) for a parallel setting this framework or mode cannot run (check_launch: what
    the host and the launcher can)."""
    p, fw, mode = c["parallel"], c["framework"], c["mode"]
    if p not in STRATEGIES:
        raise ConfigError(f"parallel={p}: accepted {' | '.join(STRATEGIES)}")
    for name in ("devices", "nodes"):
        if not isinstance(c[name], int) or isinstance(c[name], bool) or c[name] < 1:
            raise ConfigError(f"{name}={c[name]}: accepted an integer >= 1")
    for name in ("fsdp_reshard_after_forward", "fsdp_offload"):
        if not isinstance(c[name], bool):
            raise ConfigError(f"{name}={c[name]}: accepted true | false")
    if p == "none":
        if world_size(c) > 1:
            raise ConfigError(
                f"devices={c['devices']} nodes={c['nodes']}: parallel=none runs on one device; accepted: "
                "parallel=ddp|fsdp for more"
            )
    elif mode not in SUPPORTED[(fw, p)]:
        why = REFUSED_WHY.get((fw, p, mode), "not supported")
        raise ConfigError(f"mode={mode} with parallel={p}, framework={fw}: {why}")
    elif (fw, p, mode) == ("torch", "fsdp", "jvp") and c["jvp_impl"] != "lazy":
        raise ConfigError(
            f"jvp_impl={c['jvp_impl']} with parallel=fsdp: forward-mode AD through FSDP2's sharded parameters fails "
            "in torch; accepted: jvp_impl=lazy (the tangent attached module by module to the gathered parameters)"
        )
    if p != "fsdp" and (c["fsdp_offload"] or not c["fsdp_reshard_after_forward"]):
        which = "fsdp_offload=true" if c["fsdp_offload"] else "fsdp_reshard_after_forward=false"
        raise ConfigError(f"{which}: applies to parallel=fsdp only (got parallel={p})")
    if fw != "torch" and not c["fsdp_reshard_after_forward"]:
        raise ConfigError(
            "fsdp_reshard_after_forward=false: torch only (FSDP2's SHARD_GRAD_OP); in jax XLA decides when gathered "
            "parameters are freed; accepted: true"
        )
    if c["fsdp_offload"]:
        if fw != "torch":
            raise ConfigError("fsdp_offload=true: torch only (FSDP2's CPUOffloadPolicy); framework=jax accepts false")
        if c["device"] == "cpu":
            raise ConfigError(
                "fsdp_offload=true: the parameters already live in host memory on a CPU device, there is nothing to "
                "offload to; accepted on a CUDA device"
            )
    if p != "none" and (c["evaluate"] or c["measure_grad_cosine"]):
        which = "evaluate=true" if c["evaluate"] else "measure_grad_cosine=true"
        raise ConfigError(f"{which}: not measured with parallel={p} yet; accepted with parallel=none")


def check_launch(c: dict, launcher: dict, gpus: int) -> None:
    """Whether the Hydra launcher can start this trial's processes where it starts them: more than one node needs
    a submitit launcher with as many nodes; a submitit job with several tasks per node gives each task one process
    of the trial, so their count must be what the framework runs (torch: one per device; jax: one per node, or one
    per device); a trial that runs on this host (every launcher but SLURM's) needs the GPUs it asks for
    (`gpus`: this host's count, bench.system.cuda_device_count)."""
    target = str(launcher.get("_target_", ""))
    submitit = "submitit" in target
    if "slurm" not in target.lower():
        if c["device"] == "cuda" and gpus == 0:
            raise ConfigError("device=cuda: this host has no CUDA GPU (nvidia-smi lists none); accepted: cpu | auto")
        if c["fsdp_offload"] and gpus == 0:
            raise ConfigError(
                "fsdp_offload=true: this host has no GPU, so the parameters already live in host memory and there is "
                "nothing to offload to; accepted on a CUDA device"
            )
        if c["device"] in ("cuda", "auto") and 0 < gpus < c["devices"]:
            raise ConfigError(f"devices={c['devices']}: this host has {gpus} GPU(s); accepted 1..{gpus} or device=cpu")
    nodes, tasks = (launcher.get("nodes", 1), launcher.get("tasks_per_node", 1)) if submitit else (1, 1)
    fix = (f"hydra/launcher=submitit_slurm hydra.launcher.nodes={c['nodes']} "
           f"hydra.launcher.tasks_per_node={processes_per_node(c) if c['framework'] == 'torch' else 1}")  # fmt: skip
    if c["nodes"] != nodes:
        raise ConfigError(f"nodes={c['nodes']}: the launcher starts {nodes} node(s); accepted: {fix}")
    if tasks > 1:
        accepted = {processes_per_node(c)} if c["framework"] == "torch" else {1, c["devices"]}
        if tasks not in accepted or c["parallel"] == "none":
            raise ConfigError(
                f"hydra.launcher.tasks_per_node={tasks}: a {c['framework']} trial with parallel={c['parallel']} "
                f"devices={c['devices']} runs {' or '.join(map(str, sorted(accepted)))} process(es) per node; "
                f"accepted: {fix}"
            )
    elif c["nodes"] > 1 and c["framework"] == "torch" and c["devices"] > 1:
        raise ConfigError(
            f"nodes={c['nodes']} devices={c['devices']}: a torch trial across nodes runs one task per device; "
            f"accepted: {fix}"
        )


def world_size(c: dict) -> int:
    return c["devices"] * c["nodes"]


def global_batch_size(c: dict) -> int:
    return c["batch_size"] * world_size(c)


def processes_per_node(c: dict) -> int:
    """How many trial processes the runner starts on one node: torch runs one process per device (a rank each);
    JAX one process that owns every device of its node."""
    if c["parallel"] == "none" or c["framework"] == "jax":
        return 1
    return c["devices"]


def shard_rows(batch: Batch, index: int, count: int) -> Batch:
    """Rows [index*B, (index+1)*B) of a global batch of count*B rows: what device `index` of `count` feeds."""
    b = len(batch["labels"]) // count
    return {k: np.ascontiguousarray(v[index * b : (index + 1) * b]) for k, v in batch.items()}


def shard_batches(micro_batches: Sequence[Batch], index: int, count: int) -> list[Batch]:
    return [shard_rows(b, index, count) for b in micro_batches]


def expected_comm_bytes(c: dict, n_trainable: int, n_sharded: int) -> int:
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
    against these (tests/test_parallel_*.py): XLA's backprop all-reduces 4(P - T)H bytes less than 4n (the position
    embeddings' rows past seq_len have no gradient, which it knows)."""
    if c["parallel"] == "none" or world_size(c) == 1:
        return 0
    mode, k, s, ga, torch = c["mode"], c["num_tangents"], FP32_BYTES, c["grad_accum"], c["framework"] == "torch"
    p = 2 if c.get("dtype") == "bf16_pure" else FP32_BYTES  # a parameter's (and its gradient's) bytes
    loss = s  # the loss and the directional derivatives stay fp32 in every dtype
    if c["parallel"] == "ddp":
        per_update = {"inference": loss, "backprop": p * n_trainable + loss, "jacfwd": p * n_trainable + loss,
                      "jvp": s * (k + 1), "mezo": 2 * s}[mode]  # fmt: skip
        return per_update if torch else ga * per_update
    gather = p * (padded_params(c) if torch else n_sharded)
    reduce_scatter = p * (padded_params(c, trainable=True) if torch else n_trainable)
    if mode == "inference":
        per_micro, per_update = gather, loss
    elif mode == "mezo":
        per_micro, per_update = 2 * gather, 2 * s
    elif mode == "jvp":
        per_micro, per_update = (k if torch else 1) * gather, s * (k + 1)
    else:  # backprop, jacfwd
        regather = torch and mode == "backprop" and c["fsdp_reshard_after_forward"]
        per_micro, per_update = gather * (2 if regather else 1), reduce_scatter + loss
    return ga * per_micro + per_update if torch else ga * (per_micro + per_update)


def padded_params(c: dict, trainable: bool = False) -> int:
    """Parameters as FSDP2 gathers them: each tensor's first axis padded up to a multiple of the devices (the
    trainable scope's alone with `trainable`, as its reduce-scatter carries them)."""
    spec = BertSpec(**{f.name: c["model"][f.name] for f in fields(BertSpec) if f.name in c["model"]})
    n = world_size(c)
    total = 0
    for name, shape in param_shapes(spec).items():
        if trainable and not is_trainable(name, c["trainable"], spec.num_layers, c["last_k"]):
            continue
        rows = -(-shape[0] // n) * n
        total += rows * (math.prod(shape) // shape[0])
    return total
