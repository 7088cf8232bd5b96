"""Energy: joules over a trial's timed steps, from a cumulative counter the hardware keeps.

    counter = energy_counter("cuda")     # NVML's total energy on a GPU, RAPL's package energy on a CPU, or none
    window = EnergyWindow(counter)
    window.start()                       # the timed steps begin
    with window.outside(i):              # an evaluation after timed step i: its joules are left out
        evaluate()
    window.stop()
    window.columns(steps_timed, timed_s) # energy_timed_j, energy_per_step_j, power_avg_w, power_limit_w, ...

A counter is read only at the window's edges and around evaluations, never inside a timed step. Its joules are the
whole device's (NVML) or the whole socket's (RAPL): what other processes draw on it in the window is counted too, so
a trial measures its energy alone only on a device it has to itself. Absent, never an error: without a counter
the columns are empty and `energy_method` says why.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

POWERCAP = Path("/sys/class/powercap")


class Counter:
    """A cumulative energy counter: joules since some fixed moment, increasing (None where a read fails)."""

    method = "none"
    unavailable: str | None = None
    devices = 0  # how many devices (GPUs, CPU packages) the joules are summed over

    def joules(self) -> float | None:
        return None

    def power_limit_w(self) -> float | None:
        return None

    def close(self) -> None:
        pass


class Unavailable(Counter):
    def __init__(self, why: str):
        self.unavailable = why


class NvmlEnergy(Counter):
    """NVML's total energy (nvmlDeviceGetTotalEnergyConsumption: millijoules since the driver loaded, Volta and
    later), summed over the GPUs this process sees: CUDA_VISIBLE_DEVICES's indices or UUIDs where it is set (NVML
    numbers every GPU of the host, whatever CUDA shows), else every GPU. `power_limit_w`: their enforced limits."""

    method = "nvml_total_energy"

    def __init__(self, visible: str | None = None):
        visible = os.environ.get("CUDA_VISIBLE_DEVICES") if visible is None else visible
        self._nvml: Any = None
        self._handles: list[Any] = []
        try:
            import pynvml

            pynvml.nvmlInit()
            self._nvml = pynvml
            self._handles = self._visible(visible)
            for h in self._handles:
                pynvml.nvmlDeviceGetTotalEnergyConsumption(h)  # NotSupported before Volta: say so now
        except Exception as e:  # ImportError, NVMLError_LibraryNotFound, NVMLError_NotSupported, ...
            self.unavailable = f"{type(e).__name__}: {e}"
        if self.unavailable is None and not self._handles:
            self.unavailable = "NVML sees no GPU this process can use"
        self.devices = len(self._handles) if self.unavailable is None else 0

    def _visible(self, visible: str | None) -> list[Any]:
        nvml = self._nvml
        if visible is None or not visible.strip():
            return [nvml.nvmlDeviceGetHandleByIndex(i) for i in range(nvml.nvmlDeviceGetCount())]
        out = []
        for item in (v.strip() for v in visible.split(",")):
            if item.isdigit():
                out.append(nvml.nvmlDeviceGetHandleByIndex(int(item)))
            elif item.startswith(("GPU-", "MIG-")):
                out.append(nvml.nvmlDeviceGetHandleByUUID(item))
            else:
                break  # CUDA stops at the first entry it cannot read, and so do we
        return out

    def _summed(self, query: str) -> float | None:
        """NVML's `query` (milli-units) summed over the GPUs, in units; None where it is unavailable or a read fails
        mid-trial (the cells empty, the trial goes on)."""
        if self.unavailable:
            return None
        try:
            return sum(getattr(self._nvml, query)(h) for h in self._handles) / 1e3
        except Exception:
            return None

    def joules(self) -> float | None:
        return self._summed("nvmlDeviceGetTotalEnergyConsumption")

    def power_limit_w(self) -> float | None:
        return self._summed("nvmlDeviceGetEnforcedPowerLimit")

    def close(self) -> None:
        if self._nvml is not None:
            with contextlib.suppress(Exception):
                self._nvml.nvmlShutdown()
            self._nvml = None


class RaplEnergy(Counter):
    """RAPL's package energy through Linux's powercap (intel-rapl:N/energy_uj, microjoules; AMD's packages too
    since Linux 5.8), summed over the packages; the sub-domains (cores, uncore, DRAM) are inside a package's and
    left out. A counter wraps at its max_energy_range_uj: each read adds the rise since the last, so the window
    must be read more often than a wrap takes (minutes at a socket's power). Only root can read energy_uj on
    kernels since 2020 (a side channel); elsewhere `unavailable` says so."""

    method = "rapl_package"

    def __init__(self, root: Path = POWERCAP):
        self._zones: list[tuple[Path, int]] = []
        self._last: list[int] = []
        self._total = 0
        try:
            zones = sorted(p for p in root.glob("intel-rapl:*") if p.name.count(":") == 1)
            for z in zones:
                self._zones.append((z / "energy_uj", int((z / "max_energy_range_uj").read_text())))
            self._last = [int(path.read_text()) for path, _ in self._zones]
        except OSError as e:
            self.unavailable = f"{type(e).__name__}: {e}"
            self._zones = []
        if self.unavailable is None and not self._zones:
            self.unavailable = f"no RAPL package zone under {root}"
        self.devices = len(self._zones)

    def joules(self) -> float | None:
        if self.unavailable:
            return None
        try:
            now = [int(path.read_text()) for path, _ in self._zones]
        except OSError:
            return None
        for i, ((_, wrap), before, after) in enumerate(zip(self._zones, self._last, now, strict=True)):
            self._total += after - before if after >= before else after + wrap - before
            self._last[i] = after
        return self._total / 1e6


def energy_counter(kind: str) -> Counter:
    """The counter for a trial on `kind` ("cuda" or "cpu"): its own where it can be read, else Unavailable."""
    counter: Counter = NvmlEnergy() if kind == "cuda" else RaplEnergy()
    if counter.unavailable:
        counter.close()
        return Unavailable(f"{counter.method}: {counter.unavailable}")
    return counter


class EnergyWindow:
    """The counter's joules over the timed steps, the evaluations inside the window left out (as the wall clock to
    a target leaves them out), with the joules timed up to each evaluation (for the cost to a target)."""

    def __init__(self, counter: Counter):
        self.counter = counter
        self._start: float | None = None
        self._left_out = 0.0
        self._total: float | None = None
        self.at: dict[int, float | None] = {}  # timed step index -> joules timed through it

    def _timed(self) -> float | None:
        now = self.counter.joules()
        if now is None or self._start is None:
            return None
        return now - self._start - self._left_out

    def start(self) -> None:
        self._start = self.counter.joules()

    @contextlib.contextmanager
    def outside(self, step: int) -> Iterator[None]:
        """Around what follows timed step `step` and is not a step (an evaluation): its joules left out."""
        before = self.counter.joules()
        self.at[step] = None if before is None or self._start is None else before - self._start - self._left_out
        try:
            yield
        finally:
            after = self.counter.joules()
            if before is None or after is None:
                self._start = None  # a read failed: the window's joules are unknown from here on
            else:
                self._left_out += after - before

    def stop(self) -> None:
        self._total = self._timed()

    def columns(self, steps_timed: int, timed_s: float) -> dict:
        c = self.counter
        out: dict = {
            "energy_method": c.method if c.unavailable is None else f"none: {c.unavailable}"[:200],
            "energy_devices": c.devices or None,
            "power_limit_w": c.power_limit_w(),
        }
        total = self._total
        if total is not None and steps_timed and timed_s > 0:
            if total > 0:
                out.update(energy_timed_j=total, energy_per_step_j=total / steps_timed, power_avg_w=total / timed_s)
            else:  # the counter updates less often than the window lasted: 0 J would be wrong, not small
                out["energy_method"] = f"none: {c.method} did not advance in the {timed_s * 1e3:.0f} ms of timed steps"
        return out

    def to_target(self, step: int, timed_through_s: float, seconds_to_target: float) -> float | None:
        """Joules to a target met at the evaluation after timed step `step`: the power timed up to it times the
        target's own seconds (the warm-up steps and the first step, priced at the median, as seconds_to_target
        prices them)."""
        joules = self.at.get(step)
        if joules is None and step not in self.at:
            joules = self._total  # met at the window's last step, evaluated after it
        if joules is None or timed_through_s <= 0:
            return None
        return joules / timed_through_s * seconds_to_target
