"""The bf16 fix's replacement methods for Triton's interpreter, one small wrapper per entry point,
and :data:`WRAPPERS`, the table that says which method each one replaces.

Every wrapper has the same shape: ``wrap_x(parts, orig)`` returns the new method, which hands any
call without a bf16 (or, for casts, NVIDIA fp8) operand to ``orig`` untouched, and otherwise
widens bf16 bits to fp32 exactly, computes there and rounds back once
(:mod:`kernelforge.devices.interpreter_numerics`). Storage stays uint16, so loads, stores,
``where``, ``abs``, bitcasts and atomic CAS (which only move bits) need no wrapper. Installing,
guarding and rolling back are :mod:`kernelforge.devices.interpreter`'s job; nothing here imports
triton (the interpreter's pieces arrive in :class:`InterpreterParts`).
"""

from __future__ import annotations

import math
import warnings
from dataclasses import dataclass
from functools import partial
from typing import Any, Callable

import numpy as np

from kernelforge.devices.interpreter_numerics import (
    BF16_CANONICAL_NAN,
    FP8_FORMATS,
    bf16_bits_to_f32,
    f32_to_bf16_bits,
    f64_to_bf16_bits,
    fma_to_bf16_bits,
    to_bf16_bits,
)


@dataclass(frozen=True)
class InterpreterParts:
    """The pieces of ``triton.runtime.interpreter`` the wrappers use, looked up once per patch.
    The enum members are None on Triton versions without them (their wrappers are then skipped)."""

    tl: Any  # triton.language
    handle: Any  # TensorHandle(data, dtype)
    get_np_dtype: Callable[[Any], Any]
    bf16: Any
    f32: Any
    rtz_mode: Any  # ROUNDING_MODE.RTZ
    fadd_op: Any  # ATOMIC_OP.FADD
    pad_nan: Any  # PADDING_OPTION.PAD_NAN
    c_interp: Any  # the C helpers: load(ptrs, mask, other, dtype), store(ptrs, values, mask)
    original_fp_to_fp: Callable  # InterpreterBuilder.create_fp_to_fp before the patch

    @classmethod
    def of(cls, interp: Any, tl: Any) -> "InterpreterParts":
        ir = getattr(interp, "_ir", None)
        return cls(
            tl=tl, handle=interp.TensorHandle, get_np_dtype=interp._get_np_dtype, bf16=tl.bfloat16, f32=tl.float32,
            rtz_mode=getattr(getattr(ir, "ROUNDING_MODE", None), "RTZ", None),
            fadd_op=getattr(getattr(ir, "ATOMIC_OP", None), "FADD", None),
            pad_nan=getattr(getattr(ir, "PADDING_OPTION", None), "PAD_NAN", None),
            c_interp=getattr(interp, "_interpreter", None),
            original_fp_to_fp=interp.InterpreterBuilder.create_fp_to_fp,
        )

    def is_bf16(self, h: Any) -> bool:
        # Both checks: the dtype says bf16 and the data really are the uint16 bit patterns.
        data = getattr(h, "data", None)
        return getattr(data, "dtype", None) == np.uint16 and getattr(h, "dtype", None) == self.bf16

    def widen(self, h: Any) -> np.ndarray:
        return bf16_bits_to_f32(h.data) if self.is_bf16(h) else h.data

    def bf16_handle(self, x: np.ndarray) -> Any:
        return self.handle(to_bf16_bits(x), self.bf16)

    def is_rtz(self, mode: Any) -> bool:
        return self.rtz_mode is not None and mode is not None and mode == self.rtz_mode

    def fp_decode(self, h: Any) -> np.ndarray | None:
        """Exact float values of a float handle, or None for formats left to the interpreter."""
        dt = h.dtype
        if self.is_bf16(h):
            return bf16_bits_to_f32(h.data)
        fmt = FP8_FORMATS.get(getattr(dt, "name", ""))
        if fmt is not None:
            return fmt.decode(h.data)
        if dt in (self.tl.float16, self.tl.float32, self.tl.float64):
            return h.data
        return None


# -- element-wise arithmetic ------------------------------------------------------------------


