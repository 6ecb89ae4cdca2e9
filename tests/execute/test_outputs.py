"""Block contract v2: every defense a single ``out`` gets holds for a second output and for an
in-place input, and the message names the output. The block is the toy router of
tests/fixtures/kernels/toy/router (``logits`` updated in place, ``weights`` float and ``indices``
int32 written); its mutants are in tests/adversarial/expected.toml (``router_*``)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from kernelforge.block import HarnessError
from kernelforge.candidate import Candidate
from kernelforge.catalog import Catalog
from kernelforge.devices.interpret import InterpretDevice
from kernelforge.execute.judge import guard
from kernelforge.execute.judge.contract import allocate
from kernelforge.execute.evaluate import evaluate
from kernelforge.execute.runner import load_candidate
from kernelforge.execute.timing.rounds import time_candidate
from kernelforge.execute.judge.verify import verify, verify_shape
from kernelforge.result import Status

pytestmark = pytest.mark.interpreter

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "kernels"
CATALOG = Catalog.discover(FIXTURES)
ROUTER = CATALOG.block("toy/router")
SOURCE = Candidate.from_template(CATALOG.baseline("toy/router")).source
SMOKE = ROUTER.shapes("smoke")[0]
INT32_MIN = torch.iinfo(torch.int32).min


@pytest.fixture(scope="module")
def honest():
    module, failure = load_candidate(SOURCE, "router_honest")
    assert failure is None
    return module.run


def variant(old: str, new: str) -> str:
    assert old in SOURCE, old
    return SOURCE.replace(old, new)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float32], ids=str)
def test_the_honest_router_passes_on_every_shape(honest, dtype):
    """Includes t2k3: bf16/fp16 weights of 2 x 3 elements, whose fingerprint crashed in v1."""
    results = verify(ROUTER, honest, ROUTER.shapes("smoke") + ROUTER.shapes("check"), dtype, "cpu",
                     stop_at_first_failure=False)
    assert [v.status for _, v in results] == [Status.OK] * len(results), [v.message for _, v in results]


def test_outputs_are_poisoned_and_inplace_inputs_pristine_before_every_call(honest):
    seen = []

    def run(**kw):
        seen.append({name: kw[name].clone() for name in ("weights", "indices", "logits")})
        honest(**kw)

    inputs = ROUTER.make_inputs(SMOKE, torch.float16, "cpu", seed=0, distribution="normal")
    assert verify_shape(ROUTER, run, SMOKE, torch.float16, "cpu", seed=0).ok
    first, second, third = seen
    for call in (first, second):
        assert torch.isnan(call["weights"]).all()
        assert (call["indices"] == INT32_MIN).all()
        assert torch.equal(call["logits"], inputs["logits"])  # restored before the repeat
    # Call 3: new values under the same pointers; its outputs hold call 1's results, not poison.
    assert not torch.equal(third["logits"], inputs["logits"])
    expected = ROUTER.reference(**inputs)
    assert torch.equal(third["indices"], expected["indices"])
    assert not torch.isnan(third["weights"]).any()


def _wrap(honest, after):
    """A candidate that runs the honest router, then ``after(call number, kwargs)``."""
    calls = [0]

    def run(**kw):
        calls[0] += 1
        honest(**kw)
        after(calls[0], kw)

    return run


def _cache_by_pointer(name):
    cache = {}

    def after(call, kw):
        key = kw["logits"].data_ptr()
        if key in cache:
            kw[name].copy_(cache[key])
        else:
            cache[key] = kw[name].clone()

    return after


CHEATS = {
    # (after-hook, status, fragment of the message)
    "indices differ on a repeat": (lambda c, kw: c == 2 and kw["indices"].view(-1)[0].add_(1), Status.REJECTED,
                                   "indices: two calls on the same inputs gave different outputs"),
    "in-place result differs on a repeat": (lambda c, kw: c == 2 and kw["logits"].view(-1)[0].fill_(7.0),
                                            Status.REJECTED, "logits: two calls on the same inputs"),
    "indices cached by pointer": (_cache_by_pointer("indices"), Status.WRONG,
                                  "(new values in the same buffers): indices: "),
    "in-place result cached by pointer": (_cache_by_pointer("logits"), Status.WRONG,
                                          "(new values in the same buffers): logits: "),
    "indices storage replaced": (lambda c, kw: kw["indices"].set_(kw["indices"].clone()), Status.REJECTED,
                                 "indices: the output tensor was replaced"),
    "in-place input storage replaced": (lambda c, kw: kw["logits"].set_(kw["logits"].clone()), Status.REJECTED,
                                        "logits: the output tensor was replaced"),
    "weights resized": (lambda c, kw: kw["weights"].resize_(1), Status.REJECTED,
                        "weights: the output tensor was replaced"),
    "a second input modified": (lambda c, kw: kw["bias"].view(-1)[0].fill_(0.0), Status.REJECTED,
                                "modified its input 'bias'"),
    "a wrong in-place update": (lambda c, kw: kw["logits"].view(-1)[3].fill_(1e3), Status.WRONG, "logits: "),
}


@pytest.mark.parametrize("name", sorted(CHEATS))
def test_each_defense_applies_to_every_output_and_names_it(honest, name):
    after, status, fragment = CHEATS[name]
    verdict = verify_shape(ROUTER, _wrap(honest, after), SMOKE, torch.float16, "cpu")
    assert verdict.status is status and fragment in verdict.message, verdict.message
    assert verdict.message.startswith(SMOKE.name)


@pytest.mark.parametrize("target", ["weights", "indices", "logits"])
def test_work_deferred_past_the_return_is_caught_on_every_output(honest, monkeypatch, target):
    """On a GPU the late fingerprint is taken after a full device synchronisation; here the
    synchronisation finishes the candidate's pending work, as a side stream would."""
    pending = []
    monkeypatch.setattr(guard, "synchronize", lambda device: [work() for work in pending])

    def after(call, kw):
        done = kw[target].clone()
        kw[target].zero_()
        pending.append(lambda: kw[target].copy_(done))

    verdict = verify_shape(ROUTER, _wrap(honest, after), SMOKE, torch.float16, "cpu")
    assert verdict.status is Status.REJECTED, verdict.message
    assert f"{target}: output changed after the call returned" in verdict.message


