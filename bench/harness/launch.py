"""How many processes a trial is, where they start, and how they are stopped. Locally the runner starts every
process of a trial; under a multi-task submitit job each task starts its own rank. `check_launch` says, before
anything runs, whether the Hydra launcher and this host can start a trial's processes.

Every trial process leads its own session (so that the whole of it can be killed at once) and is named on its
command line after TRIAL_MODULE, which is how an interrupted launch finds what it must stop. A process the suite
starts dies with the process that started it, however that one ends (kill -9 included): Linux's
PR_SET_PDEATHSIG, set by the child itself at its start (`die_with_parent`). A pipe whose end-of-file the child
watches would do the same on any OS, at the price of a thread in every trial; the suite runs on Linux hosts (CI,
SLURM), so the kernel's own mechanism is used. The temp folders of launches that died that way are removed by the
next command (`remove_orphans`).
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import shutil
import signal
import socket
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

import psutil
from submitit.helpers import TorchDistributedEnvironment

from bench.config import BenchConfig
from bench.errors import ConfigError

LAUNCHER_PID = "BENCH_LAUNCHER_PID"
PARENT_PID = "BENCH_PARENT_PID"  # set for a child that must die with the process that started it
PR_SET_PDEATHSIG = 1  # linux/prctl.h
TRIAL_MODULE = "bench.scenarios"  # python -m bench.scenarios PAYLOAD RESULT: a trial process (its __main__)
STOP_GRACE_S = 5.0  # what an interrupted launch gives its jobs to stop their trials and clean up (they take < 1 s)
# joblib's loky resource tracker, a child of the launch, unlinks what a worker stopped by an interrupt had registered
# and warns of each at its own exit, after the launch's last line (a race with the launch's own unlink): its
# clean-up is kept, its warning left out.
QUIET_TRACKER = "ignore::UserWarning:joblib.externals.loky.backend.resource_tracker"


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
    return {
        "MASTER_ADDR": task.master_addr,
        "MASTER_PORT": str(task.master_port),
        "RANK": str(rank),
        "WORLD_SIZE": str(task.processes),
        "LOCAL_RANK": str(rank % per_node),
        "LOCAL_WORLD_SIZE": str(per_node),
    }


CPU_DEVICES_PER_CORE = 4  # CPU "devices" share the cores: beyond a few per core a trial times the scheduler
CPU_DEVICE_MIB = 512  # what one more CPU device needs at the least (a process, a framework, a model's copy)


def cpu_device_cap() -> int:
    """How many CPU devices this host can run one trial on: a few per core, as far as the memory goes."""
    by_memory = int(psutil.virtual_memory().total / 2**20 // CPU_DEVICE_MIB)
    return max(1, min(CPU_DEVICES_PER_CORE * (os.cpu_count() or 1), by_memory))


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
        on_cpu = cfg.device == "cpu" or gpus == 0
        if on_cpu and cfg.device != "cuda" and cfg.devices > cpu_device_cap():
            raise ConfigError(
                f"devices={cfg.devices}: on the CPU each device is a process (torch) or a host device sharing this "
                f"process (jax), and this host takes at most {cpu_device_cap()} ({os.cpu_count()} cores, "
                f"{psutil.virtual_memory().total / 2**30:.0f} GiB); accepted 1..{cpu_device_cap()}"
            )
        if cfg.device == "cuda" and gpus == 0:
            raise ConfigError("device=cuda: this host has no CUDA GPU (nvidia-smi lists none); accepted: cpu | auto")
        if cfg.fsdp_offload and gpus == 0 and cfg.device != "cpu":  # on device=cpu the model's checks say why
            raise ConfigError(
                "fsdp_offload=true: this host has no GPU, so the parameters already live in host memory and there is "
                "nothing to offload to; accepted on a CUDA device"
            )
        if cfg.device in ("cuda", "auto") and 0 < gpus < cfg.devices:
            raise ConfigError(f"devices={cfg.devices}: this host has {gpus} GPU(s); accepted 1..{gpus} or device=cpu")
    nodes, tasks = (launcher.get("nodes", 1), launcher.get("tasks_per_node", 1)) if submitit else (1, 1)
    fix = (
        f"hydra/launcher=submitit_slurm hydra.launcher.nodes={cfg.nodes} "
        f"hydra.launcher.tasks_per_node={processes_per_node(cfg) if cfg.framework == 'torch' else 1}"
    )
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


def child_env() -> dict[str, str]:
    """The environment entry that makes a child started by this process die with it (the child calls adopt)."""
    return {PARENT_PID: str(os.getpid())}


def adopt(sig: int = signal.SIGTERM) -> None:
    """At the start of a process the suite started (child_env): die with that parent. SIGTERM by default, so a
    launcher or a job stops its own children and cleans up as on Ctrl-C; a trial takes SIGKILL (it has nothing to
    clean up and must not linger). A no-op for a process started some other way."""
    expected = os.environ.pop(PARENT_PID, "")  # for this process only: its own children get their own
    if expected.isdigit():
        die_with_parent(int(expected), sig)


def die_with_parent(parent: int, sig: int) -> None:
    """Ask the kernel to send `sig` to this process when its parent (`parent`, the pid that started it) exits
    (PR_SET_PDEATHSIG; Linux). If the parent is gone already (it died before this call), `sig` now. A `parent`
    that is alive but an older ancestor reached this process through one that does not adopt (pytest run by
    `bench gpu-check` runs `python -m bench`): nothing to do, as for a process started some other way."""
    if not sys.platform.startswith("linux"):
        return
    if os.getppid() != parent and is_ancestor(parent):
        return
    ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, int(sig), 0, 0, 0)
    if os.getppid() != parent:
        os.kill(os.getpid(), sig)


def quiet_helpers() -> None:
    """The launch's environment, which every process it starts inherits, leaves out the warnings of loky's resource
    tracker (QUIET_TRACKER)."""
    filters = [f for f in os.environ.get("PYTHONWARNINGS", "").split(",") if f]
    if QUIET_TRACKER not in filters:
        os.environ["PYTHONWARNINGS"] = ",".join([*filters, QUIET_TRACKER])


def is_ancestor(pid: int) -> bool:
    """Whether `pid` is one of this process's ancestors (alive, so not a pid the kernel has reused)."""
    try:
        return any(p.pid == pid for p in psutil.Process().parents())
    except psutil.Error:
        return False


def remove_orphans() -> None:
    """Remove the temp folders (bench-<launcher pid>-*) of launches whose process no longer runs: what a launcher
    killed with SIGKILL could not remove itself."""
    for folder in Path(tempfile.gettempdir()).glob("bench-*-*"):
        pid = folder.name.split("-")[1]
        if pid.isdigit() and not psutil.pid_exists(int(pid)):
            shutil.rmtree(folder, ignore_errors=True)


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
