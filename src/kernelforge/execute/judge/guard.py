"""One call of a candidate, and the checks made around it by the process that runs it
(EVALUATION.md #5, #6, #11, #14).

:func:`run_call` runs ``run(**args)`` once and then requires that a Triton kernel was launched (no
torch fallback); that every tensor the candidate writes (outputs and in-place inputs) is still the
same tensor (exact type, pointer, shape, strides, dtype, device); that no thread is left running;
and that the host code did not compute with torch (a ``TorchDispatchMode`` watches every torch
operation outside Triton launches: allocation, copies and views are allowed, ``x * alpha + y`` on
floating-point tensors is not, and integer arithmetic only within a budget of the size of the
call's tensors: the index work of host-side routing, not a computation in fixed point). Code of the
candidate's that Triton calls during a launch (a grid callable, the allocator) is host code too,
watched as such. What failed is a :class:`CallReport`; :func:`settle` is the full device
synchronisation that follows.

These checks run where the candidate runs (the worker), so a candidate could defeat them: they are
extra signals that can only make a verdict worse. The verdict itself is made by the trusted side
(:mod:`kernelforge.execute.judge.verify`), from the bytes the call wrote, read once when the call
returned and again after :func:`settle` (work deferred to another stream or thread shows there).
"""

from __future__ import annotations

import functools
import threading
import traceback
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any, Callable, Iterator, Mapping, Sequence

import torch

from kernelforge.execute.judge.fingerprint import synchronize
from kernelforge.result import Status
from kernelforge.textsafe import cut, tail

RunFn = Callable[..., Any]

#: Characters of a candidate's traceback kept with its verdict (``check --verbose`` prints it).


class Rejected(Exception):
    """A check failed: the candidate's ``status``, a one-line message, and the traceback of its
    exception when it raised one."""

    def __init__(self, status: Status, message: str, traceback: str = ""):
        super().__init__(message)
        self.status = status
        self.traceback = traceback


def raised(exc: BaseException, prefix: str = "") -> Rejected:
    """The ``runtime_error`` verdict of an exception the candidate raised (being handled now)."""
    message = cut(f"{prefix}{type(exc).__name__}: {exc}".strip())
    return Rejected(Status.RUNTIME_ERROR, message, tail(traceback.format_exc()))


def _as_host_code(guard: "HostComputeGuard", function: Callable[..., Any]) -> Callable[..., Any]:
    """``function`` (the candidate's, called by Triton inside a launch) watched as the host code it
    is: while it runs the guard sees what it sees outside the launch."""
    outer = guard.depth

    def call(*args: Any, **kwargs: Any) -> Any:
        inner, guard.depth = guard.depth, outer
        try:
            return function(*args, **kwargs)
        finally:
            guard.depth = inner

    return call


@contextmanager
def _allocator_as_host_code(guard: "HostComputeGuard") -> Iterator[None]:
    """The allocator set with ``triton.set_allocator`` (called inside a launch for a kernel's
    global scratch) watched as host code for the duration of one launch."""
    try:
        from triton.runtime import _allocation
    except ImportError:  # pragma: no cover - a Triton without runtime allocation
        yield
        return
    var = getattr(_allocation, "_allocator", None)
    current = var.get() if var is not None and hasattr(var, "get") else None
    if current is None or not hasattr(var, "set"):
        yield
        return
    token = var.set(_as_host_code(guard, current))
    try:
        yield
    finally:
        if hasattr(var, "reset") and token is not None:
            var.reset(token)
        else:
            var.set(current)


