"""Every timed call counts on a GPU too (issue 29, Deliver 4), shown on the CPU.

A device that times like a GPU (several rotated input sets, phases whose call index is the loop's
own, an unprepared energy round: ``prepares_every_call`` false) runs candidates that count their
calls and write a cheap wrong result (written, not poison: nothing is left unwritten) on some calls
of the timed loops only, doing honest work on the verification calls, the warm-up and the re-check
after timing. Before this change such a device had one warm-up call verified and, with several
input sets, no last-call check: every such candidate was ``ok``. Now every call of the round is
copied aside outside the timed region and the trusted side verifies a draw of the copies made
after the round ran, so counting calls cannot tell a candidate which call is looked at.
"""

from __future__ import annotations

import random
from pathlib import Path
from typing import Any, Sequence

import pytest
import torch

from kernelforge.block import Shape
from kernelforge.candidate import Candidate
from kernelforge.catalog import Catalog
from kernelforge.devices.base import Device
from kernelforge.devices.interpret import InterpretDevice
from kernelforge.execute.timing import rounds as timing_module
from kernelforge.execute.evaluate import evaluate
from kernelforge.execute.timing.rounds import VERIFIED_DRAWS, copied_calls, input_set_count
from kernelforge.result import Status, Timing
from kf_simulated_gpu import SimulatedGpu

pytestmark = pytest.mark.interpreter

REPO = Path(__file__).resolve().parents[2]
FIXTURES = Catalog.discover(REPO / "tests" / "fixtures" / "kernels")
SHIPPED = Catalog.discover(REPO / "kernels")

#: The calls a candidate sees before the round (``evaluate``: three verification calls), then the
#: round of :class:`LoopingGpu`: 3 warm-up, 4 probe, 2 timed loops of 6, 3 energy calls.
BEFORE_ROUND = 3
WARMUP, PROBE, LOOPS, PER_LOOP, ENERGY = 3, 4, 2, 6, 3
FIRST_TIMED = BEFORE_ROUND + WARMUP + PROBE + 1  # the first call of the timed loops, counted by the candidate
LAST_TIMED = FIRST_TIMED + LOOPS * PER_LOOP - 1


class LoopingGpu(Device):
    """Calls like a GPU device: every phase prepared call by call, but the loops' call index
    restarts, several input sets rotate, and the energy round is not prepared (the interpreter
    runs the kernels)."""

    name = "looping-gpu"
    torch_device = "cpu"
    rotates_input_sets = True
    prepares_every_call = False

    def __init__(self) -> None:
        self.count = 0

    def prepare(self) -> None:
        InterpretDevice().prepare()

    def round_preparations(self, n_sets: int) -> int:
        return WARMUP + PROBE + LOOPS * PER_LOOP

    def _call(self, calls: Sequence, before, i: int) -> None:
        before(self.count)
        self.count += 1
        calls[i % len(calls)]()

    def time(self, calls: Sequence, *, working_set_bytes: int = 0, before=None, method: str | None = None) -> Timing:
        self.count = 0
        for i in range(WARMUP):
            self._call(calls, before, i)
        for i in range(PROBE):
            self._call(calls, before, i)
        for _ in range(LOOPS):
            for i in range(PER_LOOP):
                self._call(calls, before, i)
        for i in range(ENERGY):
            calls[i % len(calls)]()
        return Timing(1e-6, 1e-6, 1e-6, LOOPS * PER_LOOP, "cuda-events", "a GPU's loops on the CPU",
                      extra={"event_wall_mismatch": False, "drain_s": 0.0})

    def describe(self) -> dict[str, Any]:
        return {"device": self.name}


def counting(source: str, signature: str, fake: str, when: str) -> str:
    """``source`` whose ``run`` counts its calls and, when ``when`` holds of the count ``_C``, runs
    ``fake`` first (a cheap wrong result that still writes every output)."""
    assert signature in source, signature
    head = f"_CALLS = [0]\n\n\n{signature}\n    _CALLS[0] += 1\n    _C = _CALLS[0]\n    if {when}:\n        {fake}\n"
    return source.replace(f"{signature}\n", head, 1)


