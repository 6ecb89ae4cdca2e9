"""The trusted side's checks of a timing round (:class:`~kernelforge.execute.timing.rounds.TimedRound`).

- **The verified timed calls.** The outputs of the round's calls were copied aside (every call,
  within a memory budget: :func:`~kernelforge.execute.timing.rounds.copied_calls`), and the copies to
  verify were drawn after the round ran (every one in the interpreter; a random draw of them on a
  GPU: :func:`~kernelforge.execute.timing.rounds.drawn_checks`); each is compared with
  the reference of the inputs as they were at that call, which the trusted side rebuilds by
  replaying the round's deterministic preparations
  (:func:`~kernelforge.execute.timing.calls.touch_inputs`, the in-place resets) on its pristine
  copies (:func:`replayed_inputs`). A candidate that skips the work on some calls, or when its
  output does not look poisoned, or that serves a cached result, fails here, with the call named.
- **Every call wrote its outputs.** Each call of the round had the output elements it left
  poisoned counted; any call that left some (skipped its work: counting calls, or sensing the
  timed loops) is ``wrong``, with the call named.
- **The last call** (on a GPU, when the round has one input set; in the interpreter it is verified
  already): the outputs the set holds after the round are the results of its last call (a timed
  call, a CUDA-graph replay), compared with the reference of its last inputs.
- **Inputs unchanged.** After the round every input that is not in place must hold exactly the
  replayed values.
- **The clocks** (:func:`wall_problem`): the reported time of the round's timed calls must not
  exceed the trusted side's wall clock for the whole round (plus a small slack), and, in the
  interpreter, where a call is CPU work of the calling thread, must not be far below the CPU time
  that thread spent in the round (:mod:`kernelforge.execute.timing.cputime`): a worker whose timer was
  patched reports figures that do not fit the time that passed outside it. CPU time, unlike the
  wall clock, does not grow on a loaded machine; where it cannot be read the wall clock stands in.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import torch

from kernelforge.block import Block, Shape
from kernelforge.devices.base import Device
from kernelforge.execute.timing.cputime import RESOLUTION_S
from kernelforge.execute.judge.contract import Outputs
from kernelforge.execute.judge.fingerprint import bits_equal
from kernelforge.execute.timing.calls import touch_inputs
from kernelforge.execute.timing.rounds import TimedRound, TimingSet
from kernelforge.execute.judge.verify import expected_outputs, judge
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


def replayed_inputs(tset: TimingSet, which: int, n_sets: int, upto: int, seed: int) -> dict[str, Any]:
    """The inputs of set ``which`` (of ``n_sets``) as the runner left them after preparations
    ``0..upto`` of a round with ``seed``: the generated values with the sign flips of the set's last
    preparation (in-place inputs as well, for a block that resets them; the round's own values for
    those of one that does not stay unknown here: see the caller)."""
    state = {name: value.clone() if isinstance(value, torch.Tensor) else value for name, value in tset.inputs.items()}
    touches = [i for i in range(upto + 1) if i % n_sets == which]
    if touches:
        touch_inputs(state, touches[-1], seed)
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
             "verified_calls": [done.verified[k] + 1 for k in done.checked],
             "copied_calls": sum(which is not None for which in done.copied_sets)}
    return dataclasses.replace(timing, extra=extra)


def check_round(block: Block, shape: Shape, dtype: torch.dtype, device: Device, sets: list[TimingSet],
                done: TimedRound) -> Verification | None:
    """The trusted checks of one round (see the module docstring): None when they pass, else the
    candidate's verdict. The round's runner report is looked at first."""
    name = shape.name
    if not done.report.ok or done.timing is None:
        prefix = f"{done.report.name}: " if done.report.name else ""
        return Verification(done.report.status or Status.RUNTIME_ERROR, message=f"{name}: {prefix}{done.report.message}",
                            traceback=done.report.traceback)
    spec = Outputs.of(block, sets[0].shared, sets[0].outputs)
    if not done.checked:
        return Verification(Status.REJECTED, message=f"{name}: no call of the timing round was copied aside for "
                                                     "verification")
    for k in done.checked:
        index, copied = done.verified[k], done.copied_sets[k]
        if copied is None or not 0 <= copied < len(sets) or done.prepared < index + 1:
            return Verification(Status.REJECTED, message=f"{name}: the timed call chosen for verification (call "
                                                         f"{index + 1}) was never made")
    for which, tset in enumerate(sets):
        state = replayed_inputs(tset, which, len(sets), done.prepared - 1, done.touch_seed)
        for input_name, tensor in spec.untouchable(tset.shared).items():
            if not bits_equal(tensor, state[input_name]):
                return Verification(Status.REJECTED, message=f"{name}: the candidate modified its input "
                                                             f"{input_name!r} while timed")
    left = next(((i, n) for i, n in enumerate(done.unwritten) if n > 0), None)
    if left is not None:
        return Verification(Status.WRONG, message=f"{name} (timed call {left[0] + 1} of {done.prepared}): "
                                                  f"{left[1]} output element(s) left unwritten while timed")
    for k, aside, before in zip(done.checked, done.aside, done.inplace_before or ({},) * len(done.checked)):
        index, copied = done.verified[k], done.copied_sets[k]
        assert copied is not None
        state = replayed_inputs(sets[copied], copied, len(sets), index, done.touch_seed)
        state.update({k: v.clone() for k, v in before.items()})
        problem = _judged(block, spec, state, aside, dtype, device,
                          f"{name} (timed call {index + 1}, verified after timing)")
        if problem is not None:
            return problem
    if not device.prepares_every_call and len(sets) == 1 and done.prepared and (block.inplace_reset or not spec.inplace):
        # One input set: whatever loop ran last (timed events, graph replays, the energy round)
        # called it on the inputs of the last preparation, so its outputs are that call's results.
        # (With several sets a loop may call a set another preparation was for: not judged here.)
        tset = sets[0]
        state = replayed_inputs(tset, 0, 1, done.prepared - 1, done.touch_seed)
        got = {k: v.detach().clone() for k, v in spec.watched(tset.shared, tset.outputs).items()}
        return _judged(block, spec, state, got, dtype, device, f"{name} (the last timed call, verified after timing)")
    return None


def _judged(block: Block, spec: Outputs, state: dict[str, Any], got: dict[str, torch.Tensor], dtype: torch.dtype,
            device: Device, label: str) -> Verification | None:
    """The ``wrong`` verdict of results ``got`` against the reference of inputs ``state``, or None."""
    ref = expected_outputs(block, spec, state, {k: v for k, v in state.items() if isinstance(v, torch.Tensor)},
                           got, f"{block.id} {label.split(' ')[0]}")
    rel, excess, problem = judge(block, spec, got, ref, dtype, torch.device(device.torch_device))
    if problem:
        return Verification(Status.WRONG, rel, excess, 1, f"{label}: {problem}")
    return None


def timing_mismatch(shape: Shape, timing: Timing, done: TimedRound, device: Device, rel: float | None,
                    excess: float | None, checks: int) -> Verification | None:
    """The ``rejected`` verdict of a round whose figures do not fit the trusted clocks, or None."""
    problem = wall_problem(timing, done.wall_s, device, done.cpu_s)
    if not problem:
        return None
    return Verification(Status.REJECTED, rel, excess, checks, f"{TIMING_MISMATCH_FLAG} {shape.name}: {problem}")