def wrap_binary_op(p: InterpreterParts, orig: Callable) -> Callable:
    def binary_op(self, lhs, rhs, op):
        lb = p.is_bf16(lhs)
        if not (lb or p.is_bf16(rhs)):
            return orig(self, lhs, rhs, op)
        out = np.asarray(op(p.widen(lhs), p.widen(rhs)))
        if out.dtype == np.bool_:
            # Comparisons are int1, not "bf16 holding bools" (which made .to() crash).
            return p.handle(out, p.tl.int1)
        if lb:
            return p.bf16_handle(out)
        return p.handle(out.astype(p.get_np_dtype(lhs.dtype)), lhs.dtype)

    return binary_op


def wrap_unary_op(p: InterpreterParts, orig: Callable) -> Callable:
    def unary_op(self, arg, op):
        if not p.is_bf16(arg):
            return orig(self, arg, op)
        out = np.asarray(op(p.widen(arg)))
        return p.handle(out, p.tl.int1) if out.dtype == np.bool_ else p.bf16_handle(out)

    return unary_op


def wrap_ternary_op(p: InterpreterParts, orig: Callable) -> Callable:
    def ternary_op(self, lhs, rhs, other, op):
        # select (np.where) only moves bits: the original is right for bf16 too.
        if op is np.where or not (p.is_bf16(lhs) or p.is_bf16(rhs) or p.is_bf16(other)):
            return orig(self, lhs, rhs, other, op)
        out = np.asarray(op(p.widen(lhs), p.widen(rhs), p.widen(other)))
        if p.is_bf16(other):
            return p.bf16_handle(out)
        return p.handle(out.astype(p.get_np_dtype(other.dtype)), other.dtype)

    return ternary_op


def wrap_create_fneg(p: InterpreterParts, orig: Callable) -> Callable:
    def create_fneg(self, arg):
        if not p.is_bf16(arg):
            return orig(self, arg)
        # Flip the sign bit, as the GPU does (np.negative on uint16 is two's complement).
        return p.handle(np.bitwise_xor(arg.data, np.uint16(0x8000)), p.bf16)

    return create_fneg


def wrap_create_fma(p: InterpreterParts, orig: Callable) -> Callable:
    def create_fma(self, x, y, z):
        if not (p.is_bf16(x) or p.is_bf16(y) or p.is_bf16(z)):
            return orig(self, x, y, z)
        if not p.is_bf16(z):  # mixed types do not occur in Triton; keep the original's result type
            out = np.add(np.multiply(p.widen(x), p.widen(y), dtype=np.float64), p.widen(z), dtype=np.float64)
            return p.handle(out.astype(z.data.dtype), z.dtype)
        return p.handle(fma_to_bf16_bits(*np.broadcast_arrays(p.widen(x), p.widen(y), p.widen(z))), p.bf16)

    return create_fma


_ERF64 = np.vectorize(math.erf, otypes=[np.float64])


def wrap_create_erf(p: InterpreterParts, orig: Callable) -> Callable:
    def create_erf(self, arg):
        if not p.is_bf16(arg):
            return orig(self, arg)
        return p.bf16_handle(_ERF64(p.widen(arg).astype(np.float64)))

    return create_erf


def wrap_create_rsqrt(p: InterpreterParts, orig: Callable) -> Callable:
    def create_rsqrt(self, arg):
        if not p.is_bf16(arg):
            return orig(self, arg)
        with np.errstate(divide="ignore", invalid="ignore"):
            return p.bf16_handle(np.float32(1) / np.sqrt(p.widen(arg)))

    return create_rsqrt


# -- casts --------------------------------------------------------------------------------------


def wrap_create_fp_to_fp(p: InterpreterParts, orig: Callable) -> Callable:
    def create_fp_to_fp(self, src, dst_type, rounding_mode):
        dst = dst_type.scalar
        src_name = getattr(src.dtype, "name", "")
        dst_name = getattr(dst, "name", "")
        ours = ("bf16", *FP8_FORMATS)
        if src_name not in ours and dst_name not in ours:
            return orig(self, src, dst_type, rounding_mode)
        x = p.fp_decode(src)
        if x is None:  # an fp8 format we leave alone (e4b8, e5b16, e4b15): decode it there
            x = orig(self, src, p.f32, None).data
        rtz = p.is_rtz(rounding_mode)
        if dst == p.bf16:
            x = np.asarray(x)
            bits = f64_to_bf16_bits(x, rtz) if x.dtype == np.float64 else f32_to_bf16_bits(x, rtz)
            return p.handle(bits, p.bf16)
        fmt = FP8_FORMATS.get(dst_name)
        if fmt is not None:
            return p.handle(fmt.encode(x, rtz=rtz), dst)
        if dst in (p.tl.float16, p.tl.float32, p.tl.float64):
            return p.handle(np.asarray(x).astype(p.get_np_dtype(dst)), dst)
        # Another fp8 target: hand the interpreter an exact fp32 source.
        return orig(self, p.handle(np.asarray(x, dtype=np.float32), p.f32), dst_type, rounding_mode)

    return create_fp_to_fp


