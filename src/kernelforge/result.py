"""Records of what happened to a candidate: statuses, verification outcomes and timings.

Every outcome is data (EVALUATION.md): a failed candidate is a stored result with a status and a
message, never an exception that stops a search.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import Enum
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from kernelforge.block import Counts, Shape


class Status(str, Enum):
    """The outcome of evaluating one candidate on one shape."""

    OK = "ok"  # verified correct (and timed)
    WRONG = "wrong"  # ran, but the output does not match the reference
    REJECTED = "rejected"  # broke a rule: policy, resource limit, input mutation, nondeterminism...
    COMPILE_ERROR = "compile_error"
    RUNTIME_ERROR = "runtime_error"
    TIMEOUT = "timeout"

    def __str__(self) -> str:
        return self.value


@dataclass(frozen=True)
class Verification:
    """The verdict of checking one candidate on one shape against the block's reference.

    ``rel_error`` is the worst ``||out - ref|| / ||ref||`` over the checks run; ``excess`` the worst
    elementwise ``|out - ref| / (atol * rms(ref) + rtol * |ref|)`` (above 1 fails).
    """

    status: Status
    rel_error: float | None = None
    excess: float | None = None
    checks: int = 0
    message: str = ""

    @property
    def ok(self) -> bool:
        return self.status is Status.OK


@dataclass(frozen=True)
class Timing:
    """Timing statistics of one candidate on one shape, in seconds.

    ``method`` says how they were taken (``cuda-events``, ``cuda-graph``, ``interpreter-wall``);
    ``label`` is the human-readable caveat printed beside every figure (interpreter timings are
    not GPU speed).
    """

    median_s: float
    p20_s: float
    p80_s: float
    samples: int
    method: str
    label: str
    joules_per_call: float | None = None
    wall_over_event: float | None = None
    extra: dict[str, Any] = field(default_factory=dict, compare=False)

    @property
    def is_gpu(self) -> bool:
        return self.method.startswith("cuda")


@dataclass(frozen=True)
class Evaluation:
    """What one candidate did on one shape."""

    shape: "Shape"
    verification: Verification
    counts: "Counts"
    timing: "Timing | None" = None

    @property
    def status(self) -> Status:
        return self.verification.status


def format_seconds(seconds: float) -> str:
    """A duration with a unit a kernel engineer reads at a glance (us below 1 ms)."""
    if seconds < 1e-3:
        return f"{seconds * 1e6:.2f} us"
    if seconds < 1.0:
        return f"{seconds * 1e3:.3f} ms"
    return f"{seconds:.3f} s"
