"""Tolerance checks: is one output close enough to its reference?

Floating-point outputs are compared with a :class:`~kernelforge.block.Tolerance` against the fp32
reference (NaN or Inf never passes); integer and bool outputs must match exactly. Each check
returns ``(relative error, worst elementwise excess, problem)``; ``problem`` is empty when the
output passes.
"""

from __future__ import annotations

import math

import torch

from kernelforge.block import HarnessError, Tolerance
from kernelforge.execute.judge.fingerprint import raw_bytes

#: Relative spread of the reference output under which a check cannot tell right from wrong.
MIN_REFERENCE_SPREAD = 1e-3


def compare(out: torch.Tensor, ref: torch.Tensor, tol: Tolerance) -> tuple[float, float, str]:
    """(relative error, worst elementwise excess, problem) of ``out`` against the fp32 ``ref``.

    ``problem`` is empty when the output passes ``tol``.
    """
    out32 = out.detach().to(torch.float32)
    ref32 = ref.detach().to(torch.float32)
    bad = ~torch.isfinite(out32)
    if bool(bad.any()):
        n = int(bad.sum())
        first = tuple(int(i) for i in bad.nonzero()[0].tolist())
        return math.inf, math.inf, f"{n} of {out.numel()} outputs are NaN or Inf (first at index {first})"
    ref_norm = float(torch.linalg.vector_norm(ref32.double()))
    diff = (out32 - ref32).double()
    rel = float(torch.linalg.vector_norm(diff)) / max(ref_norm, 1e-30)
    rms = ref_norm / math.sqrt(max(ref32.numel(), 1))
    bound = tol.atol * rms + tol.rtol * ref32.abs().double()
    excess_t = diff.abs() / bound.clamp_min(1e-30)
    excess = float(excess_t.max()) if excess_t.numel() else 0.0
    if rel > tol.rel_norm:
        return rel, excess, f"relative error {rel:.3g} exceeds {tol.rel_norm:g}"
    if excess > 1.0:
        worst = tuple(int(i) for i in torch.nonzero(excess_t == excess_t.max())[0].tolist())
        return rel, excess, (
            f"element {worst} off by {float(diff.abs()[worst]):.3g} (ref {float(ref32[worst]):.3g}), "
            f"{excess:.2f}x the elementwise tolerance"
        )
    return rel, excess, ""


def compare_exact(out: torch.Tensor, ref: torch.Tensor) -> tuple[float, float, str]:
    """An integer or bool output against its reference, element for element: ``(0, 0, "")``
    when equal, else ``(inf, inf, problem)`` naming how many elements differ and the first.

    Bool outputs are compared on their bytes, so the poison byte of an unwritten element (neither
    0 nor 1) never passes as True.
    """
    if out.dtype == torch.bool:
        got = raw_bytes(out).to(torch.int64).view(out.shape)
        want = raw_bytes(ref.to(torch.bool)).to(torch.int64).view(out.shape)
    else:
        got, want = out.detach().to(torch.int64), ref.detach().to(torch.int64)
    bad = got != want
    if not bool(bad.any()):
        return 0.0, 0.0, ""
    first = tuple(int(i) for i in bad.nonzero()[0].tolist())
    return math.inf, math.inf, (f"{int(bad.sum())} of {out.numel()} elements differ (first at index {first}: "
                                f"{int(got[first])} instead of {int(want[first])})")


def is_exact(dtype: torch.dtype) -> bool:
    """Whether outputs of ``dtype`` are compared exactly (integer and bool dtypes)."""
    return not (dtype.is_floating_point or dtype.is_complex)


def check(out: torch.Tensor, ref: torch.Tensor, tol: Tolerance) -> tuple[float, float, str]:
    """:func:`compare_exact` for integer and bool outputs, :func:`compare` with ``tol`` otherwise."""
    return compare_exact(out, ref) if is_exact(out.dtype) else compare(out, ref, tol)


def within(out: torch.Tensor, ref: torch.Tensor, tol: Tolerance) -> tuple[bool, str]:
    """Whether ``out`` passes ``tol`` against ``ref``, and a one-line account of the errors."""
    rel, excess, problem = compare(out, ref, tol)
    return not problem, problem or f"relative error {rel:.3g} (max {tol.rel_norm:g}), worst element {excess:.3g}x its bound"


def check_reference_spread(ref: torch.Tensor, where: str) -> None:
    """Raise :class:`~kernelforge.block.HarnessError` when a floating-point reference is nearly
    constant: no output could then be told right from wrong (integer references are not checked:
    a constant count or index is a fine thing to compare exactly)."""
    if is_exact(ref.dtype):
        return
    ref64 = ref.double()
    rms = float(ref64.pow(2).mean().sqrt()) if ref64.numel() else 0.0
    spread = float(ref64.std()) if ref64.numel() > 1 else rms
    if ref64.numel() > 1 and (rms == 0.0 or spread / rms < MIN_REFERENCE_SPREAD):
        raise HarnessError(f"{where}: reference output is nearly constant (rms {rms:.3g}); the inputs cannot tell right from wrong")
