"""NVML energy (issue 11): recorded whenever NVML answers, a stated reason when it does not, and
no crash without ``nvidia-ml-py`` (the optional extra ``gpu``). A fake ``pynvml`` stands in."""

from __future__ import annotations

import pytest

from kernelforge.devices.nvml import MISSING_PACKAGE, Nvml, energy_per_call


class FakePynvml:
    """The few pynvml calls the device makes; the energy counter (mJ) advances 3 J per call made
    through ``run`` and can be made to fail."""

    NVML_CLOCK_SM, NVML_CLOCK_MEM = 1, 2

    def __init__(self, counter: bool = True, init_fails: bool = False):
        self.mj = 1_000_000
        self.counter, self.init_fails = counter, init_fails
        self.answering = True

    def nvmlInit(self):
        if self.init_fails:
            raise RuntimeError("NVML Shared Library Not Found")

    def nvmlDeviceGetHandleByIndex(self, index):
        return ("gpu", index)

    def nvmlDeviceGetTotalEnergyConsumption(self, handle):
        if not self.counter or not self.answering:
            raise RuntimeError("Not Supported")
        return self.mj

    def nvmlSystemGetDriverVersion(self):
        return b"570.86"

    def nvmlDeviceGetClockInfo(self, handle, kind):
        return 1980 if kind == self.NVML_CLOCK_SM else 3201

    def nvmlDeviceGetMaxClockInfo(self, handle, kind):
        raise RuntimeError("Not Supported")  # a query NVML refuses is left out, not an error

    def nvmlDeviceGetPowerManagementLimit(self, handle):
        return 700_000


def _missing():
    raise ImportError("No module named 'pynvml'")


def test_without_the_package_there_is_no_energy_and_a_reason():
    nvml = Nvml(0, loader=_missing)
    assert nvml.status == MISSING_PACKAGE and "kernelforge[gpu]" in nvml.status
    assert nvml.energy_j() is None
    assert nvml.facts() == {"energy": MISSING_PACKAGE}
    assert energy_per_call(nvml, lambda i: None, 10, lambda: None) == (None, MISSING_PACKAGE)


def test_energy_per_call_when_nvml_answers():
    fake = FakePynvml()
    nvml = Nvml(0, loader=lambda: fake)
    assert nvml.status == "nvml"

    def run(i):
        fake.mj += 3000  # 3 J per call

    # 50 calls x 3 J = 150 J over 50 calls: 3 J per call.
    joules, note = energy_per_call(nvml, run, 50, lambda: None)
    assert joules == pytest.approx(3.0) and note == "nvml"
    facts = nvml.facts()
    assert facts["driver"] == "570.86" and facts["sm_clock_mhz"] == 1980 and facts["power_limit_w"] == 700.0
    assert "max_sm_clock_mhz" not in facts and facts["energy"] == "NVML energy counter"


def test_a_counter_that_does_not_move_or_answer_gives_no_figure():
    fake = FakePynvml()
    nvml = Nvml(0, loader=lambda: fake)
    joules, note = energy_per_call(nvml, lambda i: None, 5, lambda: None)
    assert joules is None and "did not move" in note

    def stops(i):
        fake.answering = False  # NVML fails mid-round: no figure, no exception

    joules, note = energy_per_call(nvml, stops, 5, lambda: None)
    assert joules is None and "did not answer" in note
    fake.answering = True  # and it is used again as soon as it answers
    assert nvml.energy_j() == pytest.approx(1000.0)


@pytest.mark.parametrize("fake, reason", [(FakePynvml(init_fails=True), "NVML did not start"),
                                          (FakePynvml(counter=False), "not readable")])
def test_nvml_without_an_energy_counter_says_why(fake, reason):
    nvml = Nvml(0, loader=lambda: fake)
    assert reason in nvml.status
    assert energy_per_call(nvml, lambda i: None, 5, lambda: None)[0] is None
