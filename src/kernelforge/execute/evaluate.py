"""Evaluate one candidate on a list of shapes: load, verify, then time what verified.

This is the trusted judge's loop (compile -> verify -> time); an executor calls it per candidate
with a runner (:mod:`kernelforge.execute.runner`: the worker process, or this one) and the search
stores what it returns. The candidate only ever runs through the runner; inputs, references,
comparisons and verdicts are made here. Timing is skipped for a shape that fails verification; a
timed round's verified call, its inputs and its wall clock are checked
(:mod:`kernelforge.execute.timing.check`), and what was timed is verified once more afterwards (the
timing phase must not be a place to cheat).
"""

from __future__ import annotations

import dataclasses
import random
from typing import Callable, Sequence

import torch

from kernelforge.block import Block, Counts, Shape
from kernelforge.devices.base import Device
from kernelforge.execute.runner import Entry, LocalRunner, Runner
from kernelforge.execute.timing.rounds import TimedRound, TimingPlan, TimingSet, make_timing_sets, time_round
from kernelforge.execute.timing.check import check_round, replayed_inputs, timing_mismatch, with_figures
from kernelforge.execute.judge.verify import verify_again, verify_shape
from kernelforge.result import Evaluation, Status, Timing, Verification

#: Message prefixes a report can look for (the status stays one of the six).
#: A timing below the device's datasheet roofline: re-verified; status ``ok`` only if that passed.
ROOFLINE_FLAG = "[faster-than-roofline]"
#: GPU work outlived the timed events (a side stream?): status ``rejected``.
TIMING_FLAG = "[event-wall-mismatch]"
#: Verification on a held-out shape (not timed) failed: the status of that failure.
HELD_OUT_FLAG = "[held-out]"


def evaluate(
    block: Block,
    source: str,
    shapes: list[Shape],
    dtype: torch.dtype,
    device: Device,
    *,
    timed: bool = True,
    stop_at_first_failure: bool = False,
    held_out: Sequence[Shape] = (),
    recheck: bool = True,
    policy: bool = False,
    on_step: Callable[[str], None] | None = None,
    on_result: Callable[[Evaluation], None] | None = None,
    runner: Runner | None = None,
    rng: random.Random | None = None,
    plan: TimingPlan | None = None,
) -> list[Evaluation]:
    """Verify ``source`` on every shape and time the shapes it passes.

    - ``runner`` runs the candidate (default: a :class:`~kernelforge.execute.runner.LocalRunner`
      on ``device``, in this process); ``device`` is this side's copy of the device (where inputs
      are allocated, its settings and ceilings);
    - ``policy``: check the source against :mod:`kernelforge.policy.checker` first (nothing of it is
      imported when it fails: status ``rejected`` on every shape);
    - ``held_out``: shapes verified (one poisoned call each, not timed) before the timed ones; a
      failure there is the candidate's status on every shape, with the message prefixed by
      :data:`HELD_OUT_FLAG`;
    - timing: each round's verified call, its inputs and its wall clock are checked
      (:mod:`kernelforge.execute.timing.check`; ``rng`` draws the verified call, default the
      system's randomness); ``plan`` fixes each shape's timing method (the baseline's; None or a
      shape it does not name: the device chooses);
    - ``recheck``: after timing a shape, one more checked call on the timing buffers with
      perturbed values must pass (:func:`~kernelforge.execute.judge.verify.verify_again`); on a GPU, timings
      below the datasheet roofline are re-verified again and flagged (:data:`ROOFLINE_FLAG`),
      and GPU work that outlives the timed events is rejected (:data:`TIMING_FLAG`);
    - functions the harness relies on are snapshotted where the candidate runs before the import
      and compared after it and after every shape: a candidate that replaced one is ``rejected``
      (tampering).

    ``on_step(label)`` is called when a step starts (``compile``, ``held-out SHAPE``, ``SHAPE``)
    and ``on_result`` with each shape's evaluation as soon as it exists.
    """
    counts = {s.name: block.counts(s, dtype) for s in shapes}
    results: list[Evaluation] = []
    runner = runner if runner is not None else LocalRunner(device)

    def emit(ev: Evaluation) -> None:
        results.append(ev)
        if on_result is not None:
            on_result(ev)

    def step(label: str) -> None:
        runner.step(label)
        if on_step is not None:
            on_step(label)

    def fail_all(verdict: Verification) -> list[Evaluation]:
        for shape in shapes:
            if not any(r.shape.name == shape.name for r in results):
                emit(Evaluation(shape, verdict, counts[shape.name]))
        return results

    if policy:
        from kernelforge.policy.wall import refusal

        why = refusal(source)
        if why:
            return fail_all(Verification(Status.REJECTED, message=why))
    step("compile")

    def tampered(when: str) -> Verification | None:
        changed = runner.tampering()
        if not changed:
            return None
        return Verification(Status.REJECTED, message=f"the candidate replaced {', '.join(changed[:4])} {when} "
                                                     "(tampering with the harness)")

    handle, failure = runner.load(source, block.id, watch=(
        (f"{type(device).__name__}.time", type(device), "time"),
        (f"{type(block).__name__}.reference", type(block), "reference")))
    failure = failure or tampered("when imported")
    if failure is not None or handle is None:
        return fail_all(failure or Verification(Status.RUNTIME_ERROR, message="the candidate was not loaded"))
    entry = Entry(runner, handle)
    for index, shape in enumerate(held_out):
        step(f"held-out {shape.name}")
        # One poisoned call on fresh inputs catches shape hard-coding; the three-call protocol
        # (determinism, caches) runs on the timed shapes.
        verdict = verify_shape(block, entry, shape, dtype, device.torch_device, seed=101 + index,
                               calls=1)
        bad = tampered(f"while verifying {shape.name}")
        if bad is not None:
            return fail_all(bad)
        if not verdict.ok:
            return fail_all(dataclasses.replace(verdict, message=f"{HELD_OUT_FLAG} {verdict.message}"))
    for index, shape in enumerate(shapes):
        step(shape.name)
        verdict = verify_shape(block, entry, shape, dtype, device.torch_device, seed=index)
        timing = None
        if verdict.ok and timed:
            verdict, timing = _time_and_recheck(block, entry, shape, dtype, device, counts[shape.name], verdict,
                                                recheck=recheck, seed=index, rng=rng,
                                                method=plan.method_for(block.id, shape.name, dtype) if plan else None)
        bad = tampered(f"while evaluating {shape.name}")
        if bad is not None:
            verdict, timing = bad, None
        emit(Evaluation(shape, verdict, counts[shape.name], timing))
        if bad is not None:
            return fail_all(bad)
        if stop_at_first_failure and not verdict.ok:
            break
    return results


