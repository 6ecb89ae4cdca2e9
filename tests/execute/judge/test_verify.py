"""The verifier catches each way a toy candidate can cheat or fail, and accepts honest ones."""

from __future__ import annotations

import math
import threading
from pathlib import Path

import pytest
import torch

from kernelforge.block import TOLERANCES
from kernelforge.catalog import Catalog
from kernelforge.candidate import Candidate
from kernelforge.devices.interpret import InterpretDevice
from kernelforge.execute.evaluate import evaluate
from kernelforge.execute.runner import load_candidate
from kernelforge.result import Status
from kernelforge.block import HarnessError
from kernelforge.execute.judge.compare import compare
from kernelforge.execute.judge.verify import verify, verify_shape

pytestmark = pytest.mark.interpreter

FIXTURES = Path(__file__).resolve().parents[2] / "fixtures" / "kernels"

KERNEL = '''
import threading, time
import torch
import triton
import triton.language as tl


@triton.jit
def _axpy(x_ptr, y_ptr, out_ptr, alpha, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    x = tl.load(x_ptr + offs, mask=mask).to(tl.float32)
    y = tl.load(y_ptr + offs, mask=mask).to(tl.float32)
    tl.store(out_ptr + offs, (alpha * x + y).to(out_ptr.dtype.element_ty), mask=mask)


@triton.jit
def _fill(ptr, value, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    tl.store(ptr + offs, tl.full((BLOCK,), value, tl.float32).to(ptr.dtype.element_ty), mask=offs < n)


def axpy(x, y, alpha, out, n=None):
    n = x.numel() if n is None else n
    _axpy[(triton.cdiv(max(n, 1), 256),)](x, y, out, alpha, n, BLOCK=256)
'''

CANDIDATES = {
    "honest": "def run(x, y, alpha, out):\n    axpy(x, y, alpha, out)\n",
    # Writes only the first half: the NaN poison shows through.
    "partial_write": "def run(x, y, alpha, out):\n    axpy(x, y, alpha, out, n=x.numel() // 2)\n",
    # Zeroes an input after use: whatever runs second would see zeros.
    "mutates_input": (
        "def run(x, y, alpha, out):\n    axpy(x, y, alpha, out)\n"
        "    _fill[(triton.cdiv(x.numel(), 256),)](x, 0.0, x.numel(), BLOCK=256)\n"
    ),
    # Remembers the answer by pointer: stale once values change in place.
    "caches_by_pointer": (
        "_CACHE = {}\n"
        "def run(x, y, alpha, out):\n"
        "    key = (x.data_ptr(), y.data_ptr())\n"
        "    if key not in _CACHE:\n"
        "        axpy(x, y, alpha, out)\n"
        "        _CACHE[key] = out.clone()\n"
        "    axpy(_CACHE[key], torch.zeros_like(y), 1.0, out)\n"
    ),
    # Computes with torch, never launches a kernel.
    "torch_fallback": "def run(x, y, alpha, out):\n    out.copy_(alpha * x + y)\n",
    # A different answer on every call.
    "nondeterministic": (
        "_CALLS = [0]\n"
        "def run(x, y, alpha, out):\n"
        "    _CALLS[0] += 1\n"
        "    axpy(x, y, alpha + 1e-3 * _CALLS[0], out)\n"
    ),
    # Finishes the work on a background thread after returning. The thread starts after the last
    # launch and sleeps far longer than the few statements between its start and the judge's
    # thread count: started before the launch with a 50 ms sleep, it finished during the process's
    # first interpreter launch (~57 ms) and the cheat came out wrong instead of rejected.
    "deferred_thread": (
        "def run(x, y, alpha, out):\n"
        "    def late():\n"
        "        time.sleep(1.0)\n"
        "        axpy(x, y, alpha, out)\n"
        "    _fill[(triton.cdiv(out.numel(), 256),)](out, 0.0, out.numel(), BLOCK=256)\n"
        "    threading.Thread(target=late).start()\n"
    ),
    # Writes NaN everywhere.
    "nan_output": (
        "def run(x, y, alpha, out):\n"
        "    _fill[(triton.cdiv(out.numel(), 256),)](out, float('nan'), out.numel(), BLOCK=256)\n"
    ),
    # Off by a little more than bf16 rounding everywhere.
    "slightly_wrong": "def run(x, y, alpha, out):\n    axpy(x, y, alpha * 1.05, out)\n",
    # Raises.
    "raises": "def run(x, y, alpha, out):\n    raise ValueError('boom')\n",
}

EXPECTED = {
    "honest": Status.OK,
    "partial_write": Status.WRONG,
    "mutates_input": Status.REJECTED,
    "caches_by_pointer": Status.WRONG,
    "torch_fallback": Status.REJECTED,
    "nondeterministic": Status.REJECTED,
    "deferred_thread": Status.REJECTED,
    "nan_output": Status.WRONG,
    "slightly_wrong": Status.WRONG,
    "raises": Status.RUNTIME_ERROR,
}


@pytest.fixture(autouse=True)
def join_stray_threads():
    """The deferred-work cheat leaves a thread running a kernel; the interpreter's state is
    process-global, so let it finish before the next test (isolation is a worker's job)."""
    yield
    for thread in threading.enumerate():
        if thread is not threading.main_thread():
            thread.join(timeout=10)


