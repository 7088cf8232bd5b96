"""Beyond one device, framework-neutral: the strategies, what each framework supports, how a trial's global batch
is split over devices, how many processes a trial is, and how many bytes each way of differentiating should
exchange per step. The engines are each framework's own (bench/torch_impl/parallel.py: torch.distributed, DDP and
FSDP2; bench/jax_impl/parallel.py: a Mesh, NamedShardings, jax.distributed); nothing here imports them.

    parallel=none   one device (devices must be 1)
    parallel=ddp    data parallel: parameters replicated, the global batch split over devices
    parallel=fsdp   fully sharded data parallel: parameters (and gradients, optimizer state) sharded too

`devices` is the number of devices per node, `nodes` the number of nodes: world_size = devices x nodes. The trial's
`batch_size` is the per-device micro-batch; a step's global batch is exactly the single-device batch of size
batch_size x world_size, the same examples in the same order, device d taking rows [d*B, (d+1)*B) of it. So a
data-parallel trial and a single-device trial of the global batch compute the same loss, step by step.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from bench.errors import ConfigError
from bench.spec import Batch

STRATEGIES = ("none", "ddp", "fsdp")
FP32_BYTES = 4

# (framework, parallel) -> the modes it runs, and why the others are refused.
SUPPORTED = {
    ("torch", "ddp"): ("inference", "backprop", "jvp", "jacfwd", "mezo"),
    # forward-mode AD through FSDP2's DTensor parameters fails in torch 2.x (aten._has_same_storage_numel has no
    # sharding strategy), so jvp and jacfwd are refused there rather than faked
    ("torch", "fsdp"): ("inference", "backprop", "mezo"),
    ("jax", "ddp"): ("inference", "backprop", "jvp", "jacfwd", "mezo"),
    ("jax", "fsdp"): ("inference", "backprop", "jvp", "jacfwd", "mezo"),
}
REFUSED_WHY = {
    ("torch", "fsdp", "jvp"): "forward-mode AD through FSDP2's sharded (DTensor) parameters is not supported by "
    "torch (aten._has_same_storage_numel has no sharding strategy); use parallel=ddp, or framework=jax",
    ("torch", "fsdp", "jacfwd"): "forward-mode AD through FSDP2's sharded (DTensor) parameters is not supported by "
    "torch; use parallel=ddp, or framework=jax",
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
    """What the way of differentiating should exchange per step per device, in bytes, by its definition (fp32):
    the size of each collective's buffer (all-reduce: the tensor; all-gather: the gathered output; reduce-scatter:
    the input), summed over the step. `n_sharded` is how many parameters the strategy shards (fsdp: all-gathered
    for every forward pass). Every step also all-reduces its loss (4 bytes) so each device reports the global
    batch's loss.

      ddp   inference 4; backprop 4n + 4 (one all-reduce of the gradient per update); jacfwd 4n + 4;
            jvp 4(K + 1) (the K directional derivatives and the loss); mezo 8 (the two losses)
      fsdp  + 4 n_sharded per forward pass (all-gather), backprop: + 4 n_sharded again in the backward pass when
            parameters are resharded after the forward (FULL_SHARD) and the gradient reduce-scattered (4n) instead
            of all-reduced; mezo's two passes gather twice; JAX's jvp gathers the tangent with the parameters
    A world of one device exchanges nothing."""
    if c["parallel"] == "none" or world_size(c) == 1:
        return 0
    mode, k, s = c["mode"], c["num_tangents"], FP32_BYTES
    loss = s
    if c["parallel"] == "ddp":
        return {"inference": loss, "backprop": s * n_trainable + loss, "jacfwd": s * n_trainable + loss,
                "jvp": s * (k + 1), "mezo": 2 * s}[mode]  # fmt: skip
    gather = s * n_sharded
    if mode == "inference":
        return gather + loss
    if mode == "mezo":
        return 2 * gather + 2 * s
    if mode == "jvp":
        return k * 2 * gather + s * (k + 1)  # parameters and tangent, for every tangent
    backward_gather = gather if c["fsdp_reshard_after_forward"] else 0
    return gather + backward_gather + s * n_trainable + loss  # backprop, jacfwd