def baseline(catalog: Catalog, block_id: str) -> str:
    return Candidate.from_template(catalog.baseline(block_id)).source


IN_TIMED_LOOPS = f"{FIRST_TIMED} <= _C <= {LAST_TIMED}"
EVERY_OTHER_TIMED = f"{FIRST_TIMED} <= _C <= {LAST_TIMED} and _C % 2 == 0"

#: (block, catalog, shape or None for the smoke shape, signature, fake) on several block families.
FAMILIES = {
    "toy/axpy": (FIXTURES, None, "def run(x, y, alpha, out):", "alpha = 0.0"),
    "toy/router": (FIXTURES, None, "def run(logits, bias, top_k, weights, indices):", "bias = logits"),
    "demo/matmul": (FIXTURES, None, "def run(a, b, out):", "b = b.t()  # a @ b.T: square shape, a view"),
    "norm/fused_add_rmsnorm": (SHIPPED, Shape.of("t4", T=4, H=256, EPS=1e-6),
                               "def run(x, residual, weight, eps, out):", "weight = x[0]"),
}


def _shape(block_id: str):
    catalog, shape, _, _ = FAMILIES[block_id]
    block = catalog.block(block_id)
    return block, (shape if shape is not None else block.shapes("smoke")[0])


@pytest.mark.parametrize("block_id", sorted(FAMILIES))
def test_an_honest_kernel_passes_with_every_call_copied(block_id):
    block, shape = _shape(block_id)
    device = LoopingGpu()
    device.prepare()
    assert input_set_count(block.counts(shape, torch.float16), device) > 1  # several rotated sets
    source = baseline(FAMILIES[block_id][0], block_id)
    for seed in range(3, 5):  # with all 19 copies made, these draws hold the last prepared call
        [ev] = evaluate(block, source, [shape], torch.float16, device, rng=random.Random(seed))
        assert ev.status is Status.OK, ev.verification.message
        # The energy round calls the last prepared set again, unprepared: for a block with in-place
        # inputs (router, norm) that call's copy would hold twice-updated results, so it is not made.
        made = WARMUP + PROBE + LOOPS * PER_LOOP - (1 if block.inplace else 0)
        assert ev.timing.extra["copied_calls"] == made
        assert len(ev.timing.extra["verified_calls"]) == VERIFIED_DRAWS


@pytest.mark.parametrize("block_id", sorted(FAMILIES))
@pytest.mark.parametrize("when", [IN_TIMED_LOOPS, EVERY_OTHER_TIMED], ids=["timed-loops", "every-other"])
def test_a_kernel_that_fakes_some_timed_calls_is_wrong_with_the_call_named(block_id, when):
    catalog, _, signature, fake = FAMILIES[block_id]
    block, shape = _shape(block_id)
    device = LoopingGpu()
    device.prepare()
    source = counting(baseline(catalog, block_id), signature, fake, when)
    [ev] = evaluate(block, source, [shape], torch.float16, device, rng=random.Random(7))
    assert ev.status is Status.WRONG, ev.verification.message
    message = ev.verification.message
    assert "verified after timing" in message and "timed call " in message
    call = int(message.split("timed call ")[1].split(",")[0].split(" ")[0])
    # The call named is one the candidate faked (round calls are numbered from 1).
    assert FIRST_TIMED <= BEFORE_ROUND + call <= LAST_TIMED, message


