"""The trusted side's checks of a timing round (:class:`~kernelforge.execute.timing.TimedRound`).

- **The verified timed call.** The outputs of one call of the round, drawn at random, were copied
  aside; they are compared with the reference of the inputs as they were at that call, which the
  trusted side rebuilds by replaying the round's deterministic preparations
  (:func:`~kernelforge.execute.timed_calls.touch_inputs`, the in-place resets) on its pristine
  copies (:func:`replayed_inputs`). A candidate that skips the work on some calls, or when its
  output does not look poisoned, or that serves a cached result, fails here.
- **Inputs unchanged.** After the round every input that is not in place must hold exactly the
  replayed values.
- **The clocks** (:func:`wall_problem`): the reported time of the round's timed calls must not
  exceed the trusted side's wall clock for the whole round (plus a small slack), and, in the
  interpreter, where a call is CPU work of the calling thread, must not be far below the CPU time
  that thread spent in the round (:mod:`kernelforge.execute.cputime`): a worker whose timer was
  patched reports figures that do not fit the time that passed outside it. CPU time, unlike the
  wall clock, does not grow on a loaded machine; where it cannot be read the wall clock stands in.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import torch

from kernelforge.block import Block, Shape
from kernelforge.devices.base import Device
from kernelforge.execute.cputime import RESOLUTION_S
from kernelforge.execute.contract import Outputs
from kernelforge.execute.fingerprint import bits_equal
from kernelforge.execute.timed_calls import touch_inputs
from kernelforge.execute.timing import TimedRound, TimingSet
from kernelforge.execute.verify import expected_outputs, judge
from kernelforge.result import Status, Timing, Verification

#: Flag of a round whose reported time does not fit the trusted side's wall clock: ``rejected``.
TIMING_MISMATCH_FLAG = "[timing-mismatch]"
#: The reported timed total may exceed the wall clock of the round by this fraction plus
#: :data:`WALL_SLACK_S` (the median times the count over-estimates a skewed total a little).
WALL_OVER_FRACTION = 0.05
WALL_SLACK_S = 1e-3
#: Interpreter only: the calling thread may spend at most this many times the reported time of
#: the round's calls plus :data:`INTERPRETER_SLACK_S` (preparations, the request and its answer).
INTERPRETER_FAR = 4.0
INTERPRETER_SLACK_S = 5e-3


def replayed_inputs(tset: TimingSet, which: int, n_sets: int, upto: int, inplace: tuple[str, ...]) -> dict[str, Any]:
    """The inputs of set ``which`` (of ``n_sets``) as the runner left them after preparations
    ``0..upto``: one sign changed per preparation of that set, in-place inputs reset before the
    last one (the round's own values for them otherwise stay unknown here: see the caller)."""
    state = {name: value.clone() if isinstance(value, torch.Tensor) else value for name, value in tset.inputs.items()}
    touches = [i for i in range(upto + 1) if i % n_sets == which]
    plain = {name: value for name, value in state.items() if name not in inplace}
    for i in touches:
        touch_inputs(plain, i)
    if touches:
        touch_inputs({name: state[name] for name in inplace}, touches[-1])
    return state


def wall_problem(timing: Timing, wall_s: float, device: Device, cpu_s: float | None = None) -> str:
    """Why ``timing`` does not fit a round that took ``wall_s`` on the trusted side's clock and
    ``cpu_s`` of the calling thread's CPU time (None: unknown; the wall clock stands in). Empty:
    it fits. See the module docstring; interpreter calls are counted as warm-up plus repeats."""
    reported = timing.median_s * timing.samples
    floor = 0.8 * timing.p20_s * timing.samples  # at least 80% of the samples are above p20
    if floor > wall_s * (1 + WALL_OVER_FRACTION) + WALL_SLACK_S:
        return (f"the worker reported {reported * 1e3:.3g} ms of timed calls, but the whole round took "
                f"{wall_s * 1e3:.3g} ms on the trusted side's clock")
    if timing.method == "interpreter-wall":
        calls = int(getattr(device, "warmup", 0) or 0) + int(getattr(device, "repeats", 0) or 0) or timing.samples
        busy, clock = (wall_s, "wall time") if cpu_s is None else (cpu_s, "CPU time of its calling thread")
        slack = INTERPRETER_SLACK_S + (0.0 if cpu_s is None else RESOLUTION_S)
        if timing.median_s * calls * INTERPRETER_FAR + slack < busy:
            return (f"the worker reported {timing.median_s * 1e3:.3g} ms per call ({calls} calls), but the round "
                    f"took {busy * 1e3:.3g} ms of {clock} on the trusted side's clock (interpreter calls are "
                    "CPU work)")
    return ""


def with_figures(timing: Timing, done: TimedRound) -> Timing:
    """``timing`` with the trusted side's figures of its round in ``extra``: its wall clock, the
    reported total of the timed calls and which call was verified (1-based)."""
    extra = {**timing.extra, "round_wall_s": done.wall_s, "round_cpu_s": done.cpu_s, "reported_total_s": timing.median_s * timing.samples,
             "verified_call": done.chosen + 1}
    return dataclasses.replace(timing, extra=extra)


def check_round(block: Block, shape: Shape, dtype: torch.dtype, device: Device, sets: list[TimingSet],
                done: TimedRound) -> Verification | None:
    """The trusted checks of one round (see the module docstring): None when they pass, else the
    candidate's verdict. The round's runner report is looked at first."""
    name = shape.name
    if not done.report.ok or done.timing is None:
        prefix = f"{done.report.name}: " if done.report.name else ""
        return Verification(done.report.status or Status.RUNTIME_ERROR, message=f"{name}: {prefix}{done.report.message}"[:2000],
                            traceback=done.report.traceback)
    spec = Outputs.of(block, sets[0].shared, sets[0].outputs)
    if done.copied_set is None or not 0 <= done.copied_set < len(sets) or done.prepared < done.chosen + 1:
        return Verification(Status.REJECTED, message=f"{name}: the timed call chosen for verification (call "
                                                     f"{done.chosen + 1}) was never made")
    for which, tset in enumerate(sets):
        state = replayed_inputs(tset, which, len(sets), done.prepared - 1, spec.inplace)
        for input_name, tensor in spec.untouchable(tset.shared).items():
            if not bits_equal(tensor, state[input_name]):
                return Verification(Status.REJECTED, message=f"{name}: the candidate modified its input "
                                                             f"{input_name!r} while timed")
    state = replayed_inputs(sets[done.copied_set], done.copied_set, len(sets), done.chosen, spec.inplace)
    state.update({k: v.clone() for k, v in done.inplace_before.items()})
    where = f"{block.id} {name}"
    ref = expected_outputs(block, spec, state, {k: v for k, v in state.items() if isinstance(v, torch.Tensor)},
                           done.aside, where)
    rel, excess, problem = judge(block, spec, done.aside, ref, dtype, torch.device(device.torch_device))
    if problem:
        return Verification(Status.WRONG, rel, excess, 1, f"{name} (timed call {done.chosen + 1}, verified after "
                                                          f"timing): {problem}"[:2000])
    return None


def timing_mismatch(shape: Shape, timing: Timing, done: TimedRound, device: Device, rel: float | None,
                    excess: float | None, checks: int) -> Verification | None:
    """The ``rejected`` verdict of a round whose figures do not fit the trusted clocks, or None."""
    problem = wall_problem(timing, done.wall_s, device, done.cpu_s)
    if not problem:
        return None
    return Verification(Status.REJECTED, rel, excess, checks, f"{TIMING_MISMATCH_FLAG} {shape.name}: {problem}"[:2000])
