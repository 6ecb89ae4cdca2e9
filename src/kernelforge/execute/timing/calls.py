"""The timed calls of one timing round, as the process that runs the candidate makes them.

The trusted side (:mod:`kernelforge.execute.timing.rounds`) prepares the input sets in shared memory and
says which call of the round it will verify (:class:`TimingJob`); the runner (the worker, or this
process in-process) hands the device one call per input set and a preparation to run before every
call, outside the timed region (:meth:`kernelforge.devices.base.Device.time`):

- the block's in-place inputs are restored (when it resets them);
- every floating-point input gets the signs of a random half of its elements flipped, new signs at
  every preparation, drawn from a seed the trusted side drew with the system's randomness
  (:func:`touch_inputs`): identical inputs never come back, so a cache keyed on the input values
  never hits, and consecutive calls differ in half of every input, so a cache that updates only
  what changed since its last call does all the work again (EVALUATION.md #4);
- every output gets fresh poison, exactly as before a verification call, so a candidate that
  skips the work when its output does not arrive poisoned is left with poison; the first call
  after a preparation runs on the set just prepared, whatever index the device's loop gives;
- after every call the trusted side asked to have copied (every call of the round, within a
  memory budget), the outputs and in-place inputs of that call are copied aside, at the next
  preparation (or when timing ends), outside the timed region. After the round the trusted side
  draws which copies to verify (all of them in the interpreter), so no count of calls tells the
  candidate which call is looked at, and compares each with its own reference of the inputs as
  they were at that call: a timed call is a verified call;
- after every call, at the next preparation (or when timing ends), the number of output elements
  that still hold the poison is recorded for that call (``unwritten``): a call that skipped its
  work, on any call of any loop of the device, leaves poison, and the trusted side names it;
- the calls the trusted side drew (``watched``: every call in the interpreter, a share on a GPU)
  and every call the device makes without a preparation of its own (the calls a CUDA graph
  captures) run under the checks of a verification call
  (:func:`~kernelforge.execute.judge.guard.run_call`: a Triton launch, no torch compute on the
  host, the outputs still the same tensors, no thread left), except while the device times on the
  host's clock (:attr:`~kernelforge.devices.base.Device.host_clock`), where those checks' own time
  would be measured. A call that fails them ends the round with its report: a candidate that
  behaves only while verified is caught on the timed calls it cannot tell from the others.

The preparation is deterministic in the call index and the seed, so the trusted side replays it on
its pristine copies (:func:`touch_inputs` is the one function both sides run).
"""

from __future__ import annotations

import zlib
from dataclasses import dataclass
from typing import Any, Mapping

import torch

from kernelforge.devices.base import Device
from kernelforge.execute.judge.fingerprint import poison, poisoned_count
from kernelforge.execute.judge.guard import CallReport, RunFn, raised, run_call
from kernelforge.result import Status, Timing

#: The signed integer type of each floating-point element size: its top bit is the float's sign
#: (IEEE formats, bf16 and the fp8 formats alike), so flipping it negates any value exactly.
_SAME_SIZE_INT = {1: torch.int8, 2: torch.int16, 4: torch.int32, 8: torch.int64}


#: Elements flipped per random draw: bounds the temporary memory of a touch (a MoE block's
#: weights are gigabytes) to one draw of this many integers.
_FLIP_CHUNK = 1 << 26


def _generator(device: torch.device, seed: int, call: int, name: str) -> torch.Generator:
    """The random stream of input ``name``'s sign flips at preparation ``call`` (the same stream on
    both sides for the same seed and the same kind of device)."""
    generator = torch.Generator(device=device)
    generator.manual_seed((seed * 1_000_003 + call * 8_191 + zlib.crc32(name.encode())) % 2**63)
    return generator


