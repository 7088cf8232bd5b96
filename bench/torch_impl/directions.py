"""Seeded random directions: jvp's tangents and MeZO's perturbations, regenerated from their seeds rather than
stored. Mirror of jax_impl/directions.py.

A direction is drawn unit by unit (bench.spec.draw_units): a unit is a run of consecutive trainable tensors drawn by
one generator and one random op (on the CPU, a unit of more than UNIT_FLOOR entries in chunks of that many, a
generator each, filled in parallel: see CHUNK), cut into the tensors as views, never larger than the largest tensor
(or UNIT_FLOOR's 4 MiB where every tensor is small). Unit u of direction k at `step` has the seed
direction_seed(seed, step, k, u), so any unit can be drawn again alone, a direction is never held whole (at most a
unit), and the host does per unit, not per tensor, what a draw and an update cost: one seed, one generator, one
random op, one foreach add.

    Units               the trainable tensors' units, made once per trainer (the functions take it or the params)
    sample_tangent      the whole direction, by name (tests; the func/dual/naive jvp passes take it whole)
    draw_direction      the same, with each unit's flat draw (jvp's kept tangent: its estimate is one op a unit)
    SeededTangent       a tangent drawn unit by unit as the lazy pass reaches each module
    perturb             theta += scale z in place, one foreach add a unit (MeZO)
    SeededGradient      g = sum_k c_k z_k, a unit's drawn when the update reaches it
    TangentGradient     g from tangents held whole (jvp's one kept tangent, tests)

A lazy estimate yields (unit, parts): the unit's flat gradient cut into the parts of its tensors this device holds,
which Trainer.apply hands the optimizer a unit at a time.
"""

from __future__ import annotations

import functools
import hashlib
import os
import struct
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

import torch
from torch.utils._python_dispatch import _get_current_dispatch_mode

from bench.spec import UNIT_FLOOR, draw_units
from bench.torch_impl.parallel import local, sharded


def direction_seed(seed: int, *words: int) -> int:
    """A generator's seed from (seed, step, k, unit, ...): a hash, so that nearby words give unrelated streams;
    63 bits, as torch's generators take them."""
    digest = hashlib.blake2b(struct.pack(f"<{1 + len(words)}Q", seed, *words), digest_size=8).digest()
    return int.from_bytes(digest, "little") >> 1


# bench.torch_impl.memory's instrumented step watches the buffers the modes make (observe(category, tensor));
# empty on the timed path
WATCHERS: list = []


def observe(category: str, t: torch.Tensor) -> torch.Tensor:
    """Report a new buffer of a memory `category` (directions | grads) to the breakdown, if one is watching."""
    for watch in WATCHERS:
        watch(category, t)
    return t


class Unit:
    """Consecutive trainable tensors drawn together: their names and parameters, the flat views of what this
    device holds of each (written in place), and how one flat draw of the whole tensors is cut into those parts."""

    def __init__(self, index: int, params: dict[str, torch.Tensor]):
        self.index, self.names, self.params = index, list(params), list(params.values())
        first = self.params[0]
        self.dtype, self.device = first.dtype, local(first).device
        self.shapes = [p.shape for p in self.params]
        self.sizes = [p.numel() for p in self.params]
        self.numel = sum(self.sizes)
        held = [local(p) for p in self.params]
        self.held = [h.view(-1) for h in held]  # what foreach adds write: the parameters' own storage
        self.held_shapes = [h.shape for h in held]
        if any(sharded(p) for p in self.params):
            # FSDP2 holds rows [r0, r1) of each tensor on this device: a contiguous run of its flat draw, so each
            # tensor's piece is cut in three (before, held, after) and the middle one kept
            self.cuts, self.pick = [], slice(1, None, 3)
            for p, h, n in zip(self.params, held, self.sizes):
                first, rows = _held_rows(p)
                row = n // max(p.shape[0], 1)
                if rows * row != h.numel():  # FSDP2 sharded otherwise than dim 0 by chunks: an update would go astray
                    raise RuntimeError(
                        f"rows [{first}, {first + rows}) of a {tuple(p.shape)} parameter; FSDP2 holds {tuple(h.shape)}"
                    )
                self.cuts += [first * row, rows * row, n - (first + rows) * row]
        else:
            self.cuts, self.pick = self.sizes, slice(None)

    def parts(self, flat: torch.Tensor) -> list[torch.Tensor]:
        """The flat pieces of a unit-sized buffer this device holds, one per tensor (views)."""
        return list(flat.split(self.cuts)[self.pick])

    def shaped(self, flat: torch.Tensor) -> dict[str, torch.Tensor]:
        """A unit-sized buffer as whole tensors by name (views)."""
        return {n: x.view(s) for n, x, s in zip(self.names, flat.split(self.sizes), self.shapes)}


