"""A PyTorch trial's devices and processes: `start(cfg)` -> World. Mirror of jax_impl/parallel.py.

parallel=none: one process, one device. parallel=ddp|fsdp: one process per device, a process group over
torch.distributed (env:// rendezvous: the runner, or submitit, sets MASTER_ADDR, MASTER_PORT, RANK, WORLD_SIZE,
LOCAL_RANK; gloo on CPU, nccl on CUDA). The framework-neutral rules are bench/parallel.py.

    ddp   backprop runs through DistributedDataParallel (its gradient all-reduce); the other modes run the plain
          replica and exchange only what they must (World.all_reduce_mean: the loss, the K directional
          derivatives, MeZO's projection, jacfwd's gradient), so every replica takes the same update
    fsdp  FSDP2 (fully_shard): each encoder layer, then the root (embeddings, pooler, classifier); parameters,
          gradients and optimizer state are DTensors sharded on dim 0, each device holding its rows

Communication is counted where the program issues it, as the bytes of each collective's buffer (all-reduce: the
tensor; all-gather: the gathered output; reduce-scatter: the input): DDP's gradient buckets by a comm hook,
FSDP2's all-gathers and reduce-scatters by the custom collectives it accepts, bench's own all-reduces where
they are called. Nothing else is counted (DDP's one-off broadcasts at construction and bucket rebuilding).
"""

from __future__ import annotations

import gc
import inspect
import os
from contextlib import nullcontext
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

import torch
import torch.distributed as dist
from torch.distributed.algorithms.ddp_comm_hooks.default_hooks import allreduce_hook
from torch.distributed.device_mesh import DeviceMesh
from torch.nn.parallel import DistributedDataParallel

try:  # FSDP2 and the custom collectives it accepts, by which its communication is counted: torch >= 2.9
    from torch.distributed.fsdp import CPUOffloadPolicy, FSDPModule, OffloadPolicy, fully_shard

    # the interfaces set_custom_all_gather / set_custom_reduce_scatter take (no public name for them yet)
    from torch.distributed.fsdp._fully_shard._fsdp_api import AllGather, ReduceScatter
    from torch.distributed.tensor import DTensor
except ImportError:  # an older torch still runs one device and ddp; shard_model says what fsdp needs
    fully_shard = None
    FSDPModule = DTensor = ()  # isinstance(x, ()) is False: no module is FSDP2's, no tensor a DTensor
    AllGather = ReduceScatter = object

from bench.config import BenchConfig
from bench.measure.trackers import MemoryTracker
from bench.parallel import shard_batches, world_size
from bench.spec import Batch
from bench.torch_impl import models
from bench.torch_impl.device import memory_trackers, resolve_device
from bench.weights import weights_digest

# FSDP2's collectives into and from one flat tensor: torch 2.13 renamed them (the old names warn there)
all_gather_single = getattr(dist, "all_gather_single", dist.all_gather_into_tensor)
reduce_scatter_single = getattr(dist, "reduce_scatter_single", dist.reduce_scatter_tensor)


@dataclass
class World:
    parallel: str
    size: int
    rank: int
    main: bool
    device: torch.device
    reshard_after_forward: bool = True  # fsdp: FULL_SHARD (true) or SHARD_GRAD_OP (false)
    offload: bool = False  # fsdp: parameters, gradients and optimizer state in host memory (CPUOffloadPolicy)
    mesh: DeviceMesh | None = None  # fsdp: the devices FSDP2 shards over (set by shard_model)
    comm_bytes: int = 0  # what this process's collectives carried since reset_comm()

    def local_batches(self, micro_batches: list[Batch]) -> list[Batch]:
        return shard_batches(micro_batches, self.rank, self.size) if self.size > 1 else list(micro_batches)

    def memory_trackers(self) -> list[MemoryTracker]:
        return memory_trackers(self.device)

    def device_memory(self, trainer, trackers: list[MemoryTracker]) -> list[dict[str, Any]]:
        if self.parallel == "none":
            return [{"device": self.rank, **trackers[0].result().to_row()}]
        index = self.device.index if self.device.type == "cuda" else self.rank
        row = {"device": index, **trackers[0].result().to_row()}
        # The final parameters' fingerprint (after the memory is read: fsdp gathers them whole for it). Replicas
        # that took the same updates have the same one: the check that nothing made them drift apart.
        row["params_digest"] = weights_digest(trainer.weights())
        return [row]

    def reset_comm(self) -> None:
        self.comm_bytes = 0

    def comm_bytes_per_step(self, trainer, steps: int) -> float | None:
        if self.parallel == "none":
            return None
        return self.comm_bytes / steps if self.size > 1 else 0.0  # a group of one process exchanges nothing

    def count(self, buffer: torch.Tensor) -> None:
        self.comm_bytes += buffer.numel() * buffer.element_size()

    def all_reduce_mean(self, values: torch.Tensor) -> torch.Tensor:
        """The mean over devices of `values`, in place: bench's own exchanges (the loss, the directional
        derivatives, MeZO's projection, jacfwd's gradient), packed by the caller into one tensor per step."""
        if self.size == 1:
            return values
        self.count(values)
        dist.all_reduce(values)  # SUM, then divide: gloo has no AVG
        return values.div_(self.size)

    def distribute(self, model: torch.nn.Module, backward: bool) -> torch.nn.Module:
        """The model as this world runs it: DDP-wrapped where a backward pass needs its gradient all-reduce
        (ddp, backprop), sharded in place by FSDP2 (fsdp), else as it is (a replica)."""
        if self.parallel == "ddp" and backward:
            return data_parallel(model, self)
        if self.parallel == "fsdp":
            shard_model(model, self, backward)
        return model

    def gather(self, item: dict) -> list[dict] | None:
        if self.parallel == "none":
            return [item]
        items: list = [None] * self.size
        dist.all_gather_object(items, item)
        return items if self.main else None

    def close(self) -> None:
        if not dist.is_initialized():
            return
        # The process group must be gone before the interpreter shuts down: gloo's threads, ended during
        # finalization, abort the process (SIGABRT after a clean trial). Past destroy_process_group it is still
        # held by DDP's reducer until the garbage collector frees it, and by FSDP2's mesh, which DTensor's
        # caches keep alive: the mesh's own registry of groups is emptied (torch has no public way).
        gc.collect()
        if self.mesh is not None:
            self.mesh._pg_registry.clear()
        dist.destroy_process_group()