def test_the_draw_comes_after_the_round_and_spares_no_phase():
    """Which copies are verified is drawn after the calls ran, over the whole round: over a few
    draws, warm-up, probe and timed-loop calls are all verified some time."""
    block, shape = _shape("toy/axpy")
    device = LoopingGpu()
    device.prepare()
    seen: set[int] = set()
    for seed in range(4):
        [ev] = evaluate(block, baseline(FIXTURES, "toy/axpy"), [shape], torch.float16, device, rng=random.Random(seed))
        assert ev.status is Status.OK, ev.verification.message
        seen |= set(ev.timing.extra["verified_calls"])
    assert seen & set(range(1, WARMUP + 1)) and seen & set(range(WARMUP + 1, WARMUP + PROBE + 1))
    assert seen & set(range(WARMUP + PROBE + 1, WARMUP + PROBE + LOOPS * PER_LOOP + 1))


def test_beyond_the_memory_budget_a_share_of_the_calls_is_copied_and_still_catches(monkeypatch):
    """Where copies of every call do not fit the budget, as many as fit are copied, drawn over the
    whole round by the trusted side; a kernel faking the timed loops is still wrong."""
    block, shape = _shape("toy/axpy")
    device = LoopingGpu()
    call_bytes = 1000 * 2
    monkeypatch.setattr(timing_module, "SNAPSHOT_MEMORY_BUDGET", 10 * call_bytes)
    drawn = copied_calls(device, 8, call_bytes, random.Random(3))
    assert len(drawn) == 10 and len(set(drawn)) == 10 and all(0 <= i < device.round_preparations(8) for i in drawn)
    assert copied_calls(device, 8, call_bytes, random.Random(4)) != drawn
    device.prepare()
    source = counting(baseline(FIXTURES, "toy/axpy"), FAMILIES["toy/axpy"][2], "alpha = 0.0", IN_TIMED_LOOPS)
    [ev] = evaluate(block, source, [shape], torch.float16, device, rng=random.Random(1))
    assert ev.status is Status.WRONG and "verified after timing" in ev.verification.message


class CudaLoopsOnCpu(SimulatedGpu):
    """``CudaDevice.time`` as written (warm-up, launch, probe and drain samples, timed rounds, the
    energy round), with the GPU's clocks simulated (every event-timed call takes 1 ms, so events
    are the method) and its calls run on the CPU by the interpreter; it counts its preparations."""

    def __init__(self) -> None:
        super().__init__(call_s=1e-3, launch_s=1e-5)
        self.torch_device = "cpu"
        self.prepared = 0

    def prepare(self) -> None:
        InterpretDevice().prepare()

    def ceilings(self) -> Any:
        return None

    def _prepare_call(self) -> None:
        super()._prepare_call()
        self.prepared += 1

    def describe(self) -> dict[str, Any]:
        return {"device": "simulated-cuda"}


def test_cudas_own_loops_stay_within_its_declared_preparations_and_faked_event_calls_are_caught():
    """The real ``CudaDevice.time`` on CPU calls: its preparations fit ``round_preparations`` (so
    every call is copied), an honest kernel passes, and one that fakes every event-timed call
    (probe, drain, timed rounds: it counts past the warm-up and launch samples) is wrong."""
    block, shape = _shape("toy/axpy")
    device = CudaLoopsOnCpu()
    device.prepare()
    n_sets = input_set_count(block.counts(shape, torch.float16), device)
    [ev] = evaluate(block, baseline(FIXTURES, "toy/axpy"), [shape], torch.float16, device, recheck=False)
    assert ev.status is Status.OK, ev.verification.message
    assert ev.timing.method == "cuda-events" and n_sets > 1
    assert 0 < device.prepared <= device.round_preparations(n_sets)
    assert ev.timing.extra["copied_calls"] == device.prepared
    honest_work = BEFORE_ROUND + device.warmup + 5  # verification, warm-up, launch samples
    source = counting(baseline(FIXTURES, "toy/axpy"), FAMILIES["toy/axpy"][2], "alpha = 0.0",
                      f"{honest_work} < _C <= {BEFORE_ROUND + device.round_preparations(n_sets)}")
    [ev] = evaluate(block, source, [shape], torch.float16, device, recheck=False)
    assert ev.status is Status.WRONG and "verified after timing" in ev.verification.message, ev.verification.message
