"""Verification of a candidate against its block's reference, with the defenses of EVALUATION.md.

For each shape, three calls of the candidate:

1. fresh inputs, output poisoned with NaN (and the allocator's free memory poisoned too, so a kernel
   that reads uninitialised or freed memory sees NaN); the candidate runs *before* the reference,
   which is computed afterwards from an untouched copy of the inputs;
2. the same inputs again into a fresh poisoned output: the two results must be identical
   (uninitialised memory and races show up here);
3. new values written *in place* into the same input tensors (same pointers, same shapes) with a
   different value distribution: catches results cached by pointer, shape or id.

After every call: a Triton kernel must have been launched (no torch fallback), the inputs must be
bitwise unchanged, the output object must be the same tensor (type, shape, dtype, device, pointer),
and a fingerprint of the output taken when the call returns must equal one taken after a full device
synchronisation (work deferred to another stream or thread shows up here). NaN or Inf never passes.
"""

from __future__ import annotations

import math
import threading
from contextlib import contextmanager
from typing import Any, Callable, Iterator

import torch

from .block import DISTRIBUTIONS, Block, Shape, Tolerance
from .result import Status, Verification

RunFn = Callable[..., Any]

#: Relative spread of the reference output under which a check cannot tell right from wrong.
MIN_REFERENCE_SPREAD = 1e-3


class HarnessError(RuntimeError):
    """The check itself is unsound (e.g. the reference output is constant): a bug in a block, not
    in the candidate."""


@contextmanager
def count_launches() -> Iterator[list[int]]:
    """Count Triton kernel launches (JIT and interpreter) inside the block: ``counter[0]``."""
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
            return original(self, *args, **kwargs)

        return run

    for cls, original in originals.items():
        cls.run = wrap(original)
    try:
        yield counter
    finally:
        for cls, original in originals.items():
            cls.run = original


def _synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _poison_free_memory(device: torch.device, nbytes: int) -> None:
    """Fill memory the caching allocator will hand out next with NaN bit patterns (0xFF bytes are
    NaN in fp16, bf16 and fp32), so a candidate's torch.empty sees NaN rather than a stale result."""
    if device.type != "cuda":
        return
    junk = torch.empty(max(nbytes, 1 << 20), dtype=torch.uint8, device=device)
    junk.fill_(0xFF)
    del junk


def _tensors(inputs: dict[str, Any]) -> dict[str, torch.Tensor]:
    return {k: v for k, v in inputs.items() if isinstance(v, torch.Tensor)}


