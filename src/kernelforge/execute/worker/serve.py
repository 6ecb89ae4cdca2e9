"""The worker's side of a candidate session: load it, call it, time it, on shared tensors.

:class:`WorkerSession` answers the requests of :class:`kernelforge.execute.worker.runner.WorkerRunner`
(the requests and answers: :mod:`kernelforge.execute.worker.protocol`). It holds the candidate's
modules and builds the tensors of each request over the memory the trusted process shares with it
(:class:`~kernelforge.execute.worker.arena.ArenaView` on the CPU, CUDA IPC on a GPU). It never sees
a reference, an expected output or a tolerance, and it decides nothing: its checks
(:func:`~kernelforge.execute.judge.guard.run_call`) are reported, and the trusted side makes the
verdict from the bytes the candidate wrote.
"""

from __future__ import annotations

import threading
from typing import Any, Callable

import torch

from kernelforge.devices.base import Device
from kernelforge.execute.worker.arena import ArenaView
from kernelforge.execute.judge.fingerprint import poison_free_memory
from kernelforge.execute.judge.guard import CallReport, raised, run_call, settle
from kernelforge.execute.judge.harness import harness_changes, harness_snapshot, reset_candidate_state
from kernelforge.execute.runner import load_candidate
from kernelforge.execute.timing.calls import TimingJob, run_timed
from kernelforge.execute.worker import protocol as wire
from kernelforge.result import Status, Verification

class WorkerSession:
    """The requests of one worker (see the module docstring). ``healthy()`` says why the worker
    must retire (or None); it is asked when a candidate's session is released."""

    def __init__(self, device: Device, arena: ArenaView | None, healthy: Callable[[], str | None]):
        self.device = device
        self.torch_device = torch.device(device.torch_device)
        self.arena = arena
        self.healthy = healthy
        self.runs: list[Any] = []
        self.snapshot: list | None = None

    # -- tensors of a request ------------------------------------------------------------------

    def tensor(self, slot: Any) -> torch.Tensor:
        if self.torch_device.type == "cuda":
            from kernelforge.execute.worker.cuda_share import rebuild

            return rebuild(slot, self.torch_device)
        if self.arena is None:
            raise RuntimeError("this worker has no shared arena")
        return self.arena.tensor(slot)

    def arguments(self, args: dict[str, wire.Argument]) -> dict[str, Any]:
        return {name: self.tensor(arg.slot) if arg.is_tensor else arg.value for name, arg in args.items()}

    def buffers(self, slots: dict[str, Any]) -> dict[str, torch.Tensor]:
        return {name: self.tensor(slot) for name, slot in slots.items()}

    # -- requests -------------------------------------------------------------------------------

    def handle(self, request: Any) -> Any:
        """The answer (a record of :mod:`kernelforge.execute.worker.protocol`) to one request."""
        if isinstance(request, (wire.Call, wire.Time)) and self.arena is not None:
            self.arena.ensure(request.arena_bytes)
        if isinstance(request, wire.Load):
            return self.load(request.source, request.name_hint)
        if isinstance(request, wire.Call):
            return wire.Returned(self.call(request.handle, self.arguments(request.args), request.watched))
        if isinstance(request, wire.Sync):
            return wire.Synced(settle(self.torch_device))
        if isinstance(request, wire.Time):
            return self.time(request)
        if isinstance(request, wire.Tampering):
            return wire.Tampered(tuple(harness_changes(self.snapshot)) if self.snapshot else ())
        if isinstance(request, wire.Release):
            self.runs.clear()
            reset_candidate_state()  # the next candidate starts from Triton's defaults
            self.snapshot = None
            return wire.Released(self.healthy())
        raise ValueError(f"no session request: {type(request).__name__}")

    def load(self, source: str, name_hint: str) -> Any:
        if self.snapshot is None:
            self.snapshot = harness_snapshot()
        threads = threading.active_count()
        module, failure = load_candidate(source, name_hint)
        if failure is None and threading.active_count() > threads:
            failure = Verification(Status.REJECTED, message="the candidate started a thread when imported")
        if failure is not None:
            return wire.Loaded(None, failure)
        self.runs.append(module.run)
        return wire.Loaded(len(self.runs) - 1, None)

    def call(self, handle: int, args: dict[str, Any], watched: tuple[str, ...]) -> CallReport:
        poison_free_memory(self.torch_device, [args[n].numel() * args[n].element_size() for n in watched])
        report = run_call(self.runs[handle], args, watched, self.torch_device)
        if report.ok and self.torch_device.type == "cuda":
            # The trusted side reads the outputs itself once told the call returned: the work of
            # the current stream (what timing events see) must be finished; other streams are
            # waited for only at the following sync, so work deferred to them shows as a change.
            try:
                torch.cuda.current_stream(self.torch_device).synchronize()
            except Exception as exc:
                return CallReport.of(raised(exc))
        return report

    def time(self, request: Any) -> Any:
        job = TimingJob(tuple(self.arguments(wire_set) for wire_set in request.sets), tuple(request.outputs),
                        tuple(request.inplace), bool(request.reset), tuple(int(i) for i in request.verified),
                        tuple(self.buffers(slots) for slots in request.aside),
                        tuple(self.buffers(slots) for slots in request.inplace_before),
                        int(request.working_set_bytes), None if request.method is None else str(request.method),
                        None if request.unwritten is None else self.tensor(request.unwritten),
                        tuple(int(i) for i in request.watched), int(request.touch_seed))
        answer = run_timed(self.runs[request.handle], self.device, job)
        if answer.report.ok:
            try:
                self.device.synchronize()  # the aside copies are read by the trusted side next
            except Exception as exc:
                return wire.Timed(None, CallReport.of(raised(exc)), answer.prepared, (None,) * len(job.verified))
        return wire.Timed(answer.timing, answer.report, answer.prepared, tuple(answer.copied_sets))
