"""The trusted side's runner for a worker process: the candidate runs there, the verdict here.

:class:`WorkerRunner` is the :class:`~kernelforge.execute.runner.Runner` of
:class:`kernelforge.execute.worker.executor.WorkerExecutor`. The judge's tensors are placed in memory the
worker shares (:class:`~kernelforge.execute.worker.arena.Arena` on the CPU; device memory opened through
CUDA IPC on a GPU, :mod:`kernelforge.execute.worker.cuda_share`, untested in this session), and each
request names them by slot, so a call is one small message each way and no tensor ever travels
through a pipe. The requests (pickles; answers are checked JSON, :mod:`kernelforge.execute.worker.protocol`):

- ``("load", source, name_hint)`` -> ``loaded``: a handle for its ``run``, or the compile error;
- ``("call", handle, args, watched, arena_bytes)`` -> ``returned``: one call and the worker's
  :class:`~kernelforge.execute.judge.guard.CallReport`; ``("sync",)`` -> ``synced``: after a full device
  synchronisation. The trusted side reads the outputs between the two;
- ``("time", handle, sets, outputs, inplace, reset, verified, aside, inplace_before, bytes,
  method, unwritten, arena_bytes)`` -> ``timed``: one timing round
  (:mod:`kernelforge.execute.timing.calls`);
- ``("tampering",)`` -> the harness functions replaced since the session began;
- ``("release",)`` -> ``released``: the session ends; why the worker must retire, if it must.

Every answer is awaited within the current step's time limit (:meth:`WorkerRunner.step`); a worker
that runs over, dies or answers out of protocol is killed and raises
:class:`~kernelforge.execute.worker.process.WorkerGone`. On the interpreter the worker's threads are
also counted from outside (``/proc``), where the candidate cannot lie about them.
"""

from __future__ import annotations

import os
import time
from typing import Any, Mapping, Sequence

import torch

from kernelforge.devices.base import Device
from kernelforge.execute.timing.cputime import cpu_seconds
from kernelforge.execute.judge.guard import CallReport
from kernelforge.execute.timing.calls import TimingAnswer, TimingJob
from kernelforge.execute.worker.protocol import WireError, integer, names, report_from, timing_from, verification_from
from kernelforge.execute.worker.process import WorkerGone, WorkerProcess
from kernelforge.execute.worker.serve import TENSOR, VALUE
from kernelforge.result import Status, Verification