def _bits_equal(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Exact equality that also holds for NaN payloads (compares raw bytes)."""
    if a.shape != b.shape or a.dtype != b.dtype:
        return False
    return torch.equal(a.contiguous().view(torch.uint8), b.contiguous().view(torch.uint8))


def _fingerprint(out: torch.Tensor) -> torch.Tensor:
    # An integer sum of the raw words is exact and order-independent (no temporary copy: sum
    # accumulates in int64), so the fingerprint changes whenever the bytes do, in practice.
    raw = out.detach().contiguous().view(torch.uint8)
    if raw.numel() % 4 == 0:
        raw = raw.view(torch.int32)
    return raw.sum(dtype=torch.int64)


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


def within(out: torch.Tensor, ref: torch.Tensor, tol: Tolerance) -> tuple[bool, str]:
    """Whether ``out`` passes ``tol`` against ``ref``, and a one-line account of the errors."""
    rel, excess, problem = compare(out, ref, tol)
    return not problem, problem or f"relative error {rel:.3g} (max {tol.rel_norm:g}), worst element {excess:.3g}x its bound"


def _check_reference_spread(ref: torch.Tensor, where: str) -> None:
    ref64 = ref.double()
    rms = float(ref64.pow(2).mean().sqrt()) if ref64.numel() else 0.0
    spread = float(ref64.std()) if ref64.numel() > 1 else rms
    if ref64.numel() > 1 and (rms == 0.0 or spread / rms < MIN_REFERENCE_SPREAD):
        raise HarnessError(f"{where}: reference output is nearly constant (rms {rms:.3g}); the inputs cannot tell right from wrong")


class _Rejected(Exception):
    def __init__(self, status: Status, message: str):
        super().__init__(message)
        self.status = status


def _call(run: RunFn, inputs: dict[str, Any], out: torch.Tensor, device: torch.device) -> None:
    """One guarded call: launch count, output identity, deferred-work fingerprint, thread count."""
    ptr, shape, dtype = out.data_ptr(), tuple(out.shape), out.dtype
    threads_before = threading.active_count()
    with count_launches() as launches:
        try:
            run(**inputs, out=out)
        except Exception as exc:  # the candidate's failure is data, not a crash of the harness
            raise _Rejected(Status.RUNTIME_ERROR, f"{type(exc).__name__}: {exc}".strip()[:2000]) from None
    early = _fingerprint(out)
    _synchronize(device)
    late = _fingerprint(out)
    if launches[0] == 0:
        raise _Rejected(Status.REJECTED, "no Triton kernel was launched (fallback to another implementation?)")
    if type(out) is not torch.Tensor or out.data_ptr() != ptr or tuple(out.shape) != shape or out.dtype != dtype:
        raise _Rejected(Status.REJECTED, "the output tensor was replaced, resized or re-typed")
    if not torch.equal(early, late):
        raise _Rejected(Status.REJECTED, "output changed after the call returned (work deferred to another stream or thread)")
    if threading.active_count() > threads_before:
        raise _Rejected(Status.REJECTED, "the candidate left background threads running")


def verify_shape(
    block: Block,
    run: RunFn,
    shape: Shape,
    dtype: torch.dtype,
    device: str | torch.device,
    *,
    seed: int = 0,
    distributions: tuple[str, str] | None = None,
    deterministic: bool = True,
) -> Verification:
    """Verify ``run`` (a candidate's entry point) on one shape. See the module docstring."""
    device = torch.device(device)
    tol = block.tolerance(dtype, device.type)
    if distributions is None:
        # Rotate distributions by seed so a shape set covers all of them across its shapes.
        first = DISTRIBUTIONS[seed % len(DISTRIBUTIONS)]
        distributions = (first, DISTRIBUTIONS[(seed + 1) % len(DISTRIBUTIONS)])
    worst_rel, worst_excess, checks = 0.0, 0.0, 0
    where = f"{block.id} {shape.name}"
    try:
        inputs = block.make_inputs(shape, dtype, device, seed, distributions[0])
        pristine = {k: v.clone() for k, v in _tensors(inputs).items()}

        def attempt(label: str) -> torch.Tensor:
            out = block.make_output(shape, dtype, device)
            _poison_free_memory(device, out.numel() * out.element_size() * 4)
            out.fill_(math.nan)
            _call(run, inputs, out, device)
            for name, tensor in _tensors(inputs).items():
                if not _bits_equal(tensor, pristine[name]):
                    raise _Rejected(Status.REJECTED, f"{label}: the candidate modified its input {name!r}")
            return out

        first_out = attempt("call 1")
        ref = block.reference(**{**inputs, **{k: v.clone() for k, v in pristine.items()}})
        _check_reference_spread(ref, where)
        rel, excess, problem = compare(first_out, ref, tol)
        checks += 1
        worst_rel, worst_excess = max(worst_rel, rel), max(worst_excess, excess)
        if problem:
            return Verification(Status.WRONG, rel, excess, checks, f"{shape.name}: {problem}")

        second_out = attempt("call 2")
        checks += 1
        if deterministic and not _bits_equal(first_out, second_out):
            return Verification(Status.REJECTED, worst_rel, worst_excess, checks,
                                f"{shape.name}: two calls on the same inputs gave different outputs")
        if not deterministic:
            rel2, excess2, problem = compare(second_out, ref, tol)
            if problem:
                return Verification(Status.WRONG, rel2, excess2, checks, f"{shape.name} (call 2): {problem}")

        # New values under the same pointers: a result cached by pointer/shape now mismatches.
        fresh = block.make_inputs(shape, dtype, "cpu", seed + 7919, distributions[1])
        for name, tensor in _tensors(inputs).items():
            tensor.copy_(fresh[name])
            pristine[name] = tensor.clone()
        for name, value in fresh.items():
            if not isinstance(value, torch.Tensor) and value != inputs[name]:
                raise HarnessError(f"{where}: make_inputs scalar {name!r} depends on the seed")
        third_out = attempt("call 3")
        ref3 = block.reference(**{**inputs, **{k: v.clone() for k, v in pristine.items()}})
        _check_reference_spread(ref3, where)
        rel, excess, problem = compare(third_out, ref3, tol)
        checks += 1
        worst_rel, worst_excess = max(worst_rel, rel), max(worst_excess, excess)
        if problem:
            return Verification(Status.WRONG, rel, excess, checks,
                                f"{shape.name} (new values in the same buffers): {problem}")
    except _Rejected as exc:
        return Verification(exc.status, worst_rel or None, worst_excess or None, checks, f"{shape.name}: {exc}")
    return Verification(Status.OK, worst_rel, worst_excess, checks, "")


def verify(
    block: Block,
    run: RunFn,
    shapes: list[Shape],
    dtype: torch.dtype,
    device: str | torch.device,
    *,
    deterministic: bool = True,
    stop_at_first_failure: bool = True,
) -> list[tuple[Shape, Verification]]:
    """Verify on every shape (seeded by position so distributions rotate across the set)."""
    results: list[tuple[Shape, Verification]] = []
    for index, shape in enumerate(shapes):
        verdict = verify_shape(block, run, shape, dtype, device, seed=index, deterministic=deterministic)
        results.append((shape, verdict))
        if stop_at_first_failure and not verdict.ok:
            break
    return results
