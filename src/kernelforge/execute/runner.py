"""Runners: what calls a candidate for the trusted judge, and nothing else.

The judge (:mod:`kernelforge.execute.judge.verify`, :mod:`kernelforge.execute.timing.rounds`,
:mod:`kernelforge.execute.evaluate`) draws the inputs, keeps pristine private copies, poisons the
outputs, computes the reference, reads what the candidate wrote and decides. It talks to the code
that runs the candidate only through a :class:`Runner`:

- :class:`LocalRunner` runs the candidate in this process (``--in-process``, ``--trusted``
  debugging, tests of the judge; nothing is isolated there);
- :class:`kernelforge.execute.worker.runner.WorkerRunner` runs it in the worker process, on
  tensors in memory shared with this one (:mod:`kernelforge.execute.worker.arena` on the CPU,
  :mod:`kernelforge.execute.worker.cuda_share` on a GPU).

A runner's answers (:class:`~kernelforge.execute.judge.guard.CallReport`, the timing) can only make a
verdict worse: the judge verifies every result itself.
"""

from __future__ import annotations

import threading
import traceback
from dataclasses import dataclass
from typing import Any, Mapping, Protocol, Sequence

import torch

from kernelforge.candidate import load_module
from kernelforge.devices.base import Device
from kernelforge.execute.timing.cputime import this_thread_cpu_seconds
from kernelforge.execute.judge.fingerprint import poison_free_memory
from kernelforge.execute.judge.guard import CallReport, RunFn, run_call, settle
from kernelforge.execute.judge.harness import harness_changes, harness_snapshot, reset_candidate_state
from kernelforge.execute.timing.calls import TimingAnswer, TimingJob, run_timed
from kernelforge.result import Status, Verification
from kernelforge.textsafe import tail


def load_candidate(source: str, name_hint: str = "candidate") -> tuple[Any, Verification | None]:
    """Import a rendered source; a failure to import is the candidate's compile error (with the
    full traceback in :attr:`~kernelforge.result.Verification.traceback`)."""
    try:
        module = load_module(source, name_hint)
    except Exception as exc:  # candidate code is untrusted input: any failure is data
        return None, Verification(Status.COMPILE_ERROR, message=f"import failed: {type(exc).__name__}: {exc}",
                                  traceback=tail(traceback.format_exc()))
    if not callable(getattr(module, "run", None)):
        return None, Verification(Status.COMPILE_ERROR, message="the module defines no run(...) entry point")
    return module, None


class Runner(Protocol):
    """Runs candidates for the trusted judge. Contract:

    - :meth:`load` imports a source and returns a handle for its ``run`` (or the compile error);
    - :meth:`share` returns a new tensor the candidate can be called with (the same shape,
      strides and dtype; the values of ``tensor`` when ``values``), in memory the judge can read
      and write; :meth:`snapshot` is a private copy of one, which the candidate cannot reach;
    - :meth:`call` calls the candidate once with shared tensors and scalars, and reports what the
      running side saw (``watched`` are the tensors it writes); :meth:`sync` then waits for all
      of the device's work;
    - :meth:`time` runs one timing round (:mod:`kernelforge.execute.timing.calls`);
    - :meth:`tampering` names harness functions the candidates loaded since :meth:`release`
      replaced (where they run); :meth:`release` ends a candidate's session and says why the
      runner must not serve another one (or None);
    - :meth:`step` names what is being done (a runner may give each step a time limit);
    - :meth:`cpu_seconds` is the CPU time used so far by the thread that calls the candidates,
      as the kernel accounts it (None where it cannot be read):
      :mod:`kernelforge.execute.timing.cputime`.
    """

    torch_device: torch.device

    def step(self, label: str, limit: float | None = None) -> None: ...

    def load(self, source: str, name_hint: str, watch: Sequence[tuple[str, Any, str]] = ()) -> tuple[int | None, Verification | None]: ...

    def share(self, tensor: torch.Tensor, *, values: bool = True) -> torch.Tensor: ...

    def snapshot(self, tensor: torch.Tensor) -> torch.Tensor: ...

    def call(self, handle: int, args: Mapping[str, Any], watched: Sequence[str]) -> CallReport: ...

    def sync(self) -> CallReport: ...

    def time(self, handle: int, job: TimingJob) -> TimingAnswer: ...

    def tampering(self) -> list[str]: ...

    def release(self) -> str | None: ...

    def cpu_seconds(self) -> float | None: ...