def test_an_exception_is_a_runtime_error_with_its_traceback(honest):
    def run(**kw):
        raise ValueError("boom")

    verdict = verify_shape(ROUTER, run, SMOKE, torch.float16, "cpu")
    assert verdict.status is Status.RUNTIME_ERROR and verdict.message == f"{SMOKE.name}: ValueError: boom"
    assert "Traceback" in verdict.traceback and 'raise ValueError("boom")' in verdict.traceback


@pytest.mark.parametrize("reset", [True, False])
def test_timing_resets_inplace_inputs_only_when_the_block_asks(honest, reset):
    block = type("RouterNoReset", (type(ROUTER),), {"inplace_reset": reset})("toy/router")
    seen = []

    def run(**kw):
        seen.append(kw["logits"].clone())
        honest(**kw)

    sets = []
    timing = time_candidate(block, run, SMOKE, torch.float16, InterpretDevice(warmup=1, repeats=3),
                            block.counts(SMOKE, torch.float16), sets=sets)
    assert timing.samples == 3 and len(seen) == 4 and len(sets) == 1
    pristine = block.make_inputs(SMOKE, torch.float16, "cpu", seed=1000)["logits"]
    # One element's sign changes before every call (a value cache never hits); nothing else, when reset.
    changed = [int((entry.abs() != pristine.abs()).sum()) for entry in seen]
    if reset:
        assert changed == [0, 0, 0, 0]
    else:
        assert changed[0] == 0 and all(n > pristine.numel() // 2 for n in changed[1:])
    inputs, outputs = sets[0]
    assert set(outputs) == {"weights", "indices"} and set(inputs) == {"logits", "bias", "top_k"}


def _counting(source: str, kernel_arg: str, launch_arg: str) -> str:
    """``source`` with a call counter, a new kernel argument and its value at launch."""
    text = source.replace("def run(logits, bias, top_k, weights, indices):\n",
                          "_CALLS = [0]\n\n\ndef run(logits, bias, top_k, weights, indices):\n    _CALLS[0] += 1\n")
    text = text.replace("T, E, K: tl.constexpr", f"T, E, {kernel_arg}, K: tl.constexpr")
    return text.replace("n_tokens, n_experts, K=top_k", f"n_tokens, n_experts, {launch_arg}, K=top_k")


#: Right for the 3 verification calls and the timed call, wrong from the post-timing re-check on.
PHASE_INDICES = _counting(variant("idx.to(tl.int32), mask=row_ok)", "(idx + shift).to(tl.int32), mask=row_ok)"),
                          "shift", "1 if _CALLS[0] > 4 else 0")
PHASE_INPLACE = _counting(variant("    tl.store(ptrs, scores.to(", "    if update:\n        tl.store(ptrs, scores.to("),
                          "update", "_CALLS[0] <= 4")


@pytest.mark.parametrize("source, name", [(PHASE_INDICES, "indices"), (PHASE_INPLACE, "logits")],
                         ids=["second output", "in-place input"])
def test_the_post_timing_recheck_covers_every_output(source, name):
    device = InterpretDevice(warmup=0, repeats=1)
    [ok] = evaluate(ROUTER, SOURCE, [SMOKE], torch.float16, device)
    assert ok.status is Status.OK and ok.timing is not None, ok.verification.message
    [ev] = evaluate(ROUTER, source, [SMOKE], torch.float16, device)
    assert ev.status is Status.WRONG and ev.timing is None, ev.verification.message
    assert f"(after timing, on perturbed inputs): {name}: " in ev.verification.message


class _Broken:
    """Router variants that break the contract: each is the block's bug, a HarnessError."""

    @staticmethod
    def make(**attrs):
        return type("BrokenRouter", (type(ROUTER),), attrs)("toy/router")


BROKEN = {
    "reference misses the in-place entry": (
        {"reference": lambda self, logits, bias, top_k: {k: v for k, v in type(ROUTER).reference(
            self, logits, bias, top_k).items() if k != "logits"}}, "expected one entry for each of"),
    "reference returns one tensor": (
        {"reference": lambda self, logits, bias, top_k: type(ROUTER).reference(self, logits, bias, top_k)["weights"]},
        "return a dict with one entry per name"),
    "an output named like an input": (
        {"make_output": lambda self, shape, dtype, device: {"bias": torch.empty(3, dtype=dtype, device=device)}},
        "also input names"),
    "an in-place name that is no input": ({"inplace": ("residual",)}, "'residual' is not a tensor input"),
    "a reference entry of the wrong shape": (
        {"reference": lambda self, logits, bias, top_k: {**type(ROUTER).reference(self, logits, bias, top_k),
                                                         "weights": torch.ones(2)}}, "has shape (2,)"),
}


@pytest.mark.parametrize("name", sorted(BROKEN))
def test_a_block_that_breaks_the_contract_is_a_harness_error(honest, name):
    attrs, fragment = BROKEN[name]
    with pytest.raises(HarnessError, match=fragment.replace("(", r"\(").replace(")", r"\)")):
        verify_shape(_Broken.make(**attrs), honest, SMOKE, torch.float16, "cpu")


def test_a_v1_block_is_one_output_named_out_and_its_messages_do_not_name_it():
    axpy = CATALOG.block("toy/axpy")
    shape = axpy.shapes("smoke")[0]
    assert set(allocate(axpy, shape, torch.float16, "cpu")) == {"out"}
    module, _ = load_candidate(Candidate.from_template(CATALOG.baseline("toy/axpy")).source, "axpy_v1")
    wrong = verify_shape(axpy, lambda x, y, alpha, out: module.run(x, y, alpha * 1.05, out), shape, torch.float16,
                         "cpu")
    assert wrong.status is Status.WRONG and wrong.message.startswith(f"{shape.name}: relative error"), wrong.message