def _timed(block: Block, entry: Entry, shape: Shape, dtype: torch.dtype, device: Device,
           rng: random.Random | None, method: str | None = None
           ) -> tuple[Verification | None, Timing | None, list[TimingSet], TimedRound]:
    """One checked timing round: (failure or None, the timing with the round's figures, the
    sets, the round as the trusted side saw it)."""
    sets = make_timing_sets(block, shape, dtype, device, entry.runner)
    done = time_round(block, entry, shape, dtype, device, sets, rng=rng, method=method)
    failure = check_round(block, shape, dtype, device, sets, done)
    timing = with_figures(done.timing, done) if done.timing is not None else None
    return failure, timing, sets, done


def _time_and_recheck(block: Block, entry: Entry, shape: Shape, dtype: torch.dtype, device: Device, counts: Counts,
                      verdict: Verification, *, recheck: bool, seed: int,
                      rng: random.Random | None, method: str | None = None) -> tuple[Verification, Timing | None]:
    failure, timing, sets, done = _timed(block, entry, shape, dtype, device, rng, method)
    if failure is not None:
        if failure.rel_error is None:  # the candidate raised, or broke a rule, while timed
            failure = dataclasses.replace(failure, rel_error=verdict.rel_error, excess=verdict.excess,
                                          checks=verdict.checks)
        return failure, None
    assert timing is not None
    checks = verdict.checks + 1
    if recheck:
        first = sets[0]
        # The values of the set's last timed call, which the candidate has seen: a cache keyed on a
        # sample of them hits on the perturbed buffers and serves a stale result.
        state = replayed_inputs(first, 0, len(sets), done.prepared - 1, done.touch_seed)
        again = verify_again(block, entry, shape, dtype, device.torch_device, first.shared, first.outputs,
                             seed=7000 + seed, state=state)
        if not again.ok:
            return again, None
        checks += 1
    if timing.extra.get("event_wall_mismatch"):
        return Verification(Status.REJECTED, verdict.rel_error, verdict.excess, checks,
                            f"{TIMING_FLAG} {shape.name}: the GPU was busy {timing.extra['drain_s'] * 1e6:.1f} us after "
                            f"the call returned while the events timed {timing.median_s * 1e6:.1f} us per call: work "
                            "the timed stream does not see (a side stream?)"), None
    mismatch = timing_mismatch(shape, timing, done, device, verdict.rel_error, verdict.excess, checks)
    if mismatch is not None:
        return mismatch, None
    ceilings = device.ceilings() if timing.is_gpu else None
    if ceilings is not None and recheck:
        roofline = ceilings.roofline_seconds(counts.flops, counts.bytes)
        if timing.median_s < roofline:
            first = sets[0]
            third = verify_again(block, entry, shape, dtype, device.torch_device, first.shared, first.outputs,
                                 seed=9000 + seed, label="roofline re-check",
                                 state=replayed_inputs(first, 0, len(sets), done.prepared - 1, done.touch_seed))
            note = (f"{ROOFLINE_FLAG} {shape.name}: median {timing.median_s * 1e6:.2f} us is below the "
                    f"{ceilings.name} datasheet roofline of {roofline * 1e6:.2f} us")
            if not third.ok:
                return Verification(third.status, third.rel_error, third.excess, checks + 1,
                                    f"{note}; re-verification failed: {third.message}",
                                    traceback=third.traceback), None
            return Verification(Status.OK, verdict.rel_error, verdict.excess, checks + 1,
                                f"{note}; re-verified on perturbed inputs: the timing is suspect"), timing
    return Verification(verdict.status, verdict.rel_error, verdict.excess, checks, verdict.message), timing