@contextmanager
def count_launches(guard: "HostComputeGuard | None" = None) -> Iterator[list[int]]:
    """Count Triton kernel launches (JIT and interpreter) inside the block: ``counter[0]``.

    With a ``guard``, torch operations made *inside* a launch (the interpreter moves tensors
    through numpy with torch copies) are not the candidate's host code and are not watched; the
    candidate's own functions Triton calls there (a grid callable, the allocator) are.
    """
    from triton.runtime.jit import JITFunction

    classes: list[type] = [JITFunction]
    try:
        from triton.runtime.interpreter import InterpretedFunction

        classes.append(InterpretedFunction)
    except ImportError:  # pragma: no cover - interpreter missing from a build
        pass
    counter = [0]
    originals = {cls: cls.run for cls in classes}

    def wrap(original):
        def run(self, *args, **kwargs):
            if not kwargs.get("warmup", False):
                counter[0] += 1
            if guard is None:
                return original(self, *args, **kwargs)
            if callable(kwargs.get("grid")):
                kwargs["grid"] = _as_host_code(guard, kwargs["grid"])
            with _allocator_as_host_code(guard):
                guard.depth += 1
                try:
                    return original(self, *args, **kwargs)
                finally:
                    guard.depth -= 1

        return run

    for cls, original in originals.items():
        cls.run = wrap(original)
    try:
        yield counter
    finally:
        for cls, original in originals.items():
            cls.run = original


#: Host-side torch operations allowed on floating-point tensors: allocation, fills, copies and
#: dtype conversions, views, concatenation. Reading values into Python numbers
#: (``_local_scalar_dense``: ``float(t)``, ``.item()``) is not: the host would compute the result
#: with Python arithmetic (issue 10). Anything else on a floating-point tensor outside
#: a Triton launch is the candidate computing (part of) its result with torch (EVALUATION.md #6).
FLOAT_HOST_OPS = frozenset({
    "empty", "empty_like", "empty_strided", "new_empty", "new_empty_strided", "zeros", "zeros_like",
    "new_zeros", "ones", "ones_like", "new_ones", "full", "full_like", "new_full", "fill_", "zero_",
    "copy_", "clone", "_to_copy", "lift_fresh", "lift_fresh_copy", "detach", "alias", "view",
    "_unsafe_view", "reshape", "_reshape_alias", "as_strided", "transpose", "t", "permute", "expand",
    "select", "slice", "unsqueeze", "squeeze", "unbind", "split", "split_with_sizes", "chunk", "narrow",
    "view_as", "cat", "stack", "index_select", "index", "gather", "resolve_conj",
    "resolve_neg", "is_same_size", "sym_size", "sym_stride", "sym_numel", "sym_storage_offset",
})


#: Integer arithmetic the host code may do in one call, in elements, as a multiple of the elements
#: of the call's tensors (inputs and outputs): the routing of a MoE block (counts, offsets, a sort
#: of its token ids) takes a few passes over its small index tensors; a matmul computed in fixed
#: point takes K passes over its output.
INTEGER_WORK_FACTOR = 4


def _elements(value: Any) -> int:
    """The most elements of any tensor in ``value`` (a tensor, or a list or tuple of them)."""
    values = value if isinstance(value, (list, tuple)) else (value,)
    return max((item.numel() for item in values if isinstance(item, torch.Tensor)), default=0)


@functools.lru_cache(maxsize=1)
def _watching_mode() -> type:
    """The ``TorchDispatchMode`` that reports every operation to its guard (made once: a class
    made per call cost a timed call's host tens of microseconds)."""
    from torch.utils._python_dispatch import TorchDispatchMode

    class Watching(TorchDispatchMode):
        def __init__(self, guard: "HostComputeGuard") -> None:
            super().__init__()
            self.guard = guard

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            kwargs = kwargs or {}
            result = func(*args, **kwargs)
            guard = self.guard
            if guard.depth == 0 and guard.violation is None:
                guard._inspect(func, args, kwargs, result)
            return result

    return Watching


