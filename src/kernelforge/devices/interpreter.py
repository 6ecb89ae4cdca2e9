"""Triton's CPU interpreter as a device, with its bf16 (and fp8 cast) arithmetic fixed.

Why this module exists
----------------------
``TRITON_INTERPRET=1`` runs ``@triton.jit`` kernels on CPU tensors through numpy. That is how
kernelforge tests kernels on machines without a GPU (CPU_TRITON.md, section 1). The interpreter
stores bfloat16 values as their raw 16-bit patterns (``_get_np_dtype`` maps ``tl.bfloat16`` to
``np.uint16``) and then runs numpy on those *bits* as if they were integers:

* ``tl.dot`` on bf16 multiplies bit patterns (errors around 1e10);
* ``+``, ``*``, ``maximum``, ``tl.sum``, ``tl.max``, ``tl.cumsum``, ``exp``... are integer
  arithmetic on the bits; comparisons order negative numbers backwards;
* a bf16 comparison yields a handle still typed bf16 but holding bools, so ``.to(tl.float32)``
  of it crashes;
* fp32 -> bf16 truncates, where the GPU rounds to nearest even (``cvt.rn.bf16x2.f32``);
  int -> bf16 and bf16 -> int casts convert the bits, not the values;
* ``tl.atomic_add`` on bf16 raises ("Unsupported data type").

GPT-OSS and most current models run in bf16, so without a fix every bf16 kernel "fails"
verification on CPU (or passes against a wrong reference). Upstream knows: triton-lang/triton
issue #11584; the fix PR #11585 was closed unmerged, and no release (3.1 through 3.9 share the
code) contains a fix.

The fix
-------
Kernels are left unchanged. :func:`patch_bf16` replaces methods of the interpreter's
``InterpreterBuilder`` (element-wise ops, fma, erf, rsqrt, casts, fp8 conversion, ``tl.dot``,
bf16 atomic add, NaN-padded descriptor loads) and of its ``ReduceOps``/``ScanOps`` with the
wrappers of :mod:`kernelforge.devices.interpreter_wrappers`, as listed in :data:`PATCHES`. When an
operand is bf16 the bits are widened to fp32 exactly, the operation runs in fp32, and the result
is rounded back to bf16 with round-to-nearest-even (NaN becomes CUDA's canonical ``0x7FFF``);
comparisons return int1 handles. fp32 -> fp8e4nv/fp8e5 conversions are fixed too (round to
nearest even, saturating like the GPU). Anything else goes to the original method untouched. The
numerics and why they round like the GPU: :mod:`kernelforge.devices.interpreter_numerics`.

Guard
-----
:func:`needs_bf16_fix` decides from the interpreter itself, not the version string: bf16 must be
stored as uint16 and a behaviour probe on the *original* methods (1 + 1, an fp32 -> bf16 tie, a
1x1 dot, a comparison's result type) must show the bug. :func:`patch_bf16` applies the patch
only then, and only if every method it wraps exists with the expected arity; otherwise, or if
the post-patch self-test fails (the patch is then rolled back), it warns with
:class:`InterpreterPatchWarning` and leaves the interpreter alone. It never raises. Nothing here
imports triton at module import time, so ``import kernelforge.devices.interpreter`` works on any
Triton (3.6 on the GPU machine) or none. When upstream fixes the bug, the probe says so and the
patch is skipped; ``tests/devices/test_interpreter_bf16.py`` has a strict xfail test that then
XPASSes, telling us to delete this patch.
"""

from __future__ import annotations

import os
import threading
import warnings
from dataclasses import dataclass
from typing import Any, Callable

import numpy as np

from kernelforge.devices import interpreter_wrappers as w
from kernelforge.devices.interpreter_checks import arity, bug_symptoms, self_test

__all__ = [
    "InterpreterPatchWarning",
    "enable",
    "is_patched",
    "needs_bf16_fix",
    "patch_bf16",
]


class InterpreterPatchWarning(RuntimeWarning):
    """The bf16 interpreter patch was not applied (unrecognised Triton internals)."""


# The originals are stored on the InterpreterBuilder class itself, so that a second import of this
# module (importlib.reload, two copies on sys.path) sees the patch and never wraps twice.
_MARK = "_kernelforge_bf16_originals"
_LOCK = threading.Lock()


@dataclass(frozen=True)
class Patch:
    """One replaced interpreter method: ``owner.name`` becomes ``make(parts, original)``.

    ``arity`` is the number of positional parameters (self included) the wrapper relies on, a
    minimum when ``at_least`` (extra ones are passed through). A required method that is missing
    or has another arity stops the whole patch; an ``optional`` one is then only left out (older
    Triton negates with 0 - x and has no descriptors), as it is when ``requires(parts)`` is false.
    """

    owner: str  # "InterpreterBuilder", "ReduceOps" or "ScanOps"
    name: str
    arity: int
    make: Callable[[w.InterpreterParts, Callable], Callable]
    at_least: bool = False
    optional: bool = False
    requires: Callable[[w.InterpreterParts], bool] | None = None

    @property
    def key(self) -> str:
        return f"{self.owner}.{self.name}"

    def arity_ok(self, fn: Callable) -> bool:
        got = arity(fn)
        return got is not None and (got >= self.arity if self.at_least else got == self.arity)


