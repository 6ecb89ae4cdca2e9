"""The trusted judge of one shape: a candidate against its block's reference, with the defenses of
EVALUATION.md.

Everything here runs in the trusted process. The candidate is called only through a runner
(:mod:`kernelforge.execute.runner`: in the worker process, on tensors in memory shared with this
one; or in this process for debugging), and what it wrote is read back as raw bytes into private
memory the candidate cannot reach. Inputs are drawn here (seeded ``make_inputs``), pristine copies
stay here, the reference is computed here from them, and the expected output never exists where
the candidate runs.

For each shape, three calls of the candidate (:func:`checked_call`: the runner's checks of
:func:`~kernelforge.execute.judge.guard.run_call`, then the bytes read when the call returned and again
after a full device synchronisation must agree, and every input that is not in place must come
back bit for bit):

1. fresh inputs, outputs poisoned (:func:`~kernelforge.execute.judge.fingerprint.poison`: NaN, or a
   sentinel for integer outputs) and, where the candidate runs, the allocator's free memory
   poisoned too, so a kernel that reads uninitialised or freed memory sees NaN; the candidate
   runs *before* the reference, which is computed afterwards from the pristine copy of the inputs;
2. the same inputs again (in-place inputs restored to their values before call 1) into fresh
   poisoned outputs: the results must be bit-identical (uninitialised memory and races show up);
3. new values written *in place* into the same input tensors (same pointers, same shapes) with a
   different value distribution: catches results cached by pointer, shape or id. Its outputs are
   fresh but hold call 1's results instead of poison: a candidate that skips the work when its
   output already looks written is left with stale results here (the timed calls, freshly
   poisoned, are verified too: :mod:`kernelforge.execute.timing.check`).

After every call every output and in-place input is compared with the block's reference
(:mod:`kernelforge.execute.judge.compare`: floating point within the tolerance, integers exactly; NaN or
Inf never passes). The same defenses apply to every output and every in-place input
(:class:`~kernelforge.execute.judge.contract.Outputs`), and a failure's message names the output.

:func:`verify_again` re-checks a candidate on the very buffers it was timed with after perturbing
their values (phase detection, caches), for :mod:`kernelforge.execute.evaluate`.

Every function taking ``run`` accepts a function of this process (called here, for tests and
debugging) or a loaded :class:`~kernelforge.execute.runner.Entry`.
"""

from __future__ import annotations

from typing import Any, Mapping

import torch

from kernelforge.block import DISTRIBUTIONS, Block, HarnessError, Shape
from kernelforge.execute.judge.compare import check, check_reference_spread
from kernelforge.execute.judge.contract import Outputs, allocate
from kernelforge.execute.judge.fingerprint import bits_equal, poison
from kernelforge.execute.judge.guard import CallReport, Rejected, RunFn
from kernelforge.execute.runner import Entry, LocalRunner
from kernelforge.result import Status, Verification


def _tensors(inputs: Mapping[str, Any]) -> dict[str, torch.Tensor]:
    return {k: v for k, v in inputs.items() if isinstance(v, torch.Tensor)}