def wrap_cast_impl(p: InterpreterParts, orig: Callable) -> Callable:
    fp_to_fp = wrap_create_fp_to_fp(p, p.original_fp_to_fp)  # fp8 sources go through the fixed one

    # cast_impl serves create_fp_trunc / fp_ext / si_to_fp / ui_to_fp / fp_to_si / fp_to_ui.
    def cast_impl(self, src, dst_type):
        dst = dst_type.scalar
        src_bf16 = p.is_bf16(src)
        if not src_bf16 and dst != p.bf16:
            return orig(self, src, dst_type)
        if src_bf16 and dst == p.bf16:
            return p.handle(src.data.copy(), p.bf16)
        if src_bf16:  # bf16 -> fp32/fp64 (exact) or -> int (truncation, as for fp32)
            with np.errstate(invalid="ignore", over="ignore"):
                return p.handle(bf16_bits_to_f32(src.data).astype(p.get_np_dtype(dst)), dst)
        if getattr(src.dtype, "name", "").startswith("fp8"):
            return fp_to_fp(self, src, dst_type, None)
        data = np.asarray(src.data)
        if data.dtype.itemsize <= 2 or data.dtype == np.float32:
            # bool, 8/16-bit ints, fp16, fp32: exact in fp32, one rounding to bf16.
            return p.handle(f32_to_bf16_bits(data.astype(np.float32)), p.bf16)
        # fp64 and 32/64-bit ints: via float64 with round-to-odd (int64 beyond 2^53 may still
        # round twice; not worth more code).
        return p.handle(f64_to_bf16_bits(data.astype(np.float64)), p.bf16)

    return cast_impl


# -- dot ------------------------------------------------------------------------------------------


def wrap_create_dot(p: InterpreterParts, orig: Callable) -> Callable:
    def dot_operand(h: Any) -> np.ndarray:
        if p.is_bf16(h):
            return bf16_bits_to_f32(h.data)
        fmt = FP8_FORMATS.get(getattr(h.dtype, "name", ""))
        if fmt is not None:
            return fmt.decode(h.data)
        return h.data

    def is_fp8(h: Any) -> bool:
        return getattr(h.dtype, "name", "") in FP8_FORMATS

    def create_dot(self, a, b, d, *args, **kwargs):
        # fp8 operands too: decoded exactly to fp32 (products of fp8 are exact there) for a BLAS
        # matmul; the interpreter's own path converts through fp16 bits and is ~100x slower.
        if not (p.is_bf16(a) or p.is_bf16(b) or p.is_bf16(d) or is_fp8(a) or is_fp8(b)):
            return orig(self, a, b, d, *args, **kwargs)
        # bf16 products are exact in fp32 and the GPU accumulates them in fp32.
        acc_dtype = np.float32 if p.is_bf16(d) else d.data.dtype
        out = np.matmul(dot_operand(a), dot_operand(b), dtype=acc_dtype) + p.widen(d)
        return p.bf16_handle(out) if p.is_bf16(d) else p.handle(out.astype(d.data.dtype), d.dtype)

    return create_dot


# -- memory: atomics and tensor-descriptor loads ---------------------------------------------------