def _builder(name: str, arity: int, make: Callable, **extra: Any) -> Patch:
    return Patch("InterpreterBuilder", name, arity, make, **extra)


#: Every method the fix replaces, in the order they are installed.
PATCHES: tuple[Patch, ...] = (
    _builder("binary_op", 4, w.wrap_binary_op),
    _builder("unary_op", 3, w.wrap_unary_op),
    _builder("ternary_op", 5, w.wrap_ternary_op),
    _builder("create_fneg", 2, w.wrap_create_fneg, optional=True),
    _builder("create_fma", 4, w.wrap_create_fma),
    _builder("create_erf", 2, w.wrap_create_erf),
    _builder("create_rsqrt", 2, w.wrap_create_rsqrt),
    _builder("create_fp_to_fp", 4, w.wrap_create_fp_to_fp),
    _builder("cast_impl", 3, w.wrap_cast_impl),
    _builder("create_dot", 4, w.wrap_create_dot, at_least=True),  # (self, a, b, d, ...)
    _builder("create_atomic_rmw", 7, w.wrap_create_atomic_rmw, optional=True,
             requires=lambda p: p.fadd_op is not None and hasattr(p.c_interp, "load") and hasattr(p.c_interp, "store")),
    _builder("create_descriptor_load", 4, w.wrap_create_descriptor_load, optional=True,
             requires=lambda p: p.pad_nan is not None),
    Patch("ReduceOps", "sum", 2, w.wrap_reduction),
    Patch("ReduceOps", "min_max", 3, w.wrap_min_max, at_least=True),
    Patch("ScanOps", "cumsum", 2, w.wrap_reduction),
    Patch("ScanOps", "cumprod", 2, w.wrap_reduction),
)
# Builder entry points that must route through the wrapped methods for the patch to be whole.
_USED_BUILDER_API = (
    "create_fadd", "create_fmul", "create_fcmpOLT", "create_maximumf", "create_exp", "create_fp_trunc",
    "create_fp_ext", "create_si_to_fp", "create_select", "create_clampf",
)


# -- finding the interpreter and checking its shape ----------------------------------------------


def _interpreter_module() -> Any:
    """triton.runtime.interpreter, or None where triton is absent or does not import."""
    try:
        import triton.runtime.interpreter as interp  # noqa: PLC0415 (lazy: triton is optional here)
    except Exception:
        return None
    return interp


def _tl() -> Any:
    import triton.language as tl  # noqa: PLC0415

    return tl


def _shape_problems(interp: Any) -> list[str]:
    """What in this interpreter the patch does not recognise (empty: all recognised)."""
    problems: list[str] = []
    try:
        tl = _tl()
    except Exception as exc:  # pragma: no cover - triton.language broken
        return [f"triton.language does not import ({exc!r})"]
    for name in ("bfloat16", "float32", "int1", "float8e4nv", "float8e5", "block_type"):
        if not hasattr(tl, name):
            problems.append(f"triton.language.{name} missing")
    for name in ("TensorHandle", "InterpreterBuilder", "ReduceOps", "ScanOps", "_get_np_dtype",
                 "interpreter_builder"):
        if not hasattr(interp, name):
            problems.append(f"triton.runtime.interpreter.{name} missing")
    if problems:
        return problems
    originals = _originals(interp)  # once patched, judge the originals, not our wrappers
    for patch in PATCHES:
        if patch.optional:
            continue
        fn = originals.get(patch.key, getattr(getattr(interp, patch.owner), patch.name, None))
        if not callable(fn):
            problems.append(f"{patch.key} missing")
        elif not patch.arity_ok(fn):
            problems.append(f"{patch.key} takes {arity(fn)} positional parameters, expected {patch.arity}")
    for name in _USED_BUILDER_API:
        if not callable(getattr(interp.InterpreterBuilder, name, None)):
            problems.append(f"InterpreterBuilder.{name} missing")
    try:
        if np.dtype(interp._get_np_dtype(tl.bfloat16)) != np.uint16:
            problems.append(f"bf16 is stored as {interp._get_np_dtype(tl.bfloat16)}, not as uint16 bits")
    except Exception as exc:
        problems.append(f"_get_np_dtype(bfloat16) failed ({exc!r})")
    return problems


def _originals(interp: Any) -> dict[str, Callable]:
    return dict(interp.InterpreterBuilder.__dict__.get(_MARK, {}))