@dataclass(frozen=True)
class Entry:
    """A loaded candidate's ``run``, as the judge holds it: a runner and a handle."""

    runner: Runner
    handle: int


class LocalRunner:
    """A :class:`Runner` that calls candidates in this process (see the module docstring): shared
    tensors are ordinary tensors of the device, and the checks of
    :func:`~kernelforge.execute.judge.guard.run_call` run here."""

    def __init__(self, device: Device | None = None, torch_device: str | torch.device | None = None):
        self.device = device
        self.torch_device = torch.device(torch_device if torch_device is not None else
                                         (device.torch_device if device is not None else "cpu"))
        self._runs: list[RunFn] = []
        self._snapshot: list | None = None

    @classmethod
    def entry(cls, run: RunFn | Entry, device: str | torch.device, timing_device: Device | None = None) -> Entry:
        """``run`` as an :class:`Entry`: itself when it is one, else a plain function called here."""
        if isinstance(run, Entry):
            return run
        runner = cls(timing_device, device)
        return Entry(runner, runner.adopt(run))

    def adopt(self, run: RunFn) -> int:
        """A handle for a function of this process."""
        self._runs.append(run)
        return len(self._runs) - 1

    def step(self, label: str, limit: float | None = None) -> None:
        """Nothing: a step in this process has no time limit."""

    def load(self, source: str, name_hint: str, watch: Sequence[tuple[str, Any, str]] = ()) -> tuple[int | None, Verification | None]:
        """Import ``source`` here; the harness functions are recorded first (plus ``watch``:
        (label, owner, attribute) entries such as the block's ``reference``)."""
        if self._snapshot is None:
            self._snapshot = harness_snapshot(*watch)
        threads = threading.active_count()
        module, failure = load_candidate(source, name_hint)
        if failure is None and threading.active_count() > threads:
            failure = Verification(Status.REJECTED, message="the candidate started a thread when imported")
        if failure is not None:
            return None, failure
        return self.adopt(module.run), None

    def share(self, tensor: torch.Tensor, *, values: bool = True) -> torch.Tensor:
        """A new tensor of this process like ``tensor`` (its values copied when ``values``)."""
        shared = torch.empty_strided(tuple(tensor.shape), tuple(tensor.stride()), dtype=tensor.dtype,
                                     device=self.torch_device)
        if values:
            shared.copy_(tensor)
        return shared

    @staticmethod
    def snapshot(tensor: torch.Tensor) -> torch.Tensor:
        return tensor.detach().clone(memory_format=torch.contiguous_format)

    def call(self, handle: int, args: Mapping[str, Any], watched: Sequence[str]) -> CallReport:
        poison_free_memory(self.torch_device, [args[n].numel() * args[n].element_size() for n in watched])
        return run_call(self._runs[handle], args, watched, self.torch_device)

    def sync(self) -> CallReport:
        return settle(self.torch_device)

    def time(self, handle: int, job: TimingJob) -> TimingAnswer:
        if self.device is None:
            raise ValueError("this runner has no device to time with")
        return run_timed(self._runs[handle], self.device, job)

    def tampering(self) -> list[str]:
        return harness_changes(self._snapshot) if self._snapshot is not None else []

    def release(self) -> str | None:
        self._snapshot = None
        reset_candidate_state()
        return None

    def cpu_seconds(self) -> float | None:
        """The calling thread's CPU time (the candidates run in it)."""
        return this_thread_cpu_seconds()
