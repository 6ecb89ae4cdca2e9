"""Evaluate one candidate on a list of shapes: load, verify, then time what verified.

This is the device-side stage of the flow (compile -> verify -> time); an executor calls it per
candidate (in a worker process, :mod:`kernelforge.execute.worker_main`, or in this one,
:mod:`kernelforge.execute.inprocess`) and the search stores what it returns. Timing is skipped for
a shape that fails verification, and what was timed is verified once more afterwards (the timing
phase must not be a place to cheat).
"""

from __future__ import annotations

import dataclasses
import traceback
from typing import Any, Callable, Sequence

import torch

from kernelforge.block import Block, Counts, Shape
from kernelforge.candidate import load_module, source_id
from kernelforge.devices.base import Device
from kernelforge.errors import UserError
from kernelforge.execute.guard import TRACEBACK_CHARS
from kernelforge.execute.harness import harness_changes, harness_snapshot
from kernelforge.execute.timing import time_candidate
from kernelforge.execute.verify import verify_again, verify_shape
from kernelforge.result import Evaluation, Status, Timing, Verification


def load_candidate(source: str, name_hint: str = "candidate") -> tuple[Any, Verification | None]:
    """Import a rendered source; a failure to import is the candidate's compile error (with the
    full traceback in :attr:`~kernelforge.result.Verification.traceback`)."""
    try:
        module = load_module(source, name_hint)
    except Exception as exc:  # candidate code is untrusted input: any failure is data
        return None, Verification(Status.COMPILE_ERROR, message=f"import failed: {type(exc).__name__}: {exc}"[:2000],
                                  traceback=traceback.format_exc()[-TRACEBACK_CHARS:])
    if not callable(getattr(module, "run", None)):
        return None, Verification(Status.COMPILE_ERROR, message="the module defines no run(...) entry point")
    return module, None


#: Message prefixes a report can look for (the status stays one of the six).
#: A timing below the device's datasheet roofline: re-verified; status ``ok`` only if that passed.
ROOFLINE_FLAG = "[faster-than-roofline]"
#: GPU work outlived the timed events (a side stream?): status ``rejected``.
TIMING_FLAG = "[event-wall-mismatch]"
#: Verification on a held-out shape (not timed) failed: the status of that failure.
HELD_OUT_FLAG = "[held-out]"


def held_out_shapes(block: Block, shapes: Sequence[Shape], source: str, device_name: str) -> list[Shape]:
    """Shapes a candidate is verified on besides the timed ones, so hard-coding the timed shapes
    does not pass (EVALUATION.md #8): the block's ``check`` shapes (odd sizes, ragged lengths,
    skewed routing) not among ``shapes``, else its ``smoke`` shapes.

    On a GPU all of them (milliseconds each). In the interpreter one poisoned call costs 0.1-0.5 s
    on the shipped blocks' check shapes, so one shape is used per candidate, chosen by the hash of
    its source: a generator cannot know which, and every check shape is off the timed ones.
    """
    timed = {s.name for s in shapes}
    pool: list[Shape] = []
    for set_name in ("check", "smoke"):
        try:
            pool = [s for s in block.shapes(set_name) if s.name not in timed]
        except UserError:
            pool = []
        if pool:
            break
    if not pool or device_name not in ("interpret",):
        return pool
    return [pool[int(source_id(source), 16) % len(pool)]]


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
    held_out: Sequence[Shape] = (),
    recheck: bool = True,
    policy: bool = False,
    on_step: Callable[[str], None] | None = None,
    on_result: Callable[[Evaluation], None] | None = None,
) -> list[Evaluation]:
    """Verify ``source`` on every shape and time the shapes it passes.

    - ``policy``: check the source against :mod:`kernelforge.execute.policy` first (nothing of it is
      imported when it fails: status ``rejected`` on every shape);
    - ``held_out``: shapes verified (one poisoned call each, not timed) before the timed ones; a
      failure there is the candidate's status on every shape, with the message prefixed by
      :data:`HELD_OUT_FLAG`;
    - ``recheck``: after timing a shape, one more guarded call on the timing buffers with
      perturbed values must pass (:func:`~kernelforge.execute.verify.verify_again`); on a GPU, timings
      below the datasheet roofline are re-verified again and flagged (:data:`ROOFLINE_FLAG`),
      and GPU work that outlives the timed events is rejected (:data:`TIMING_FLAG`);
    - functions the harness relies on are snapshotted before the import and compared after it
      and after every shape: a candidate that replaced one is ``rejected`` (tampering).

    ``on_step(label)`` is called when a step starts (``compile``, ``held-out SHAPE``, ``SHAPE``)
    and ``on_result`` with each shape's evaluation as soon as it exists: the worker process
    streams both to its parent, which times out steps and keeps results a later crash would lose.
    """
    counts = {s.name: block.counts(s, dtype) for s in shapes}
    results: list[Evaluation] = []

    def emit(ev: Evaluation) -> None:
        results.append(ev)
        if on_result is not None:
            on_result(ev)

    def step(label: str) -> None:
        if on_step is not None:
            on_step(label)

    def fail_all(verdict: Verification) -> list[Evaluation]:
        for shape in shapes:
            if not any(r.shape.name == shape.name for r in results):
                emit(Evaluation(shape, verdict, counts[shape.name]))
        return results

    if policy:
        from kernelforge.execute.policy import check_source

        report = check_source(source)
        if not report.ok:
            return fail_all(Verification(Status.REJECTED, message=report.message()))
    step("compile")
    snapshot = harness_snapshot((f"{type(device).__name__}.time", type(device), "time"),
                                (f"{type(block).__name__}.reference", type(block), "reference"))

    def tampered(when: str) -> Verification | None:
        changed = harness_changes(snapshot)
        if not changed:
            return None
        return Verification(Status.REJECTED, message=f"the candidate replaced {', '.join(changed[:4])} {when} "
                                                     "(tampering with the harness)")

    module, failure = load_candidate(source, block.id)
    failure = failure or tampered("when imported")
    if failure is not None:
        return fail_all(failure)
    run = module.run
    for index, shape in enumerate(held_out):
        step(f"held-out {shape.name}")
        # One poisoned call on fresh inputs catches shape hard-coding; the three-call protocol
        # (determinism, caches) runs on the timed shapes.
        verdict = verify_shape(block, run, shape, dtype, device.torch_device, seed=101 + index,
                               deterministic=deterministic, calls=1)
        bad = tampered(f"while verifying {shape.name}")
        if bad is not None:
            return fail_all(bad)
        if not verdict.ok:
            return fail_all(dataclasses.replace(verdict, message=f"{HELD_OUT_FLAG} {verdict.message}"[:2000]))
    for index, shape in enumerate(shapes):
        step(shape.name)
        verdict = verify_shape(block, run, shape, dtype, device.torch_device, seed=index, deterministic=deterministic)
        timing = None
        if verdict.ok and timed:
            verdict, timing = _time_and_recheck(block, run, shape, dtype, device, counts[shape.name], verdict,
                                                recheck=recheck, seed=index)
        bad = tampered(f"while evaluating {shape.name}")
        if bad is not None:
            verdict, timing = bad, None
        emit(Evaluation(shape, verdict, counts[shape.name], timing))
        if bad is not None:
            return fail_all(bad)
        if stop_at_first_failure and not verdict.ok:
            break
    return results