class WorkerRunner:
    """Runs one candidate session in ``process`` for the judge (see the module docstring).

    ``device`` is the trusted side's copy of the worker's device. ``retire`` is set when the
    worker must not serve another candidate after this one (a message matching the device's
    ``fatal_errors``: a CUDA error)."""

    def __init__(self, process: WorkerProcess, device: Device, *, compile_timeout: float, run_timeout: float):
        self.process = process
        self.device = device
        self.torch_device = torch.device(device.torch_device)
        self.compile_timeout, self.run_timeout = compile_timeout, run_timeout
        if self.torch_device.type == "cuda":
            from kernelforge.execute.worker.cuda_share import CudaShare

            self.memory: Any = CudaShare.of(self.torch_device)
        else:
            if process.arena is None:
                raise RuntimeError("the worker process has no shared arena")
            self.memory = process.arena
        self.retire: str | None = None
        self._label, self._limit = "starting", run_timeout
        self._deadline = time.monotonic() + run_timeout
        self._compiled = False

    # -- steps and messages ---------------------------------------------------------------------

    def step(self, label: str, limit: float | None = None) -> None:
        """Start a step: ``compile`` gets the compile timeout, any other the run timeout (on a GPU
        the first run step gets both: the JIT compiles there), or ``limit`` seconds when given.
        The shared memory of the previous step is handed out again."""
        if limit is not None:
            self._label = label
        elif label == "compile":
            self._label, limit = "importing the candidate", self.compile_timeout
        else:
            jit = not self._compiled and self.device.jit_on_first_call
            self._compiled = True
            self._label, limit = f"running {label}", self.run_timeout + (self.compile_timeout if jit else 0)
        self._limit = limit
        self._deadline = time.monotonic() + limit
        self.memory.reset()

    def _ask(self, request: tuple, answer: str) -> dict[str, Any]:
        self.process.send(request)
        message = self.process.receive(max(self._deadline - time.monotonic(), 1e-3), self._label, limit=self._limit)
        if message["kind"] == "error":
            self.process.kill()
            raise WorkerGone("runtime_error", f"harness error in the worker: {str(message.get('message'))[:1800]}")
        if message["kind"] != answer:
            self.process.kill()
            raise WorkerGone("runtime_error", f"the worker answered {str(message['kind'])[:40]!r} to a request for "
                                              f"{answer!r} while {self._label}")
        return message

    def _checked(self, parse: Any, value: Any) -> Any:
        try:
            return parse(value)
        except WireError as exc:
            self.process.kill()
            raise WorkerGone("runtime_error", f"unreadable answer from the worker while {self._label}: {exc}") from None

    def _report(self, value: Any) -> CallReport:
        report = self._checked(report_from, value)
        fatal = self.device.fatal_errors
        if not report.ok and fatal is not None and fatal.search(report.message):
            self.retire = f"{self.device.name} error: " + report.message[:200]
        return report

    def _tasks(self) -> int | None:
        """The worker's thread count as the kernel sees it (interpreter only: on a GPU the driver
        starts threads of its own)."""
        if self.device.sandbox_role != "interpreter" or self.process.pid is None:  # a GPU driver's own threads
            return None
        try:
            return len(os.listdir(f"/proc/{self.process.pid}/task"))
        except OSError:
            return None

    def _slot(self, tensor: torch.Tensor) -> Any:
        return self.memory.slot(tensor)

    def _wire(self, args: Mapping[str, Any]) -> dict[str, tuple[str, Any]]:
        return {name: (TENSOR, self._slot(v)) if isinstance(v, torch.Tensor) else (VALUE, v) for name, v in args.items()}

    def _arena_bytes(self) -> int:
        return getattr(self.memory, "size", 0)

    def _prepare(self) -> None:
        prepare = getattr(self.memory, "prepare_call", None)
        if prepare is not None:
            prepare()

    # -- the runner protocol ----------------------------------------------------------------------

    def load(self, source: str, name_hint: str, watch: Sequence[tuple[str, Any, str]] = ()) -> tuple[int | None, Verification | None]:
        """Import ``source`` in the worker (``watch`` names objects of this process: unused here)."""
        tasks = self._tasks()
        message = self._ask(("load", source, name_hint), "loaded")
        failure = self._checked(verification_from, message.get("failure"))
        handle = self._checked(lambda v: integer(v, optional=True), message.get("handle"))
        after = self._tasks()
        if failure is None and tasks is not None and after is not None and after > tasks:
            failure = Verification(Status.REJECTED, message="the candidate started a thread when imported (seen from "
                                                            "outside the worker)")
        if failure is None and handle is None:
            failure = Verification(Status.RUNTIME_ERROR, message="the worker loaded nothing")
        return (None, failure) if failure is not None else (handle, None)

    def share(self, tensor: torch.Tensor, *, values: bool = True) -> torch.Tensor:
        return self.memory.share(tensor, values=values)

    def snapshot(self, tensor: torch.Tensor) -> torch.Tensor:
        return self.memory.snapshot(tensor)

    def call(self, handle: int, args: Mapping[str, Any], watched: Sequence[str]) -> CallReport:
        self._prepare()
        tasks = self._tasks()
        message = self._ask(("call", handle, self._wire(args), tuple(watched), self._arena_bytes()), "returned")
        report = self._report(message.get("report"))
        after = self._tasks()
        if report.ok and tasks is not None and after is not None and after > tasks:
            return CallReport(Status.REJECTED, "the candidate left background threads running (seen from outside "
                                               "the worker)")
        return report

    def sync(self) -> CallReport:
        return self._report(self._ask(("sync",), "synced").get("report"))

    def time(self, handle: int, job: TimingJob) -> TimingAnswer:
        self._prepare()
        request = ("time", handle, tuple(self._wire(args) for args in job.sets), job.outputs, job.inplace, job.reset,
                   tuple(job.verified), tuple({n: self._slot(t) for n, t in buffers.items()} for buffers in job.aside),
                   tuple({n: self._slot(t) for n, t in buffers.items()} for buffers in job.inplace_before),
                   job.working_set_bytes, job.method,
                   None if job.unwritten is None else self._slot(job.unwritten), self._arena_bytes())
        message = self._ask(request, "timed")
        report = self._report(message.get("report"))
        timing = self._checked(timing_from, message.get("timing"))
        prepared = self._checked(integer, message.get("prepared"))
        copied = self._checked(lambda v: _copied_sets(v, len(job.verified)), message.get("copied_sets"))
        return TimingAnswer(timing, report, prepared, copied)

    def tampering(self) -> list[str]:
        return self._checked(names, self._ask(("tampering",), "tampering").get("changed"))

    def release(self) -> str | None:
        """End the session; the reason the worker must retire (a CUDA error seen here first)."""
        message = self._ask(("release",), "released")
        reason = self._checked(lambda v: None if v is None else str(v)[:300], message.get("retire"))
        return self.retire or reason

    def cpu_seconds(self) -> float | None:
        """The CPU time of the worker's calling thread, read from ``/proc`` here (the worker
        cannot change it)."""
        return None if self.process.pid is None else cpu_seconds(self.process.pid)


def _copied_sets(value: Any, count: int) -> tuple[int | None, ...]:
    """The ``copied_sets`` field of a ``timed`` answer: one optional integer per verified call."""
    if not isinstance(value, list) or len(value) != count:
        raise WireError(f"expected {count} copied sets, got {value!r}"[:200])
    return tuple(integer(v, optional=True) for v in value)
