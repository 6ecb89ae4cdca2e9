"""One guarded call of a candidate, and the checks made around it (EVALUATION.md #5, #6, #11, #14).

:func:`guarded_call` runs ``run(**inputs, **outputs)`` once and then requires that a Triton kernel
was launched (no torch fallback); that every tensor the candidate writes (outputs and in-place
inputs) is still the same tensor (exact type, pointer, shape, strides, dtype, device); that a
byte fingerprint of each, taken when the call returns, equals one taken after a full device
synchronisation (work deferred to another stream or thread shows up here); that no thread is left
running; and that the host code did not compute with torch on floating-point tensors (a
``TorchDispatchMode`` watches every torch operation outside Triton launches: allocation, copies,
views and integer index arithmetic are allowed, ``x * alpha + y`` is not). A failed check raises
:class:`Rejected` with the candidate's status.
"""

from __future__ import annotations

import threading
import traceback
from contextlib import contextmanager
from typing import Any, Callable, Iterator, Mapping

import torch

from kernelforge.execute.fingerprint import fingerprint, synchronize
from kernelforge.result import Status

RunFn = Callable[..., Any]

#: Characters of a candidate's traceback kept with its verdict (``check --verbose`` prints it).
TRACEBACK_CHARS = 20000


class Rejected(Exception):
    """A check failed: the candidate's ``status``, a one-line message, and the traceback of its
    exception when it raised one."""

    def __init__(self, status: Status, message: str, traceback: str = ""):
        super().__init__(message)
        self.status = status
        self.traceback = traceback


def raised(exc: BaseException, prefix: str = "") -> Rejected:
    """The ``runtime_error`` verdict of an exception the candidate raised (being handled now)."""
    message = f"{prefix}{type(exc).__name__}: {exc}".strip()[:2000]
    return Rejected(Status.RUNTIME_ERROR, message, traceback.format_exc()[-TRACEBACK_CHARS:])


@contextmanager
def count_launches(guard: "HostComputeGuard | None" = None) -> Iterator[list[int]]:
    """Count Triton kernel launches (JIT and interpreter) inside the block: ``counter[0]``.

    With a ``guard``, torch operations made *inside* a launch (the interpreter moves tensors
    through numpy with torch copies) are not the candidate's host code and are not watched.
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
            if guard is not None:
                guard.depth += 1
            try:
                return original(self, *args, **kwargs)
            finally:
                if guard is not None:
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
#: dtype conversions, views, concatenation, reads. Anything else on a floating-point tensor outside
#: a Triton launch is the candidate computing (part of) its result with torch (EVALUATION.md #6).
FLOAT_HOST_OPS = frozenset({
    "empty", "empty_like", "empty_strided", "new_empty", "new_empty_strided", "zeros", "zeros_like",
    "new_zeros", "ones", "ones_like", "new_ones", "full", "full_like", "new_full", "fill_", "zero_",
    "copy_", "clone", "_to_copy", "lift_fresh", "lift_fresh_copy", "detach", "alias", "view",
    "_unsafe_view", "reshape", "_reshape_alias", "as_strided", "transpose", "t", "permute", "expand",
    "select", "slice", "unsqueeze", "squeeze", "unbind", "split", "split_with_sizes", "chunk", "narrow",
    "view_as", "cat", "stack", "_local_scalar_dense", "index_select", "index", "gather", "resolve_conj",
    "resolve_neg", "is_same_size", "sym_size", "sym_stride", "sym_numel", "sym_storage_offset",
})


def _dispatch_mode_base() -> type:
    from torch.utils._python_dispatch import TorchDispatchMode

    return TorchDispatchMode


class HostComputeGuard:
    """Watches the torch operations a candidate's host code makes (a ``TorchDispatchMode``).

    ``violation`` is the first operation outside :data:`FLOAT_HOST_OPS` that touched a
    floating-point tensor (``"aten.mul.Tensor on torch.float16"``), or None. Operations made while
    ``depth > 0`` (inside a Triton launch) are ignored. Nothing is raised inside the candidate's
    call: an exception could be caught by its own ``except RuntimeError``; the verdict is read
    after the call returns.
    """

    def __init__(self) -> None:
        self.depth = 0
        self.violation: str | None = None
        guard = self

        class _Mode(_dispatch_mode_base()):
            def __torch_dispatch__(self, func, types, args=(), kwargs=None):
                kwargs = kwargs or {}
                if guard.depth == 0 and guard.violation is None:
                    guard._inspect(func, args, kwargs)
                return func(*args, **kwargs)

        self._mode = _Mode()

    def _inspect(self, func: Any, args: tuple, kwargs: dict) -> None:
        name = getattr(getattr(func, "overloadpacket", None), "__name__", str(func))
        if name in FLOAT_HOST_OPS:
            return
        for value in (*args, *kwargs.values()):
            values = value if isinstance(value, (list, tuple)) else (value,)
            for item in values:
                if isinstance(item, torch.Tensor) and (item.is_floating_point() or item.is_complex()):
                    self.violation = f"{func} on {item.dtype}"
                    return

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


def guarded_call(run: RunFn, inputs: Mapping[str, Any], outputs: Mapping[str, torch.Tensor],
                 watched: Mapping[str, torch.Tensor], device: torch.device, label: Callable[[str], str]) -> None:
    """Call ``run(**inputs, **outputs)`` once under every check of the module docstring.

    ``watched`` are the tensors the candidate writes, by name (the outputs and the in-place
    inputs); ``label(name)`` prefixes a message about one of them. Raises :class:`Rejected`.
    """
    before = {name: identity(tensor) for name, tensor in watched.items()}
    threads_before = threading.active_count()
    guard = HostComputeGuard()
    with count_launches(guard) as launches:
        try:
            with guard:
                run(**inputs, **outputs)
        except Exception as exc:  # the candidate's failure is data, not a crash of the harness
            raise raised(exc) from None
    try:
        early = {name: fingerprint(tensor) for name, tensor in watched.items()}
        synchronize(device)
        late = {name: fingerprint(tensor) for name, tensor in watched.items()}
    except Exception as exc:  # an asynchronous fault of the candidate's kernels (CUDA error) surfaces here
        raise raised(exc) from None
    if launches[0] == 0:
        raise Rejected(Status.REJECTED, "no Triton kernel was launched (fallback to another implementation?)")
    for name, tensor in watched.items():
        if type(tensor) is not torch.Tensor or identity(tensor) != before[name]:
            raise Rejected(Status.REJECTED, f"{label(name)}the output tensor was replaced, resized or re-typed")
    for name in watched:
        if not torch.equal(early[name], late[name]):
            raise Rejected(Status.REJECTED, f"{label(name)}output changed after the call returned (work deferred "
                                            "to another stream or thread)")
    if threading.active_count() > threads_before:
        raise Rejected(Status.REJECTED, "the candidate left background threads running")
    if guard.violation is not None:
        raise Rejected(Status.REJECTED, f"host code computed with torch ({guard.violation}); torch may only "
                                        "allocate, copy, view and index on the host: compute in a Triton kernel")
