"""Scenario `ops`: op-level AD micro-benchmarks (issue 6).

spec.py       the ops, framework-neutral: inputs for a shape, and the primal, jvp and vjp in numpy (the analytic
              derivatives every framework is checked against)
torch_ops.py  the same ops in PyTorch: primal, torch.func.jvp, torch.func.vjp (eager, or torch.compile'd)
jax_ops.py    mirror image in JAX: primal, jax.jvp, jax.vjp, each under jax.jit
measure.py    the trial process's loop: for every op and shape, warm up, time (median of repeats), check

One trial = one framework x every op x every shape, in one spawned process (bench/runner.py), rows to ops.csv.
"""
