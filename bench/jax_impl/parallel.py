"""A JAX trial's devices and processes: `start(cfg)` -> World. Mirror of torch_impl/parallel.py.

parallel=none: one process, one device. parallel=ddp|fsdp: one process owns every device of its node (on the CPU,
`jax_num_cpu_devices` of them), a Mesh with one axis `data` over the trial's devices, and the trainer's arrays
placed with NamedShardings on it; with several processes (RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT in the
environment: one per node, or one per device), jax.distributed joins them into one runtime (gloo collectives on
the CPU). The framework-neutral rules are bench/parallel.py.

    ddp   parameters, frozen state and optimizer state replicated; every batch sharded over `data` on its batch
          axis. XLA partitions the step: the mean over the batch becomes a local sum and an all-reduce
    fsdp  as ddp, but each parameter of two axes or more (and its optimizer state) sharded over `data` along its
          largest axis that the device count divides; the loss gathers them whole where it starts

Nothing here issues a collective: XLA's SPMD partitioner puts them in the compiled step. So communication is
counted from the compiled programs (every collective of their HLO, by the bytes of its buffer: all-reduce the
tensor, all-gather the gathered output, reduce-scatter the input; inside a loop, times its trip count), and on
the CPU, where one process hosts every device and no allocator reports per device, each device's memory is its
resident arrays plus the programs' own analysis of what they add (XLA's buffer assignment, per device).
"""

from __future__ import annotations

import hashlib
import json
import os
import re
from dataclasses import dataclass
from typing import Any

import jax
import numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec

from bench.config import BenchConfig
from bench.jax_impl.device import compilation_cache, memory_trackers, resolve_device
from bench.jax_impl.models.common import is_stacked
from bench.measure.trackers import HostRssTracker, JaxDeviceTracker, MemoryTracker, MiB, NvmlTracker
from bench.parallel import shard_batches, world_size
from bench.spec import Batch

AXIS = "data"  # the mesh's one axis: batches are split over it (ddp, fsdp) and so are parameters (fsdp)


