"""A fresh state per candidate (issue 29): what a candidate sets for its process (Triton's global
allocator, which the policy allows for device-side tensor descriptors) does not outlive its
evaluation, in this process and in the worker."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from kernelforge.candidate import Candidate
from kernelforge.catalog import Catalog
from kernelforge.devices.interpret import InterpretDevice
from kernelforge.execute.inprocess import InProcessExecutor
from kernelforge.policy.checker import check_source
from kernelforge.result import Status

pytestmark = pytest.mark.interpreter

CATALOG = Catalog.discover(Path(__file__).resolve().parents[1] / "fixtures" / "kernels")
AXPY = CATALOG.block("toy/axpy")
HONEST = Candidate.from_template(CATALOG.baseline("toy/axpy")).source
SETS_ALLOCATOR = ("import torch\n" + HONEST.replace(
    "def run(x, y, alpha, out):\n", "def _keep(size, alignment, stream):\n    return torch.empty(size, dtype=torch.int8)\n\n\n"
    "def run(x, y, alpha, out):\n    triton.set_allocator(_keep)\n"))


def _allocator():
    from triton.runtime import _allocation

    return _allocation._allocator.get()


def test_the_allocator_a_candidate_set_is_reset_after_its_evaluation():
    from triton.runtime import _allocation

    assert check_source(SETS_ALLOCATOR).ok, check_source(SETS_ALLOCATOR).message()
    executor = InProcessExecutor(InterpretDevice(warmup=0, repeats=1), held_out=False)
    executor.prepare()
    [ev] = executor.evaluate(AXPY, SETS_ALLOCATOR, AXPY.shapes("smoke")[:1], torch.float16)
    assert ev.status is Status.OK, ev.verification.message
    assert _allocator() is _allocation._NULL_ALLOCATOR


def test_the_worker_resets_the_allocator_when_a_candidates_session_ends():
    from triton.runtime import _allocation

    from kernelforge.execute.worker import protocol, serve as worker_serve

    triton_allocator = _allocation._allocator
    triton_allocator.set(lambda size, alignment, stream: None)
    session = worker_serve.WorkerSession(InterpretDevice(), None, lambda: None)
    assert session.handle(protocol.Release()) == protocol.Released(None)
    assert _allocator() is _allocation._NULL_ALLOCATOR


def test_a_worker_left_holding_a_candidates_memory_is_retired(monkeypatch):
    """Issue 29: a candidate that keeps memory alive in its module (here 40 MB more on every call) would
    shrink every later candidate's limit in a long-lived worker: the trusted side reads the
    worker's resident memory after each candidate and retires a worker that grew too much."""
    from kernelforge.execute.worker import memory_watch
    from kernelforge.execute.worker.executor import WorkerExecutor

    monkeypatch.setattr(memory_watch, "RETIRE_MEMORY_GROWTH", 150 * 2**20)
    hog = "import torch\n" + HONEST.replace("def run(x, y, alpha, out):\n", "_KEEP = []\n\n\ndef run(x, y, alpha, out):\n"
                                            "    _KEEP.append(torch.ones(10 * 2**20, dtype=torch.float32))\n")
    shapes = AXPY.shapes("smoke")[:1]
    with WorkerExecutor(InterpretDevice(warmup=0, repeats=1), held_out=False, run_timeout=120) as executor:
        [ev] = executor.evaluate(AXPY, HONEST, shapes, torch.float16)
        [ev] = executor.evaluate(AXPY, HONEST, shapes, torch.float16)
        assert ev.status is Status.OK and executor.starts == 1, ev.verification.message
        [ev] = executor.evaluate(AXPY, hog, shapes, torch.float16)
        assert ev.status is Status.OK, ev.verification.message  # right, and 40 MB heavier per call
        [ev] = executor.evaluate(AXPY, HONEST, shapes, torch.float16)
        assert ev.status is Status.OK and executor.starts == 2  # the next candidate got a fresh worker
