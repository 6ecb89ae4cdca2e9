"""Records of what happened to a candidate: statuses, verification outcomes, timings, and the
stored result the search, the objective and the reports read back.

Every outcome is data (EVALUATION.md): a failed candidate is a stored result with a status and a
message, never an exception that stops a search.
"""

from __future__ import annotations

import hashlib
import json
import time
from dataclasses import dataclass, field
from enum import Enum
from typing import TYPE_CHECKING, Any, Iterable

from kernelforge.textsafe import MESSAGE, TRACEBACK, cut, printable

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

    ``rel_error`` is the worst ``||out - ref|| / ||ref||`` over the checks run (and over the
    floating-point outputs of a block with several); ``excess`` the worst elementwise
    ``|out - ref| / (atol * rms(ref) + rtol * |ref|)`` (above 1 fails). ``message`` is one line
    (it names the failing output of a block with several). ``traceback`` is the candidate's full
    Python traceback when its import or its call raised (``check --verbose`` prints it); it is not
    part of the verdict (not compared, not stored).
    """

    status: Status
    rel_error: float | None = None
    excess: float | None = None
    checks: int = 0
    message: str = ""
    traceback: str = field(default="", compare=False, repr=False)

    def __post_init__(self) -> None:
        # A candidate writes much of this text (its exceptions, its output): no terminal escapes
        # or control characters reach a terminal or the database (kernelforge.textsafe).
        object.__setattr__(self, "message", cut(printable(str(self.message)), MESSAGE))
        object.__setattr__(self, "traceback", cut(printable(str(self.traceback)), TRACEBACK))

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


def env_key(env: dict[str, Any]) -> str:
    """What makes two measurements comparable: device and library versions (not clocks). Results
    are unique per (candidate, shape, dtype, env_key) and only compared within one env_key."""
    keep = {k: env.get(k) for k in ("device", "device_name", "capability", "torch", "triton", "cuda", "driver")}
    return hashlib.sha256(json.dumps(keep, sort_keys=True).encode()).hexdigest()[:16]


@dataclass(frozen=True)
class StoredResult:
    """One stored result (a row of the results database): what one candidate did on one shape in
    one environment (``env``, identified by ``env_key``). Times are seconds; None when not timed."""

    candidate_id: str
    block: str
    shape: str
    dtype: str
    device: str
    env_key: str
    status: Status
    rel_error: float | None
    median_s: float | None
    p20_s: float | None
    p80_s: float | None
    samples: int | None
    timing_method: str | None
    timing_label: str | None
    joules: float | None
    flops: float | None
    bytes: float | None
    message: str
    env: dict[str, Any]
    job: str | None
    created: float
    excess: float | None = None
    #: Host seconds to enqueue one call (the launch overhead wherever it is not graph-captured):
    #: a CUDA timing's ``extra["host_launch_s"]``; None elsewhere.
    host_launch_s: float | None = None

    @property
    def ok(self) -> bool:
        return self.status is Status.OK

    @classmethod
    def of(cls, candidate_id: str, block: str, ev: "Evaluation", *, dtype: str, device: str, env: dict[str, Any],
           env_key: str, job: str | None) -> "StoredResult":
        """The stored form of one evaluation: the one place an :class:`Evaluation` becomes a row."""
        t, v = ev.timing, ev.verification
        launch = t.extra.get("host_launch_s") if t else None
        return cls(
            candidate_id=candidate_id, block=block, shape=ev.shape.name, dtype=dtype, device=device,
            env_key=env_key, status=v.status, rel_error=v.rel_error, median_s=t.median_s if t else None,
            p20_s=t.p20_s if t else None, p80_s=t.p80_s if t else None, samples=t.samples if t else None,
            timing_method=t.method if t else None, timing_label=t.label if t else None,
            joules=t.joules_per_call if t else None, flops=ev.counts.flops, bytes=ev.counts.bytes, message=v.message,
            env=dict(env), job=job, created=time.time(), excess=v.excess,
            host_launch_s=float(launch) if isinstance(launch, (int, float)) else None,
        )


def resource_rejected(compile_status: str | None, results: Iterable[StoredResult]) -> bool:
    """Whether a candidate's stored ``results`` are a resource rejection: its ahead-of-time compile
    for the run's target ended ``rejected`` (``compile_status``, the stored compile's: a kernel over
    the target's shared memory, threads or tensor memory, see
    :func:`kernelforge.compile.resources.limit_problems`) and so every result is ``rejected``:
    nothing of it ran. Such a configuration is infeasible on that target, not a failed evaluation:
    the search tells its strategy ``infeasible`` and charges no budget. A compile error, a policy
    rejection (no compile) or an executor's rejection (the compile was ``ok``) is the candidate's
    failure, an evaluation like any other. The one place this is decided (the search, its resume)."""
    results = list(results)
    return (compile_status == Status.REJECTED.value and bool(results)
            and all(r.status is Status.REJECTED for r in results))


def format_seconds(seconds: float) -> str:
    """A duration with a unit a kernel engineer reads at a glance (us below 1 ms)."""
    if seconds < 1e-3:
        return f"{seconds * 1e6:.2f} us"
    if seconds < 1.0:
        return f"{seconds * 1e3:.3f} ms"
    return f"{seconds:.3f} s"