@dataclass
class World:
    parallel: str
    size: int
    rank: int
    main: bool
    device: Any  # this process's first device
    mesh: Mesh | None = None  # the trial's devices, one `data` axis (None: parallel=none)
    processes: int = 1
    distributed: bool = False  # jax.distributed initialised (several processes)

    # -- placement: what the trainer asks of the world ---------------------------------------------------------
    @property
    def replicated(self) -> NamedSharding:
        return NamedSharding(self.mesh, PartitionSpec())

    @property
    def batch_sharding(self) -> NamedSharding:
        """Device d of the mesh holds rows [d*B, (d+1)*B) of every batch array (its first axis)."""
        return NamedSharding(self.mesh, PartitionSpec(AXIS))

    def sharding(self, shape: tuple[int, ...], stacked: bool = False) -> NamedSharding:
        """Where a parameter, or optimizer-state tensor, of this shape lives. A function of the shape alone (and
        whether its leading axis stacks layers: scan_layers), so a parameter and its optimizer state (AdamW's mu
        and nu have its shape and path) are always sharded alike. A stacked tensor is sharded as each of its
        layers is: never along the layer axis."""
        axis = shard_axis(shape[stacked:], self.size) if self.parallel == "fsdp" else None
        if axis is None:
            return self.replicated
        axis += stacked
        return NamedSharding(self.mesh, PartitionSpec(*(AXIS if i == axis else None for i in range(len(shape)))))

    def shardings(self, tree):
        return jax.tree_util.tree_map_with_path(lambda path, x: self.sharding(x.shape, is_stacked(path)), tree)

    def place(self, tree):
        """Host-identical values (every process built the same weights) as global arrays on their shardings."""

        def put(path, x):
            host = np.asarray(x)
            sharding = self.sharding(host.shape, is_stacked(path))
            # a copy per shard: on the CPU a device array may alias the numpy memory it came from, and a view
            # would keep the whole tensor (and the one it was read from) alive for each shard
            return jax.make_array_from_callback(host.shape, sharding, lambda i: host[i].copy())

        return jax.tree_util.tree_map_with_path(put, tree)

    def place_batches(self, micro_batches: list[Batch]) -> list[dict]:
        """This process's rows of each global batch (local_batches) as global arrays sharded over `data`."""
        scale = self.size // len(self.mesh.local_devices)  # global rows per local row

        def put(x):
            x = np.asarray(x, np.int32)
            global_shape = (x.shape[0] * scale, *x.shape[1:])
            return jax.make_array_from_process_local_data(self.batch_sharding, x, global_shape)

        return [{k: put(v) for k, v in b.items()} for b in micro_batches]

    def gather_whole(self, tree):
        """Inside a program: the parameters whole on every device, as each device's forward pass needs them (fsdp:
        an all-gather per sharded tensor, which XLA places and frees as its schedule decides; ddp: nothing)."""
        if self.parallel != "fsdp":
            return tree
        return jax.lax.with_sharding_constraint(tree, jax.tree.map(lambda _: self.replicated, tree))

    # -- the World protocol ------------------------------------------------------------------------------------
    def local_batches(self, micro_batches: list[Batch]) -> list[Batch]:
        if self.processes == 1:
            return list(micro_batches)  # this process feeds every device: the global batches whole
        return shard_batches(micro_batches, self.rank, self.processes)  # mesh order: process by process

    def memory_trackers(self) -> list[MemoryTracker]:
        if self.mesh is None:
            return memory_trackers(self.device)
        local = self.mesh.local_devices
        if self.device.platform == "gpu":
            return [*(JaxDeviceTracker(d) for d in local), NvmlTracker()]
        return [*(ResidentArraysTracker(d) for d in local), HostRssTracker()]

    def device_memory(self, trainer, trackers: list[MemoryTracker]) -> list[dict[str, Any]]:
        if self.mesh is None:
            return [{"device": 0, **trackers[0].result().to_row()}]
        rows = []
        transient = None
        position = {d: i for i, d in enumerate(self.mesh.devices.flat)}  # device i holds rows [i*B, (i+1)*B)
        for t in trackers:
            if isinstance(t, JaxDeviceTracker):
                row = t.result().to_row()
            elif isinstance(t, ResidentArraysTracker):
                if transient is None:  # the programs are the same on every device: one analysis for all
                    transient = max(program_transient_bytes(p) for p, _ in trainer.programs()) / MiB
                r = t.result()
                row = {
                    "peak_mem_mb": r.peak_mb + transient,
                    "excess_mem_mb": r.peak_mb + transient - r.baseline_mb,
                    "baseline_mem_mb": r.baseline_mb,
                    "mem_method": t.method,
                }
            else:
                continue
            digest = replicated_digest(trainer.params, t.device)
            rows.append({"device": position[t.device], **row, "params_digest": digest})
        return rows

    def reset_comm(self) -> None:
        pass  # counted from the compiled programs, the same every step: nothing accumulates

    def comm_bytes_per_step(self, trainer, steps: int) -> float | None:
        if self.mesh is None:
            return None
        if self.size == 1:
            return 0.0
        counts = [program_comm_bytes(p.as_text(), self.size) for p, _ in trainer.programs()]
        if None in counts:
            return None  # a collective inside a loop of unknown trip count: not countable
        return float(sum(n * runs for n, (_, runs) in zip(counts, trainer.programs(), strict=True)))

    def gather(self, item: dict) -> list[dict] | None:
        if self.processes == 1:
            return [item]
        from jax.experimental import multihost_utils  # several processes only

        # Each process's item (its devices' measurements) as JSON bytes, padded to the longest, through one
        # all-gather of a (processes, length) byte array.
        mine = np.frombuffer(json.dumps(item).encode(), np.uint8)
        length = int(np.max(multihost_utils.process_allgather(np.array([mine.size]))))
        padded = np.zeros(length, np.uint8)
        padded[: mine.size] = mine
        every = multihost_utils.process_allgather(padded)  # (processes, length)
        if not self.main:
            return None
        return [json.loads(bytes(row).rstrip(b"\0")) for row in np.asarray(every)]

    def close(self) -> None:
        if self.distributed:
            jax.distributed.shutdown()


