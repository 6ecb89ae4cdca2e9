"""Timing one verified candidate on one shape, from the trusted side: input sets, the round, the
wall clock around it.

The device times the calls (:meth:`kernelforge.devices.base.Device.time`) where the candidate runs
(:mod:`kernelforge.execute.timing.calls`); this module makes the round: freshly generated input sets
(rotated so the L2 cache never holds the inputs, outputs allocated once per set), placed in memory
shared with the runner while the trusted side keeps pristine private copies; the calls of the
round whose outputs are copied aside (every call, within a memory budget: :func:`copied_calls`)
and which of those copies are verified, drawn after the round ran (:func:`drawn_checks`); and the
trusted side's own wall clock around the round, which :mod:`kernelforge.execute.timing.check`
holds the reported figures against; and the timing method of each shape (:class:`TimingPlan`),
decided once from the baseline and carried to the device in every round of that shape.
"""

from __future__ import annotations

import gc
import math
import random
import time
from dataclasses import dataclass
from typing import Any, Iterable

import torch

from kernelforge.block import Block, Counts, Shape
from kernelforge.devices.base import Device
from kernelforge.execute.judge.contract import Outputs, allocate
from kernelforge.execute.judge.fingerprint import poison
from kernelforge.execute.judge.guard import CallReport, RunFn
from kernelforge.execute.runner import Entry, LocalRunner, Runner
from kernelforge.execute.timing.calls import TimingJob
from kernelforge.result import Status, Timing

#: Input sets are rotated while timing so the L2 cache never holds the inputs; beyond this many,
#: the device flushes L2 instead (and large sets need no help: they do not fit in L2 anyway).
MAX_INPUT_SETS = 8
INPUT_SET_MEMORY_BUDGET = 16 * 2**30


@dataclass(frozen=True)
class TimingSet:
    """One input set of a round: ``inputs`` is the trusted side's private copy as generated
    (scalars included); ``shared`` is what the candidate is called with (the same values in
    shared tensors, and the scalars); ``outputs`` are the shared outputs."""

    inputs: dict[str, Any]
    shared: dict[str, Any]
    outputs: dict[str, torch.Tensor]


@dataclass(frozen=True)
class TimedRound:
    """What one timing round gave the trusted side: the runner's ``timing`` and ``report``, the
    trusted ``wall_s`` around the round and the CPU time ``cpu_s`` the running process spent in it
    (None: unknown), how many calls the runner ``prepared``, the ``verified`` preparations whose
    calls were copied aside (``copied_sets[k]``: from which input set; None: never made), the
    positions in ``verified`` of the copies drawn for verification after the round
    (``checked``), private copies of those calls' results (``aside[j]`` for ``checked[j]``:
    outputs and in-place inputs) and, for a block that does not reset its in-place inputs, of those
    inputs before each (``inplace_before[j]``), ``unwritten[i]``: how many output elements the
    call after preparation ``i`` left poisoned (-1: not recorded), and the ``touch_seed`` of the
    round's preparations (:func:`~kernelforge.execute.timing.calls.touch_inputs`)."""

    timing: Timing | None
    report: CallReport
    wall_s: float
    cpu_s: float | None
    prepared: int
    verified: tuple[int, ...]
    copied_sets: tuple[int | None, ...]
    aside: tuple[dict[str, torch.Tensor], ...]
    inplace_before: tuple[dict[str, torch.Tensor], ...]
    unwritten: tuple[int, ...] = ()
    checked: tuple[int, ...] = ()
    touch_seed: int = 0


@dataclass(frozen=True)
class TimingPlan:
    """The timing method of each shape of one block at one dtype (EVALUATION.md, one timing method
    per shape).

    The device decides a shape's method once, from the round of the shape's baseline (on a GPU:
    :func:`kernelforge.devices.cuda.choose_method` of its probe); the search collects what the
    baseline's results say (:meth:`of`) and hands the plan to ``Executor.evaluate``, and every
    candidate's round on that shape carries the method to the device
    (:class:`~kernelforge.execute.timing.calls.TimingJob`), which times with it or not at all. A
    round whose timing comes back with another method is the candidate's failure
    (:func:`time_round`), so two timings of one shape taken by different methods never meet.
    A shape the plan does not name (the baseline's own round) is timed with what the device
    chooses.
    """

    block: str
    dtype: torch.dtype
    methods: tuple[tuple[str, str], ...] = ()

    @classmethod
    def of(cls, block: str, dtype: torch.dtype, methods: Iterable[tuple[str, str | None]]) -> "TimingPlan":
        """The plan from the baseline's (shape name, ``Timing.method``) pairs; untimed shapes
        (method None) are left out."""
        return cls(block, dtype, tuple(sorted((shape, method) for shape, method in methods if method)))

    def method_for(self, block: str, shape: str, dtype: torch.dtype) -> str | None:
        """The method fixed for ``shape`` of ``block`` at ``dtype`` (None: not fixed yet). A plan
        made for another block or dtype is a caller's mistake: ``ValueError``."""
        if block != self.block or dtype != self.dtype:
            raise ValueError(f"the timing plan of {self.block} at {self.dtype} was given for {block} at {dtype}")
        return dict(self.methods).get(shape)