class PairSpeedup(float):
    """One pair's speedup (baseline time / candidate time) that also carries the two times it is
    the ratio of, so the report can show the very measurements behind it (issue 32)."""

    baseline_s: float
    candidate_s: float

    def __new__(cls, baseline_s: float, candidate_s: float) -> "PairSpeedup":
        value = super().__new__(cls, baseline_s / candidate_s)
        value.baseline_s, value.candidate_s = baseline_s, candidate_s
        return value


def pair_speedups(block: Block, baseline_source: str, candidate_source: str, shape: Shape, dtype: torch.dtype,
                  device: Device, pairs: int, *, runner: Runner | None = None,
                  rng: random.Random | None = None, held_out: Sequence[Shape] = ()) -> list[float]:
    """Interleaved baseline/candidate timings on one shape: the speedup of each pair (drift of the
    machine between pairs cancels within a pair), each a :class:`PairSpeedup` with its two times.
    Every round is checked as in :func:`evaluate`
    (its verified call, inputs and wall clock), after one verification call of each source on the
    shape (which also warms its kernels) and of the candidate on each ``held_out`` shape (a new
    draw: :class:`~kernelforge.execute.judge.held_out.HeldOutDraw`). Empty when either source fails to
    load or any check fails: the candidate is then not confirmed."""
    runner = runner if runner is not None else LocalRunner(device)
    entries = []
    for source in (baseline_source, candidate_source):
        handle, failure = runner.load(source, block.id)
        if failure is not None or handle is None:
            return []
        entries.append(Entry(runner, handle))
    if runner.tampering():
        return []
    for entry in entries:
        if not verify_shape(block, entry, shape, dtype, device.torch_device, seed=0, calls=1).ok:
            return []
    for index, other in enumerate(held_out):
        if not verify_shape(block, entries[1], other, dtype, device.torch_device, seed=301 + index, calls=1).ok:
            return []
    speedups = []
    method = None  # the baseline's first round decides the pairs' timing method (TimingPlan)
    for _ in range(pairs):
        times = []
        for entry in entries:
            failure, timing, _, done = _timed(block, entry, shape, dtype, device, rng, method)
            if failure is not None or timing is None or timing_mismatch(shape, timing, done, device, None, None, 0):
                return []
            method = method or timing.method
            times.append(timing.median_s)
        speedups.append(PairSpeedup(times[0], times[1]))
    return speedups if not runner.tampering() else []