def start(cfg: BenchConfig) -> World:
    """This process's place in the trial (parallel=none: the whole trial, on one device). Called before anything
    touches a device: the CPU device count, the distributed runtime and the persistent compilation cache
    (compile_cache_dir) can only be set before JAX starts or compiles."""
    compilation_cache(cfg.compile_cache_dir)
    p = cfg.parallel
    if p == "none":
        assert world_size(cfg) == 1
        return World(parallel="none", size=1, rank=0, main=True, device=resolve_device(cfg.device))
    size = world_size(cfg)
    processes, rank = int(os.environ.get("WORLD_SIZE", "1")), int(os.environ.get("RANK", "0"))
    if size % processes:
        raise ValueError(
            f"parallel={p}: devices={cfg.devices} x nodes={cfg.nodes} = {size} devices over {processes} "
            "processes (WORLD_SIZE); accepted: a process count that divides the device count"
        )
    local = size // processes
    jax.config.update("jax_num_cpu_devices", local)  # the CPU backend's devices; a GPU backend ignores it
    if processes > 1:
        jax.config.update("jax_cpu_collectives_implementation", "gloo")  # CPU collectives across processes
        gpu_ids = None
        if cfg.device != "cpu":  # several processes on a node each take their own GPUs
            first = int(os.environ.get("LOCAL_RANK", "0")) * local
            gpu_ids = list(range(first, first + local))
        jax.distributed.initialize(
            f"{os.environ['MASTER_ADDR']}:{os.environ['MASTER_PORT']}", processes, rank, local_device_ids=gpu_ids
        )
    platform = resolve_device(cfg.device).platform
    # process by process, so each process's devices (and batch rows) are one block of the mesh
    devices = sorted(jax.devices(platform), key=lambda d: (d.process_index, d.id))
    if processes == 1:
        devices = devices[:size]  # a host with more GPUs than the trial asks for
    if len(devices) != size:
        raise RuntimeError(
            f"parallel={p}: devices={cfg.devices} x nodes={cfg.nodes} = {size} {platform} devices expected, "
            f"jax sees {len(devices)} over {processes} process(es)"
        )
    mesh = Mesh(np.array(devices), (AXIS,))
    return World(
        parallel=p,
        size=size,
        rank=jax.process_index(),
        main=jax.process_index() == 0,
        device=mesh.local_devices[0],
        mesh=mesh,
        processes=processes,
        distributed=processes > 1,
    )


# ---------------------------------------------------------------------------------------------------------------
# fsdp: which axis


def shard_axis(shape: tuple[int, ...], n: int) -> int | None:
    """fsdp: the axis a tensor is split along over `n` devices: its largest axis that n divides (the first such,
    on a tie), or None (replicated). Tensors of one axis (LayerNorm scales, biases) stay replicated: BERT-base
    has 0.1 M of them against 109 M in matrices (0.1%), and each would cost a gather of a few KiB per pass."""
    if len(shape) < 2:
        return None
    axes = [i for i, s in enumerate(shape) if s % n == 0]
    return max(axes, key=lambda i: shape[i]) if axes else None


# ---------------------------------------------------------------------------------------------------------------
# measured from the compiled programs


_COLLECTIVE = re.compile(
    r"^\s*(?:ROOT\s+)?%?[\w.-]+\s*=\s*(?P<shape>.*?)\s"
    r"(?P<op>all-reduce|all-gather|reduce-scatter|collective-permute|all-to-all)(?:-done)?\("
)
_ARRAY = re.compile(r"\b(pred|[suf]\d+|bf16|c64|c128)\[([\d,]*)\]")
_CALLEE = re.compile(
    r"\b(?:body|condition|calls|branch_computations|true_computation|false_computation)=(\{[^}]*\}|%?[\w.-]+)"
)
_TRIP = re.compile(r'"known_trip_count":\{"n":"(\d+)"')
_DTYPE_BYTES = {"pred": 1, "bf16": 2, "c64": 8, "c128": 16}


