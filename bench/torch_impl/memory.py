"""What holds a PyTorch trial's memory, from torch's own accounting. Mirror image of jax_impl/memory.py.

One instrumented step, after the timed window, on the trial's first batch: every buffer the step makes is
counted by what holds it, from the moment it exists until it is freed (a weak reference per tensor), by unique
storage (views and the same tensor saved twice count once):

    saved       torch.autograd.graph.saved_tensors_hooks: every tensor autograd keeps for the backward pass
                (parameters and batches excluded: they are resident before the step)
    grads       .grad buffers as backward accumulates them (post-accumulate-grad hooks), jacfwd's gradient buffer
    directions  every seeded direction / tangent the mode draws and jacfwd's basis block (directions.observe)
    temp        CUDA: the caching allocator's peak over the step above what the categories held at their joint
                peak; CPU (no allocator statistics): None here, the runner labels the rest of the measured
                excess as temp

Each category reports the most it held at once during the step; `tracked_peak` is the most the three held
together, which the step's peak contains.
"""

from __future__ import annotations

import gc
import weakref
from contextlib import contextmanager

import torch

from bench.torch_impl import directions
from bench.torch_impl.parallel import local

CATEGORIES = ("saved", "grads", "directions")


def storage(t: torch.Tensor) -> tuple[object, int]:
    """(a key naming the memory t lives in, its bytes): views share their base's storage, and count once.
    FSDP2's DTensors are counted by this device's shard; a tensor without storage (functorch's wrappers inside
    torch.func.jvp) by its own bytes."""
    held = local(t)
    try:
        s = held.untyped_storage()
        return s.data_ptr(), s.nbytes()
    except (RuntimeError, NotImplementedError):
        return ("tensor", id(t)), held.numel() * held.element_size()


class Ledger:
    """Live bytes per category, and the most each category (and all of them together) held at once."""

    def __init__(self, resident: set):
        self.resident = resident  # storages that existed before the step: never counted
        self.live: dict = {}  # storage key -> [category, references, bytes]
        self.now = dict.fromkeys(CATEGORIES, 0)
        self.peak = dict.fromkeys(CATEGORIES, 0)
        self.together = 0
        self.open = True

    def hold(self, category: str, t: torch.Tensor) -> None:
        key, nbytes = storage(t)
        if key in self.resident:
            return
        entry = self.live.get(key)
        if entry is None:  # a storage counts under the category that held it first
            self.live[key] = [category, 1, nbytes]
            self.now[category] += nbytes
            self.peak[category] = max(self.peak[category], self.now[category])
            self.together = max(self.together, sum(self.now.values()))
        else:
            entry[1] += 1
        weakref.finalize(t, self.release, key)

    def release(self, key) -> None:
        entry = self.live.get(key) if self.open else None
        if entry is None:
            return
        entry[1] -= 1
        if entry[1] == 0:
            del self.live[key]
            self.now[entry[0]] -= entry[2]


@contextmanager
def watching(trainer, ledger: Ledger):
    """Within: autograd's saved tensors, the gradients accumulated and the directions drawn go to `ledger`."""

    def pack(t):
        # a detached alias: the graph keeps the same storage, and no reference cycle through t.grad_fn delays
        # the release until a garbage collection
        alias = t.detach()
        ledger.hold("saved", alias)
        return alias

    hooks = [
        p.register_post_accumulate_grad_hook(lambda p: ledger.hold("grads", p.grad))
        for p in trainer.params.values()
        if p.requires_grad
    ]
    directions.WATCHERS.append(ledger.hold)
    try:
        with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
            yield
    finally:
        directions.WATCHERS.remove(ledger.hold)
        for h in hooks:
            h.remove()


def breakdown(trainer, micro_batches) -> dict:
    """Bytes per category of one instrumented step on `micro_batches` (device batches), with their method."""
    gc.collect()
    resident = {storage(t)[0] for t in trainer.model.parameters()}
    resident |= {storage(t)[0] for b in micro_batches for t in b.values()}
    cuda = trainer.device.type == "cuda"
    if cuda:
        trainer.sync()
        torch.cuda.reset_peak_memory_stats(trainer.device)
        before = torch.cuda.memory_allocated(trainer.device)
    ledger = Ledger(resident)
    with watching(trainer, ledger):
        trainer.sync(trainer.step(micro_batches))
    gc.collect()
    ledger.open = False
    trainable = sum(storage(p)[1] for p in trainer.params.values())
    temp = None
    if cuda:
        temp = max(torch.cuda.max_memory_allocated(trainer.device) - before - ledger.together, 0)
    return {
        "trainable": trainable,
        **ledger.peak,
        "tracked_peak": ledger.together,
        "temp": temp,
        "method": "torch_saved_tensors_hooks" + ("+cuda_allocator" if cuda else ""),
    }
