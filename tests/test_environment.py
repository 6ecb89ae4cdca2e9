"""Reading a stored environment: what its timings measure, decided in one place."""

from __future__ import annotations

import pytest

from kernelforge.devices.interpret import InterpretDevice
from kernelforge.environment import Timings, timings_of


@pytest.mark.parametrize("env, timings", [
    ({"device": "cuda", "device_name": "NVIDIA H100 80GB HBM3", "timing": "CUDA events"}, Timings.GPU),
    ({"device": "interpret", "device_name": "Triton interpreter on x86_64"}, Timings.INTERPRETER),
    # A replay names the recording's device in its timing: an interpreter recording stays interpreter time.
    ({"device": "replay", "timing": "replayed from a.db (measured on Triton interpreter on x86_64)"},
     Timings.INTERPRETER),
    ({"device": "replay", "timing": "replayed from a.db (measured on NVIDIA H100 80GB HBM3)"}, Timings.REPLAYED),
    ({}, Timings.GPU),
])
def test_timings_of_a_stored_environment(env, timings):
    assert timings_of(env) is timings


def test_the_interpreter_devices_own_description_reads_as_interpreter_time():
    assert timings_of(InterpretDevice().describe()) is Timings.INTERPRETER