def _array_bytes(shape: str) -> int:
    total = 0
    for dtype, dims in _ARRAY.findall(shape):
        size = _DTYPE_BYTES[dtype] if dtype in _DTYPE_BYTES else int(dtype[1:]) // 8  # f32: 4, s8: 1, ...
        total += size * int(np.prod([int(d) for d in dims.split(",") if d], dtype=np.int64))
    return total


def program_comm_bytes(hlo: str, devices: int) -> int | None:
    """Bytes one device exchanges in one run of a compiled (SPMD-partitioned) program, from its HLO text: every
    all-reduce (its tensor), all-gather (the gathered output), reduce-scatter (its input: the output times the
    group), collective-permute and all-to-all (the buffer), async ones counted once at their -done; a collective
    in a while loop counted its known trip count times. None when a loop holding one has no known trip count."""
    comps: dict[str, list[str]] = {}
    entry, name = None, None
    for line in hlo.splitlines():
        head = re.match(r"^(ENTRY\s+)?%?([\w.-]+)\s.*\{\s*$", line)
        if head and not line.startswith(" "):
            name = head.group(2)
            comps[name] = []
            entry = name if head.group(1) else entry
        elif name is not None and line.strip() and line.strip() != "}":
            comps[name].append(line)
    if entry is None:
        raise ValueError("no ENTRY computation in the HLO text")

    def visit(comp: str, times: int) -> int | None:
        total = 0
        for line in comps.get(comp, ()):
            m = _COLLECTIVE.search(line)
            if m:  # an async collective's -start does not match: counted once, at its -done
                size = _array_bytes(m.group("shape"))
                if m.group("op") == "reduce-scatter":
                    size *= devices  # the mesh has one axis: every collective's group is the whole mesh
                total += times * size
            callees = [c.strip(" %{}") for group in _CALLEE.findall(line) for c in group.split(",")]
            if not callees:
                continue
            trip = _TRIP.search(line)
            is_loop = re.search(r"\swhile\(", line) is not None
            for callee in filter(None, callees):
                inner = visit(callee, times * (int(trip.group(1)) if trip else 1))
                if inner is None or (is_loop and trip is None and inner > 0):
                    return None
                total += inner
        return total

    return visit(entry, 1)


def program_transient_bytes(compiled) -> int:
    """What one run of a compiled program adds, per device, to what is resident before it (XLA's buffer
    assignment): its outputs and temporaries, less the outputs written over donated arguments."""
    m = compiled.memory_analysis()
    return m.output_size_in_bytes + m.temp_size_in_bytes - m.alias_size_in_bytes


class ResidentArraysTracker(MemoryTracker):
    """One device's resident arrays: the bytes of every live jax.Array's shard on it (jax.live_arrays), read at
    the baseline and again at the end of the timed window (then the optimizer state is resident too). The
    programs' own transient memory is not visible from here: World.device_memory adds it, from XLA's memory
    analysis. For the CPU, where one process hosts every device and its RSS cannot be split among them."""

    method = "xla_memory_analysis"

    def __init__(self, device):
        super().__init__()
        self.device = device

    def current_mb(self) -> float:
        # by buffer: a global array's shards are also listed as arrays of their own (one buffer, counted once)
        held = {
            s.data.unsafe_buffer_pointer(): s.data.nbytes
            for x in jax.live_arrays()
            for s in x.addressable_shards
            if s.device == self.device
        }
        return sum(held.values()) / MiB

    def reset_peak(self) -> None:
        pass

    def peak_mb(self) -> float:
        return self.current_mb()  # resident at the window's end; the step's transient is added by device_memory


def replicated_digest(tree, device) -> str:
    """A fingerprint of `device`'s own copies of the replicated tensors of `tree` (ddp: every parameter; fsdp:
    the unsharded ones). Devices that took the same updates hold the same bytes: the check that no device drifted
    from the others (a sharded tensor has one copy of each part, nothing to compare)."""
    h = hashlib.blake2b(digest_size=8)
    for x in jax.tree.leaves(tree):
        if x.sharding.is_fully_replicated:
            (shard,) = [s for s in x.addressable_shards if s.device == device]
            h.update(np.ascontiguousarray(shard.data).tobytes())
    return h.hexdigest()
