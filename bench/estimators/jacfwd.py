"""jacfwd: the exact gradient by forward mode, one jvp per basis direction of the trainable parameters, `chunk`
directions vmapped together (the trainable=head scopes run the untangented trunk once)."""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from typing import Any

from bench.estimators.base import (
    CommContext,
    CommTerms,
    Estimator,
    FlopContext,
    FlopTerms,
    MemoryContext,
    MemoryTerms,
    TrialContext,
    integer,
    setting,
)
from bench.spec import HEAD_ONLY


@dataclass
class JacfwdSettings:
    chunk: Any = setting("auto", "basis directions per vmapped jvp, auto (jax on CPU 8, else 256) | integer >= 1")
    max_params: int = setting(
        2_000_000, "refuse more trainable parameters (one forward-mode pass each) than this, integer >= 1"
    )
    max_forwards: int = setting(
        2_000,
        "refuse a step the FLOP model prices above this many forward passes (a pass per trained parameter through "
        "every layer after it: LoRA's adapters and BitFit's biases cross them all, the head scopes only the "
        "head), integer >= 1",
    )


def chunk_for(chunk: int | str, framework: str, device_kind: str) -> int:
    """`jacfwd.chunk=auto`: the chunk each framework runs fastest with (measured, MiniLM head, 2-core CPU).
    XLA on CPU: 8 directions, so the (chunk, n) one-hot block stays in cache (256: 3.5x slower, memory bound).
    torch: 256, where the Python loop over chunks costs less than the vmapped pass (16 or 1024: no faster)."""
    if chunk != "auto":
        return int(chunk)
    return 8 if (framework, device_kind) == ("jax", "cpu") else 256


class Jacfwd(Estimator):
    name, label = "jacfwd", "jacfwd"
    rank = 3
    color = "#2ca02c"
    summary = "exact gradient by forward mode: one jvp per basis direction, chunks vmapped"
    passes, compiles = "ceil(n / chunk) vmapped forward-mode passes", False
    settings = JacfwdSettings
    moved = {"jacfwd_chunk": "chunk", "jacfwd_max_params": "max_params"}

    def variant(self, off: dict[str, str]) -> tuple[list[str], list[str]]:
        # jacfwd's settings name no variant: the chunk is how fast the same maths runs (the row records the one that
        # ran, which under auto is the device's choice, never a default) and the guards refuse, they change nothing
        return [], []

    def forward_passes_for(self, row: dict) -> int | None:
        # a forward-mode pass per basis direction, as a jvp counts one per tangent: the chunks vmap them, not merge
        n = row.get("n_trainable")
        return int(float(n)) if n not in (None, "") else None

    def check(self, s: JacfwdSettings) -> str | None:
        if s.chunk != "auto" and integer("jacfwd.chunk", s.chunk, 1):
            return f"jacfwd.chunk={s.chunk}: accepted auto | an integer >= 1"
        return integer("jacfwd.max_params", s.max_params, 1) or integer("jacfwd.max_forwards", s.max_forwards, 1)

    def refuses(self, c: TrialContext) -> str | None:
        s = self.settings_of(c.step)
        if (c.framework, c.parallel) == ("torch", "fsdp"):
            return (
                "mode=jacfwd with parallel=fsdp, framework=torch: forward-mode AD through FSDP2's sharded (DTensor) "
                "parameters is not supported by torch (aten._has_same_storage_numel has no sharding strategy); use "
                "parallel=ddp, or framework=jax"
            )
        if c.n > s.max_params:
            return (
                f"mode=jacfwd with trainable={c.step.trainable}: {c.n:,} trainable parameters, one forward-mode pass "
                f"each (> jacfwd.max_params={s.max_params}); accepted: trainable=head|bias|last_k with fewer "
                "parameters, or a larger jacfwd.max_params"
            )
        if c.forwards is not None and c.forwards > s.max_forwards:
            # a step that costs thousands of forward passes runs minutes on a CPU and looks hung: asked for, or not run
            return (
                f"mode=jacfwd with trainable={c.step.trainable}: {c.n:,} trainable parameters, one forward-mode pass "
                f"each through every layer after it: the FLOP model prices a step at {c.forwards:,.0f} forward "
                f"passes (> jacfwd.max_forwards={s.max_forwards}); accepted: trainable=head|classifier (the trunk "
                f"runs once), or jacfwd.max_forwards={math.ceil(c.forwards)} or more to run it"
            )
        return None

    def resolve(self, s: JacfwdSettings, framework: str, device_kind: str) -> JacfwdSettings:
        return replace(s, chunk=chunk_for(s.chunk, framework, device_kind))

    def chunk(self, step) -> int:
        """The step's chunk, resolved for its device (Estimator.resolved) before a model of it is asked."""
        chunk = self.settings_of(step).chunk
        if not isinstance(chunk, int):
            raise ValueError(f"jacfwd.chunk={chunk!r}: resolve it for the device first (Estimator.resolved)")
        return chunk

    def memory(self, c: MemoryContext) -> MemoryTerms:
        chunk, P = self.chunk(c.step), c.param_bytes
        if c.step.trainable in HEAD_ONLY:  # the trunk once, untangented; the head's rows carry the chunk's tangents
            temp = c.forward_temp + 2 * chunk * c.batch_size * c.activation_bytes * c.hidden
        else:  # every activation carries the chunk's tangents beside its primal
            temp = 2 * c.forward_temp * chunk
        return MemoryTerms(grads=P * c.n, directions=P * c.n * chunk, temp=temp)

    def flops(self, c: FlopContext) -> FlopTerms:
        chunks = math.ceil(c.n / min(self.chunk(c.step), c.n))
        head_only = c.step.trainable in HEAD_ONLY
        if c.hoists or (c.framework == "jax" and head_only):  # the (head's) primal out of the loop
            forward = c.every
        elif head_only:  # the trunk once, untangented; the head's primal once per chunk
            forward = c.trunk + chunks * (c.every - c.trunk) + (c.pooler if c.framework == "torch" else 0)
        else:
            forward = chunks * c.every
        return FlopTerms(forward=forward, tangent=c.n * c.derivative + chunks * c.zero_terms)  # zeros: per chunk

    def comm(self, c: CommContext) -> CommTerms:
        return CommTerms(per_micro=c.gather, per_update=c.gradient + c.scalar)  # the whole gradient, as backprop


ESTIMATOR = Jacfwd()
