"""The trusted side's runner for a worker process: the candidate runs there, the verdict here.

:class:`WorkerRunner` is the :class:`~kernelforge.execute.runner.Runner` of
:class:`kernelforge.execute.worker.executor.WorkerExecutor`. The judge's tensors are placed in memory the
worker shares (:class:`~kernelforge.execute.worker.arena.Arena` on the CPU; device memory opened through
CUDA IPC on a GPU, :mod:`kernelforge.execute.worker.cuda_share`, untested in this session), and each
request names them by slot, so a call is one small message each way and no tensor ever travels
through a pipe. The requests and answers are the records of :mod:`kernelforge.execute.worker.protocol`.

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
from kernelforge.execute.judge.guard import CallReport
from kernelforge.execute.timing.calls import TimingAnswer, TimingJob
from kernelforge.execute.timing.cputime import cpu_seconds
from kernelforge.execute.worker import protocol as wire
from kernelforge.execute.worker.process import WorkerGone, WorkerProcess
from kernelforge.result import Status, Verification
from kernelforge.textsafe import DETAIL, cut


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

    def _ask(self, request: Any, answer: type) -> Any:
        """Send ``request`` and return its answer, a record of type ``answer`` (anything else kills
        the worker)."""
        self.process.send(request)
        message = self.process.receive(max(self._deadline - time.monotonic(), 1e-3), self._label, limit=self._limit)
        if isinstance(message, wire.HarnessError):
            self.process.kill()
            raise WorkerGone("runtime_error", f"harness error in the worker: {message.message}")
        if not isinstance(message, answer):
            self.process.kill()
            raise WorkerGone("runtime_error", f"the worker answered {type(message).__name__} to "
                                              f"{type(request).__name__} while {self._label}")
        return message

    def _report(self, report: CallReport) -> CallReport:
        fatal = self.device.fatal_errors
        if not report.ok and fatal is not None and fatal.search(report.message):
            self.retire = f"{self.device.name} error: " + cut(report.message, DETAIL)
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

    def _wire(self, args: Mapping[str, Any]) -> dict[str, wire.Argument]:
        return {name: wire.Argument(slot=self._slot(v), is_tensor=True) if isinstance(v, torch.Tensor)
                else wire.Argument(value=v) for name, v in args.items()}

    def _slots(self, buffers: Mapping[str, torch.Tensor]) -> dict[str, Any]:
        return {name: self._slot(tensor) for name, tensor in buffers.items()}

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
        message = self._ask(wire.Load(source, name_hint), wire.Loaded)
        failure, handle = message.failure, message.handle
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
        message = self._ask(wire.Call(handle, self._wire(args), tuple(watched), self._arena_bytes()), wire.Returned)
        report = self._report(message.report)
        after = self._tasks()
        if report.ok and tasks is not None and after is not None and after > tasks:
            return CallReport(Status.REJECTED, "the candidate left background threads running (seen from outside "
                                               "the worker)")
        return report

    def sync(self) -> CallReport:
        return self._report(self._ask(wire.Sync(), wire.Synced).report)

    def time(self, handle: int, job: TimingJob) -> TimingAnswer:
        self._prepare()
        request = wire.Time(handle, tuple(self._wire(args) for args in job.sets), job.outputs, job.inplace, job.reset,
                            tuple(job.verified), tuple(self._slots(b) for b in job.aside),
                            tuple(self._slots(b) for b in job.inplace_before), job.working_set_bytes, job.method,
                            None if job.unwritten is None else self._slot(job.unwritten), self._arena_bytes(),
                            tuple(job.watched), int(job.touch_seed))
        message = self._ask(request, wire.Timed)
        if len(message.copied_sets) != len(job.verified):
            self.process.kill()
            raise WorkerGone("runtime_error", f"the worker answered {len(message.copied_sets)} copied sets for "
                                              f"{len(job.verified)} verified calls while {self._label}")
        return TimingAnswer(message.timing, self._report(message.report), message.prepared, message.copied_sets)

    def tampering(self) -> list[str]:
        return list(self._ask(wire.Tampering(), wire.Tampered).changed)

    def release(self) -> str | None:
        """End the session; the reason the worker must retire (a CUDA error seen here first)."""
        return self.retire or self._ask(wire.Release(), wire.Released).retire

    def cpu_seconds(self) -> float | None:
        """The CPU time of the worker's calling thread, read from ``/proc`` here (the worker
        cannot change it)."""
        return None if self.process.pid is None else cpu_seconds(self.process.pid)