def start(cfg: BenchConfig) -> World:
    """This process's place in the trial (parallel=none: the whole trial, on one device)."""
    p = cfg.parallel
    if p == "none":
        assert world_size(cfg) == 1
        return World(parallel="none", size=1, rank=0, main=True, device=resolve_device(cfg.device))
    size = world_size(cfg)
    started = int(os.environ.get("WORLD_SIZE", "1"))
    if started != size:
        raise ValueError(
            f"parallel={p}: {started} process(es) started (WORLD_SIZE), devices={cfg.devices} x "
            f"nodes={cfg.nodes} = {size} expected; trials beyond one device are started by `python -m bench`"
        )
    rank, local = int(os.environ.get("RANK", "0")), int(os.environ.get("LOCAL_RANK", "0"))
    device = resolve_device(cfg.device)
    if device.type == "cuda":
        device = torch.device("cuda", local % torch.cuda.device_count())
        torch.cuda.set_device(device)
    else:
        # Each rank an equal share of the host's cores: ranks running every core each would time the scheduler
        # (and OpenMP threads spinning while their rank waits in a collective), not the step.
        per_node = int(os.environ.get("LOCAL_WORLD_SIZE", "1"))
        torch.set_num_threads(max(1, len(os.sched_getaffinity(0)) // per_node))
    backend = "nccl" if device.type == "cuda" else "gloo"
    # A collective whose peer died fails at the trial's own deadline rather than waiting forever (the runner
    # also kills the rest of the trial as soon as one process exits badly).
    timeout = timedelta(seconds=cfg.timeout_s)
    device_id = device if device.type == "cuda" else None
    if size == 1 and "MASTER_ADDR" not in os.environ:  # one device: a group of one, no rendezvous to wait for
        dist.init_process_group(
            backend, store=dist.HashStore(), rank=0, world_size=1, timeout=timeout, device_id=device_id
        )
    else:
        dist.init_process_group(backend, init_method="env://", timeout=timeout, device_id=device_id)
    return World(
        parallel=p,
        size=size,
        rank=rank,
        main=rank == 0,
        device=device,
        reshard_after_forward=cfg.fsdp_reshard_after_forward,
        offload=cfg.fsdp_offload,
    )


# ---------------------------------------------------------------------------------------------------------------
# ddp


def data_parallel(model: torch.nn.Module, world: World) -> DistributedDataParallel:
    """DistributedDataParallel with its gradient all-reduce counted. No buffer sync before each forward: BERT's
    buffers are constant position and token-type ids, broadcasting them would be needless communication.
    gradient_as_bucket_view: the gradients live in DDP's buckets, not in a second copy beside them."""
    # torch 2.13 renamed broadcast_buffers forward_sync_buffers (the old name warns)
    renamed = "forward_sync_buffers" in inspect.signature(DistributedDataParallel).parameters
    ddp = DistributedDataParallel(
        model,
        device_ids=[world.device.index] if world.device.type == "cuda" else None,
        gradient_as_bucket_view=True,
        **{"forward_sync_buffers" if renamed else "broadcast_buffers": False},
    )
    ddp.register_comm_hook(world, counted_all_reduce)
    return ddp


def counted_all_reduce(world: World, bucket):
    """DDP's default all-reduce (mean) of one gradient bucket (a dist.GradBucket), its bytes counted first.
    Unannotated: DDP compares the annotations with dist.GradBucket, and this module's are strings."""
    world.count(bucket.buffer())
    return allreduce_hook(None, bucket)  # None: the default group


def accumulating(model: torch.nn.Module, skip_sync: bool):
    """Around one micro-batch's backward: with `skip_sync` the gradient accumulates locally and is not
    exchanged (DDP's no_sync, FSDP2's set_requires_gradient_sync), so an update exchanges it once, in the last
    micro-batch's backward."""
    if isinstance(model, DistributedDataParallel):
        return model.no_sync() if skip_sync else nullcontext()
    if isinstance(model, FSDPModule):
        model.set_requires_gradient_sync(not skip_sync)
    return nullcontext()


# ---------------------------------------------------------------------------------------------------------------
# fsdp


def shard_model(model: torch.nn.Module, world: World, backward: bool) -> None:
    """FSDP2 over the world's devices, in place: each encoder layer a unit (gathered whole for its forward, then
    resharded), then the root holding the rest. Without a backward pass there is nothing to keep the gathered
    parameters for, so they are resharded after every forward whatever fsdp_reshard_after_forward says; MeZO
    needs it, since FSDP2 would not gather the perturbed shards again for the second pass."""
    if fully_shard is None:
        raise RuntimeError(f"parallel=fsdp: needs torch >= 2.9 (FSDP2's custom collectives), not {torch.__version__}")
    world.mesh = mesh = DeviceMesh.from_group(dist.group.WORLD, world.device.type)
    reshard = world.reshard_after_forward or not backward
    # pinned host memory needs an accelerator (offload is refused on CPU hosts anyway)
    offload = CPUOffloadPolicy(pin_memory=world.device.type == "cuda") if world.offload else OffloadPolicy()
    units = [*models.of(model).layers(model), model]  # each layer of the model's family, then the rest
    for unit in units:
        fully_shard(unit, mesh=mesh, reshard_after_forward=reshard, offload_policy=offload)
    for unit in units:
        unit.set_custom_all_gather(CountedAllGather(world))
        unit.set_custom_reduce_scatter(CountedReduceScatter(world))


class CountedAllGather(AllGather):
    """FSDP2's all-gather (as its default does, into one tensor), the gathered output's bytes counted."""

    def __init__(self, world: World):
        self.world = world

    def allocate(self, size, *, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
        return torch.empty(*size, dtype=dtype, device=device)

    def __call__(self, output_tensor, input_tensor, group, async_op: bool = False):
        self.world.count(output_tensor)
        return all_gather_single(output_tensor, input_tensor, group=group, async_op=async_op)


class CountedReduceScatter(ReduceScatter):
    """FSDP2's gradient reduce-scatter (as its default does, from one tensor), the input's bytes counted."""

    def __init__(self, world: World):
        self.world = world

    def allocate(self, size, *, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
        return torch.empty(*size, dtype=dtype, device=device)

    def __call__(self, output_tensor, input_tensor, group, op, async_op: bool = False):
        self.world.count(input_tensor)
        return reduce_scatter_single(output_tensor, input_tensor, op=op, group=group, async_op=async_op)


def sharded(p: torch.Tensor) -> bool:
    """Whether FSDP2 shards the parameter `p` (it is then a DTensor)."""
    return isinstance(p, DTensor)


def local(p: torch.Tensor) -> torch.Tensor:
    """What this device holds of `p`: its shard where FSDP2 sharded p (a DTensor; in-place ops on it change the
    parameter), else p itself."""
    return p.to_local() if sharded(p) else p


def local_rows(whole: torch.Tensor, p: torch.Tensor) -> torch.Tensor:
    """This device's part of `whole`, a tensor shaped like the parameter `p`: FSDP2 shards dim 0 as torch.chunk
    does (the last ranks' parts shorter, or empty), so these are exactly the rows of p this device holds."""
    if not sharded(p):
        return whole
    mesh = p.device_mesh
    chunks = torch.chunk(whole, mesh.size(), dim=0)
    rank = mesh.get_local_rank()
    part = chunks[rank] if rank < len(chunks) else whole[:0]
    held = p.to_local().shape
    if part.shape != held:  # FSDP2 sharded otherwise than on dim 0 by chunks: the update would go astray
        raise RuntimeError(f"rows {tuple(part.shape)} of a {tuple(p.shape)} parameter; FSDP2 holds {tuple(held)}")
    return part


def like_param(g: torch.Tensor, p: torch.Tensor) -> torch.Tensor:
    """`g` (this device's rows, from local_rows) as p's gradient: a DTensor sharded as p where FSDP2 shards p."""
    if not sharded(p):
        return g
    return DTensor.from_local(g, p.device_mesh, p.placements, run_check=False, shape=p.shape, stride=p.stride())
