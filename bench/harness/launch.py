"""How many processes a trial is, where they start, and how they are stopped. Locally the runner starts every
process of a trial; under a multi-task submitit job each task starts its own rank. `check_launch` says, before
anything runs, whether the Hydra launcher and this host can start a trial's processes.

Every trial process leads its own session (so that the whole of it can be killed at once) and is named on its
command line after TRIAL_MODULE, which is how an interrupted launch finds what it must stop.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import socket
import tempfile
from dataclasses import dataclass
from pathlib import Path

import psutil
from submitit.helpers import TorchDistributedEnvironment

from bench.config import BenchConfig
from bench.errors import ConfigError

LAUNCHER_PID = "BENCH_LAUNCHER_PID"
TRIAL_MODULE = "bench.scenarios"  # python -m bench.scenarios PAYLOAD RESULT: a trial process (its __main__)
STOP_GRACE_S = 5.0  # what an interrupted launch gives its jobs to stop their trials and clean up (they take < 1 s)


def processes_per_node(cfg: BenchConfig) -> int:
    """How many trial processes the runner starts on one node: torch runs one process per device (a rank each);
    JAX one process that owns every device of its node."""
    if cfg.parallel == "none" or cfg.framework == "jax":
        return 1
    return cfg.devices


@dataclass(frozen=True)
class Task:
    """This job's share of a trial's processes. Locally the runner starts every process of the trial; under a
    multi-task submitit job (hydra/launcher=submitit_* with tasks_per_node and nodes) every task runs this job
    and starts one process: its own rank, with the rendezvous submitit gives."""

    ranks: tuple[int, ...]  # the ranks this job starts
    processes: int  # every process of the trial, on every node
    master_addr: str
    master_port: int

    @property
    def main(self) -> bool:
        return 0 in self.ranks  # the job that records the trial


def this_task(cfg: BenchConfig) -> Task:
    try:
        env = TorchDistributedEnvironment()  # submitit's: rank, world size, rendezvous (host of rank 0)
    except RuntimeError:  # not inside a submitit job
        env = None
    if env is not None and env.world_size > 1:
        return Task((env.rank,), env.world_size, env.master_addr, env.master_port)
    n = processes_per_node(cfg)  # nodes=1 here: preflight refuses more nodes without a multi-node launcher
    return Task(tuple(range(n)), n, "127.0.0.1", free_port() if n > 1 else 0)


def rank_env(cfg: BenchConfig, task: Task, rank: int) -> dict[str, str]:
    """The env:// rendezvous of one trial process (torch.distributed reads it; so does jax_impl/parallel.py)."""
    if task.processes == 1:
        return {}
    per_node = max(1, task.processes // cfg.nodes)
    return {"MASTER_ADDR": task.master_addr, "MASTER_PORT": str(task.master_port), "RANK": str(rank),
            "WORLD_SIZE": str(task.processes), "LOCAL_RANK": str(rank % per_node),
            "LOCAL_WORLD_SIZE": str(per_node)}  # fmt: skip


def free_port() -> int:
    """A TCP port nobody listens on now, for a trial's rendezvous on localhost (the OS picks it)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def check_launch(cfg: BenchConfig, launcher: dict, gpus: int) -> None:
    """Whether the Hydra launcher can start this trial's processes where it starts them: more than one node needs
    a submitit launcher with as many nodes; a submitit job with several tasks per node gives each task one process
    of the trial, so their count must be what the framework runs (torch: one per device; jax: one per node, or one
    per device); a trial that runs on this host (every launcher but SLURM's) needs the GPUs it asks for
    (`gpus`: this host's count, bench.measure.system.cuda_device_count)."""
    target = str(launcher.get("_target_", ""))
    submitit = "submitit" in target
    if "slurm" not in target.lower():
        if cfg.device == "cuda" and gpus == 0:
            raise ConfigError("device=cuda: this host has no CUDA GPU (nvidia-smi lists none); accepted: cpu | auto")
        if cfg.fsdp_offload and gpus == 0:
            raise ConfigError(
                "fsdp_offload=true: this host has no GPU, so the parameters already live in host memory and there is "
                "nothing to offload to; accepted on a CUDA device"
            )
        if cfg.device in ("cuda", "auto") and 0 < gpus < cfg.devices:
            raise ConfigError(f"devices={cfg.devices}: this host has {gpus} GPU(s); accepted 1..{gpus} or device=cpu")
    nodes, tasks = (launcher.get("nodes", 1), launcher.get("tasks_per_node", 1)) if submitit else (1, 1)
    fix = (f"hydra/launcher=submitit_slurm hydra.launcher.nodes={cfg.nodes} "
           f"hydra.launcher.tasks_per_node={processes_per_node(cfg) if cfg.framework == 'torch' else 1}")  # fmt: skip
    if cfg.nodes != nodes:
        raise ConfigError(f"nodes={cfg.nodes}: the launcher starts {nodes} node(s); accepted: {fix}")
    if tasks > 1:
        accepted = {processes_per_node(cfg)} if cfg.framework == "torch" else {1, cfg.devices}
        if tasks not in accepted or cfg.parallel == "none":
            raise ConfigError(
                f"hydra.launcher.tasks_per_node={tasks}: a {cfg.framework} trial with parallel={cfg.parallel} "
                f"devices={cfg.devices} runs {' or '.join(map(str, sorted(accepted)))} process(es) per node; "
                f"accepted: {fix}"
            )
    elif cfg.nodes > 1 and cfg.framework == "torch" and cfg.devices > 1:
        raise ConfigError(
            f"nodes={cfg.nodes} devices={cfg.devices}: a torch trial across nodes runs one task per device; "
            f"accepted: {fix}"
        )


# ---------------------------------------------------------------------------------------------------------------
# stopping


def temp_prefix() -> str:
    """Trial temp folders are named after the launching process (`python -m bench` sets BENCH_LAUNCHER_PID for
    its jobs, wherever a launcher runs them), so that an interrupted launch can remove what a killed job left."""
    return f"bench-{os.environ.get(LAUNCHER_PID, os.getpid())}-"


def kill_session(proc) -> None:
    try:
        os.killpg(proc.pid, signal.SIGKILL)  # the whole session: the child and anything it started
    except ProcessLookupError:
        pass


def is_trial(p: psutil.Process) -> bool:
    try:
        cmd = p.cmdline()
    except psutil.Error:
        return False
    return TRIAL_MODULE in cmd


def stop_descendants(grace_s: float = STOP_GRACE_S) -> None:
    """On SIGINT/SIGTERM to the launching process: ask every descendant (a launcher's workers, submitit's local
    jobs) to stop with SIGTERM, which makes a job stop its trial, remove its temp folder and record nothing
    (run_job), give them `grace_s`, then SIGKILL what is left, trial sessions included, and remove the temp folders
    of this launch that a killed job could not."""
    me = psutil.Process()
    trials = [p for p in me.children(recursive=True) if is_trial(p)]
    jobs = []  # the processes that started the trials: a launcher's workers, submitit's jobs (not the launcher's
    for p in trials:  # own helpers, such as loky's resource tracker: the launcher stops those itself)
        with contextlib.suppress(psutil.Error):
            parent = p.parent()
            if parent is not None and parent.pid != me.pid and parent not in jobs:
                jobs.append(parent)
    for p in jobs:
        with contextlib.suppress(psutil.Error):
            p.terminate()
    _, alive = psutil.wait_procs(jobs, timeout=grace_s)
    for p in alive:
        with contextlib.suppress(psutil.Error):
            p.kill()
    for p in trials:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(p.pid, signal.SIGKILL)  # a trial leads its own session: it and whatever it started
    psutil.wait_procs(trials, timeout=grace_s)
    for leftover in Path(tempfile.gettempdir()).glob(f"bench-{os.getpid()}-*"):
        shutil.rmtree(leftover, ignore_errors=True)
