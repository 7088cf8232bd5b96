"""Energy (bench/measure/energy.py) against made-up counters: RAPL's powercap files in a folder of our own, NVML
as a module of our own, and a trial whose counter is the clock times a power, so its rows' joules are known."""

from __future__ import annotations

import sys
import types

import pytest

from bench.measure import energy
from bench.measure.energy import Counter, EnergyWindow, NvmlEnergy, RaplEnergy, Unavailable, energy_counter
from bench.store.read import read_rows
from tests.scenarios.test_cost_to_target import TINY
from tests.support import run_here


def rapl_zone(root, name: str, uj: int, wrap: int = 1000_000_000) -> None:
    zone = root / name
    zone.mkdir()
    (zone / "energy_uj").write_text(f"{uj}\n")
    (zone / "max_energy_range_uj").write_text(f"{wrap}\n")


def test_rapl_sums_the_packages_counts_a_wrap_and_leaves_the_sub_domains_out(tmp_path):
    rapl_zone(tmp_path, "intel-rapl:0", 999_000_000)
    rapl_zone(tmp_path, "intel-rapl:1", 5_000_000)
    rapl_zone(tmp_path, "intel-rapl:0:0", 0)  # cores, inside package 0's joules
    counter = RaplEnergy(tmp_path)
    assert counter.unavailable is None and counter.devices == 2 and counter.joules() == 0
    (tmp_path / "intel-rapl:0" / "energy_uj").write_text("2000000\n")  # wrapped at 1,000 J: 1 J + 2 J later
    (tmp_path / "intel-rapl:1" / "energy_uj").write_text("9000000\n")
    (tmp_path / "intel-rapl:0:0" / "energy_uj").write_text("7000000\n")
    assert counter.joules() == pytest.approx(3 + 4)


def test_without_a_readable_counter_the_trial_gets_a_reason_not_an_error(tmp_path):
    assert "no RAPL package zone" in RaplEnergy(tmp_path).unavailable
    rapl_zone(tmp_path, "intel-rapl:0", 1)
    (tmp_path / "intel-rapl:0" / "energy_uj").unlink()  # as a non-root user finds it: unreadable
    assert "FileNotFoundError" in RaplEnergy(tmp_path).unavailable


class FakeNvml(types.ModuleType):
    """pynvml's calls the counter makes, over GPUs with a counter in mJ and a power limit in mW each."""

    def __init__(self, millijoules: list[int], limits_mw: list[int], energy_supported: bool = True):
        super().__init__("pynvml")
        self.mj, self.limits, self.supported, self.shut = millijoules, limits_mw, energy_supported, False

    def nvmlInit(self):
        pass

    def nvmlShutdown(self):
        self.shut = True

    def nvmlDeviceGetCount(self):
        return len(self.mj)

    def nvmlDeviceGetHandleByIndex(self, i):
        return i

    def nvmlDeviceGetHandleByUUID(self, uuid):
        return int(uuid.rsplit("-", 1)[1])

    def nvmlDeviceGetTotalEnergyConsumption(self, h):
        if not self.supported:
            raise RuntimeError("Not Supported")
        return self.mj[h]

    def nvmlDeviceGetEnforcedPowerLimit(self, h):
        return self.limits[h]


def test_nvml_sums_the_gpus_this_process_sees(monkeypatch):
    nvml = FakeNvml([1_000, 20_000, 300_000], [700_000, 700_000, 350_000])
    monkeypatch.setitem(sys.modules, "pynvml", nvml)
    every = NvmlEnergy(visible="")
    assert every.devices == 3 and every.joules() == pytest.approx(321) and every.power_limit_w() == 1750
    two = NvmlEnergy(visible="2,GPU-0")
    assert two.devices == 2 and two.joules() == pytest.approx(301) and two.power_limit_w() == 1050
    nvml.mj[2] += 5_500
    assert two.joules() == pytest.approx(306.5)
    assert NvmlEnergy(visible="1,x,2").devices == 1  # CUDA stops at the first entry it cannot read
    two.close()
    assert nvml.shut


def test_a_gpu_without_the_counter_says_so_and_the_trial_goes_on(monkeypatch):
    monkeypatch.setitem(sys.modules, "pynvml", FakeNvml([1], [1], energy_supported=False))
    counter = energy_counter("cuda")
    assert isinstance(counter, Unavailable) and counter.unavailable == "nvml_total_energy: RuntimeError: Not Supported"
    window = EnergyWindow(counter)
    window.start()
    window.stop()
    cols = window.columns(10, 1.0)
    assert cols["energy_method"] == "none: nvml_total_energy: RuntimeError: Not Supported"
    assert "energy_timed_j" not in cols and cols["power_limit_w"] is None


