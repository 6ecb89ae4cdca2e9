"""The worker protocol: every request the trusted process sends its worker and every answer it gets
back, as frozen records, with the one place each way is encoded and decoded. Both sides import this
module; nothing else touches the bytes on the pipe.

Requests (parent -> worker) are pickled records: the worker trusts its parent.
:func:`decode_request` still refuses anything that is not one of :data:`REQUESTS`.

- :class:`Init` -> :class:`Ready` or :class:`InitError` (the first message, once);
- :class:`Load` -> :class:`Loaded`: a handle for the candidate's ``run``, or why it did not load;
- :class:`Call` -> :class:`Returned`: one call and the worker's
  :class:`~kernelforge.execute.judge.guard.CallReport`; :class:`Sync` -> :class:`Synced`, after a
  full device synchronisation (the trusted side reads the outputs between the two);
- :class:`Time` -> :class:`Timed`: one timing round (:mod:`kernelforge.execute.timing.calls`);
- :class:`Tampering` -> :class:`Tampered`: the harness functions replaced since the session began;
- :class:`Release` -> :class:`Released`: the session ends, with why the worker must retire, if it must;
- :class:`Probe` -> :class:`Probed`: what the worker sees (tests); :class:`Exit`: no answer.

Any request may instead be answered :class:`HarnessError` (a bug of the harness; the worker ends).

Answers (worker -> parent) are untrusted: the worker runs candidate code. They are never unpickled
(a pickle is a program: a worker taken over by a candidate could run anything in the trusted process
with one); they are JSON objects of at most :data:`MAX_MESSAGE_BYTES` with a ``kind``, and every
record is rebuilt by :func:`decode_answer` from checked fields. A field of the wrong type or range is
a :class:`WireError`: the trusted side kills the worker and records a ``runtime_error``.

Tensors never travel here: a request names them by their slot in the memory both sides share
(:mod:`.arena` on the CPU, :mod:`.cuda_share` on a GPU).
"""

from __future__ import annotations

import json
import pickle
from dataclasses import dataclass, field
from typing import Any, ClassVar

from kernelforge.execute.judge.guard import CallReport
from kernelforge.execute.worker.checked import (WireError, integer, names, report_from, report_to,
                                               text, timing_from, timing_to, verification_from, verification_to)
from kernelforge.result import Timing, Verification
from kernelforge.textsafe import MESSAGE

__all__ = ["Argument", "Init", "Load", "Call", "Sync", "Time", "Tampering", "Release", "Probe", "Exit", "REQUESTS",
           "Ready", "InitError", "Loaded", "Returned", "Synced", "Timed", "Tampered", "Released", "Probed",
           "HarnessError", "ANSWERS", "MAX_MESSAGE_BYTES", "WireError", "encode_request", "decode_request",
           "encode_answer", "decode_answer"]

#: The largest answer a worker may send (tensors travel through shared memory, never here).
MAX_MESSAGE_BYTES = 8 * 2**20


# -- requests ---------------------------------------------------------------------------------------

@dataclass(frozen=True)
class Argument:
    """One argument of a call: a shared tensor by its ``slot``, or a plain ``value``."""

    slot: Any = None
    value: Any = None
    is_tensor: bool = False


@dataclass(frozen=True)
class Init:
    """Build the worker's own copy of the search's device: its class (``module:qualname``), the
    constructor arguments it was built with, and torch's thread count (None: torch's default)."""

    device_class: str
    device_kwargs: dict[str, Any]
    threads: int | None


@dataclass(frozen=True)
class Load:
    """Import a candidate's ``source`` as a module named after ``name_hint``."""

    source: str
    name_hint: str


@dataclass(frozen=True)
class Call:
    """Call loaded candidate ``handle`` once on ``args``; ``watched`` name the outputs it writes.
    ``arena_bytes`` is the shared arena's size the slots refer to."""

    handle: int
    args: dict[str, Argument]
    watched: tuple[str, ...]
    arena_bytes: int = 0


@dataclass(frozen=True)
class Sync:
    """Synchronise the whole device (work left on other streams shows after this)."""


@dataclass(frozen=True)
class Time:
    """One timing round of loaded candidate ``handle``: the shared form of a
    :class:`~kernelforge.execute.timing.calls.TimingJob` (see there for each field), with the slots
    of its tensors in place of the tensors."""

    handle: int
    sets: tuple[dict[str, Argument], ...]
    outputs: tuple[str, ...]
    inplace: tuple[str, ...]
    reset: bool
    verified: tuple[int, ...]
    aside: tuple[dict[str, Any], ...]
    inplace_before: tuple[dict[str, Any], ...]
    working_set_bytes: int
    method: str | None
    unwritten: Any
    arena_bytes: int = 0
    watched: tuple[int, ...] = ()
    touch_seed: int = 0


@dataclass(frozen=True)
class Tampering:
    """Which harness functions a candidate replaced since the session began."""


@dataclass(frozen=True)
class Release:
    """End the candidate's session (its modules dropped, Triton's defaults restored)."""


@dataclass(frozen=True)
class Probe:
    """What the worker sees: environment names, working directory, limits (for tests)."""


@dataclass(frozen=True)
class Exit:
    """Leave now; nothing is answered."""


REQUESTS = (Init, Load, Call, Sync, Time, Tampering, Release, Probe, Exit)


def encode_request(request: Any) -> bytes:
    if not isinstance(request, REQUESTS):
        raise TypeError(f"not a worker request: {type(request).__name__}")
    return pickle.dumps(request, protocol=pickle.HIGHEST_PROTOCOL)


def decode_request(data: bytes) -> Any:
    """A request from the parent (trusted: unpickled), refused unless it is one of :data:`REQUESTS`."""
    request = pickle.loads(data)
    if not isinstance(request, REQUESTS):
        raise TypeError(f"not a worker request: {type(request).__name__}")
    return request


