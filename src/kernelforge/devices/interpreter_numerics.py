"""The numerics of the bf16 (and fp8 cast) fix for Triton's CPU interpreter: pure numpy.

The interpreter stores bf16 values as their raw uint16 bit patterns; these functions widen them to
fp32 exactly and round results back the way NVIDIA GPUs do (see :mod:`kernelforge.devices.interpreter`
for why). Nothing here needs triton.

Rounding: for +, -, *, / and sqrt, computing in fp32 (24 bits) and rounding to bf16 (8 bits) is
the correctly rounded result (double rounding is innocuous when p' >= 2p + 2), i.e. what the
GPU's native bf16 instructions give. ``fma`` is computed exactly (float64 plus the TwoSum error,
rounded to odd) so it rounds once, like ``fma.rn.bf16``. Reductions and scans accumulate in fp32
and round once at the end; on the GPU the combine runs in bf16 with a rounding at each step of a
tree, so GPU results can be slightly less accurate than the interpreter's (compare with a
tolerance, not bitwise).

fp8: the interpreter's generic bit converter (``_convert_float``) gets fp32 -> fp8e4nv/fp8e5
wrong for ties, carries into the exponent, subnormals and overflow, and decodes fp8 NaN/inf
codes as finite numbers. :data:`FP8_FORMATS` holds the two fp8 formats NVIDIA GPUs use,
``fp8e4nv`` (e4m3fn) and ``fp8e5`` (e5m2): encoding rounds to nearest even and saturates to the
largest finite value like the GPU's ``cvt.rn.satfinite.e4m3x2.f32`` / ``e5m2x2`` (so +-inf ->
+-max; torch's e5m2 cast gives inf instead); decoding uses an exact 256-entry table.
"""

from __future__ import annotations

from typing import Any

import numpy as np

BF16_CANONICAL_NAN = np.uint16(0x7FFF)  # CUDART_NAN_BF16: what GPU bf16 arithmetic produces
_FP8_CANONICAL_NAN = 0x7F


def bf16_bits_to_f32(bits: np.ndarray) -> np.ndarray:
    """Exact bf16 -> fp32: a bf16 is the top half of an fp32."""
    return (np.asarray(bits, dtype=np.uint16).astype(np.uint32) << np.uint32(16)).view(np.float32)


def f32_to_bf16_bits(x: Any, rtz: bool = False) -> np.ndarray:
    """fp32 -> bf16 bits, round to nearest even (or toward zero), like ``cvt.rn.bf16.f32``.

    Adding 0x7FFF plus the lowest kept bit and dropping 16 bits is RNE for every finite value,
    denormals included, and overflows to inf exactly where it should. NaN would carry into the
    sign, so NaNs are mapped to the canonical NaN instead.
    """
    x = np.asarray(x, dtype=np.float32)
    u = x.view(np.uint32)
    with np.errstate(over="ignore"):
        if rtz:
            r = u >> np.uint32(16)
        else:
            r = (u + (np.uint32(0x7FFF) + ((u >> np.uint32(16)) & np.uint32(1)))) >> np.uint32(16)
    return np.where(np.isnan(x), BF16_CANONICAL_NAN, r.astype(np.uint16))


def _f64_to_f32_round_to_odd(x: np.ndarray) -> np.ndarray:
    """float64 -> float32 rounded to odd (inexact results get an odd last bit).

    Rounding to odd at 24 bits and then to nearest even at 8 bits equals rounding the float64
    directly to 8 bits (24 >= 8 + 2); plain RNE twice could round a tie the wrong way.
    """
    x = np.asarray(x, dtype=np.float64)
    with np.errstate(over="ignore", invalid="ignore"):
        t = x.astype(np.float32)
        inexact = (t.astype(np.float64) != x) & ~np.isnan(x)
        even = (t.view(np.uint32) & np.uint32(1)) == 0
        toward = np.where(x > t, np.float32(np.inf), np.float32(-np.inf))
        return np.where(inexact & even, np.nextafter(t, toward), t)


def _f64_to_f32_rtz(x: np.ndarray) -> np.ndarray:
    x = np.asarray(x, dtype=np.float64)
    with np.errstate(over="ignore", invalid="ignore"):
        t = x.astype(np.float32)
        too_big = np.abs(t.astype(np.float64)) > np.abs(x)
        return np.where(too_big, np.nextafter(t, np.float32(0)), t)


def f64_to_bf16_bits(x: Any, rtz: bool = False) -> np.ndarray:
    """float64 -> bf16 bits with a single rounding (no fp32 double-rounding error)."""
    return f32_to_bf16_bits(_f64_to_f32_rtz(x) if rtz else _f64_to_f32_round_to_odd(x), rtz=rtz)