@pytest.fixture(scope="module")
def axpy_block():
    return Catalog.discover(FIXTURES).block("toy/axpy")


@pytest.mark.parametrize("name", sorted(CANDIDATES))
def test_each_cheat_gets_its_status(axpy_block, name):
    module, failure = load_candidate(KERNEL + CANDIDATES[name], f"verify_{name}")
    assert failure is None
    shapes = axpy_block.shapes("smoke") + axpy_block.shapes("check")
    results = verify(axpy_block, module.run, shapes, torch.float16, "cpu")
    statuses = {v.status for _, v in results}
    expected = EXPECTED[name]
    if expected is Status.OK:
        assert statuses == {Status.OK}, [v.message for _, v in results]
    else:
        assert results[-1][1].status is expected, results[-1][1].message
        assert results[-1][1].message


def test_determinism_is_the_blocks_rule(axpy_block, monkeypatch):
    """Whether call 2 must be bit-identical to call 1 is read from the block (issue 29: no
    template header can loosen it): the same wobbling candidate is rejected by a deterministic
    block and judged by tolerance where the block allows atomics."""
    module, _ = load_candidate(KERNEL + CANDIDATES["nondeterministic"], "verify_nondet_block")
    shape = axpy_block.shapes("smoke")[0]
    assert verify_shape(axpy_block, module.run, shape, torch.float16, "cpu").status is Status.REJECTED
    monkeypatch.setattr(axpy_block, "deterministic", False)
    assert verify_shape(axpy_block, module.run, shape, torch.float16, "cpu").status is not Status.REJECTED


def test_deferred_thread_message_names_the_trick(axpy_block):
    module, _ = load_candidate(KERNEL + CANDIDATES["deferred_thread"], "verify_deferred_msg")
    verdict = verify_shape(axpy_block, module.run, axpy_block.shapes("smoke")[0], torch.float16, "cpu")
    assert "thread" in verdict.message or "deferred" in verdict.message


def test_compare_rejects_nan_and_inf_even_when_reference_agrees():
    ref = torch.tensor([1.0, float("nan"), 3.0])
    out = torch.tensor([1.0, float("nan"), 3.0])
    rel, _, problem = compare(out, ref, TOLERANCES[torch.float32])
    assert math.isinf(rel) and "NaN" in problem


def test_compare_elementwise_catches_a_single_bad_element():
    ref = torch.linspace(-1, 1, 4096)
    out = ref.clone()
    out[17] += 0.5  # tiny in norm over 4096 elements, large for one element
    rel, excess, problem = compare(out.to(torch.bfloat16), ref, TOLERANCES[torch.bfloat16])
    assert rel < TOLERANCES[torch.bfloat16].rel_norm
    assert excess > 1 and "element (17,)" in problem


def test_constant_reference_is_a_harness_error(axpy_block, monkeypatch):
    module, _ = load_candidate(KERNEL + CANDIDATES["honest"], "verify_constant")
    monkeypatch.setattr(type(axpy_block), "reference", lambda self, x, y, alpha: torch.ones_like(x, dtype=torch.float32))
    with pytest.raises(HarnessError, match="nearly constant"):
        verify_shape(axpy_block, module.run, axpy_block.shapes("smoke")[0], torch.float32, "cpu")


def test_evaluate_times_only_what_verified(axpy_block):
    template = Catalog.discover(FIXTURES).baseline("toy/axpy")
    good = Candidate.from_template(template)
    device = InterpretDevice(warmup=0, repeats=2)
    [ok] = evaluate(axpy_block, good.source, axpy_block.shapes("smoke"), torch.bfloat16, device)
    assert ok.status is Status.OK and ok.timing is not None
    assert ok.timing.method == "interpreter-wall" and "not GPU speed" in ok.timing.label
    [bad] = evaluate(axpy_block, KERNEL + CANDIDATES["slightly_wrong"], axpy_block.shapes("smoke"),
                     torch.float16, device)
    assert bad.status is Status.WRONG and bad.timing is None


def test_a_source_that_does_not_import_is_a_compile_error(axpy_block):
    [ev] = evaluate(axpy_block, "def run(:\n", axpy_block.shapes("smoke"), torch.float16, InterpretDevice())
    assert ev.status is Status.COMPILE_ERROR and "SyntaxError" in ev.verification.message


def test_a_failing_import_or_call_keeps_the_full_traceback_beside_a_short_message(axpy_block):
    """For ``kernelforge check --verbose``: the message stays one line, the traceback is complete."""
    [ev] = evaluate(axpy_block, "import triton\n\ndef run(:\n", axpy_block.shapes("smoke"), torch.float16,
                    InterpretDevice())
    assert ev.status is Status.COMPILE_ERROR and "\n" not in ev.verification.message
    assert "Traceback" in ev.verification.traceback and "SyntaxError" in ev.verification.traceback
    module, _ = load_candidate(KERNEL + CANDIDATES["raises"], "verify_traceback")
    verdict = verify_shape(axpy_block, module.run, axpy_block.shapes("smoke")[0], torch.float16, "cpu")
    assert verdict.message == "n1000: ValueError: boom"
    assert "raise ValueError('boom')" in verdict.traceback and "ValueError: boom" in verdict.traceback
