"""Each estimator's gradient in torch: bench/torch_impl/estimators/<name>.py, beside its framework-neutral module
bench/estimators/<name>.py and its JAX mirror bench/jax_impl/estimators/<name>.py (the same functions, the same
names, in the same order), or the module an installed plug-in names (Estimator.implementations). The Trainer
(bench/torch_impl/steps.py) delegates to the module `mode=<name>` selects
(bench.estimators.REQUIRED: what it must define):

    gradient(trainer, micro_batches, tangents=None, in_step=False) -> (loss, gradient)
        the loss before the update and the gradient or its estimate over trainer.params, never updating: a dict
        of tensors, or a lazy estimate (directions.SeededGradient, TangentGradient) the update draws tensor by
        tensor. `tangents`: given directions instead of seeded ones (tests). `in_step`: the timed step's call,
        which may leave work to the update (MeZO's last +eps, restored by the update's draw of z).
    init_state(trainer) -> state            optional: what the estimator keeps across steps (HiZOO's Hessian
                                            estimate), made by the first gradient or step: trainer.state
    prepare(trainer)                        optional: set the model up once, before anything runs
    step(trainer, micro_batches) -> loss    optional: the timed step, when it is not gradient then apply

A module reads what the Trainer holds: spec (the StepSpec, its settings resolved for the device), estimator (its
neutral module's ESTIMATOR, whose settings_of(spec) gives its settings), step_count, module (what the forward pass
runs), params (the trainable parameters by name), reduce (the mean over devices), autocast, state.
"""

from __future__ import annotations

import importlib
from types import ModuleType

from bench import estimators


def implementation(name: str) -> ModuleType:
    """The torch module of estimator `name` (ValueError naming the accepted ones for another name; PluginError
    for one that lacks a function it must define)."""
    module = importlib.import_module(estimators.module_of(name, "torch"))
    estimators.check_module(name, "torch", module)
    return module
