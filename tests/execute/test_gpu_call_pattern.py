"""The timed-call checks under a GPU's call pattern, on the CPU, and the held-out draw of a
confirmation (issue 29). A device that calls
like ``CudaDevice.time`` (warm-up calls after their own preparation; loops whose call index is not
the preparation's; back-to-back preparations before a graph capture; an unprepared energy round)
must not make an honest candidate look wrong, and a candidate that counts calls and skips the
work on some of the timed loop's calls must be caught, naming the call."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Sequence

import pytest
import torch

from kernelforge.candidate import Candidate
from kernelforge.catalog import Catalog
from kernelforge.devices.base import Device
from kernelforge.devices.interpret import InterpretDevice
from kernelforge.execute.evaluate import evaluate
from kernelforge.result import Status, Timing

pytestmark = pytest.mark.interpreter

CATALOG = Catalog.discover(Path(__file__).resolve().parents[1] / "fixtures" / "kernels")
AXPY = CATALOG.block("toy/axpy")
HONEST = Candidate.from_template(CATALOG.baseline("toy/axpy")).source


class GpuPattern(Device):
    """Calls like CudaDevice.time (its loops, not its clocks), on the CPU with the interpreter."""

    name = "gpu-pattern"
    torch_device = "cpu"
    prepares_every_call = False

    def __init__(self, graph: bool):
        self.warmup, self.graph, self.count = 3, graph, 0

    def prepare(self) -> None:
        InterpretDevice().prepare()

    def round_preparations(self, n_sets: int) -> int:
        return self.warmup + 5 + (n_sets if self.graph else 0)

    def _prepare(self, before) -> None:
        before(self.count)
        self.count += 1

    def time(self, calls: Sequence, *, working_set_bytes: int = 0, before=None, method: str | None = None) -> Timing:
        self.count = 0
        for i in range(self.warmup):  # warm-up: each call right after its own preparation
            self._prepare(before)
            calls[i % len(calls)]()
        for i in range(5):  # the probe and the timed loops: the call index is the loop's own
            self._prepare(before)
            calls[i % len(calls)]()
        if self.graph:  # preparations back to back, then the captured calls (run eagerly here)
            for _ in range(len(calls)):
                self._prepare(before)
            for i in range(max(len(calls), 4)):
                calls[i % len(calls)]()
        self.host_clock = True
        for i in range(3):  # the energy round: no preparation at all, timed on the host's clock
            calls[i % len(calls)]()
        self.host_clock = False
        return Timing(1e-6, 1e-6, 1e-6, 5, "cuda-events", "a GPU's call pattern on the CPU",
                      extra={"event_wall_mismatch": False, "drain_s": 0.0})

    def ceilings(self) -> Any:
        return None

    def describe(self) -> dict[str, Any]:
        return {"device": self.name}


def _skipping(call: int) -> str:
    """The honest axpy, except that call ``call`` (1-based, all calls counted) launches nothing."""
    return HONEST.replace("def run(x, y, alpha, out):\n    n = x.numel()\n",
                          "_CALLS = [0]\n\n\ndef run(x, y, alpha, out):\n    _CALLS[0] += 1\n    n = x.numel()\n"
                          f"    if _CALLS[0] == {call}:\n        return\n")


@pytest.mark.parametrize("graph", [False, True])
def test_an_honest_candidate_passes_a_gpu_call_pattern(graph):
    device = GpuPattern(graph)
    device.prepare()
    evaluations = evaluate(AXPY, HONEST, AXPY.shapes("smoke"), torch.float16, device)
    assert [ev.status for ev in evaluations] == [Status.OK] * len(evaluations), \
        [ev.verification.message for ev in evaluations]


@pytest.mark.parametrize("graph", [False, True])
def test_a_candidate_that_skips_one_call_of_a_timed_loop_is_wrong_with_the_call_named(graph, monkeypatch):
    monkeypatch.setattr("kernelforge.execute.timing.rounds.WATCHED_SHARE", 0.0)  # the unwritten count alone
    device = GpuPattern(graph)
    device.prepare()
    # 3 verification calls, then the round: 3 warm-up calls, and the 2nd call of the timed loop.
    [ev] = evaluate(AXPY, _skipping(3 + 3 + 2), AXPY.shapes("smoke")[:1], torch.float16, device)
    assert ev.status is Status.WRONG, ev.verification.message
    assert "(timed call 5 of" in ev.verification.message and "left unwritten" in ev.verification.message


@pytest.mark.parametrize("graph", [False, True])
def test_a_timed_call_drawn_for_the_guard_is_a_verification_call(graph, monkeypatch):
    """With every prepared call drawn (the share at 1), the skipped call is caught by the guard
    itself: no Triton kernel was launched, the call named."""
    monkeypatch.setattr("kernelforge.execute.timing.rounds.WATCHED_SHARE", 1.0)
    device = GpuPattern(graph)
    device.prepare()
    [ev] = evaluate(AXPY, _skipping(3 + 3 + 2), AXPY.shapes("smoke")[:1], torch.float16, device)
    assert ev.status is Status.REJECTED and "timed call 5: no Triton kernel was launched" in ev.verification.message


def test_the_calls_a_graph_captures_are_guarded_whatever_the_draw(monkeypatch):
    """A CUDA graph replays what its capture launched and never runs the host code again: a
    candidate that computes with torch only in the calls made without a preparation of their own
    (the capture) is caught there, though no prepared call was drawn."""
    monkeypatch.setattr("kernelforge.execute.timing.rounds.WATCHED_SHARE", 0.0)
    device = GpuPattern(True)
    device.prepare()
    # 3 verification calls, 3 warm-up, 5 timed; the capture's calls come after (the 12th on).
    torch_late = HONEST.replace(
        "def run(x, y, alpha, out):\n    n = x.numel()\n",
        "_CALLS = [0]\n\n\ndef run(x, y, alpha, out):\n    _CALLS[0] += 1\n    n = x.numel()\n"
        "    if _CALLS[0] >= 12:\n        out.copy_(x * alpha + y)\n")  # then the honest launch as well
    [ev] = evaluate(AXPY, torch_late, AXPY.shapes("smoke")[:1], torch.float16, device)
    assert ev.status is Status.REJECTED and "host code computed with torch" in ev.verification.message


def test_confirmation_verifies_the_candidate_on_its_own_held_out_draw():
    """Issue 29: confirmation draws new held-out shapes; a candidate wrong there is not confirmed
    (no pairs are timed), one right there is."""
    from kernelforge.execute.evaluate import pair_speedups

    device = InterpretDevice(warmup=0, repeats=1)
    device.prepare()
    smoke = AXPY.shapes("smoke")[0]
    n7 = next(s for s in AXPY.shapes("check") if s.name == "n7")
    wrong_on_n7 = HONEST.replace("    n = x.numel()\n", "    n = x.numel()\n    if n == 7:\n        n = 6\n")
    assert pair_speedups(AXPY, HONEST, wrong_on_n7, smoke, torch.float16, device, 1, held_out=[n7]) == []
    assert len(pair_speedups(AXPY, HONEST, wrong_on_n7, smoke, torch.float16, device, 1)) == 1
    assert len(pair_speedups(AXPY, HONEST, HONEST, smoke, torch.float16, device, 1, held_out=[n7])) == 1
