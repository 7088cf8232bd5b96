"""An example plug-in for bench: the estimator `coordinate`, found through the entry point its pyproject.toml
declares (group bench.estimators). Its framework-neutral module is coordinate.py; its gradient in torch and in JAX
are torch_coordinate.py and jax_coordinate.py, the same functions under the same names."""