# -- answers ----------------------------------------------------------------------------------------

class _Answer:
    """An answer's ``kind`` on the wire, its fields as JSON (:meth:`fields`) and its rebuilding
    from checked fields (:meth:`parse`)."""

    KIND: ClassVar[str]

    def fields(self) -> dict[str, Any]:
        return dict(self.__dict__)

    @classmethod
    def parse(cls, message: dict[str, Any]) -> Any:
        raise NotImplementedError


@dataclass(frozen=True)
class Ready(_Answer):
    """The worker is ready: its pid, its device's name and its address-space limit (bytes, -1: none)."""

    KIND: ClassVar[str] = "ready"
    pid: int
    device: str
    memory_limit: int

    @classmethod
    def parse(cls, message: dict[str, Any]) -> Ready:
        return cls(integer(message.get("pid")), text(message.get("device"), 100),
                   integer(message.get("memory_limit"), low=-1))


@dataclass(frozen=True)
class InitError(_Answer):
    KIND: ClassVar[str] = "init_error"
    message: str

    @classmethod
    def parse(cls, message: dict[str, Any]) -> InitError:
        return cls(text(message.get("message")))


@dataclass(frozen=True)
class Loaded(_Answer):
    """A handle for the loaded candidate's ``run``, or the ``failure`` that kept it from loading."""

    KIND: ClassVar[str] = "loaded"
    handle: int | None
    failure: Verification | None

    def fields(self) -> dict[str, Any]:
        return {"handle": self.handle, "failure": verification_to(self.failure)}

    @classmethod
    def parse(cls, message: dict[str, Any]) -> Loaded:
        return cls(integer(message.get("handle"), optional=True), verification_from(message.get("failure")))


@dataclass(frozen=True)
class Returned(_Answer):
    KIND: ClassVar[str] = "returned"
    report: CallReport

    def fields(self) -> dict[str, Any]:
        return {"report": report_to(self.report)}

    @classmethod
    def parse(cls, message: dict[str, Any]) -> Any:
        return cls(report_from(message.get("report")))


@dataclass(frozen=True)
class Synced(Returned):
    KIND: ClassVar[str] = "synced"


@dataclass(frozen=True)
class Timed(_Answer):
    """One round's ``timing`` (None when the candidate raised: ``report``), how many calls were
    ``prepared``, and per verified preparation the input set copied aside (None: never called)."""

    KIND: ClassVar[str] = "timed"
    timing: Timing | None
    report: CallReport
    prepared: int
    copied_sets: tuple[int | None, ...]

    def fields(self) -> dict[str, Any]:
        return {"timing": timing_to(self.timing), "report": report_to(self.report), "prepared": self.prepared,
                "copied_sets": list(self.copied_sets)}

    @classmethod
    def parse(cls, message: dict[str, Any]) -> Timed:
        copied = message.get("copied_sets")
        if not isinstance(copied, list) or len(copied) > 10_000:
            raise WireError("expected a list of copied sets")
        return cls(timing_from(message.get("timing")), report_from(message.get("report")),
                   integer(message.get("prepared")), tuple(integer(v, optional=True) for v in copied))


@dataclass(frozen=True)
class Tampered(_Answer):
    KIND: ClassVar[str] = "tampered"
    changed: tuple[str, ...] = ()

    def fields(self) -> dict[str, Any]:
        return {"changed": list(self.changed)}

    @classmethod
    def parse(cls, message: dict[str, Any]) -> Tampered:
        return cls(tuple(names(message.get("changed"))))


@dataclass(frozen=True)
class Released(_Answer):
    KIND: ClassVar[str] = "released"
    retire: str | None = None

    @classmethod
    def parse(cls, message: dict[str, Any]) -> Released:
        return cls(text(message.get("retire"), 300, optional=True))


@dataclass(frozen=True)
class Probed(_Answer):
    """What the worker sees (tests read it; nothing is decided from it)."""

    KIND: ClassVar[str] = "probed"
    info: dict[str, Any] = field(default_factory=dict)

    @classmethod
    def parse(cls, message: dict[str, Any]) -> Probed:
        info = message.get("info")
        if not isinstance(info, dict):
            raise WireError("expected what the worker sees, by name")
        return cls(info)


@dataclass(frozen=True)
class HarnessError(_Answer):
    """A failure of the harness itself; the worker ends after sending it."""

    KIND: ClassVar[str] = "error"
    message: str

    @classmethod
    def parse(cls, message: dict[str, Any]) -> HarnessError:
        return cls(text(message.get("message"), 2 * MESSAGE))


ANSWERS = (Ready, InitError, Loaded, Returned, Synced, Timed, Tampered, Released, Probed, HarnessError)
_BY_KIND = {answer.KIND: answer for answer in ANSWERS}


def encode_answer(answer: _Answer) -> bytes:
    """One answer of the worker as JSON bytes: ``{"kind": ..., **fields}``."""
    return json.dumps({"kind": answer.KIND, **answer.fields()}).encode("utf-8")


def decode_answer(data: bytes) -> Any:
    """A worker's answer rebuilt as its record from checked fields, or :class:`WireError`."""
    try:
        message = json.loads(data.decode("utf-8"))
    except (UnicodeDecodeError, ValueError) as exc:
        raise WireError(f"not JSON ({type(exc).__name__})") from None
    if not isinstance(message, dict) or not isinstance(message.get("kind"), str):
        raise WireError("not an answer object")
    answer = _BY_KIND.get(message["kind"])
    if answer is None:
        raise WireError(f"unknown answer {message['kind'][:40]!r}")
    return answer.parse(message)