def needs_bf16_fix() -> bool:
    """True when this Triton's interpreter stores bf16 as uint16 bits and computes on the bits.

    Decided by inspecting and probing the interpreter (original methods, even after patching),
    not by the version string. False when triton is missing, when the internals are not what
    the patch understands, or when upstream has fixed the bug.
    """
    interp = _interpreter_module()
    if interp is None:
        return False
    try:
        if _shape_problems(interp):
            return False
        return bool(bug_symptoms(interp, _tl(), _originals(interp)))
    except Exception:
        return False


def is_patched() -> bool:
    """True when the bf16 patch is installed in this process's Triton interpreter."""
    interp = _interpreter_module()
    builder_cls = getattr(interp, "InterpreterBuilder", None)
    return builder_cls is not None and _MARK in builder_cls.__dict__


# -- the patch -------------------------------------------------------------------------------------


def _make_patch(interp: Any) -> dict[str, tuple[type, str, Callable]]:
    """Build the replacement methods of :data:`PATCHES`. Returns {key: (class, attribute, new function)}."""
    parts = w.InterpreterParts.of(interp, _tl())
    new: dict[str, tuple[type, str, Callable]] = {}
    for patch in PATCHES:
        cls = getattr(interp, patch.owner)
        if patch.optional:
            present = getattr(cls, patch.name, None)
            if not (callable(present) and patch.arity_ok(present)):
                continue
            if patch.requires is not None and not patch.requires(parts):
                continue
        fn = patch.make(parts, getattr(cls, patch.name))
        fn.__name__ = patch.name
        fn.__qualname__ = patch.key
        fn.__doc__ = f"kernelforge bf16 fix around the interpreter's {patch.key} (see kernelforge.devices.interpreter)."
        new[patch.key] = (cls, patch.name, fn)
    return new


def _install(interp: Any, new: dict[str, tuple[type, str, Callable]]) -> None:
    originals: dict[str, Callable] = {}
    for key, (cls, attr, fn) in new.items():
        originals[key] = cls.__dict__[attr] if attr in cls.__dict__ else getattr(cls, attr)
        setattr(cls, attr, fn)
    setattr(interp.InterpreterBuilder, _MARK, originals)


def _uninstall(interp: Any) -> None:
    """Put the original methods back (used to roll back a patch whose self-test failed)."""
    builder_cls = interp.InterpreterBuilder
    originals = builder_cls.__dict__.get(_MARK)
    if originals is None:
        return
    classes = {cls.__name__: cls for cls in (builder_cls, interp.ReduceOps, interp.ScanOps)}
    for key, fn in originals.items():
        cls_name, attr = key.split(".", 1)
        setattr(classes[cls_name], attr, fn)
    delattr(builder_cls, _MARK)


def patch_bf16() -> bool:
    """Fix bf16 (and fp8e4nv/fp8e5 casts) in Triton's interpreter, once. Never raises.

    Returns True when the patch is in place after the call. Applies it only when
    :func:`needs_bf16_fix` finds the bug; warns (:class:`InterpreterPatchWarning`) and changes
    nothing when the interpreter's internals are not the shape the patch was written for.
    """
    with _LOCK:
        interp = _interpreter_module()
        if interp is None:
            return False
        if is_patched():
            return True
        try:
            problems = _shape_problems(interp)
            if problems:
                warnings.warn(
                    "kernelforge: Triton's interpreter internals are not what the bf16 fix expects "
                    f"({'; '.join(problems)}); bf16 kernels run unpatched and may be wrong under "
                    "TRITON_INTERPRET=1. Check kernelforge/devices/interpreter.py against this Triton.",
                    InterpreterPatchWarning,
                    stacklevel=2,
                )
                return False
            if not bug_symptoms(interp, _tl(), _originals(interp)):
                return False  # fixed upstream: nothing to do (the strict xfail test reports it)
            _install(interp, _make_patch(interp))
            failures = self_test(interp, _tl(), _originals(interp))
            if failures:
                _uninstall(interp)
                warnings.warn(
                    "kernelforge: the bf16 fix for Triton's interpreter failed its self-test "
                    f"({'; '.join(failures)}) and was rolled back; bf16 kernels run unpatched.",
                    InterpreterPatchWarning,
                    stacklevel=2,
                )
                return False
            return True
        except Exception as exc:  # never let the patch break an import or a test session
            try:
                _uninstall(interp)
            except Exception:
                pass
            warnings.warn(f"kernelforge: could not patch Triton's interpreter for bf16 ({exc!r}).",
                          InterpreterPatchWarning, stacklevel=2)
            return False


def enable() -> None:
    """Turn the interpreter on for kernels decorated from now on, and fix its bf16 and (Triton
    3.6 with NumPy 2.4) its scalars used as integers (:mod:`kernelforge.devices.interpreter_index`).

    ``TRITON_INTERPRET`` is read when ``@triton.jit`` decorates a function, so call this before
    importing any module that defines kernels.
    """
    from kernelforge.devices.interpreter_index import patch_scalar_index

    os.environ["TRITON_INTERPRET"] = "1"
    patch_bf16()
    patch_scalar_index()
