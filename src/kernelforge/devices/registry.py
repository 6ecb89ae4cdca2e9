"""Device names, as jobs and the command line give them, and the device each one means
(:func:`require_visible`: whether a CUDA one is there, asked before anything is written)."""

from __future__ import annotations

import torch

from kernelforge.devices.base import Device
from kernelforge.devices.cuda import CudaDevice, require_visible
from kernelforge.devices.interpret import InterpretDevice
from kernelforge.errors import UserError


def get_device(name: str) -> Device:
    """The device called ``name`` (``cuda``, ``cuda:N`` or ``interpret``)."""
    if name == "interpret":
        return InterpretDevice()
    if name == "cuda" or name.startswith("cuda:"):
        index = name.split(":", 1)[1] if ":" in name else "0"
        if not index.isdigit():
            raise UserError(f"device {name!r}: cuda:N takes a GPU index, e.g. cuda:0")
        return CudaDevice(index=int(index))
    raise UserError(f"unknown device {name!r}; choose cuda, cuda:N or interpret")


def default_device_name() -> str:
    """``cuda`` when a GPU is visible, else ``interpret``."""
    return "cuda" if torch.cuda.is_available() else "interpret"