def input_set_count(counts: Counts, device: Device) -> int:
    """How many input sets to rotate through: enough that together they overflow a GPU's L2
    (about 2 x 64 MiB), within :data:`MAX_INPUT_SETS` and the memory budget; one in the
    interpreter (no cache to defeat, and its calls are slow)."""
    working_set = int(counts.bytes)
    l2_guess = 64 * 2**20
    n_sets = max(1, min(MAX_INPUT_SETS, math.ceil(2 * l2_guess / max(working_set, 1))))
    n_sets = max(1, min(n_sets, INPUT_SET_MEMORY_BUDGET // max(working_set, 1)))
    return n_sets if device.rotates_input_sets else 1


#: How many calls of a round get their unwritten outputs counted (more than any device makes).
UNWRITTEN_CAPACITY = 4096
#: The memory one round may spend on copies of its calls' results (outputs and in-place inputs,
#: and those inputs before the call where a block does not reset them), set aside for the
#: trusted side. Within it every call of the round is copied; beyond it, a share drawn at random.
SNAPSHOT_MEMORY_BUDGET = 2 * 2**30
#: On a device that does not prepare every call on one input set (a GPU), the share of a round's
#: calls that run under the checks of a verification call (drawn by :func:`watched_calls`): small
#: enough that their checks' time cannot move a median, large enough that a candidate that
#: behaves differently on half its calls is caught on about ``n/16`` of them (``n`` calls).
WATCHED_SHARE = 1 / 8
#: On a device that does not prepare every call on one input set (a GPU), how many of the copied
#: calls the trusted side verifies against its reference, drawn after the round ran. A candidate
#: that fakes a share ``f`` of its calls escapes all of them with probability about ``(1-f)**8``
#: on each shape (under 0.4% where it fakes half of them, which it must to move a median).
VERIFIED_DRAWS = 8


def _draw(rng: random.Random | None) -> random.Random:
    """``rng`` (a test's), else the system's randomness, which nothing in the candidate's process
    can know: every draw of a round (copies, watched calls, verified copies, the touch seed)."""
    return rng or random.SystemRandom()


def copied_calls(device: Device, n_sets: int, call_bytes: int, rng: random.Random | None = None) -> tuple[int, ...]:
    """The preparations of a round whose calls are copied aside (outside the timed region: see
    :mod:`~kernelforge.execute.timing.calls`). Every preparation the device may make
    (:meth:`~kernelforge.devices.base.Device.round_preparations`: warm-up, timed loops, probes
    alike) when copies of all of them fit :data:`SNAPSHOT_MEMORY_BUDGET` (``call_bytes`` a copy);
    otherwise as many as fit, drawn with ``rng`` (default: the system's randomness, which nothing
    in the candidate's process can know) over the whole round, so no phase is spared. Which of the
    copies is verified is drawn only after the round (:func:`drawn_checks`)."""
    total = max(1, int(device.round_preparations(n_sets)))
    fit = SNAPSHOT_MEMORY_BUDGET // max(int(call_bytes), 1)
    if total <= fit:
        return tuple(range(total))
    return tuple(sorted(_draw(rng).sample(range(total), max(1, int(fit)))))


def watched_calls(device: Device, rng: random.Random | None = None) -> tuple[int, ...]:
    """The preparations of a round whose calls run under the checks of a verification call
    (:mod:`~kernelforge.execute.timing.calls`): every one where the device prepares every call
    (the interpreter: its rounds are a few calls), else each with probability
    :data:`WATCHED_SHARE`, drawn with ``rng`` (default: the system's randomness, which nothing in
    the candidate's process can know)."""
    total = max(1, int(device.round_preparations(1)))
    if device.prepares_every_call:
        return tuple(range(total))
    draw = _draw(rng)
    return tuple(i for i in range(total) if draw.random() < WATCHED_SHARE)


def drawn_checks(device: Device, copied: tuple[int, ...], copied_sets: tuple[int | None, ...],
                 rng: random.Random | None = None) -> tuple[int, ...]:
    """The positions (in ``copied``) of the copies the trusted side verifies, drawn after the round
    ran, among the copies that were made (``copied_sets[k]`` not None: a device's back-to-back
    preparations before a graph capture leave some without a call). In the interpreter, every
    copy (it prepares before every call on one set, and its rounds are a few calls); on a GPU
    :data:`VERIFIED_DRAWS` of them, drawn with ``rng`` (default: the system's randomness). Since
    the draw comes after the calls, no count of calls tells a candidate which of them will be
    looked at: warm-up, timed loops and probes are alike."""
    made = [k for k, which in enumerate(copied_sets) if which is not None]
    if device.prepares_every_call or len(made) <= VERIFIED_DRAWS:
        return tuple(made)
    return tuple(sorted(_draw(rng).sample(made, VERIFIED_DRAWS)))


def make_timing_sets(block: Block, shape: Shape, dtype: torch.dtype, device: Device, runner: Runner) -> list[TimingSet]:
    """Fresh input sets of a round (seeds 1000, 1001, ...), each placed in shared memory with its
    outputs; the trusted side keeps the generated tensors as its pristine copies."""
    made = []
    count = input_set_count(block.counts(shape, dtype), device)
    for i in range(count):
        inputs = block.make_inputs(shape, dtype, device.torch_device, seed=1000 + i)
        shared = {name: runner.share(value) if isinstance(value, torch.Tensor) else value
                  for name, value in inputs.items()}
        outputs = {name: runner.share(tensor, values=False)
                   for name, tensor in allocate(block, shape, dtype, device.torch_device).items()}
        made.append(TimingSet(inputs, shared, outputs))
    return made


def time_round(block: Block, entry: Entry, shape: Shape, dtype: torch.dtype, device: Device, sets: list[TimingSet],
               *, rng: random.Random | None = None, method: str | None = None) -> TimedRound:
    """One timing round of ``entry`` on ``sets``, with the trusted side's wall clock around it.

    The calls copied aside are :func:`copied_calls` (every call of the round within the memory
    budget). Their outputs and in-place inputs are copied into shared buffers poisoned here;
    after the round the copies to verify are drawn (:func:`drawn_checks`, with ``rng`` where not
    every copy is verified) and only those are read back privately, with the count of what every
    call left unwritten. ``method`` is the shape's fixed timing method (:class:`TimingPlan`); a
    timing that comes back with another one is no timing: the round's report says why
    (``rejected``).
    """
    runner = entry.runner
    spec = Outputs.of(block, sets[0].shared, sets[0].outputs)
    like = spec.watched(sets[0].shared, sets[0].outputs)
    kept = [] if block.inplace_reset else list(spec.inplace)
    call_bytes = sum(t.numel() * t.element_size() for t in like.values()) + sum(
        sets[0].shared[name].numel() * sets[0].shared[name].element_size() for name in kept)
    verified = copied_calls(device, len(sets), call_bytes, rng)
    aside = tuple({name: runner.share(tensor, values=False) for name, tensor in like.items()} for _ in verified)
    for buffers in aside:
        for tensor in buffers.values():
            poison(tensor)
    before = tuple({name: runner.share(sets[0].shared[name], values=False) for name in kept} if kept else {}
                   for _ in verified)
    unwritten = runner.share(torch.full((UNWRITTEN_CAPACITY,), -1, dtype=torch.int64, device=device.torch_device))
    seed = _draw(rng).getrandbits(62)
    job = TimingJob(tuple({**s.shared, **s.outputs} for s in sets), spec.names, spec.inplace, block.inplace_reset,
                    verified, aside, before, int(block.counts(shape, dtype).bytes), method, unwritten,
                    watched_calls(device, rng), seed)
    # No garbage collection of this process inside the round: a full collection of a large process
    # (100+ ms) would count as the calling thread's CPU time of an in-process round.
    collecting = gc.isenabled()
    gc.disable()
    try:
        cpu_start = runner.cpu_seconds()
        start = time.perf_counter()
        answer = runner.time(entry.handle, job)
        wall = time.perf_counter() - start
        cpu_end = runner.cpu_seconds()
    finally:
        if collecting:
            gc.enable()
    cpu = None if cpu_start is None or cpu_end is None else cpu_end - cpu_start
    timing, report = answer.timing, answer.report
    if timing is not None and method is not None and timing.method != method:
        timing, report = None, CallReport(Status.REJECTED, f"timed with {timing.method!r}, but this shape's method is "
                                                           f"{method!r} (its baseline's): not comparable")
    checked = drawn_checks(device, verified, answer.copied_sets, rng)
    return TimedRound(timing, report, wall, cpu, answer.prepared, verified, answer.copied_sets,
                      tuple({name: runner.snapshot(t) for name, t in aside[k].items()} for k in checked),
                      tuple({name: runner.snapshot(t) for name, t in before[k].items()} for k in checked),
                      tuple(int(v) for v in runner.snapshot(unwritten)[:max(answer.prepared, 0)].tolist()), checked,
                      seed)


def time_candidate(block: Block, run: RunFn | Entry, shape: Shape, dtype: torch.dtype, device: Device, counts: Counts,
                   *, sets: list | None = None) -> Timing:
    """Time ``run`` (a function of this process, or a loaded :class:`~kernelforge.execute.runner.Entry`)
    on ``shape`` and return the device's timing, unchecked (the judge uses :func:`time_round`
    and :mod:`kernelforge.execute.timing.check`). The timing sets (shared inputs, outputs) are
    appended to ``sets`` when a list is given. A candidate that raises raises ``RuntimeError``.

    ``counts`` is kept for callers of the earlier signature (the round reads the block's).
    """
    entry = LocalRunner.entry(run, device.torch_device, device)
    made = make_timing_sets(block, shape, dtype, device, entry.runner)
    if sets is not None:
        sets.extend((s.shared, s.outputs) for s in made)
    done = time_round(block, entry, shape, dtype, device, made)
    if done.timing is None:
        raise RuntimeError(done.report.message)
    return done.timing
