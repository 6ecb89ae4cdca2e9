"""A skeleton device: what a new kind of device (a ROCm GPU, say) provides to join kernelforge.

It is the whole of the device side of docs/devices.md in one file: a :class:`Device` subclass that
states its capabilities and implements ``time`` and ``describe``. This one times calls on the CPU
with the wall clock under a method of its own name, so the contract tests can run it anywhere;
a real device replaces the body of ``time`` with its event timing. Nothing else in kernelforge
asks what device it is: every decision reads a capability (``kernelforge.devices.base``).
"""

from __future__ import annotations

import re
import statistics
import time
from typing import Any, Sequence

from kernelforge.devices.base import Before, Call, Device, MethodUnavailable, library_versions, quantiles
from kernelforge.result import Timing

METHOD = "skeleton-wall"


class SkeletonDevice(Device):
    """A GPU-like device of a vendor kernelforge does not know, timed by the host's clock."""

    name = "skeleton"
    torch_device = "cpu"
    measures_hardware = True          # its timings stand for a GPU's
    sandbox_role = "cuda"             # its worker may run a driver and a compiler
    jit_on_first_call = True
    fatal_errors = re.compile(r"HIP error|hipError", re.IGNORECASE)
    address_space_limit = False
    rotates_input_sets = True
    prepares_every_call = True        # its time() prepares before every call, as the contract test checks

    def __init__(self, warmup: int = 1, repeats: int = 3, index: int = 0):
        self.warmup, self.repeats, self.index = warmup, repeats, index

    def time(self, calls: Sequence[Call], *, working_set_bytes: int = 0, before: Before | None = None,
             method: str | None = None) -> Timing:
        if method not in (None, METHOD):
            raise MethodUnavailable(f"the skeleton times with {METHOD!r}, not {method!r}")
        samples = []
        for i in range(self.warmup + self.repeats):
            if before is not None:
                before(i)
            start = time.perf_counter()
            calls[i % len(calls)]()
            if i >= self.warmup:
                samples.append(time.perf_counter() - start)
        median, p20, p80 = quantiles(samples)
        return Timing(median, p20, p80, len(samples), METHOD, "skeleton wall time (a test device)",
                      extra={"spread": statistics.pstdev(samples)})

    def describe(self) -> dict[str, Any]:
        return {"device": self.name, "device_name": f"Skeleton GPU {self.index}", **library_versions()}
