"""Device names, as jobs and the command line give them, and the device each one means
(:func:`require_visible`: whether a CUDA one is there, asked before anything is written)."""

from __future__ import annotations

import torch

from kernelforge.devices.base import Device
from kernelforge.devices.cuda import CudaDevice, require_visible
from kernelforge.devices.interpret import InterpretDevice
from kernelforge.errors import UserError
from kernelforge.fields import device_name


def get_device(name: str) -> Device:
    """The device called ``name`` (``cuda``, ``cuda:N`` or ``interpret``; a replay is no device
    but a recording, :mod:`kernelforge.execute.replay`)."""
    device_name("device", name)
    if name == "interpret":
        return InterpretDevice()
    if name.startswith("cuda"):
        return CudaDevice(index=int(name.partition(":")[2] or 0))
    raise UserError(f"device {name!r} is a recording, not a device: kernelforge.execute.executor.make_executor "
                    "replays it")


def default_device_name() -> str:
    """``cuda`` when a GPU is visible, else ``interpret``."""
    return "cuda" if torch.cuda.is_available() else "interpret"
