"""The checked fields of a worker's answers: each value read from untrusted JSON is checked for type
and range, cut to its limit, and rebuilt into the record it stands for; anything else is a
:class:`WireError`. :mod:`kernelforge.execute.worker.protocol` builds its answers from these."""

from __future__ import annotations

import math
from dataclasses import asdict
from typing import Any

from kernelforge.execute.judge.guard import CallReport
from kernelforge.result import Status, Timing, Verification
from kernelforge.textsafe import DETAIL, LINE, MESSAGE, TRACEBACK, cut



#: The most names a list field keeps (harness function labels).
MAX_NAMES = 100


class WireError(ValueError):
    """A worker's answer that is not what the protocol allows."""


def text(value: Any, limit: int = MESSAGE, *, optional: bool = False) -> str | None:
    """A string field (shortened to ``limit``); None only when ``optional``."""
    if value is None and optional:
        return None
    if not isinstance(value, str):
        raise WireError(f"expected a string, got {type(value).__name__}")
    return value[:limit]


def integer(value: Any, *, optional: bool = False, low: int = 0) -> int | None:
    """A non-negative (at least ``low``) integer field; None only when ``optional``."""
    if value is None and optional:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value < low:
        raise WireError(cut(f"expected an integer >= {low}, got {value!r}", DETAIL))
    return value


def seconds(value: Any) -> float:
    """A finite, non-negative number of seconds."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value < 0:
        raise WireError(cut(f"expected a number of seconds, got {value!r}", DETAIL))
    return float(value)


def names(value: Any) -> list[str]:
    """A list of short strings (harness function labels)."""
    if not isinstance(value, list):
        raise WireError("expected a list of names")
    return [text(item, LINE) for item in value[:MAX_NAMES]]


def status(value: Any, *, optional: bool = False) -> Status | None:
    if value is None and optional:
        return None
    try:
        return Status(value)
    except ValueError:
        raise WireError(cut(f"unknown status {value!r}", DETAIL)) from None


def report_to(report: CallReport) -> dict[str, Any]:
    return {"status": None if report.status is None else report.status.value, "message": report.message,
            "name": report.name, "traceback": report.traceback}


def report_from(value: Any) -> CallReport:
    """A :class:`~kernelforge.execute.judge.guard.CallReport` rebuilt from checked fields."""
    if not isinstance(value, dict):
        raise WireError("expected a call report")
    return CallReport(status(value.get("status"), optional=True), text(value.get("message", "")),
                      text(value.get("name"), DETAIL, optional=True), text(value.get("traceback", ""), TRACEBACK))


def verification_to(verdict: Verification | None) -> dict[str, Any] | None:
    if verdict is None:
        return None
    return {"status": verdict.status.value, "message": verdict.message, "traceback": verdict.traceback}


def verification_from(value: Any) -> Verification | None:
    """A load failure (status, message, traceback) rebuilt from checked fields, or None."""
    if value is None:
        return None
    if not isinstance(value, dict):
        raise WireError("expected a verdict")
    return Verification(status(value.get("status")), message=text(value.get("message", "")),
                        traceback=text(value.get("traceback", ""), TRACEBACK))


def timing_to(timing: Timing | None) -> dict[str, Any] | None:
    return None if timing is None else asdict(timing)


def _extra_value(value: Any) -> Any:
    if value is None or isinstance(value, (bool, int, str)):
        return value if not isinstance(value, str) else cut(value, LINE)
    if isinstance(value, float):
        return value
    raise WireError(f"timing detail of type {type(value).__name__}")


def timing_from(value: Any) -> Timing | None:
    """A :class:`~kernelforge.result.Timing` rebuilt from checked fields (quantiles ordered,
    finite, non-negative), or None."""
    if value is None:
        return None
    if not isinstance(value, dict):
        raise WireError("expected a timing")
    median, p20, p80 = (seconds(value.get(k)) for k in ("median_s", "p20_s", "p80_s"))
    if not p20 <= median <= p80:
        raise WireError("timing quantiles out of order")
    extra = value.get("extra") or {}
    if not isinstance(extra, dict) or len(extra) > 50:
        raise WireError("expected timing details by name")
    joules, ratio = value.get("joules_per_call"), value.get("wall_over_event")
    return Timing(median, p20, p80, integer(value.get("samples"), low=1), text(value.get("method"), 100),
                  text(value.get("label"), 300), None if joules is None else seconds(joules),
                  None if ratio is None else seconds(ratio),
                  {text(k, 100): _extra_value(v) for k, v in extra.items()})