def _time_and_recheck(block: Block, run, shape: Shape, dtype: torch.dtype, device: Device, counts: Counts,
                      verdict: Verification, *, recheck: bool, seed: int) -> tuple[Verification, Timing | None]:
    sets: list = []
    try:
        timing = time_candidate(block, run, shape, dtype, device, counts, sets=sets)
    except Exception as exc:  # a crash while timing is the candidate's runtime error
        return Verification(Status.RUNTIME_ERROR, verdict.rel_error, verdict.excess, verdict.checks,
                            f"{shape.name}: while timing: {type(exc).__name__}: {exc}"[:2000],
                            traceback=traceback.format_exc()[-TRACEBACK_CHARS:]), None
    if not recheck:
        return verdict, timing
    inputs, outputs = sets[0]
    again = verify_again(block, run, shape, dtype, device.torch_device, inputs, outputs, seed=7000 + seed)
    if not again.ok:
        return again, None
    if timing.extra.get("event_wall_mismatch"):
        return Verification(Status.REJECTED, verdict.rel_error, verdict.excess, verdict.checks + 1,
                            f"{TIMING_FLAG} {shape.name}: the GPU was busy {timing.extra['drain_s'] * 1e6:.1f} us after "
                            f"the call returned while the events timed {timing.median_s * 1e6:.1f} us per call: work "
                            "the timed stream does not see (a side stream?)"), None
    ceilings = device.ceilings() if timing.is_gpu else None
    if ceilings is not None:
        roofline = ceilings.roofline_seconds(counts.flops, counts.bytes)
        if timing.median_s < roofline:
            third = verify_again(block, run, shape, dtype, device.torch_device, inputs, outputs, seed=9000 + seed,
                                 label="roofline re-check")
            note = (f"{ROOFLINE_FLAG} {shape.name}: median {timing.median_s * 1e6:.2f} us is below the "
                    f"{ceilings.name} datasheet roofline of {roofline * 1e6:.2f} us")
            if not third.ok:
                return Verification(third.status, third.rel_error, third.excess, verdict.checks + 2,
                                    f"{note}; re-verification failed: {third.message}"[:2000],
                                    traceback=third.traceback), None
            return Verification(Status.OK, verdict.rel_error, verdict.excess, verdict.checks + 2,
                                f"{note}; re-verified on perturbed inputs: the timing is suspect"), timing
    return Verification(verdict.status, max(verdict.rel_error or 0.0, again.rel_error or 0.0), verdict.excess,
                        verdict.checks + 1, verdict.message), timing


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
