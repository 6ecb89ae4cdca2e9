"""Triton's CPU interpreter as a device, with kernelforge's bf16 fix
(:mod:`kernelforge.devices.interpreter`).

Correctness is real; timings are wall-clock interpreter timings and say nothing about GPU speed,
and every timing carries a label (:data:`INTERPRETER_LABEL`) saying so.
"""

from __future__ import annotations

import platform
import time
from typing import Any, Sequence

from kernelforge.devices.base import Before, Call, Device, MethodUnavailable, library_versions, quantiles
from kernelforge.result import Timing

INTERPRETER_LABEL = "interpreter wall time (CPU), not GPU speed"
#: The one timing method of the interpreter.
INTERPRETER_METHOD = "interpreter-wall"


class InterpretDevice(Device):
    """Triton's CPU interpreter (with the bf16 fix). Timings are interpreter wall time."""

    name = "interpret"
    torch_device = "cpu"

    def __init__(self, warmup: int = 1, repeats: int = 3):
        self.warmup = warmup
        self.repeats = repeats

    def prepare(self) -> None:
        from kernelforge.devices import interpreter

        interpreter.enable()

    def time(self, calls: Sequence[Call], *, working_set_bytes: int = 0, before: Before | None = None,
             method: str | None = None) -> Timing:
        """Interpreter wall time (``interpreter-wall``, the only method here): see the class."""
        if method not in (None, INTERPRETER_METHOD):
            raise MethodUnavailable(f"the interpreter times with {INTERPRETER_METHOD!r}, not {method!r}")
        for i in range(self.warmup):
            if before is not None:
                before(i)
            calls[i % len(calls)]()
        samples = []
        for i in range(self.repeats):
            if before is not None:
                before(self.warmup + i)
            start = time.perf_counter()
            calls[i % len(calls)]()
            samples.append(time.perf_counter() - start)
        median, p20, p80 = quantiles(samples)
        return Timing(median, p20, p80, len(samples), INTERPRETER_METHOD, INTERPRETER_LABEL)

    def describe(self) -> dict[str, Any]:
        return {
            "device": "interpret",
            "device_name": f"Triton interpreter on {platform.processor() or platform.machine()}",
            "timing": INTERPRETER_LABEL,
            **library_versions(),
        }