def wrap_create_atomic_rmw(p: InterpreterParts, orig: Callable) -> Callable:
    c_interp = p.c_interp

    def load(ptrs: np.ndarray, mask: np.ndarray) -> np.ndarray:
        return c_interp.load(ptrs, mask, np.zeros(ptrs.shape, dtype=np.uint16), np.dtype(np.uint16))

    def add(old_bits: np.ndarray, value_bits: np.ndarray) -> np.ndarray:
        return to_bf16_bits(bf16_bits_to_f32(old_bits) + bf16_bits_to_f32(value_bits))

    def create_atomic_rmw(self, rmwOp, ptr, val, mask, sem, scope):
        if rmwOp != p.fadd_op or not p.is_bf16(val):
            return orig(self, rmwOp, ptr, val, mask, sem, scope)
        sems = getattr(self, "ir_sem_to_interpreter_sem", None)
        if sems is not None and sem not in sems:
            raise ValueError(f"unsupported semantic {sem}")
        # The interpreter runs programs one after another, so an atomic add is a
        # load-add-store; lanes hitting the same address are applied in lane order.
        mask_data = np.ones(1, dtype=bool) if mask is None else np.asarray(mask.data, dtype=bool)
        ptrs, vals, masks = np.broadcast_arrays(ptr.data, val.data, mask_data)
        ptrs, vals, masks = ptrs.copy(), vals.copy(), masks.copy()
        flat_p, flat_v, flat_m = ptrs.reshape(-1), vals.reshape(-1), masks.reshape(-1)
        old = np.zeros(flat_p.shape, dtype=np.uint16)
        active = np.flatnonzero(flat_m)
        if len(np.unique(flat_p[active])) == len(active):
            old = load(flat_p, flat_m)
            c_interp.store(flat_p, add(old, flat_v), flat_m)
        else:
            for i in active:
                one_p, one_m = flat_p[i:i + 1], np.ones(1, dtype=bool)
                cur = load(one_p, one_m)
                old[i] = cur[0]
                c_interp.store(one_p, add(cur, flat_v[i:i + 1]), one_m)
        return p.handle(np.asarray(old, dtype=np.uint16).reshape(ptrs.shape), p.bf16)

    return create_atomic_rmw


def wrap_create_descriptor_load(p: InterpreterParts, orig: Callable) -> Callable:
    def create_descriptor_load(self, desc, indices, cache_policy):
        elem = getattr(getattr(getattr(desc, "base", None), "dtype", None), "element_ty", None)
        if elem != p.bf16 or getattr(desc, "padding", None) != p.pad_nan:
            return orig(self, desc, indices, cache_policy)
        # The original fills with float('nan') cast to uint16, i.e. 0: pad with bf16 NaN.
        with np.errstate(invalid="ignore"), warnings.catch_warnings():
            warnings.simplefilter("ignore", RuntimeWarning)
            result = orig(self, desc, indices, cache_policy)
        _, in_bounds = desc.materialize_pointers(indices)
        return p.handle(np.where(in_bounds.data, result.data, BF16_CANONICAL_NAN), p.bf16)

    return create_descriptor_load


# -- reductions and scans ---------------------------------------------------------------------------


def _retyped(p: InterpreterParts, t: Any, handle: Any, elem: Any) -> Any:
    ty = p.tl.block_type(elem, list(t.type.shape)) if t.type.is_block() else elem
    return p.tl.tensor(handle, ty)


def _back_to_bf16(p: InterpreterParts, result: Any) -> Any:
    # Only the fp32 values we produced go back to bf16; index results (int32) stay.
    if isinstance(result, (list, tuple)):
        return type(result)(_back_to_bf16(p, r) for r in result)
    if isinstance(result, p.tl.tensor) and result.handle.data.dtype == np.float32:
        return _retyped(p, result, p.handle(f32_to_bf16_bits(result.handle.data), p.bf16), p.bf16)
    return result


def wrap_reduction(p: InterpreterParts, orig: Callable, *, tuple_input: bool = False) -> Callable:
    """A ``ReduceOps``/``ScanOps`` method; ``tuple_input``: its input may be a tuple of tensors
    whose first one decides (``min_max``, which also returns indices)."""

    def method(self, input, *args, **kwargs):
        t = input[0] if isinstance(input, tuple) and tuple_input else input
        if not (isinstance(t, p.tl.tensor) and p.is_bf16(t.handle)):
            return orig(self, input, *args, **kwargs)
        # Accumulate in fp32 through the original method (keeps its axis/keep_dims logic),
        # then round once to bf16.
        as_f32 = _retyped(p, t, p.handle(bf16_bits_to_f32(t.handle.data), p.f32), p.f32)
        return _back_to_bf16(p, orig(self, as_f32, *args, **kwargs))

    return method


wrap_min_max = partial(wrap_reduction, tuple_input=True)
