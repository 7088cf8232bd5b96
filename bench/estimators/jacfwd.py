"""jacfwd: the exact gradient by forward mode, one jvp per basis direction of the trainable parameters, `chunk`
directions vmapped together (the trainable=head scopes run the untangented trunk once)."""

from __future__ import annotations

import math

from bench.estimators.base import CommContext, CommTerms, Estimator, FlopContext, FlopTerms, MemoryContext, MemoryTerms
from bench.spec import HEAD_ONLY


class Jacfwd(Estimator):
    name, label = "jacfwd", "jacfwd"
    summary = "exact gradient by forward mode: one jvp per basis direction, chunks vmapped"
    passes = "ceil(n / chunk) vmapped forward-mode passes"

    def refuses(self, framework: str, parallel: str) -> str | None:
        if (framework, parallel) == ("torch", "fsdp"):
            return (
                "forward-mode AD through FSDP2's sharded (DTensor) parameters is not supported by torch "
                "(aten._has_same_storage_numel has no sharding strategy); use parallel=ddp, or framework=jax"
            )
        return None

    def memory(self, c: MemoryContext) -> MemoryTerms:
        chunk, P = c.jacfwd_chunk, c.param_bytes
        if c.step.trainable in HEAD_ONLY:  # the trunk once, untangented; the head's rows carry the chunk's tangents
            temp = c.forward_temp + 2 * chunk * c.batch_size * c.activation_bytes * c.hidden
        else:  # every activation carries the chunk's tangents beside its primal
            temp = 2 * c.forward_temp * chunk
        return MemoryTerms(grads=P * c.n, directions=P * c.n * chunk, temp=temp)

    def flops(self, c: FlopContext) -> FlopTerms:
        if not isinstance(c.jacfwd_chunk, int):
            raise ValueError(f"jacfwd_chunk={c.jacfwd_chunk!r}: pass predict(..., jacfwd_chunk=trainer.jacfwd_chunk)")
        chunks = math.ceil(c.n / min(c.jacfwd_chunk, c.n))
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
