"""Kernels a JAX step launches, and the host's share of it. Mirror image of torch_impl/kernels.py.

    count(trainer, micro_batches, step_s)   the compiled step's kernels, and one more step traced

A jitted step launches what its compiled programs hold, so the count is read from their optimized HLO, nothing
run: every instruction XLA's runtime executes as a kernel or thunk (a fusion, a custom call such as a cuBLAS GEMM
or a oneDNN matmul, a copy, a dot or convolution left unfused, a sort, a random-bit generator, a collective's
start), and none of those that only name or regroup buffers (parameter, constant, tuple, get-tuple-element,
bitcast, an async op's done). A fusion is one kernel, whatever it fuses. A while loop's body counts its
known_trip_count times (XLA's annotation; a loop without one counts once, and the method says how many), its
condition not at all (a known trip count runs the body that many times without it); a call counts what it calls
(XLA:GPU's command buffers), except XLA:CPU's small calls (a small loop compiled into one kernel), which count one;
a conditional counts its largest branch. Each program counts times its runs per step (Trainer.programs).

The host's share is read from one more step traced by jax.profiler (bench/jax_impl/profile.py): the share of that
step in which no XLA operation ran (bench/measure/timeline.py's overhead), the suite's Python, the arguments'
flattening and the runtime's launches. No JAX API times a compiled program's operations without a profiler.
"""

from __future__ import annotations

from collections import Counter

import jax

from bench.jax_impl import profile
from bench.jax_impl.flops import called, parse_computations, trip_count
from bench.measure.timeline import traced_overhead_share

METHOD = "xla.hlo_thunks"
TOP = 10  # kernels named per step in kernels_top
# instructions that launch nothing: they name, regroup or wait on buffers other instructions make
NO_KERNEL = frozenset(
    {
        "parameter",
        "constant",
        "tuple",
        "get-tuple-element",
        "bitcast",
        "after-all",
        "add-dependency",
        "opt-barrier",
        "domain",
        "async-update",
    }
)
SMALL_CALL = 'xla_cpu_small_call="true"'  # XLA:CPU: a small while loop compiled into one kernel


def count(trainer, micro_batches, step_s: float) -> dict:
    """The kernels one step of `trainer` launches (its programs compiled here for these device micro-batches if
    the trainer has not been), and its host's share from one more step traced (run it after the timed window).
    `step_s` is not read: the trace's own step is the share's denominator. Keys as torch_impl.kernels.count's:

    kernels_per_step                the programs' kernels, times their runs per step
    kernels_method                  "xla.hlo_thunks", and the loops of unknown trip count where there are some
    no_kernel_dispatches_per_step   None: a compiled program dispatches no operator that launches nothing
    host_share                      the traced step's share in which no XLA operation ran
    host_share_method               "jax_profiler_step"
    kernels_top                     the most launched kernels {opcode: count}, for the reader (not a column)
    """
    if not all(isinstance(c, jax.stages.Compiled) for c, _ in trainer.programs()):
        trainer.compile(micro_batches)
    kinds: Counter = Counter()
    unknown = 0
    for compiled, runs in trainer.programs():
        found, loops = hlo_kernels(compiled.as_text())
        kinds.update({k: runs * n for k, n in found.items()})
        unknown += loops
    method = METHOD + (f" ({unknown} while loops of unknown trip count, counted once)" if unknown else "")
    return {
        "kernels_per_step": sum(kinds.values()),
        "kernels_method": method,
        "no_kernel_dispatches_per_step": None,
        "host_share": traced_overhead_share(profile, trainer, micro_batches),
        "host_share_method": "jax_profiler_step",
        "kernels_top": dict(kinds.most_common(TOP)),
    }


def hlo_kernels(text: str) -> tuple[Counter, int]:
    """({opcode: kernels} of one run of the optimized HLO module `text`, while loops whose trip count it lacks),
    by the rules of the module's docstring."""
    computations, entry = parse_computations(text)
    unknown = 0

    def kernels_of(name: str) -> Counter:
        nonlocal unknown
        out: Counter = Counter()
        for _, _, tail in computations.get(name, []):
            op = tail.split("(", 1)[0]
            if op in NO_KERNEL or op.endswith("-done"):
                continue
            calls = dict(called(tail))
            if op == "while":
                trip = trip_count(tail)
                unknown += trip is None
                out.update({k: n * (1 if trip is None else trip) for k, n in kernels_of(calls["body"]).items()})
            elif op == "call" and SMALL_CALL not in tail:
                out.update(kernels_of(calls["to_apply"]))
            elif op == "conditional":
                out.update(max((kernels_of(c) for _, c in called(tail)), key=lambda k: k.total()))
            else:
                out[op.removesuffix("-start")] += 1
        return out

    return (kernels_of(entry) if entry else Counter()), unknown
