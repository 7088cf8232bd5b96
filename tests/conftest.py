"""Shared test setup. The `cuda` and `slow` markers are registered in pyproject.toml."""

from __future__ import annotations

import functools
import os
import shutil
import subprocess
import tempfile

import pytest

# One XLA compilation cache for the session, shared by the test process and every trial it starts (they inherit
# the environment): the suite compiles the same tiny programs in many trials, and a trial that finds its program
# there skips XLA's compile (about a tenth of the JAX tests' time). Nothing asserts how long a compile takes.
# Under pytest-xdist the workers inherit the controller's folder (it is set before they start); only the process
# that made it removes it, once every worker is done.
_XLA_CACHE = None
if "JAX_COMPILATION_CACHE_DIR" not in os.environ:
    _XLA_CACHE = os.environ["JAX_COMPILATION_CACHE_DIR"] = tempfile.mkdtemp(prefix="bench-tests-xla-")
os.environ.setdefault("JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS", "0")


def pytest_unconfigure(config):
    if _XLA_CACHE is not None:
        shutil.rmtree(_XLA_CACHE, ignore_errors=True)


@functools.cache
def _nvidia_gpu_present() -> bool:
    # nvidia-smi rather than torch.cuda.is_available(): collecting tests must not import torch (nor jax) just
    # to decide what to skip. A test that also needs a CUDA build of torch or jaxlib checks for it itself.
    exe = shutil.which("nvidia-smi")
    if exe is None:
        return False
    try:
        out = subprocess.run([exe, "-L"], capture_output=True, text=True, timeout=20)
    except (OSError, subprocess.TimeoutExpired):
        return False
    return out.returncode == 0 and "GPU" in out.stdout


def pytest_collection_modifyitems(config, items):
    cuda_items = [item for item in items if "cuda" in item.keywords]
    if cuda_items and not _nvidia_gpu_present():
        skip = pytest.mark.skip(reason="needs a CUDA GPU (nvidia-smi -L lists none)")
        for item in cuda_items:
            item.add_marker(skip)