def _held_rows(p) -> tuple[int, int]:
    """(first row, rows) of `p` this device holds: FSDP2 shards dim 0 as torch.chunk does (the last ranks' parts
    shorter, or empty)."""
    rows, world, rank = p.shape[0], p.device_mesh.size(), p.device_mesh.get_local_rank()
    per = -(-rows // world)
    first = min(rank * per, rows)
    return first, min(per, rows - first)


class Units(list):
    """The trainable tensors' units, in order; `.params` the tensors by name."""

    def __init__(self, params: dict[str, torch.Tensor]):
        self.params = params
        names = list(params)
        kinds = [(p.dtype, local(p).device) for p in params.values()]
        ranges = draw_units([p.numel() for p in params.values()], kinds)
        super().__init__(Unit(u, {names[i]: params[names[i]] for i in r}) for u, r in enumerate(ranges))
        self.unit_of = {n: unit for unit in self for n in unit.names}


def units_of(params) -> Units:
    """`params` as Units: a trainer's (made once), or a dict of tensors (tests)."""
    return params if isinstance(params, Units) else Units(params)


def draw(unit: Unit, seed: int, step: int, k: int, kind: str = "gaussian", *, salt: int = 0) -> torch.Tensor:
    """Unit `unit` of direction k at `step`, flat and whole: N(0, I) entries, or (kind="rademacher") +-1 ones from
    random bits, both with E[z z^T] = I. `salt` separates other draws of the same unit (LOZO's factors)."""
    flat = torch.empty(unit.numel, device=unit.device, dtype=unit.dtype)
    fill(flat, (seed, step, k, unit.index, salt), kind)
    return observe("directions", flat)


# On the CPU a unit's draw comes in chunks of CHUNK entries, each from its own generator (chunk c > 0 seeded by
# direction_seed(*words, c), chunk 0 by the unit's own seed, so a unit of at most CHUNK entries draws as one),
# filled by a thread each: torch's CPU generator is sequential, so one generator per unit drew a whole model's
# direction on one core while the others waited. The chunks are fixed, so the values do not depend on the threads.
CHUNK = UNIT_FLOOR


@functools.cache
def _pool() -> ThreadPoolExecutor:
    return ThreadPoolExecutor(max(torch.get_num_threads(), 1), thread_name_prefix="bench-draw")


os.register_at_fork(after_in_child=_pool.cache_clear)  # a forked child has none of the pool's threads


def fill(flat: torch.Tensor, words: tuple[int, ...], kind: str = "gaussian") -> None:
    """Write the draw seeded by `words` into the flat buffer `flat`, in place."""
    if flat.device.type != "cpu":  # one generator, one kernel
        _fill(flat, words, kind)
        return
    starts = range(0, flat.numel(), CHUNK)
    # a dispatch mode (the kernel count, the FLOP counter) sees its own thread's ops only: draw in this one for it
    if len(starts) <= 1 or _get_current_dispatch_mode() is not None:
        for start in starts:
            _fill(flat[start : start + CHUNK], _chunk_words(words, start), kind)
        return
    inference = torch.is_inference_mode_enabled()  # grad modes are per thread: the workers take the caller's

    def chunk(start: int) -> None:
        with torch.inference_mode(inference), torch.no_grad():
            _fill(flat[start : start + CHUNK], _chunk_words(words, start), kind)

    list(_pool().map(chunk, starts))


def _chunk_words(words: tuple[int, ...], start: int) -> tuple[int, ...]:
    return (*words, start // CHUNK) if start else words


def _fill(part: torch.Tensor, words: tuple[int, ...], kind: str) -> None:
    g = torch.Generator(device=part.device)
    g.manual_seed(direction_seed(*words))
    into(part, g, kind)


def random(shape, g: torch.Generator, device, dtype, kind: str = "gaussian") -> torch.Tensor:
    return into(torch.empty(shape, device=device, dtype=dtype), g, kind)


def into(out: torch.Tensor, g: torch.Generator, kind: str = "gaussian") -> torch.Tensor:
    """`out` filled in place from `g`: N(0, 1) entries, or (kind="rademacher") +-1 ones."""
    if kind == "rademacher":
        return out.copy_(rademacher(out.shape, g, out.device, out.dtype))
    return out.normal_(generator=g)


def rademacher(shape, g: torch.Generator, device, dtype) -> torch.Tensor:
    """+-1 entries, one random bit each: 8 bits per drawn byte, unpacked (torch draws no single bits itself)."""
    n = shape.numel() if isinstance(shape, torch.Size) else int(torch.Size(shape).numel())
    packed = torch.randint(0, 256, ((n + 7) // 8,), generator=g, device=device, dtype=torch.uint8)
    bits = packed[:, None].bitwise_right_shift(torch.arange(8, device=device, dtype=torch.uint8)).bitwise_and_(1)
    return bits.view(-1)[:n].to(dtype).mul_(2).sub_(1).view(shape)


@dataclass
class Direction:
    """One direction drawn whole: each unit's flat draw, and the tensors' views of them by name."""

    flats: list[torch.Tensor]
    tensors: dict[str, torch.Tensor]


def draw_direction(params, seed: int, step: int, k: int, kind: str = "gaussian") -> Direction:
    units = units_of(params)
    flats = [draw(unit, seed, step, k, kind) for unit in units]
    tensors = {n: x for unit, flat in zip(units, flats) for n, x in unit.shaped(flat).items()}
    return Direction(flats, tensors)


def sample_tangent(params, seed: int, step: int, k: int, kind: str = "gaussian") -> dict[str, torch.Tensor]:
    """Direction k of `step` over `params`, whole, by name."""
    return draw_direction(params, seed, step, k, kind).tensors


class SeededTangent:
    """Tangent k of `step` drawn a unit at a time when asked for (tangent[name]), the unit of the tensor asked for
    kept until another's is: the same values as sample_tangent(params, seed, step, k), never held whole."""

    def __init__(self, params, seed: int, step: int, k: int, kind: str = "gaussian"):
        self.units, self.seed, self.step, self.k, self.kind = units_of(params), seed, step, k, kind
        self.unit, self.tensors = None, {}

    def __getitem__(self, name: str) -> torch.Tensor:
        # whole: the pass runs the module with the parameter gathered (under FSDP2, by its unit's forward)
        unit = self.units.unit_of[name]
        if unit is not self.unit:
            self.tensors = {}  # the last unit's draw goes before the next one is made
            self.unit, self.tensors = unit, unit.shaped(draw(unit, self.seed, self.step, self.k, self.kind))
        return self.tensors[name]


@dataclass
class SeededGradient:
    """g = sum_k coeffs[k] * z_k, a unit at a time: z_k regenerated from (seed, step, k, unit) where the update
    reaches the unit, each of its tensors first moved by shift * z_0 (MeZO's last +eps z, which puts theta back:
    fused, one draw fewer)."""

    params: object  # Units, or a dict of tensors
    coeffs: list[float]
    seed: int
    step: int
    kind: str = "gaussian"
    shift: float = 0.0

    def __iter__(self):
        for unit in units_of(self.params):
            z = draw(unit, self.seed, self.step, 0, self.kind)
            parts = unit.parts(z)
            if self.shift:
                with torch.no_grad():
                    torch._foreach_add_(unit.held, parts, alpha=self.shift)
            # the first direction becomes g in place: for K=1 (MeZO) one unit-sized buffer, not two
            g = z.mul_(self.coeffs[0])
            for k, c in enumerate(self.coeffs[1:], start=1):
                g.add_(draw(unit, self.seed, self.step, k, self.kind), alpha=c)
            yield unit, parts
            del z, g, parts  # before the next unit is drawn: one unit's estimate at a time

    def materialize(self) -> dict[str, torch.Tensor]:
        return materialize(self)


@dataclass
class TangentGradient:
    """g = sum_k coeffs[k] * tangents[k] for tangents held in memory (supplied by tests, or jvp's one tangent).
    `kept`: the one tangent as drawn (draw_direction), scaled in place a unit at a time: no temporary."""

    params: object  # Units, or a dict of tensors
    tangents: list[dict[str, torch.Tensor]]
    coeffs: list[float]
    kept: Direction | None = None

    def __iter__(self):
        for u, unit in enumerate(units_of(self.params)):
            if self.kept is not None:
                flat = self.kept.flats[u].mul_(self.coeffs[0])
                self.kept.flats[u] = None  # each unit leaves the tangent as it is applied
            else:
                flat = torch.cat(
                    [sum(c * t[n] for c, t in zip(self.coeffs, self.tangents)).reshape(-1) for n in unit.names]
                )
            yield unit, unit.parts(flat)

    def materialize(self) -> dict[str, torch.Tensor]:
        return materialize(self)


def materialize(estimate) -> dict[str, torch.Tensor]:
    """A lazy estimate whole, by name, each tensor's part this device holds in its shape (tests, gradient quality)."""
    return {n: x.view(s) for unit, parts in estimate for n, x, s in zip(unit.names, parts, unit.held_shapes)}


@torch.no_grad()
def perturb(params, scale: float, seed: int, step: int, kind: str = "gaussian", k: int = 0) -> None:
    """theta += scale * z in place, z (direction k of `step`) regenerated a unit at a time from its seed (no stored
    noise): one draw and one foreach add per unit; under FSDP2 each device perturbs the rows it holds."""
    for unit in units_of(params):
        torch._foreach_add_(unit.held, unit.parts(draw(unit, seed, step, k, kind)), alpha=scale)
