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
synchronisation (work deferred to another stream or thread shows up here), no thread may be left
running, and the host code may not compute with torch on floating-point tensors (a
``TorchDispatchMode`` watches every torch operation outside Triton launches: allocation, copies,
views and integer index arithmetic are allowed, ``x * alpha + y`` is not). NaN or Inf never passes.

Also here, for :mod:`kernelforge.execute.evaluate`: :func:`verify_again` re-checks a candidate on the very
buffers it was timed with after perturbing their values (phase detection, caches), and
:func:`harness_snapshot` / :func:`harness_changes` detect a candidate that replaced functions the
harness relies on (``torch.equal``, ``time.perf_counter``, this module's checks...).
"""

from __future__ import annotations

import math
import sys
import threading
import time
from contextlib import contextmanager
from typing import Any, Callable, Iterator

import torch

from kernelforge.block import DISTRIBUTIONS, Block, Shape, Tolerance
from kernelforge.result import Status, Verification

RunFn = Callable[..., Any]

#: Relative spread of the reference output under which a check cannot tell right from wrong.
MIN_REFERENCE_SPREAD = 1e-3


class HarnessError(RuntimeError):
    """The check itself is unsound (e.g. the reference output is constant): a bug in a block, not
    in the candidate."""


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


def _synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _poison_free_memory(device: torch.device, nbytes: int) -> None:
    """Fill memory the allocator will hand out next with NaN bit patterns (0xFF bytes are NaN in
    fp16, bf16 and fp32), so a candidate's torch.empty sees NaN rather than a stale result.

    On a GPU, one large block of the caching allocator. On the CPU, glibc's malloc hands back the
    most recently freed chunk of a size class first, so freeing poisoned buffers of the sizes a
    candidate is likely to ask for (the output in its own dtype, in fp32 and in fp64: the sizes of
    the harness's own temporaries holding reference values) makes its next torch.empty of that size
    poisoned (measured: the freed chunk is reused for sizes of about 1 KB and up; the first 16
    bytes hold malloc's free-list pointers).
    """
    if device.type == "cuda":
        junk = torch.empty(max(nbytes, 1 << 20), dtype=torch.uint8, device=device)
        junk.fill_(0xFF)
        del junk
        return
    for size in sorted({nbytes // 4, nbytes // 2, nbytes}):
        if size > 0:
            junk = torch.empty(size, dtype=torch.uint8, device=device)
            junk.fill_(0xFF)
            del junk


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
    guard = HostComputeGuard()
    with count_launches(guard) as launches:
        try:
            with guard:
                run(**inputs, out=out)
        except Exception as exc:  # the candidate's failure is data, not a crash of the harness
            raise _Rejected(Status.RUNTIME_ERROR, f"{type(exc).__name__}: {exc}".strip()[:2000]) from None
    try:
        early = _fingerprint(out)
        _synchronize(device)
        late = _fingerprint(out)
    except Exception as exc:  # an asynchronous fault of the candidate's kernels (CUDA error) surfaces here
        raise _Rejected(Status.RUNTIME_ERROR, f"{type(exc).__name__}: {exc}".strip()[:2000]) from None
    if launches[0] == 0:
        raise _Rejected(Status.REJECTED, "no Triton kernel was launched (fallback to another implementation?)")
    if type(out) is not torch.Tensor or out.data_ptr() != ptr or tuple(out.shape) != shape or out.dtype != dtype:
        raise _Rejected(Status.REJECTED, "the output tensor was replaced, resized or re-typed")
    if not torch.equal(early, late):
        raise _Rejected(Status.REJECTED, "output changed after the call returned (work deferred to another stream or thread)")
    if threading.active_count() > threads_before:
        raise _Rejected(Status.REJECTED, "the candidate left background threads running")
    if guard.violation is not None:
        raise _Rejected(Status.REJECTED, f"host code computed with torch ({guard.violation}); torch may only "
                                         "allocate, copy, view and index on the host: compute in a Triton kernel")


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
    calls: int = 3,
) -> Verification:
    """Verify ``run`` (a candidate's entry point) on one shape. See the module docstring.

    ``calls=1`` makes only the first, poisoned call on fresh inputs (enough to catch a candidate
    hard-coded to other shapes, at a third of the cost: used for held-out shapes).
    """
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
        if calls < 2:
            return Verification(Status.OK, worst_rel, worst_excess, checks, "")

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


# -- after timing ---------------------------------------------------------------------------------


def perturb_inputs(inputs: dict[str, Any], seed: int, fraction: float = 1 / 64) -> None:
    """Change the values of ``inputs``' floating-point tensors in place (same pointers, shapes and
    strides): about ``fraction`` of the elements of each get the value of another random element,
    so values keep their distribution. Integer tensors (routing, lengths) are left alone: their
    values carry invariants the block's inputs guarantee.

    A result cached by pointer, shape, or a sample of the input values is now stale, and a full
    cache by value misses (it then has to compute).
    """
    gen = torch.Generator(device="cpu")
    gen.manual_seed(seed)
    for tensor in _tensors(inputs).values():
        if not tensor.is_floating_point() or tensor.numel() < 2 or not tensor.is_contiguous():
            continue
        flat = tensor.view(-1)
        count = max(1, int(flat.numel() * fraction))
        dst = torch.randint(flat.numel(), (count,), generator=gen).to(tensor.device)
        src = torch.randint(flat.numel(), (count,), generator=gen).to(tensor.device)
        flat[dst] = flat[src].clone()


def verify_again(
    block: Block,
    run: RunFn,
    shape: Shape,
    dtype: torch.dtype,
    device: str | torch.device,
    inputs: dict[str, Any],
    out: torch.Tensor,
    *,
    seed: int,
    label: str = "after timing",
) -> Verification:
    """One more guarded call on buffers the candidate has already seen (the timing set), after
    :func:`perturb_inputs` changed their values: the output is poisoned, the call must pass every
    check of :func:`verify_shape`, and it must match the reference of the perturbed inputs.

    Catches candidates that are right for the first calls and then cheat (phase detection:
    EVALUATION.md #16), results cached by pointer or by a sample of the values, and stale memory
    read during the timing phase, whose outputs are otherwise never looked at.
    """
    device = torch.device(device)
    tol = block.tolerance(dtype, device.type)
    where = f"{block.id} {shape.name}"
    try:
        perturb_inputs(inputs, seed)
        pristine = {k: v.clone() for k, v in _tensors(inputs).items()}
        _poison_free_memory(device, out.numel() * out.element_size() * 4)
        out.fill_(math.nan)
        _call(run, inputs, out, device)
        for name, tensor in _tensors(inputs).items():
            if not _bits_equal(tensor, pristine[name]):
                raise _Rejected(Status.REJECTED, f"the candidate modified its input {name!r}")
        ref = block.reference(**{**inputs, **{k: v.clone() for k, v in pristine.items()}})
        _check_reference_spread(ref, where)
        rel, excess, problem = compare(out, ref, tol)
    except _Rejected as exc:
        return Verification(exc.status, None, None, 1, f"{shape.name} ({label}): {exc}")
    if problem:
        return Verification(Status.WRONG, rel, excess, 1, f"{shape.name} ({label}, on perturbed inputs): {problem}")
    return Verification(Status.OK, rel, excess, 1, "")


# -- harness integrity ------------------------------------------------------------------------------


def _harness_objects() -> list[tuple[str, Any, str]]:
    """(label, owner, attribute) of every function the harness's verdicts and timings rely on."""
    from triton.runtime.jit import JITFunction

    items: list[tuple[str, Any, str]] = []
    for name in ("equal", "isfinite", "isnan", "nonzero", "randn", "randint", "empty", "empty_like", "zeros"):
        items.append((f"torch.{name}", torch, name))
    items.append(("torch.linalg.vector_norm", torch.linalg, "vector_norm"))
    for name in ("__eq__", "__sub__", "sum", "copy_", "fill_", "clone", "to", "float", "double", "abs", "max",
                 "std", "pow", "mean", "view", "contiguous", "data_ptr", "any", "all", "__bool__", "__float__",
                 "item"):
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
    this = sys.modules[__name__]
    for name in ("compare", "_call", "_fingerprint", "_bits_equal", "_synchronize", "verify_shape", "verify_again",
                 "count_launches", "perturb_inputs", "_poison_free_memory", "_check_reference_spread",
                 "HostComputeGuard"):
        items.append((f"kernelforge.execute.verify.{name}", this, name))
    for module_name in ("kernelforge.execute.evaluate", "kernelforge.devices.device", "kernelforge.execute.worker"):
        module = sys.modules.get(module_name)
        if module is None:
            continue
        for name, value in list(vars(module).items()):
            if callable(value) and getattr(value, "__module__", None) == module_name:
                items.append((f"{module_name}.{name}", module, name))
                if isinstance(value, type):
                    for attr, member in list(vars(value).items()):
                        if callable(member) and not attr.startswith("__"):
                            items.append((f"{module_name}.{name}.{attr}", value, attr))
    return items


def harness_snapshot(*extra: tuple[str, Any, str]) -> list[tuple[str, Any, str, Any]]:
    """The current value of every harness function (plus ``extra`` (label, owner, attribute)
    entries, e.g. the device's ``time`` and the block's ``reference``), to compare later with
    :func:`harness_changes`. Taken before a candidate is imported."""
    return [(label, owner, attr, owner.__dict__.get(attr, getattr(owner, attr, None))
             if isinstance(owner, type) else getattr(owner, attr, None))
            for label, owner, attr in [*_harness_objects(), *extra]]


def harness_changes(snapshot: list[tuple[str, Any, str, Any]]) -> list[str]:
    """Labels of the harness functions that are no longer the objects recorded in ``snapshot``:
    a candidate replaced them (evaluator tampering, EVALUATION.md #12 and #15)."""
    changed = []
    for label, owner, attr, value in snapshot:
        now = owner.__dict__.get(attr, getattr(owner, attr, None)) if isinstance(owner, type) else getattr(owner, attr, None)
        if now is not value:
            changed.append(label)
    return changed
