"""The worker protocol's contract (issue 30): every request goes through a real worker and gets the
answer record the protocol names for it; every answer survives its encoding; an answer that breaks
the protocol is refused before the trusted side reads a field of it."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from kernelforge.candidate import Candidate
from kernelforge.catalog import Catalog
from kernelforge.devices.interpret import InterpretDevice
from kernelforge.execute.judge.guard import CallReport
from kernelforge.execute.worker import protocol as wire
from kernelforge.execute.worker.executor import WorkerExecutor
from kernelforge.execute.worker.process import WorkerProcess
from kernelforge.result import Status, Timing, Verification

FIXTURES = Path(__file__).resolve().parents[2] / "fixtures" / "kernels"
CATALOG = Catalog.discover(FIXTURES)
BLOCK = CATALOG.block("toy/axpy")
HONEST = Candidate.from_template(CATALOG.baseline("toy/axpy")).source

#: The answer each request gets (Exit gets none; Init gets Ready or InitError).
ANSWER_OF = {wire.Init: wire.Ready, wire.Load: wire.Loaded, wire.Call: wire.Returned, wire.Sync: wire.Synced,
             wire.Time: wire.Timed, wire.Tampering: wire.Tampered, wire.Release: wire.Released,
             wire.Probe: wire.Probed, wire.Exit: None}

#: One example of every answer, as a worker could send it.
EXAMPLES = [
    wire.Ready(1234, "interpret", -1),
    wire.InitError("ImportError: no module named triton"),
    wire.Loaded(0, None),
    wire.Loaded(None, Verification(Status.COMPILE_ERROR, message="SyntaxError at line 3", traceback="tb")),
    wire.Returned(CallReport(None, "", None, "")),
    wire.Returned(CallReport(Status.RUNTIME_ERROR, "boom", "kernel", "Traceback ...")),
    wire.Synced(CallReport(None, "", None, "")),
    wire.Timed(Timing(1e-3, 9e-4, 1.1e-3, 20, "events", "n63", None, None, {"rounds": 2}),
               CallReport(None, "", None, ""), 21, (0, None)),
    wire.Timed(None, CallReport(Status.RUNTIME_ERROR, "raised", None, ""), 3, ()),
    wire.Tampered(("torch.allclose",)),
    wire.Released(None),
    wire.Released("a candidate left threads running"),
    wire.Probed({"pid": 1, "env": ["PATH"]}),
    wire.HarnessError("ValueError: ..."),
]


def test_every_request_has_its_answer_and_every_answer_an_example():
    assert set(ANSWER_OF) == set(wire.REQUESTS)
    assert {type(e) for e in EXAMPLES} == set(wire.ANSWERS)


@pytest.mark.parametrize("answer", EXAMPLES, ids=lambda a: type(a).__name__)
def test_an_answer_is_rebuilt_equal_from_its_encoding(answer):
    assert wire.decode_answer(wire.encode_answer(answer)) == answer


@pytest.mark.parametrize("raw, why", [
    (b"\x80\x04K\x01.", "not JSON"),  # a pickle: never unpickled on the trusted side
    (b"[1, 2]", "not an answer object"),
    (json.dumps({"kind": "loaded!", "handle": 0}).encode(), "unknown answer"),
    (json.dumps({"kind": "loaded", "handle": -1, "failure": None}).encode(), "integer"),
    (json.dumps({"kind": "loaded", "handle": True, "failure": None}).encode(), "integer"),
    (json.dumps({"kind": "timed", "timing": {"median_s": 1.0, "p20_s": 2.0, "p80_s": 3.0, "samples": 3,
                 "method": "events", "label": "x"}, "report": {"status": None}, "prepared": 1,
                 "copied_sets": []}).encode(), "out of order"),
    (json.dumps({"kind": "returned", "report": {"status": "winner"}}).encode(), "unknown status"),
    (json.dumps({"kind": "tampered", "changed": "torch.allclose"}).encode(), "list of names"),
    (json.dumps({"kind": "probed", "info": [1]}).encode(), "by name"),
])
def test_an_answer_out_of_protocol_is_a_wire_error(raw, why):
    with pytest.raises(wire.WireError, match=why):
        wire.decode_answer(raw)


def test_a_request_is_one_of_the_protocols_records():
    assert isinstance(wire.decode_request(wire.encode_request(wire.Load("x = 1", "k"))), wire.Load)
    with pytest.raises(TypeError, match="not a worker request"):
        wire.encode_request(("load", "x = 1", "k"))


@pytest.mark.interpreter
def test_every_request_goes_through_a_real_worker_and_gets_its_answer(monkeypatch):
    """A search's evaluation, a probe and a close send every request there is to a real worker
    process; each answer is the record the protocol names for its request."""
    exchanges: list[tuple[type, type | None]] = []
    send, receive = WorkerProcess.send, WorkerProcess.receive
    pending: list[type] = []

    def recording_send(self, request):
        pending.append(type(request))
        if isinstance(request, wire.Exit):
            exchanges.append((wire.Exit, None))
            pending.pop()
        return send(self, request)

    def recording_receive(self, *args, **kwargs):
        answer = receive(self, *args, **kwargs)
        exchanges.append((pending.pop(0) if pending else wire.Init, type(answer)))
        return answer

    kill, ended = WorkerProcess.kill, []

    def recording_kill(self):
        ended.append(None if self._proc is None else self._proc.poll())
        return kill(self)

    monkeypatch.setattr(WorkerProcess, "send", recording_send)
    monkeypatch.setattr(WorkerProcess, "receive", recording_receive)
    monkeypatch.setattr(WorkerProcess, "kill", recording_kill)
    with WorkerExecutor(InterpretDevice(warmup=0, repeats=1), held_out=False, run_timeout=120) as executor:
        [ev] = executor.evaluate(BLOCK, HONEST, BLOCK.shapes("smoke")[:1], torch.float16)
        assert ev.status is Status.OK, ev.verification.message
        info = executor.probe()
        assert info["pid"] == executor.info.pid and executor.info.device == "interpret"
    sent = {request for request, _ in exchanges}
    assert sent == set(wire.REQUESTS), f"never sent: {sorted(t.__name__ for t in set(wire.REQUESTS) - sent)}"
    wrong = [(r.__name__, a.__name__) for r, a in exchanges if a is not ANSWER_OF[r]]
    assert not wrong, wrong
    assert ended[-1] == 0  # Exit: the worker left by itself before the parent made sure
