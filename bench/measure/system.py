"""Facts about the host and the process, shared by every scenario and known to nothing of BERT or of ops: the
CPU's name, the GPUs, installed versions, the git commit and the thread environment. Nothing here imports torch or
jax."""

from __future__ import annotations

import functools
import os
import platform
import shutil
import subprocess
from collections.abc import Mapping
from importlib import metadata
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
VERSIONED = ("jax", "jaxlib", "flax", "torch", "transformers")


def cpu_name() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            model = next(line.split(":", 1)[1].strip() for line in f if line.startswith("model name"))
    except (OSError, StopIteration):
        model = platform.processor() or "cpu"
    return f"{model} x{os.cpu_count()}"


def host_slug() -> str:
    """A short name for this host's hardware, as benchmarks/ files are named: "2core-epyc", "1gpu-h100"."""
    gpus = cuda_gpu_names()
    if gpus:
        return gpu_slug(gpus[0], len(gpus))
    model = cpu_name().rsplit(" x", 1)[0]
    words = [
        w
        for w in model.replace("(R)", "").replace("(TM)", "").split()
        if w.lower() not in ("amd", "intel", "core", "processor", "cpu", "genuine")
    ]
    return f"{os.cpu_count()}core-{(words[0] if words else 'cpu').lower()}"


def gpu_slug(name: str, count: int) -> str:
    """A GPU host's short name from its card's name: ("NVIDIA H200", 1) -> "1gpu-h200"."""
    words = [w for w in name.replace("NVIDIA", "").split() if any(c.isdigit() for c in w)]
    return f"{count}gpu-{(words[0] if words else 'gpu').lower()}"


def nvidia_smi(*args: str) -> str:
    """nvidia-smi's output for these arguments; "" without a driver (the parent never imports a framework to ask
    about GPUs)."""
    exe = shutil.which("nvidia-smi")
    if exe is None:
        return ""
    try:
        out = subprocess.run([exe, *args], capture_output=True, text=True, timeout=20)
    except (OSError, subprocess.SubprocessError):
        return ""
    return out.stdout if out.returncode == 0 else ""


@functools.cache
def cuda_gpu_names() -> list[str]:
    """Each GPU's name on this host, by `nvidia-smi -L` ("GPU 0: NVIDIA H100 80GB HBM3 (UUID: ...)")."""
    lines = [ln for ln in nvidia_smi("-L").splitlines() if ln.startswith("GPU ")]
    return [ln.split(":", 1)[1].split("(UUID")[0].strip() for ln in lines]


def host_facts() -> dict[str, str]:
    """Where and with what a trial ran: host, Python, git commit and the frameworks' versions."""
    return {
        "hostname": platform.node(),
        "python_version": platform.python_version(),
        "git_sha": git_sha(),
        **versions(),
    }


def versions() -> dict[str, str]:
    """Installed versions, read from package metadata: importing the frameworks here would defeat isolation."""
    out = {}
    for name in VERSIONED:
        try:
            out[f"{name}_version"] = metadata.version(name)
        except metadata.PackageNotFoundError:
            out[f"{name}_version"] = ""
    return out


def cuda_device_count() -> int:
    """GPUs on this host, by `nvidia-smi -L`; 0 without a driver."""
    return len(cuda_gpu_names())


@functools.cache
def cuda_memory_mb() -> list[int]:
    """Each GPU's total memory on this host in MiB, by nvidia-smi."""
    return [int(float(v)) for v in nvidia_smi("--query-gpu=memory.total", "--format=csv,noheader,nounits").split()]


def jaxlib_at_least(*version: int) -> bool:
    """Whether the installed jaxlib is at least `version`, read without importing jax (the parent never does)."""
    try:
        release = metadata.version("jaxlib").split(".")
        return tuple(int("".join(ch for ch in p if ch.isdigit()) or 0) for p in release[:3]) >= version
    except metadata.PackageNotFoundError:
        return False


# The commit of a tree that travelled without .git (a lent GPU machine's copy): `make gpu-check` sets it from what
# `make gpu-wheels` recorded beside the wheels (bench/scenarios/gpu/wheels.py), so every row still names its commit.
GIT_SHA_ENV = "BENCH_GIT_SHA"


# Tracked files that record results rather than make them: a run resumed inside the repository
# (benchmarks/cost_to_target_rows) writes its own runs.csv there, which says nothing about the code that measured.
RESULTS_TRACKED = "benchmarks"


def git_sha(environ: Mapping[str, str] = os.environ) -> str:
    """The checkout's commit (12 hex, "-dirty" with uncommitted changes to tracked files outside
    RESULTS_TRACKED), else "". BENCH_GIT_SHA in `environ`, where set, wins: a tree copied to a GPU host may carry
    another checkout's .git, and the commit recorded beside the wheels is the one the tree was copied from."""
    if recorded := environ.get(GIT_SHA_ENV):
        return recorded
    try:
        sha = subprocess.run(
            ["git", "rev-parse", "--short=12", "HEAD"], cwd=REPO, capture_output=True, text=True, timeout=10
        ).stdout.strip()
        dirty = subprocess.run(
            ["git", "status", "--porcelain", "--untracked-files=no", "--", ".", f":(exclude){RESULTS_TRACKED}"],
            cwd=REPO,
            capture_output=True,
            text=True,
            timeout=10,
        ).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        sha, dirty = "", ""
    if not sha:
        return ""
    return f"{sha}-dirty" if dirty else sha


def thread_env(threads: str) -> dict[str, str]:
    """threads=1 | all, as the trial's environment: read when the libraries load, so set before the child imports
    torch or jax. OpenMP sizes torch's intra-op pool (and numpy's BLAS) from OMP_NUM_THREADS;
    --xla_cpu_multi_thread_eigen=false makes XLA:CPU run its matmuls on the calling thread instead of Eigen's
    pool. The child also calls torch.set_num_threads (torch_impl/ops.py setup)."""
    n = "1" if threads == "1" else str(len(os.sched_getaffinity(0)))
    env = {"OMP_NUM_THREADS": n, "MKL_NUM_THREADS": n, "OPENBLAS_NUM_THREADS": n}
    flags = os.environ.get("XLA_FLAGS", "")
    if threads == "1":
        flags = f"{flags} --xla_cpu_multi_thread_eigen=false".strip()
    if flags:
        env["XLA_FLAGS"] = flags
    return env
