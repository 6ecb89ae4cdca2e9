"""Behaviour checks of Triton's interpreter for the bf16 fix, on tiny inputs.

:func:`bug_symptoms` runs the *original* methods and lists the bf16 bugs it sees (none: upstream
fixed them, and the patch is not needed); :func:`self_test` runs the *patched* interpreter through
its public builder entry points (a failure rolls the patch back). Both are given the interpreter
module and ``triton.language``, so nothing here imports triton.
"""

from __future__ import annotations

import inspect
from typing import Any, Callable

import numpy as np

from kernelforge.devices.interpreter_numerics import bf16_bits_to_f32, f32_to_bf16_bits


def arity(fn: Callable) -> int | None:
    """Positional parameters of ``fn`` (99 with ``*args``; None when it has no signature)."""
    try:
        params = inspect.signature(fn).parameters.values()
    except (TypeError, ValueError):
        return None
    if any(p.kind is p.VAR_POSITIONAL for p in params):
        return 99
    return sum(p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD) for p in params)


def bug_symptoms(interp: Any, tl: Any, originals: dict[str, Callable]) -> list[str]:
    """Run the *original* (unpatched) builder methods on tiny bf16 inputs; list what is wrong.

    ``originals`` holds the methods the patch replaced, by ``Class.name`` (empty when unpatched).
    """
    builder_cls = interp.InterpreterBuilder
    orig = originals

    def method(name: str) -> Callable:
        return orig.get(f"InterpreterBuilder.{name}", getattr(builder_cls, name))

    b = interp.interpreter_builder
    H = interp.TensorHandle
    one = H(np.array([0x3F80], dtype=np.uint16), tl.bfloat16)
    symptoms: list[str] = []

    def check(label: str, fn: Callable[[], bool]) -> None:
        try:
            if not fn():
                symptoms.append(label)
        except Exception as exc:
            symptoms.append(f"{label} (raised {type(exc).__name__})")

    check("bf16 1 + 1 != 2", lambda: int(method("binary_op")(b, one, one, np.add).data[0]) == 0x4000)
    check("bf16 comparison result is not int1",
          lambda: method("binary_op")(b, one, one, np.less).dtype == tl.int1)
    # 1 + 2^-8 + 2^-9 lies above the tie between two bf16 neighbours: RNE rounds up to 0x3F81.
    check("fp32 -> bf16 does not round to nearest even",
          lambda: int(method("cast_impl")(b, H(np.array([0x3F80C000], np.uint32).view(np.float32), tl.float32),
                                          tl.bfloat16).data[0]) == 0x3F81)

    def dot_ok() -> bool:
        a = H(np.full((1, 1), 0x3F80, dtype=np.uint16), tl.bfloat16)
        acc = H(np.zeros((1, 1), dtype=np.float32), tl.float32)
        fn = method("create_dot")
        extra = [None] * max(0, (arity(fn) or 4) - 4)
        return float(fn(b, a, a, acc, *extra).data[0, 0]) == 1.0

    check("bf16 tl.dot is wrong", dot_ok)
    return symptoms


def self_test(interp: Any, tl: Any, originals: dict[str, Callable]) -> list[str]:
    """Check the patched interpreter through its public builder entry points; list what failed.

    ``originals`` holds the methods the patch replaced, by ``Class.name``.
    """
    b = interp.interpreter_builder
    H = interp.TensorHandle

    def bf(*vals: float) -> Any:
        return H(f32_to_bf16_bits(np.array(vals, dtype=np.float32)), tl.bfloat16)

    def f32(*vals: float) -> Any:
        return H(np.array(vals, dtype=np.float32), tl.float32)

    failures: list[str] = []

    def check(label: str, fn: Callable[[], bool]) -> None:
        try:
            if not fn():
                failures.append(label)
        except Exception as exc:
            failures.append(f"{label} (raised {exc!r})")

    check("add", lambda: bf16_bits_to_f32(b.create_fadd(bf(1.5, -2.0), bf(2.25, 0.5)).data).tolist() == [3.75, -1.5])
    check("compare", lambda: (lambda r: r.dtype == tl.int1 and r.data.tolist() == [True, False])(
        b.create_fcmpOLT(bf(-1.0, 1.0), bf(1.0, -1.0))))
    tie_bits = np.array([0x3F808000, 0x3F818000, 0x3F80C000], np.uint32).view(np.float32)
    check("fp32->bf16 RNE", lambda: b.create_fp_trunc(H(tie_bits, tl.float32), tl.bfloat16).data.tolist()
          == [0x3F80, 0x3F82, 0x3F81])
    check("bf16->fp32", lambda: b.create_fp_ext(bf(-3.0), tl.float32).data.tolist() == [-3.0])
    ones = H(np.full((2, 2), 0x3F80, np.uint16), tl.bfloat16)
    acc = H(np.zeros((2, 2), np.float32), tl.float32)
    dot_extra = [None] * max(0, (arity(originals["InterpreterBuilder.create_dot"]) or 4) - 4)
    check("dot", lambda: float(b.create_dot(ones, ones, acc, *dot_extra).data[0, 0]) == 2.0)
    rtne = getattr(getattr(getattr(interp, "_ir", None), "ROUNDING_MODE", None), "RTNE", None)
    check("fp32->fp8e4nv", lambda: b.create_fp_to_fp(f32(1.0625, 1.1875, 1000.0), tl.float8e4nv, rtne).data.tolist()
          == [0x38, 0x3A, 0x7E])

    def reduce_ok() -> bool:
        t = tl.tensor(bf(1.0, -2.0, 4.0, 0.0), tl.block_type(tl.bfloat16, [4]))
        r = interp.ReduceOps(0, None, False).sum(t)
        return bf16_bits_to_f32(r.handle.data).tolist() == [3.0] and r.handle.data.dtype == np.uint16

    check("sum", reduce_ok)
    return failures