class HostComputeGuard:
    """Watches the torch operations a candidate's host code makes (a ``TorchDispatchMode``).

    ``violation`` is the first operation outside :data:`FLOAT_HOST_OPS` that touched a
    floating-point tensor (``"aten.mul.Tensor on torch.float16"``), or the one that took the
    integer work of the call past ``integer_budget`` elements (each such operation counts the
    elements of its largest tensor, operand or result), or None. Operations made while
    ``depth > 0`` (inside a Triton launch) are ignored. Nothing is raised inside the candidate's
    call: an exception could be caught by its own ``except RuntimeError``; the verdict is read
    after the call returns.
    """

    def __init__(self, integer_budget: int | None = None) -> None:
        self.depth = 0
        self.violation: str | None = None
        self.integer_budget = integer_budget
        self.integer_work = 0
        self._mode = _watching_mode()(self)

    def _inspect(self, func: Any, args: tuple, kwargs: dict, result: Any) -> None:
        name = getattr(getattr(func, "overloadpacket", None), "__name__", str(func))
        if name in FLOAT_HOST_OPS:
            return
        for value in (*args, *kwargs.values()):
            values = value if isinstance(value, (list, tuple)) else (value,)
            for item in values:
                if isinstance(item, torch.Tensor) and (item.is_floating_point() or item.is_complex()):
                    self.violation = f"{func} on {item.dtype}"
                    return
        if self.integer_budget is None:
            return
        self.integer_work += max(_elements(result), *(_elements(v) for v in (*args, *kwargs.values())), 1)
        if self.integer_work > self.integer_budget:
            self.violation = (f"{func} took its integer arithmetic past {self.integer_budget} elements "
                              f"({INTEGER_WORK_FACTOR}x the elements of the call's tensors)")

    def __enter__(self) -> "HostComputeGuard":
        self._mode.__enter__()
        return self

    def __exit__(self, *exc: Any) -> None:
        self._mode.__exit__(*exc)


def identity(tensor: torch.Tensor) -> tuple:
    """What must not change about a tensor the candidate writes: its exact type, pointer, shape,
    strides, dtype and device."""
    return (type(tensor), tensor.data_ptr(), tuple(tensor.shape), tuple(tensor.stride()), tensor.dtype,
            tensor.device)


@dataclass(frozen=True)
class CallReport:
    """What the side that ran a call saw (the worker, or this process in-process): ``status`` None
    when every check there passed, else the candidate's status with a one-line ``message`` (about
    the written tensor ``name`` when it concerns one) and the traceback of its exception.

    It can only make a verdict worse: an ``ok`` report is never a verdict, the trusted side still
    compares what the call wrote (:mod:`kernelforge.execute.judge.verify`).
    """

    status: Status | None = None
    message: str = ""
    name: str | None = None
    traceback: str = field(default="", repr=False)

    @property
    def ok(self) -> bool:
        return self.status is None

    @classmethod
    def of(cls, rejected: Rejected, name: str | None = None) -> "CallReport":
        return cls(rejected.status, str(rejected), name, rejected.traceback)


def run_call(run: RunFn, args: Mapping[str, Any], watched: Sequence[str], device: torch.device) -> CallReport:
    """Call ``run(**args)`` once under the checks of the module docstring that need the calling
    process (a launch counted, the written tensors ``watched`` still the same tensors, no thread
    left running, no torch compute on the host), and report what failed first. The candidate's
    exception is its ``runtime_error``; nothing raises."""
    before = {name: identity(args[name]) for name in watched}
    threads_before = threading.active_count()
    guard = HostComputeGuard(INTEGER_WORK_FACTOR * sum(_elements(v) for v in args.values()))
    with count_launches(guard) as launches:
        try:
            with guard:
                run(**args)
        except Exception as exc:  # the candidate's failure is data, not a crash of the harness
            return CallReport.of(raised(exc))
    if launches[0] == 0:
        return CallReport(Status.REJECTED, "no Triton kernel was launched (fallback to another implementation?)")
    for name in watched:
        tensor = args[name]
        if type(tensor) is not torch.Tensor or identity(tensor) != before[name]:
            return CallReport(Status.REJECTED, "the output tensor was replaced, resized or re-typed", name)
    if threading.active_count() > threads_before:
        return CallReport(Status.REJECTED, "the candidate left background threads running")
    if guard.violation is not None:
        return CallReport(Status.REJECTED, f"host code computed with torch ({guard.violation}); torch may only "
                                           "allocate, copy, view and index on the host: compute in a Triton kernel")
    return CallReport()


def settle(device: torch.device) -> CallReport:
    """Wait for all work of the call on ``device`` (every stream): an asynchronous fault of the
    candidate's kernels (a CUDA error) surfaces here, as its ``runtime_error``."""
    try:
        synchronize(device)
    except Exception as exc:
        return CallReport.of(raised(exc))
    return CallReport()