def touch_inputs(inputs: Mapping[str, Any], call: int, seed: int, *, undo: int | None = None) -> None:
    """Flip the signs of a random half of the elements of each floating-point input tensor, in
    place, for preparation ``call`` of a timing round with ``seed`` (the module docstring), first
    undoing preparation ``undo``'s flips (the tensors hold that preparation's values). A tensor's
    values after preparation ``k`` are its generated values with the flips of ``k`` alone."""
    for name, tensor in inputs.items():
        if not (isinstance(tensor, torch.Tensor) and tensor.is_floating_point() and tensor.numel()
                and tensor.is_contiguous() and tensor.element_size() in _SAME_SIZE_INT):
            continue
        kind, sign = _SAME_SIZE_INT[tensor.element_size()], 8 * tensor.element_size() - 1
        bits = tensor.view(-1).view(kind)
        streams = [_generator(tensor.device, seed, k, name) for k in (call, undo) if k is not None]
        for start in range(0, bits.numel(), _FLIP_CHUNK):
            part = bits[start:start + _FLIP_CHUNK]
            for stream in streams:
                flips = torch.randint(0, 2, part.shape, dtype=kind, device=tensor.device, generator=stream)
                part.bitwise_xor_(flips.bitwise_left_shift_(sign))


class _Refused(Exception):
    """A watched call of the round failed its checks: the round ends with ``report``."""

    def __init__(self, report: CallReport):
        super().__init__(report.message)
        self.report = report


@dataclass(frozen=True)
class TimingJob:
    """One timing round, as the trusted side asks for it.

    ``sets`` are the arguments of each input set's call (shared tensors and scalars by name);
    ``outputs`` name the outputs among them (poisoned before every call) and ``inplace`` the
    in-place inputs (restored before every call when ``reset``). After the call that follows
    preparation ``verified[k]``, the tensors named in ``aside[k]`` (outputs and in-place inputs)
    are copied into those shared buffers; for a block that does not reset its in-place inputs,
    their values just before that call are copied into ``inplace_before[k]``. ``unwritten`` (a
    shared int64 vector, -1 where nothing was recorded) gets, at index ``i``, how many output
    elements the call after preparation ``i`` left poisoned. ``method`` is the timing method fixed
    for the shape (its baseline's; None: the device chooses, and what it chose is the shape's
    method from then on: :class:`kernelforge.execute.timing.rounds.TimingPlan`). The call after
    each preparation in ``watched`` runs under the checks of a verification call, and
    ``touch_seed`` is the seed of :func:`touch_inputs` (both drawn by the trusted side).
    """

    sets: tuple[dict[str, Any], ...]
    outputs: tuple[str, ...]
    inplace: tuple[str, ...]
    reset: bool
    verified: tuple[int, ...]
    aside: tuple[dict[str, torch.Tensor], ...]
    inplace_before: tuple[dict[str, torch.Tensor], ...] = ()
    working_set_bytes: int = 0
    method: str | None = None
    unwritten: torch.Tensor | None = None
    watched: tuple[int, ...] = ()
    touch_seed: int = 0


@dataclass(frozen=True)
class TimingAnswer:
    """What the runner says about a round: the device's ``timing`` (None when the candidate
    raised: ``report``), how many calls it ``prepared``, and for each verified preparation the
    input set whose call after it was copied aside (None: that call was never made)."""

    timing: Timing | None
    report: CallReport
    prepared: int
    copied_sets: tuple[int | None, ...]


