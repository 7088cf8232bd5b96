"""Shared test setup. The `cuda` and `slow` markers are registered in pyproject.toml."""

from __future__ import annotations

import functools
import os
import shutil
import subprocess

import pytest

from bench.measure.system import REPO  # imports neither jax nor torch: the cache is set before either

# One XLA compilation cache, shared by the test process and every trial it starts (they inherit the environment),
# and kept between runs in .cache/xla (ignored by git; `make clean` removes it): the suite compiles the same tiny
# programs in many trials, and a run finds there what the last one compiled, so a second `make test` skips most of
# XLA's compiling (docs/testing.md has it measured). JAX's cache key is the program, the jax/jaxlib versions, the XLA
# flags and the device, so an edited program compiles anew; least recently used entries go beyond 1 GiB. Nothing
# asserts how long a compile takes. JAX_COMPILATION_CACHE_DIR set by the caller wins (an empty folder: a cold run).
# Under pytest-xdist the workers inherit the folder, and JAX's file lock keeps their writes apart.
XLA_CACHE = REPO / ".cache" / "xla"
if "JAX_COMPILATION_CACHE_DIR" not in os.environ:
    XLA_CACHE.mkdir(parents=True, exist_ok=True)
    os.environ["JAX_COMPILATION_CACHE_DIR"] = str(XLA_CACHE)
os.environ.setdefault("JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS", "0")
os.environ.setdefault("JAX_COMPILATION_CACHE_MAX_SIZE", str(1 << 30))
# One OpenMP thread for torch in the test process and the trials it starts (a value the caller sets wins): the
# tests' shapes are tiny, and torch's pool beside another busy process (a trial, a parallel sweep's other worker,
# xdist's other worker) spins against it for many times the work (docs/testing.md has it measured). Tests of what
# more threads do set their own with torch.set_num_threads.
os.environ.setdefault("OMP_NUM_THREADS", "1")


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
