"""Limits per candidate (issue 29, Deliver 5): memory a candidate leaves alive in a long-lived
worker (host memory it only reserved, device memory of a device that has its own) retires the
worker, so the next candidate has the worker's limits to itself; the decision reads a device's
capabilities (``process_memory``, ``memory_held``), never its name."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import torch

from kernelforge.candidate import Candidate
from kernelforge.catalog import Catalog
from kernelforge.devices.interpret import InterpretDevice
from kernelforge.devices.nvml import Nvml
from kernelforge.execute.worker import memory_watch
from kernelforge.execute.worker.memory_watch import MemoryReading, device_growth_reason, retire_reason
from kernelforge.execute.worker.executor import WorkerExecutor
from kernelforge.result import Status

pytestmark = pytest.mark.interpreter

REPO = Path(__file__).resolve().parents[2]
CATALOG = Catalog.discover(REPO / "tests" / "fixtures" / "kernels")
AXPY = CATALOG.block("toy/axpy")
HONEST = Candidate.from_template(CATALOG.baseline("toy/axpy")).source
SHAPES = AXPY.shapes("smoke")[:1]


def keeping(expression: str) -> str:
    """The honest axpy, keeping ``expression`` (a tensor) alive in its module on every call."""
    return "import torch\n" + HONEST.replace("def run(x, y, alpha, out):\n", "_KEEP = []\n\n\ndef run(x, y, alpha, out):\n"
                                             f"    _KEEP.append({expression})\n")


def test_address_space_a_candidate_only_reserved_retires_the_worker(monkeypatch):
    """A candidate that keeps untouched allocations alive (no resident memory at all) still takes
    them from every later candidate's address-space limit: the worker's virtual size is watched
    too. (The resident size alone, as before, never saw it.)"""
    monkeypatch.setattr(memory_watch, "RETIRE_ADDRESS_SPACE_GROWTH", 800 * 2**20)
    hog = keeping("torch.empty(256 * 2**20, dtype=torch.int8)")  # 256 MiB a call, never touched
    with WorkerExecutor(InterpretDevice(warmup=0, repeats=1), held_out=False, run_timeout=120,
                        memory_limit=0) as executor:
        [ev] = executor.evaluate(AXPY, HONEST, SHAPES, torch.float16)
        [ev] = executor.evaluate(AXPY, hog, SHAPES, torch.float16)
        assert ev.status is Status.OK and executor.starts == 1, ev.verification.message
        [ev] = executor.evaluate(AXPY, HONEST, SHAPES, torch.float16)
        assert ev.status is Status.OK and executor.starts == 2, ev.verification.message  # a fresh worker


def test_device_memory_a_candidate_keeps_retires_the_worker(monkeypatch):
    """On a device with memory of its own (simulated: kf_memory_device counts live tensors as a
    GPU's allocator does), the worker itself reports that a candidate left device memory
    allocated when its session ends, and retires; an honest candidate leaves none."""
    fixtures = str(REPO / "tests" / "fixtures")
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(filter(None, [fixtures, os.environ.get("PYTHONPATH")])))
    from kf_memory_device import TensorMemoryDevice

    # 250 MiB a call, never touched: 1.25 GiB over its five calls, past the device limit (1 GiB) and
    # within the address-space one (2 GiB), so the device route is what retires the worker.
    hog = keeping("torch.empty(250 * 2**20, dtype=torch.int8)")
    with WorkerExecutor(TensorMemoryDevice(warmup=0, repeats=1), held_out=False, run_timeout=120,
                        memory_limit=0) as executor:
        for _ in range(2):
            [ev] = executor.evaluate(AXPY, HONEST, SHAPES, torch.float16)
            assert ev.status is Status.OK and executor.starts == 1, ev.verification.message
        [ev] = executor.evaluate(AXPY, hog, SHAPES, torch.float16)
        assert ev.status is Status.OK, ev.verification.message
        [ev] = executor.evaluate(AXPY, HONEST, SHAPES, torch.float16)
        assert ev.status is Status.OK and executor.starts == 2, ev.verification.message


def test_each_reading_past_its_limit_names_what_grew():
    start = MemoryReading(1 * 2**30, 8 * 2**30, 512 * 2**20)
    assert retire_reason(start, start) is None
    assert retire_reason(start, MemoryReading(None, None, None)) is None  # unreadable: nothing decided
    grown = retire_reason(start, MemoryReading(1 * 2**30, 8 * 2**30, 3 * 2**30))
    assert grown is not None and "device memory" in grown
    assert "address space" in retire_reason(start, MemoryReading(1 * 2**30, 11 * 2**30, 512 * 2**20))
    assert "resident memory" in retire_reason(start, MemoryReading(4 * 2**30, 8 * 2**30, 512 * 2**20))
    assert device_growth_reason(0, 2 * 2**30) and device_growth_reason(None, 2 * 2**30) is None
    assert device_growth_reason(0, 100) is None


def test_every_candidate_has_its_whole_address_space_limit():
    """The worker's limit is the candidate's plus what may be left behind before it retires."""
    with WorkerExecutor(InterpretDevice(), memory_limit=6 * 2**30) as executor:
        assert executor.memory_limit == 6 * 2**30
        assert executor.probe()["rlimit_as"] == 6 * 2**30 + memory_watch.RETIRE_ADDRESS_SPACE_GROWTH


class _Process:
    def __init__(self, pid: int, used: int | None):
        self.pid, self.usedGpuMemory = pid, used


class _FakeNvml:
    def nvmlInit(self):
        pass

    def nvmlDeviceGetHandleByIndex(self, index):
        return ("gpu", index)

    def nvmlDeviceGetTotalEnergyConsumption(self, handle):
        return 1000

    def nvmlDeviceGetComputeRunningProcesses(self, handle):
        return [_Process(41, 3 * 2**30), _Process(42, None)]


def test_a_gpu_reads_a_workers_memory_from_outside_through_nvml():
    from kernelforge.devices.cuda import CudaDevice

    nvml = Nvml(0, loader=_FakeNvml)
    assert nvml.process_memory(41) == 3 * 2**30
    assert nvml.process_memory(42) is None and nvml.process_memory(7) is None  # not listed: unknown
    device = CudaDevice()
    assert device.process_memory(41) is None  # not prepared: no NVML, nothing decided
    device._nvml = nvml
    assert device.process_memory(41) == 3 * 2**30
    assert InterpretDevice().process_memory(os.getpid()) is None and InterpretDevice().memory_held() is None