class _Round:
    """The preparation and the calls of one round (see the module docstring)."""

    def __init__(self, run: RunFn, job: TimingJob, device: Device):
        self.run, self.job, self.device = run, job, device
        self.watched = frozenset(job.watched)
        self.written = tuple(job.outputs) + tuple(name for name in job.inplace if name not in job.outputs)
        self.touched: list[int | None] = [None] * len(job.sets)  # each set's latest preparation
        self.saved = [{name: args[name].clone() for name in job.inplace} if job.reset else {} for args in job.sets]
        self.inputs = [{k: v for k, v in args.items() if k not in job.outputs} for args in job.sets]
        self.slots = {index: k for k, index in enumerate(job.verified)}
        self.prepared = 0
        self.index = -1  # the latest preparation
        self.armed: int | None = None  # the slot of aside buffers the next call fills
        self.pending: tuple[int, int] | None = None  # (slot, input set) made, not yet copied
        self.copied: list[int | None] = [None] * len(job.verified)
        self.last: tuple[int, int] | None = None  # (preparation, input set) of a call not yet counted
        self.fresh: int | None = None  # the input set prepared since the last call

    def settle(self) -> None:
        """Copy the verified call aside and count what the latest call left unwritten (outside
        the timed region: before the next preparation, and when the round ends)."""
        if self.pending is not None:
            slot, which = self.pending
            args = self.job.sets[which]
            for name, buffer in self.job.aside[slot].items():
                buffer.copy_(args[name])
            self.copied[slot], self.pending = which, None
        unwritten = self.job.unwritten
        if self.last is not None and unwritten is not None:
            index, which = self.last
            if 0 <= index < unwritten.numel():
                args = self.job.sets[which]
                unwritten[index:index + 1].copy_(sum(poisoned_count(args[name]) for name in self.job.outputs)
                                                  .reshape(1))
        self.last = None

    def before(self, index: int) -> None:
        self.settle()
        which = index % len(self.job.sets)
        args = self.job.sets[which]
        for name, copy in self.saved[which].items():
            args[name].copy_(copy)
        restored = {name: args[name] for name in self.saved[which]}
        kept = {name: value for name, value in self.inputs[which].items() if name not in restored}
        touch_inputs(restored, index, self.job.touch_seed)
        touch_inputs(kept, index, self.job.touch_seed, undo=self.touched[which])
        self.touched[which] = index
        for name in self.job.outputs:
            poison(args[name])
        self.armed = self.slots.get(index)
        if self.armed is not None and self.armed < len(self.job.inplace_before):
            for name, buffer in self.job.inplace_before[self.armed].items():
                buffer.copy_(args[name])
        self.index, self.fresh = index, which
        self.prepared = max(self.prepared, index + 1)

    def call(self, which: int) -> None:
        prepared = self.fresh is not None
        if self.fresh is not None:
            # The first call after a preparation runs on the set just prepared, whichever set the
            # device's loop index names (CudaDevice's later loops restart their index while the
            # preparations go on counting): a call never finds a set it did not poison and touch.
            which, self.fresh = self.fresh, None
        elif self.pending is not None and self.pending[1] == which and self.job.inplace:
            # A call with no preparation (a graph capture, the energy round) on the set whose copy
            # is pending updates its in-place inputs once more: the copy, made later, would not be
            # the prepared call's results. It is not made (the trusted side draws among those made).
            self.pending = None
        watch = not self.device.host_clock and (self.index in self.watched if prepared else True)
        if watch:
            report = run_call(self.run, self.job.sets[which], self.written, torch.device(self.device.torch_device))
            if not report.ok:
                what = "while timing" if report.status is Status.RUNTIME_ERROR else f"timed call {self.index + 1}"
                raise _Refused(CallReport(report.status, f"{what}: {report.message}", report.name, report.traceback))
        else:
            self.run(**self.job.sets[which])
        if self.armed is not None:
            self.pending, self.armed = (self.armed, which), None
        if self.index >= 0:
            self.last = (self.index, which)


def run_timed(run: RunFn, device: Device, job: TimingJob) -> TimingAnswer:
    """Time ``run`` on the sets of ``job`` with ``device`` (see the module docstring). The
    candidate's exception is its ``runtime_error`` (in the answer's report); nothing raises."""
    round_ = _Round(run, job, device)
    calls = [lambda which=which: round_.call(which) for which in range(len(job.sets))]
    try:
        # ``method`` is passed only when fixed, so a device written before it existed still times
        # a shape's first round.
        fixed = {} if job.method is None else {"method": job.method}
        timing = device.time(calls, working_set_bytes=job.working_set_bytes, before=round_.before, **fixed)
        round_.settle()
    except _Refused as refused:
        return TimingAnswer(None, refused.report, round_.prepared, (None,) * len(job.verified))
    except Exception as exc:  # a crash while timing is the candidate's runtime error
        return TimingAnswer(None, CallReport.of(raised(exc, "while timing: ")), round_.prepared,
                            (None,) * len(job.verified))
    return TimingAnswer(timing, CallReport(), round_.prepared, tuple(round_.copied))
