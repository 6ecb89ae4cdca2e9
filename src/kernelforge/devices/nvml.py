"""NVML on a CUDA host: the GPU's energy counter and device facts, through ``nvidia-ml-py``.

``nvidia-ml-py`` (imported as ``pynvml``) is the optional extra ``gpu`` (``pip install
kernelforge[gpu]``); nothing else needs it. Its import is guarded: without it, without NVML in the
driver, or without permission to read the counter, :class:`Nvml` answers no energy and says why in
:attr:`Nvml.status`; the CUDA device puts that reason beside every timing
(``Timing.extra["energy"]``) and in its description, and never fails for want of NVML. Energy is
recorded whenever NVML answers: the counter is read afresh at every round, so an answer that
comes back after a transient failure is used.
"""

from __future__ import annotations

from typing import Any, Callable

from kernelforge.textsafe import DETAIL, error_text

#: What a timing says when NVML gave no energy (the install hint for a missing package).
MISSING_PACKAGE = "no energy: nvidia-ml-py is not installed (pip install 'kernelforge[gpu]')"


def _import_pynvml() -> Any:
    import pynvml  # nvidia-ml-py; the optional extra ``gpu``

    return pynvml


class Nvml:
    """NVML's view of GPU ``index``.

    ``loader`` returns the ``pynvml`` module (tests pass a fake). :attr:`status` is ``"nvml"``
    when the energy counter answered at start-up, else the reason it did not (missing package,
    no driver support, no permission), written for a person.
    """

    def __init__(self, index: int, loader: Callable[[], Any] = _import_pynvml):
        self.nvml: Any = None
        self.handle: Any = None
        self.status = "nvml"
        try:
            self.nvml = loader()
        except ImportError:
            self.status = MISSING_PACKAGE
            return
        try:
            self.nvml.nvmlInit()
            self.handle = self.nvml.nvmlDeviceGetHandleByIndex(index)
        except Exception as exc:  # no NVML in the driver, or no such GPU
            self.handle = None
            self.status = f"no energy: NVML did not start ({error_text(exc, DETAIL)})"
            return
        if self.energy_j() is None:
            self.status = "no energy: NVML's energy counter is not readable on this GPU"

    def energy_j(self) -> float | None:
        """The GPU's energy counter in joules since the driver loaded, or None when NVML does not
        answer now (an exception is not the caller's problem: no energy is not an error)."""
        if self.handle is None:
            return None
        try:
            return self.nvml.nvmlDeviceGetTotalEnergyConsumption(self.handle) / 1000.0  # mJ -> J
        except Exception:
            return None

    def process_memory(self, pid: int) -> int | None:
        """Bytes of this GPU's memory process ``pid`` holds, as NVML lists its compute processes,
        or None when NVML does not answer or does not list ``pid`` (a process in another PID
        namespace, or one with no CUDA context yet)."""
        if self.handle is None:
            return None
        try:
            listed = self.nvml.nvmlDeviceGetComputeRunningProcesses(self.handle)
        except Exception:
            return None
        for process in listed:
            if getattr(process, "pid", None) == pid:
                used = getattr(process, "usedGpuMemory", None)
                return int(used) if isinstance(used, int) and used >= 0 else None
        return None

    def facts(self) -> dict[str, Any]:
        """Driver version and clocks, those NVML answers (empty without NVML), and ``energy``:
        where joules come from, or why there are none."""
        facts: dict[str, Any] = {"energy": "NVML energy counter" if self.status == "nvml" else self.status}
        if self.handle is None:
            return facts
        nvml = self.nvml
        for key, query in (
            ("driver", lambda: nvml.nvmlSystemGetDriverVersion()),
            ("sm_clock_mhz", lambda: nvml.nvmlDeviceGetClockInfo(self.handle, nvml.NVML_CLOCK_SM)),
            ("max_sm_clock_mhz", lambda: nvml.nvmlDeviceGetMaxClockInfo(self.handle, nvml.NVML_CLOCK_SM)),
            ("mem_clock_mhz", lambda: nvml.nvmlDeviceGetClockInfo(self.handle, nvml.NVML_CLOCK_MEM)),
            ("power_limit_w", lambda: nvml.nvmlDeviceGetPowerManagementLimit(self.handle) / 1000.0),
        ):
            try:
                value = query()
                facts[key] = value.decode() if isinstance(value, bytes) else value
            except Exception:
                pass
        return facts


def energy_per_call(nvml: Nvml | None, run: Callable[[int], None], count: int,
                    synchronize: Callable[[], None]) -> tuple[float | None, str]:
    """Joules per call over ``count`` back-to-back calls (``run(i)`` makes call i), with a note for
    the timing: ``"nvml"`` when measured, else why not. The counter is read around the round
    after a synchronisation each side; a counter that did not move (it updates in coarse steps)
    gives no figure rather than zero."""
    if nvml is None:
        return None, "no energy: NVML was not started"
    synchronize()
    e0 = nvml.energy_j()
    if e0 is None:
        return None, nvml.status if nvml.status != "nvml" else "no energy: NVML did not answer"
    for i in range(count):
        run(i)
    synchronize()
    e1 = nvml.energy_j()
    if e1 is None:
        return None, "no energy: NVML did not answer after the round"
    if e1 <= e0:
        return None, "no energy: NVML's counter did not move during the round"
    return (e1 - e0) / count, "nvml"
