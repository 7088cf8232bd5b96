"""Each estimator's gradient in JAX: bench/jax_impl/estimators/<name>.py, beside its framework-neutral module
bench/estimators/<name>.py and its torch mirror bench/torch_impl/estimators/<name>.py (the same functions, the
same names, in the same order), or the module an installed plug-in names (Estimator.implementations). The Trainer
(bench/jax_impl/steps.py) delegates to the module `mode=<name>` selects
(bench.estimators.REQUIRED: what it must define):

    gradient(trainer, params, micro_batches, step, tangents=None) -> (params, loss, gradient)
        traced inside a jitted program: the parameters (MeZO's after its perturbation round trip), the loss before
        the update and the gradient or its estimate, never updating. `tangents`: given directions (tests).
    memory(trainer, micro_batches, temp) -> Held
        the step's categories of memory from the pytrees and the compiled programs (bench/jax_impl/memory.py);
        `temp`: the temporaries of the step's largest program
    init_state(trainer) -> state      optional: what the estimator keeps across steps (HiZOO's Hessian estimate),
        made by the first gradient or step: trainer.state, an argument of every program that reads it

By default the timed step is one program, `gradient` then the optax update, fused by XLA. A module whose step is
better run as several programs (jvp, MeZO: see their docstrings) defines all four of:

    prepare(trainer, shardings)      jit the step's programs onto the trainer (with the world's shardings)
    lower(trainer, micro_batches) -> {attribute: jax.stages.Lowered}   for Trainer.compile, ahead of time
    programs(trainer) -> [(compiled program, runs per step)]            what one timed step runs
    step(trainer, micro_batches) -> loss                                 the timed step

A module reads what the Trainer holds: spec (the StepSpec, its settings resolved for the device), estimator (its
neutral module's ESTIMATOR, whose settings_of(spec) gives its settings), step_count, params, frozen, opt_state,
optimizer, loss_of and trunk (the loss and its halves), on(frozen, state) (the trainer computing on a program's
arguments), gather, jit, micro_batches (per update), state.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass
from types import ModuleType

from bench import estimators
from bench.spec import UNIT_FLOOR

# Trained entries under which a split step (MeZO's, HiZOO's, LOZO's) on one device runs its programs' bodies as one
# program: the perturbed copies of theta XLA then holds are what a unit of the small tensors' shared draw holds
# already (UNIT_FLOOR's 4 MiB in float32), and at that size the host's cost of each program call is much of the step
ONE_PROGRAM_BELOW = UNIT_FLOOR


@dataclass(frozen=True)
class Held:
    """An estimator's bytes per category on the fullest device (bench/jax_impl/memory.py defines each); `inside`
    is how much of them lives within the largest program's temporaries, `beside` how much is held outside it."""

    saved: int = 0
    grads: int = 0
    directions: int = 0
    inside: int = 0
    beside: int = 0


def implementation(name: str) -> ModuleType:
    """The JAX module of estimator `name` (ValueError naming the accepted ones for another name; PluginError for
    one that lacks a function it must define, or defines part of a split step)."""
    module = importlib.import_module(estimators.module_of(name, "jax"))
    estimators.check_module(name, "jax", module)
    if any(hasattr(module, f) for f in estimators.SPLIT_STEP):
        estimators.check_module(name, "jax", module, estimators.SPLIT_STEP)
    return module


def one_program(trainer) -> bool:
    """Whether a split step's programs run as one: on one device, a trained state under ONE_PROGRAM_BELOW."""
    return trainer.world is None and trainer.n_trainable < ONE_PROGRAM_BELOW