def to_bf16_bits(x: np.ndarray) -> np.ndarray:
    """Round a numpy result (fp32, fp64 or narrower) to bf16 bits."""
    x = np.asarray(x)
    if x.dtype == np.float64:
        return f64_to_bf16_bits(x)
    return f32_to_bf16_bits(x.astype(np.float32, copy=False))


def fma_to_bf16_bits(x: np.ndarray, y: np.ndarray, z: np.ndarray) -> np.ndarray:
    """x * y + z for bf16 values (given as fp32), rounded once to bf16 like ``fma.rn.bf16``.

    The product of two 8-bit significands is exact in float64; the sum is made round-to-odd with
    its TwoSum error so that the final rounding to bf16 is the only one that matters.
    """
    x, y, z = (np.asarray(v, dtype=np.float64) for v in (x, y, z))
    with np.errstate(over="ignore", invalid="ignore"):
        p = x * y
        s = p + z
        bb = s - p
        err = (p - (s - bb)) + (z - bb)
        fix = np.isfinite(s) & (err != 0) & ((s.view(np.uint64) & np.uint64(1)) == 0)
        s = np.where(fix, np.nextafter(s, np.where(err > 0, np.inf, -np.inf)), s)
    return f64_to_bf16_bits(s)


class Fp8Format:
    """An fp8 format the GPU converts with ``cvt.rn.satfinite``: exact decode table, RNE encode."""

    def __init__(self, man_bits: int, exp_bits: int, bias: int, ieee_inf: bool) -> None:
        self.man = man_bits
        self.bias = bias
        self.emin = 1 - bias  # exponent of the smallest normal
        self.ieee_inf = ieee_inf
        codes = np.arange(256)
        sign = codes >> 7
        e = (codes >> man_bits) & ((1 << exp_bits) - 1)
        m = codes & ((1 << man_bits) - 1)
        mag = np.where(
            e == 0,
            m * 2.0 ** (self.emin - man_bits),
            (1.0 + m / 2.0**man_bits) * np.ldexp(1.0, e - bias),
        )
        emax_field = (1 << exp_bits) - 1
        if ieee_inf:  # e5m2: exponent all ones is inf (mantissa 0) or NaN
            mag = np.where((e == emax_field) & (m == 0), np.inf, mag)
            mag = np.where((e == emax_field) & (m != 0), np.nan, mag)
            self.max_code = (emax_field - 1) << man_bits | ((1 << man_bits) - 1)
        else:  # e4m3fn: no inf, only S.1111.111 is NaN
            mag = np.where((codes & 0x7F) == 0x7F, np.nan, mag)
            self.max_code = 0x7E
        self.table = np.where(sign == 1, -mag, mag).astype(np.float32)
        self.max_value = float(self.table[self.max_code])

    def decode(self, codes: np.ndarray) -> np.ndarray:
        return self.table[np.asarray(codes).view(np.uint8)]

    def encode(self, x: Any, rtz: bool = False) -> np.ndarray:
        x = np.asarray(x, dtype=np.float64)
        neg = np.signbit(x)
        a = np.abs(x)
        nan = np.isnan(a)
        inf = np.isinf(a)
        a = np.where(nan | inf, 0.0, a)
        # Quantum of a's binade (at least the subnormal quantum); a / q is exact, so rint is RNE.
        e = np.maximum(np.frexp(a)[1] - 1, self.emin)
        q = np.ldexp(1.0, e - self.man)
        r = (np.floor(a / q) if rtz else np.rint(a / q)) * q
        r = np.minimum(r, self.max_value)  # satfinite: too large -> largest finite
        e2 = np.frexp(r)[1] - 1
        sub = r < 2.0**self.emin
        mant = np.where(sub, r / 2.0 ** (self.emin - self.man), (r / np.ldexp(1.0, e2) - 1.0) * 2**self.man)
        code = np.where(sub, 0, (e2 + self.bias) << self.man) | mant.astype(np.int64)
        if rtz and self.ieee_inf:  # the GPU's RTZ path truncates bits, keeping inf
            inf_code = ((1 << (7 - self.man)) - 1) << self.man
            code = np.where(inf, inf_code, code)
        else:  # satfinite: inf -> +-max finite
            code = np.where(inf, self.max_code, code)
        code = code | np.where(neg, 0x80, 0)
        code = np.where(nan, _FP8_CANONICAL_NAN, code)
        return code.astype(np.uint8)


#: The fp8 formats the fix encodes and decodes itself, by Triton's dtype name.
FP8_FORMATS = {
    "fp8e4nv": Fp8Format(man_bits=3, exp_bits=4, bias=7, ieee_inf=False),
    "fp8e5": Fp8Format(man_bits=2, exp_bits=5, bias=15, ieee_inf=True),
}