class Scripted(Counter):
    """A counter that reads the values it is given, in order."""

    method = "scripted"
    devices = 1

    def __init__(self, values: list[float]):
        self.values = iter(values)

    def joules(self):
        return next(self.values)

    def power_limit_w(self):
        return 300.0


def test_the_window_leaves_the_evaluations_out_and_prices_the_target_at_its_power():
    # start 100; evaluation after step 4: 130 -> 150 (20 J left out); after step 9: 190 -> 200; stop 230
    window = EnergyWindow(Scripted([100, 130, 150, 190, 200, 230]))
    window.start()
    with window.outside(4):
        pass
    with window.outside(9):
        pass
    window.stop()
    assert window.at == {4: 30, 9: 70}
    cols = window.columns(12, timed_s=2.0)
    assert cols["energy_timed_j"] == 100 and cols["energy_per_step_j"] == pytest.approx(100 / 12)
    assert cols["power_avg_w"] == 50 and cols["power_limit_w"] == 300 and cols["energy_devices"] == 1
    # met at the evaluation after step 9: 70 J in the 1.25 s timed through it, 56 W, over the target's 1.5 s
    assert window.to_target(9, 1.25, 1.5) == pytest.approx(84)
    assert window.to_target(11, 2.0, 2.2) == pytest.approx(110)  # at the last step, evaluated after the window


def test_a_failed_read_empties_the_cells_from_then_on():
    window = EnergyWindow(Scripted([100, None, 150, 230]))
    window.start()
    with window.outside(4):
        pass
    window.stop()
    assert window.at == {4: None} and "energy_timed_j" not in window.columns(12, 2.0)


def test_a_counter_that_did_not_move_in_the_window_leaves_the_cells_empty_and_says_so():
    window = EnergyWindow(Scripted([100, 100]))  # a window shorter than the counter's update period
    window.start()
    window.stop()
    cols = window.columns(2, timed_s=0.016)
    assert (
        "energy_per_step_j" not in cols
        and cols["energy_method"] == "none: scripted did not advance in the 16 ms of timed steps"
    )


class Reads(Counter):
    """A counter that rises by 1 J at each read: what a trial's row says is then fixed by where it reads, not by how
    fast the host runs."""

    method = "made_up"
    devices = 1

    def __init__(self):
        self.read = -1

    def joules(self):
        self.read += 1
        return float(self.read)


@pytest.mark.slow
def test_a_trial_records_its_joules_per_step_and_to_its_target(tmp_path, monkeypatch):
    """Through a real trial that meets its target at its first evaluation (after timed step 2): the counter is read
    as the timed steps begin (0 J), around that evaluation (1 J, 2 J: left out) and as they end (3 J), so 2 J were
    timed, 1 J through the target's evaluation, and the power is over the steps' own seconds."""
    monkeypatch.setattr("bench.scenarios.model.trial.energy_counter", lambda kind: Reads())
    (outcome,) = run_here(*TINY, "target.metric=eval_loss", "target.value=100", "target.max_steps=21", results=tmp_path)
    assert outcome["status"] == "ok", outcome
    (row,) = read_rows(tmp_path / "runs.csv")
    assert row["energy_method"] == "made_up" and row["energy_devices"] == "1" and row["target_status"] == "reached"
    timed_s, steps = float(row["total_train_time_s"]), int(row["steps_timed"])
    assert steps == 2 and float(row["energy_timed_j"]) == 2 and float(row["energy_per_step_j"]) == 1
    assert float(row["power_avg_w"]) == pytest.approx(2 / timed_s)
    # 1 J over the seconds timed through the target's step, times seconds_to_target (both steps: all of timed_s)
    assert float(row["energy_to_target_j"]) == pytest.approx(float(row["seconds_to_target"]) / timed_s)


def test_on_this_host_the_counter_is_the_devices_own_or_a_reason():
    counter = energy_counter("cpu")
    assert counter.method == "rapl_package" or counter.unavailable.startswith("rapl_package: ")
    assert energy.POWERCAP.exists() or isinstance(counter, Unavailable)
