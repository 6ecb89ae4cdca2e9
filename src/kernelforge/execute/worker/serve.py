"""The worker's side of a candidate session: load it, call it, time it, on shared tensors.

:class:`WorkerSession` answers the requests of :class:`kernelforge.execute.worker.runner.WorkerRunner`
(see there for the protocol). It holds the candidate's modules and builds the tensors of each
request over the memory the trusted process shares with it (:class:`~kernelforge.execute.worker.arena.ArenaView`
on the CPU, CUDA IPC on a GPU). It never sees a reference, an expected output or a tolerance, and
it decides nothing: its checks (:func:`~kernelforge.execute.judge.guard.run_call`) are reported, and the
trusted side makes the verdict from the bytes the candidate wrote.
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
from kernelforge.execute.worker.protocol import report_to, timing_to, verification_to
from kernelforge.result import Status, Verification

#: How a request names one argument: a shared tensor by its slot, or a plain value.
TENSOR, VALUE = "t", "v"


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

    def arguments(self, wire: dict[str, tuple[str, Any]]) -> dict[str, Any]:
        return {name: self.tensor(value) if kind == TENSOR else value for name, (kind, value) in wire.items()}

    # -- requests -------------------------------------------------------------------------------

    def handle(self, message: tuple) -> dict[str, Any]:
        """The answer (a JSON-able dict with ``kind``) to one request."""
        kind = message[0]
        if len(message) > 1 and kind in ("call", "time") and self.arena is not None:
            self.arena.ensure(message[-1])
        if kind == "load":
            return self.load(*message[1:])
        if kind == "call":
            _, handle, wire, watched, _size = message
            return {"kind": "returned", "report": report_to(self.call(handle, self.arguments(wire), watched))}
        if kind == "sync":
            return {"kind": "synced", "report": report_to(settle(self.torch_device))}
        if kind == "time":
            return self.time(*message[1:-1])
        if kind == "tampering":
            return {"kind": "tampering", "changed": harness_changes(self.snapshot) if self.snapshot else []}
        if kind == "release":
            self.runs.clear()
            reset_candidate_state()  # the next candidate starts from Triton's defaults
            self.snapshot = None
            return {"kind": "released", "retire": self.healthy()}
        raise ValueError(f"unknown request {kind!r}")

    def load(self, source: str, name_hint: str) -> dict[str, Any]:
        if self.snapshot is None:
            self.snapshot = harness_snapshot()
        threads = threading.active_count()
        module, failure = load_candidate(source, name_hint)
        if failure is None and threading.active_count() > threads:
            failure = Verification(Status.REJECTED, message="the candidate started a thread when imported")
        if failure is not None:
            return {"kind": "loaded", "handle": None, "failure": verification_to(failure)}
        self.runs.append(module.run)
        return {"kind": "loaded", "handle": len(self.runs) - 1, "failure": None}

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

    def time(self, handle: int, sets: tuple, outputs: tuple[str, ...], inplace: tuple[str, ...], reset: bool,
             verified: tuple, aside: tuple, before: tuple, working_set_bytes: int, method: str | None = None,
             unwritten: Any = None) -> dict[str, Any]:
        job = TimingJob(tuple(self.arguments(wire) for wire in sets), tuple(outputs), tuple(inplace), bool(reset),
                        tuple(int(i) for i in verified),
                        tuple({name: self.tensor(slot) for name, slot in buffers.items()} for buffers in aside),
                        tuple({name: self.tensor(slot) for name, slot in buffers.items()} for buffers in before),
                        int(working_set_bytes), None if method is None else str(method),
                        None if unwritten is None else self.tensor(unwritten))
        answer = run_timed(self.runs[handle], self.device, job)
        if answer.report.ok:
            try:
                self.device.synchronize()  # the aside copies are read by the trusted side next
            except Exception as exc:
                return {"kind": "timed", "timing": None, "report": report_to(CallReport.of(raised(exc))),
                        "prepared": answer.prepared, "copied_sets": [None] * len(job.verified)}
        return {"kind": "timed", "timing": timing_to(answer.timing), "report": report_to(answer.report),
                "prepared": answer.prepared, "copied_sets": list(answer.copied_sets)}
