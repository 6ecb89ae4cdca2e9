"""The device contract (``kernelforge.devices.base``), run on every device kernelforge ships and on
the skeleton device a new kind would start from (tests/devices/skeleton_device.py). Nothing here
needs a GPU: the CUDA device is checked for what it states, not for what it measures."""

from __future__ import annotations

import inspect
import re

import pytest
import torch

from kernelforge.devices.base import Device, MethodUnavailable
from kernelforge.devices.cuda import CudaDevice
from kernelforge.devices.interpret import InterpretDevice
from kernelforge.sandbox.roles import Role
from skeleton_device import SkeletonDevice

DEVICES = [InterpretDevice, CudaDevice, SkeletonDevice]
RUNNABLE = [InterpretDevice, SkeletonDevice]  # time() and describe() work without a GPU


@pytest.mark.parametrize("cls", DEVICES, ids=lambda c: c.__name__)
def test_every_device_states_its_capabilities(cls):
    assert issubclass(cls, Device) and cls.name and isinstance(cls.torch_device, str)
    for flag in ("measures_hardware", "jit_on_first_call", "address_space_limit", "rotates_input_sets",
                 "prepares_every_call", "host_clock"):
        assert isinstance(getattr(cls, flag), bool), f"{cls.__name__}.{flag}"
    assert Role(cls.sandbox_role) in Role  # a role the sandbox knows
    assert cls.fatal_errors is None or isinstance(cls.fatal_errors, re.Pattern)
    assert cls().round_preparations(8) >= 1


@pytest.mark.parametrize("cls", DEVICES, ids=lambda c: c.__name__)
def test_a_device_is_rebuilt_from_its_constructor_arguments(cls):
    """A worker rebuilds its device from the class and the constructor arguments, read back as
    attributes of the same names (kernelforge.execute.worker.executor)."""
    device = cls()
    args = {name: getattr(device, name) for name in inspect.signature(cls.__init__).parameters if name != "self"}
    rebuilt = cls(**args)
    assert {name: getattr(rebuilt, name) for name in args} == args


@pytest.mark.parametrize("cls", RUNNABLE, ids=lambda c: c.__name__)
def test_time_runs_every_phase_through_before_and_labels_its_method(cls):
    device = cls()
    device.prepare()
    seen, calls = [], [0]

    def call():
        calls[0] += 1

    timing = device.time([call, call], before=seen.append)
    assert seen == list(range(len(seen))) and calls[0] == len(seen) >= 2  # every call prepared, in order
    assert len(seen) <= device.round_preparations(2)  # every call can be copied aside (issue 29)
    assert timing.median_s >= 0 and timing.samples >= 1 and timing.method and timing.label
    assert device.host_clock is False, "host_clock is set only while time() measures on the host's clock"
    assert device.time([call], method=timing.method).method == timing.method  # its own method, when fixed
    with pytest.raises(MethodUnavailable):
        device.time([call], method="no-such-method")


@pytest.mark.parametrize("cls", RUNNABLE, ids=lambda c: c.__name__)
def test_describe_names_the_device_and_the_versions(cls):
    described = cls().describe()
    assert described["device"] and described["device_name"]
    assert {"torch", "triton", "python"} <= set(described)
    assert described["torch"] == torch.__version__


def test_capabilities_not_names_decide():
    """The decisions that once asked for a device's name read its capabilities: a skeleton GPU
    gets a GPU's treatment without any code naming it."""
    from kernelforge.search.library import times_on

    assert times_on(SkeletonDevice()) and not times_on(InterpretDevice())
    assert SkeletonDevice.fatal_errors.search("hipErrorIllegalAddress")
    assert CudaDevice.fatal_errors.search("CUDA error: an illegal memory access was encountered")
