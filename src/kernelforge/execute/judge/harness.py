"""Harness integrity: has a candidate replaced a function the verdicts or timings rely on?

:func:`harness_snapshot` records those functions (``torch.equal``, ``time.perf_counter``, every
function of the verification, timing and device modules...) before a candidate is imported, and
:func:`harness_changes` names the ones that are no longer the same objects (evaluator tampering,
EVALUATION.md #12 and #15). The worker process also compares against a snapshot of a clean worker
before serving the next candidate.
"""

from __future__ import annotations

import math
import sys
import threading
import time
from typing import Any

import torch

#: Packages whose loaded modules make the verdicts and the timings: every callable in them is
#: watched, imported names included (a candidate that replaces ``kernelforge.execute.judge.verify.check``
#: changes what verify calls even though the function lives in another module).
HARNESS_PACKAGES = ("kernelforge.execute.", "kernelforge.devices.")


def _library_objects() -> list[tuple[str, Any, str]]:
    from triton.runtime.jit import JITFunction

    items: list[tuple[str, Any, str]] = []
    for name in ("equal", "isfinite", "isnan", "nonzero", "randn", "randint", "empty", "empty_like", "zeros"):
        items.append((f"torch.{name}", torch, name))
    items.append(("torch.linalg.vector_norm", torch.linalg, "vector_norm"))
    for name in ("__eq__", "__ne__", "__sub__", "sum", "copy_", "fill_", "clone", "to", "float", "double", "abs",
                 "max", "std", "pow", "mean", "view", "reshape", "contiguous", "data_ptr", "stride", "any", "all",
                 "__bool__", "__float__", "__int__", "item"):
        items.append((f"torch.Tensor.{name}", torch.Tensor, name))
    for name in ("synchronize", "Event"):
        items.append((f"torch.cuda.{name}", torch.cuda, name))
    for name in ("record", "elapsed_time", "synchronize"):
        items.append((f"torch.cuda.Event.{name}", torch.cuda.Event, name))
    for name in ("perf_counter", "time", "monotonic"):
        items.append((f"time.{name}", time, name))
    items.append(("threading.active_count", threading, "active_count"))
    items.append(("math.isfinite", math, "isfinite"))
    items.append(("triton JITFunction.run", JITFunction, "run"))
    try:
        from triton.runtime.interpreter import InterpretedFunction

        items.append(("triton InterpretedFunction.run", InterpretedFunction, "run"))
    except ImportError:  # pragma: no cover
        pass
    return items


def harness_objects() -> list[tuple[str, Any, str]]:
    """(label, owner, attribute) of every function the harness's verdicts and timings rely on:
    library functions, and every callable of the loaded modules of :data:`HARNESS_PACKAGES`
    (with the methods of the classes defined there)."""
    items = _library_objects()
    # A copy first (one C call): another thread importing meanwhile must not break the iteration.
    for module_name, module in sorted(sys.modules.copy().items()):
        if module is None or not module_name.startswith(HARNESS_PACKAGES):
            continue
        for name, value in list(vars(module).items()):
            if name.startswith("__") or not callable(value):
                continue
            items.append((f"{module_name}.{name}", module, name))
            if isinstance(value, type) and getattr(value, "__module__", None) == module_name:
                for attr, member in list(vars(value).items()):
                    if callable(member) and not attr.startswith("__"):
                        items.append((f"{module_name}.{name}.{attr}", value, attr))
    return items


def _current(owner: Any, attr: str) -> Any:
    return owner.__dict__.get(attr, getattr(owner, attr, None)) if isinstance(owner, type) else getattr(owner, attr, None)


def harness_snapshot(*extra: tuple[str, Any, str]) -> list[tuple[str, Any, str, Any]]:
    """The current value of every harness function (plus ``extra`` (label, owner, attribute)
    entries, e.g. the device's ``time`` and the block's ``reference``), to compare later with
    :func:`harness_changes`. Taken before a candidate is imported."""
    return [(label, owner, attr, _current(owner, attr)) for label, owner, attr in [*harness_objects(), *extra]]


def harness_changes(snapshot: list[tuple[str, Any, str, Any]]) -> list[str]:
    """Labels of the harness functions that are no longer the objects recorded in ``snapshot``:
    a candidate replaced them (evaluator tampering, EVALUATION.md #12 and #15)."""
    return [label for label, owner, attr, value in snapshot if _current(owner, attr) is not value]


def reset_candidate_state() -> None:
    """Undo the process-wide settings a candidate may make and the next candidate would inherit,
    once a candidate's session ends: Triton's global allocator (``triton.set_allocator`` is
    allowed, for the workspace of device-side tensor descriptors) goes back to Triton's default,
    which allocates nothing."""
    try:
        from triton.runtime import _allocation
    except ImportError:  # a Triton without a global allocator: nothing to reset
        return
    default = getattr(_allocation, "_NULL_ALLOCATOR", None)
    if default is not None:
        _allocation._allocator.set(default)
