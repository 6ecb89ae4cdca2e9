"""Evaluate one candidate on a list of shapes: load, verify, then time what verified.

This is the device-side stage of the flow (compile -> verify -> time); the search calls it per
candidate and stores what it returns. Timing is skipped for a shape that fails verification.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import torch

from .block import Block, Counts, Shape
from .candidate import load_module
from .device import Device
from .result import Status, Timing, Verification
from .verify import verify_shape

#: Input sets are rotated while timing so the L2 cache never holds the inputs; beyond this many,
#: the device flushes L2 instead (and large sets need no help: they do not fit in L2 anyway).
MAX_INPUT_SETS = 8
INPUT_SET_MEMORY_BUDGET = 16 * 2**30


@dataclass(frozen=True)
class Evaluation:
    """What one candidate did on one shape."""

    shape: Shape
    verification: Verification
    counts: Counts
    timing: Timing | None = None

    @property
    def status(self) -> Status:
        return self.verification.status


def load_candidate(source: str, name_hint: str = "candidate") -> tuple[Any, Verification | None]:
    """Import a rendered source; a failure to import is the candidate's compile error."""
    try:
        module = load_module(source, name_hint)
    except Exception as exc:  # candidate code is untrusted input: any failure is data
        return None, Verification(Status.COMPILE_ERROR, message=f"import failed: {type(exc).__name__}: {exc}"[:2000])
    if not callable(getattr(module, "run", None)):
        return None, Verification(Status.COMPILE_ERROR, message="the module defines no run(...) entry point")
    return module, None


def time_candidate(block: Block, run, shape: Shape, dtype: torch.dtype, device: Device, counts: Counts) -> Timing:
    """Time ``run`` on ``shape`` with freshly generated, rotated input sets."""
    working_set = int(counts.bytes)
    l2_guess = 64 * 2**20
    n_sets = max(1, min(MAX_INPUT_SETS, math.ceil(2 * l2_guess / max(working_set, 1))))
    n_sets = max(1, min(n_sets, INPUT_SET_MEMORY_BUDGET // max(working_set, 1)))
    if device.name == "interpret":
        n_sets = 1  # no cache to defeat; interpreter calls are slow
    sets = []
    for i in range(n_sets):
        inputs = block.make_inputs(shape, dtype, device.torch_device, seed=1000 + i)
        out = block.make_output(shape, dtype, device.torch_device)
        sets.append((inputs, out))
    calls = [lambda inputs=inputs, out=out: run(**inputs, out=out) for inputs, out in sets]
    return device.time(calls, working_set_bytes=working_set)


def evaluate(
    block: Block,
    source: str,
    shapes: list[Shape],
    dtype: torch.dtype,
    device: Device,
    *,
    deterministic: bool = True,
    timed: bool = True,
    stop_at_first_failure: bool = False,
) -> list[Evaluation]:
    """Verify ``source`` on every shape and time the shapes it passes."""
    module, failure = load_candidate(source, block.id)
    results: list[Evaluation] = []
    for index, shape in enumerate(shapes):
        counts = block.counts(shape, dtype)
        if failure is not None:
            results.append(Evaluation(shape, failure, counts))
            continue
        verdict = verify_shape(block, module.run, shape, dtype, device.torch_device, seed=index,
                               deterministic=deterministic)
        timing = None
        if verdict.ok and timed:
            try:
                timing = time_candidate(block, module.run, shape, dtype, device, counts)
            except Exception as exc:  # a crash while timing is the candidate's runtime error
                verdict = Verification(Status.RUNTIME_ERROR, verdict.rel_error, verdict.excess, verdict.checks,
                                       f"{shape.name}: while timing: {type(exc).__name__}: {exc}"[:2000])
        results.append(Evaluation(shape, verdict, counts, timing))
        if stop_at_first_failure and not verdict.ok:
            break
    return results


def pair_speedups(block: Block, baseline_source: str, candidate_source: str, shape: Shape, dtype: torch.dtype,
                  device: Device, pairs: int) -> list[float]:
    """Interleaved baseline/candidate timings on one shape: the speedup of each pair (drift of the
    machine between pairs cancels within a pair). Empty when either source fails to load."""
    base_module, base_failure = load_candidate(baseline_source, block.id)
    cand_module, cand_failure = load_candidate(candidate_source, block.id)
    if base_failure is not None or cand_failure is not None:
        return []
    counts = block.counts(shape, dtype)
    speedups = []
    for _ in range(pairs):
        base = time_candidate(block, base_module.run, shape, dtype, device, counts)
        cand = time_candidate(block, cand_module.run, shape, dtype, device, counts)
        speedups.append(base.median_s / cand.median_s)
    return speedups


class InProcessExecutor:
    """Evaluates candidates in this process: for trusted templates and tests. Untrusted code runs
    through an isolating executor with the same two methods."""

    def __init__(self, device: Device):
        self.device = device

    def evaluate(self, block: Block, source: str, shapes: list[Shape], dtype: torch.dtype, *,
                 deterministic: bool = True) -> list[Evaluation]:
        return evaluate(block, source, shapes, dtype, self.device, deterministic=deterministic)

    def pair_speedups(self, block: Block, baseline_source: str, candidate_source: str, shape: Shape,
                      dtype: torch.dtype, pairs: int) -> list[float]:
        return pair_speedups(block, baseline_source, candidate_source, shape, dtype, self.device, pairs)

    def close(self) -> None:
        pass