def _clones(tensors: Mapping[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    return {k: v.clone() for k, v in tensors.items()}


class _Worst:
    """The worst relative error and elementwise excess over the checks of one shape."""

    def __init__(self) -> None:
        self.rel, self.excess, self.checks = 0.0, 0.0, 0

    def add(self, rel: float, excess: float) -> None:
        self.rel, self.excess = max(self.rel, rel), max(self.excess, excess)


def judge(block: Block, spec: Outputs, got: Mapping[str, torch.Tensor], ref: Mapping[str, torch.Tensor],
          dtype: torch.dtype, device: torch.device) -> tuple[float, float, str]:
    """(worst relative error, worst excess, problem) of one call's results against the reference:
    every output and in-place input checked; ``problem`` names the first that fails (empty: all
    pass)."""
    worst_rel, worst_excess = 0.0, 0.0
    for name in spec.all:
        rel, excess, problem = check(got[name], ref[name], spec.tolerance(block, name, dtype, device.type))
        if problem:
            return max(worst_rel, rel), max(worst_excess, excess), spec.label(name) + problem
        worst_rel, worst_excess = max(worst_rel, rel), max(worst_excess, excess)
    return worst_rel, worst_excess, ""


def expected_outputs(block: Block, spec: Outputs, inputs: Mapping[str, Any], pristine: Mapping[str, torch.Tensor],
                     got: Mapping[str, torch.Tensor], where: str) -> dict[str, torch.Tensor]:
    """The block's reference by name, computed from copies of the ``pristine`` tensors (and the
    scalars of ``inputs``), each checked to have a spread the comparison can use."""
    ref = spec.expected(block, {**inputs, **_clones(pristine)}, got)
    for name, tensor in ref.items():
        check_reference_spread(tensor, f"{where} {name}" if spec.named else where)
    return ref


def _unchanged(spec: Outputs, inputs: Mapping[str, Any], pristine: Mapping[str, torch.Tensor], label: str) -> None:
    for name, tensor in spec.untouchable(inputs).items():
        if not bits_equal(tensor, pristine[name]):
            raise Rejected(Status.REJECTED, f"{label}the candidate modified its input {name!r}")


def _raise(report: CallReport, spec: Outputs) -> None:
    if not report.ok:
        prefix = spec.label(report.name) if report.name else ""
        raise Rejected(report.status, prefix + report.message, report.traceback)


def checked_call(entry: Entry, spec: Outputs, inputs: dict[str, Any], pristine: Mapping[str, torch.Tensor],
                 outputs: dict[str, torch.Tensor], label: str,
                 prefill: Mapping[str, torch.Tensor] | None = None) -> dict[str, torch.Tensor]:
    """One verification call of ``entry`` with the shared ``inputs`` (tensors and scalars) into
    the shared ``outputs``: the in-place inputs restored from ``pristine`` and the outputs poisoned
    (or, with ``prefill``, holding those values) first. Returns private copies of what the call
    wrote (outputs and in-place inputs, by name), read when the runner said the call returned;
    raises :class:`~kernelforge.execute.judge.guard.Rejected` when a check fails.
    """
    runner = entry.runner
    spec.restore(inputs, pristine)
    for name, tensor in outputs.items():
        if prefill is None:
            poison(tensor)
        else:
            tensor.copy_(prefill[name])
    watched = spec.watched(inputs, outputs)
    _raise(runner.call(entry.handle, {**inputs, **outputs}, tuple(watched)), spec)
    early = {name: runner.snapshot(tensor) for name, tensor in watched.items()}
    _raise(runner.sync(), spec)
    for name, tensor in watched.items():
        if not bits_equal(runner.snapshot(tensor), early[name]):
            raise Rejected(Status.REJECTED, f"{spec.label(name)}output changed after the call returned (work deferred "
                                            "to another stream or thread)")
    _unchanged(spec, inputs, pristine, label)
    return early


def verify_shape(
    block: Block,
    run: RunFn | Entry,
    shape: Shape,
    dtype: torch.dtype,
    device: str | torch.device,
    *,
    seed: int = 0,
    distributions: tuple[str, str] | None = None,
    calls: int = 3,
) -> Verification:
    """Verify ``run`` (a candidate's entry point) on one shape. See the module docstring.

    ``calls=1`` makes only the first, poisoned call on fresh inputs (enough to catch a candidate
    hard-coded to other shapes, at a third of the cost: used for held-out shapes). A block that
    breaks its contract raises :class:`~kernelforge.block.HarnessError`.
    """
    device = torch.device(device)
    entry = LocalRunner.entry(run, device)
    runner = entry.runner
    if distributions is None:
        # Rotate distributions by seed so a shape set covers all of them across its shapes.
        first = DISTRIBUTIONS[seed % len(DISTRIBUTIONS)]
        distributions = (first, DISTRIBUTIONS[(seed + 1) % len(DISTRIBUTIONS)])
    worst = _Worst()
    where = f"{block.id} {shape.name}"

    def verdict(status: Status, message: str, rel: float | None = None, excess: float | None = None) -> Verification:
        rel = worst.rel if rel is None else rel
        excess = worst.excess if excess is None else excess
        return Verification(status, rel, excess, worst.checks, f"{shape.name}{message}")

    try:
        inputs = block.make_inputs(shape, dtype, device, seed, distributions[0])
        pristine = _tensors(inputs)  # private: the candidate is called with shared copies
        shared = {**inputs, **{name: runner.share(tensor) for name, tensor in pristine.items()}}

        def attempt(label: str, prefill: Mapping[str, torch.Tensor] | None = None) -> tuple[Outputs, dict]:
            outputs = {name: runner.share(tensor, values=False)
                       for name, tensor in allocate(block, shape, dtype, device).items()}
            spec = Outputs.of(block, shared, outputs)
            return spec, checked_call(entry, spec, shared, pristine, outputs, f"{label}: ", prefill)

        spec, first_out = attempt("call 1")
        ref = expected_outputs(block, spec, inputs, pristine, first_out, where)
        rel, excess, problem = judge(block, spec, first_out, ref, dtype, device)
        worst.checks += 1
        worst.add(rel, excess)
        if problem:
            return verdict(Status.WRONG, f": {problem}", rel, excess)
        if calls < 2:
            return Verification(Status.OK, worst.rel, worst.excess, worst.checks, "")

        _, second_out = attempt("call 2")
        worst.checks += 1
        if block.deterministic:
            for name in spec.all:
                if not bits_equal(first_out[name], second_out[name]):
                    return verdict(Status.REJECTED, f": {spec.label(name)}two calls on the same inputs gave "
                                                    "different outputs")
        else:
            rel2, excess2, problem = judge(block, spec, second_out, ref, dtype, device)
            if problem:
                return verdict(Status.WRONG, f" (call 2): {problem}", rel2, excess2)

        # New values under the same pointers: a result cached by pointer/shape now mismatches.
        stale = {name: first_out[name] for name in spec.names}
        fresh = block.make_inputs(shape, dtype, device, seed + 7919, distributions[1])  # drawn on the device
        for name, tensor in _tensors(fresh).items():
            shared[name].copy_(tensor)
            pristine[name] = tensor.to(device=device, copy=True)
        for name, value in fresh.items():
            if not isinstance(value, torch.Tensor) and value != inputs[name]:
                raise HarnessError(f"{where}: make_inputs scalar {name!r} depends on the seed")
        _, third_out = attempt("call 3", prefill=stale)
        ref3 = expected_outputs(block, spec, inputs, pristine, third_out, where)
        rel, excess, problem = judge(block, spec, third_out, ref3, dtype, device)
        worst.checks += 1
        worst.add(rel, excess)
        if problem:
            return verdict(Status.WRONG, f" (new values in the same buffers): {problem}", rel, excess)
    except Rejected as exc:
        return Verification(exc.status, worst.rel or None, worst.excess or None, worst.checks,
                            f"{shape.name}: {exc}", traceback=exc.traceback)
    return Verification(Status.OK, worst.rel, worst.excess, worst.checks, "")


def verify(
    block: Block,
    run: RunFn | Entry,
    shapes: list[Shape],
    dtype: torch.dtype,
    device: str | torch.device,
    *,
    stop_at_first_failure: bool = True,
) -> list[tuple[Shape, Verification]]:
    """Verify on every shape (seeded by position so distributions rotate across the set)."""
    entry = LocalRunner.entry(run, device)
    results: list[tuple[Shape, Verification]] = []
    for index, shape in enumerate(shapes):
        verdict = verify_shape(block, entry, shape, dtype, device, seed=index)
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
    run: RunFn | Entry,
    shape: Shape,
    dtype: torch.dtype,
    device: str | torch.device,
    inputs: dict[str, Any],
    outputs: Mapping[str, torch.Tensor] | torch.Tensor,
    *,
    seed: int,
    label: str = "after timing",
    state: Mapping[str, Any] | None = None,
) -> Verification:
    """One more checked call on buffers the candidate has already seen (the timing set: its shared
    ``inputs`` and ``outputs`` by name, or a v1 block's one output tensor), after
    :func:`perturb_inputs` changed their values: the outputs are poisoned, the call must pass
    every check of :func:`verify_shape`, and every output and in-place input must match the
    reference of the perturbed inputs.

    ``state`` is the trusted side's own copy of the values the inputs hold now (the replayed
    timing round); without it they are read from ``inputs``. Either way the perturbed values are
    written into ``inputs`` from a private copy, which the reference is computed from.

    Catches candidates that are right for the first calls and then cheat (phase detection:
    EVALUATION.md #16), results cached by pointer or by a sample of the values, and stale memory
    read during the timing phase.
    """
    device = torch.device(device)
    entry = LocalRunner.entry(run, device)
    where = f"{block.id} {shape.name}"
    outputs = {"out": outputs} if isinstance(outputs, torch.Tensor) else dict(outputs)
    try:
        spec = Outputs.of(block, inputs, outputs)
        source = _tensors(state if state is not None else inputs)
        pristine = {name: entry.runner.snapshot(tensor) if state is None else tensor.clone()
                    for name, tensor in source.items()}
        perturb_inputs(pristine, seed)
        for name, tensor in pristine.items():
            inputs[name].copy_(tensor)
        got = checked_call(entry, spec, inputs, pristine, outputs, "")
        ref = expected_outputs(block, spec, inputs, pristine, got, where)
        rel, excess, problem = judge(block, spec, got, ref, dtype, device)
    except Rejected as exc:
        return Verification(exc.status, None, None, 1, f"{shape.name} ({label}): {exc}", traceback=exc.traceback)
    if problem:
        return Verification(Status.WRONG, rel, excess, 1, f"{shape.name} ({label}, on perturbed inputs): {problem}")
    return Verification(Status.OK, rel, excess, 1, "")
