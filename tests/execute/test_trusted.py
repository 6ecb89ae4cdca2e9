"""The verdict is made in the trusted process (issue 10, item 1): with the static policy off, so
that the run-time defense is what is tested, a candidate that changes anything in its own (the
worker's) process, including the worker's own checks, still gets a failing verdict; honest
kernels pass; the timed calls are verified calls; the reported timing must fit the trusted side's
wall clock; and the expected output never exists in the worker."""

from __future__ import annotations

import dataclasses
import os
import pickle
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from kernelforge.candidate import Candidate
from kernelforge.catalog import Catalog
from kernelforge.devices.interpret import InterpretDevice
from kernelforge.execute.timing.check import TIMING_MISMATCH_FLAG
from kernelforge.execute.judge.held_out import INTERPRETER_HELD_OUT
from kernelforge.execute.worker.executor import WorkerExecutor
from kernelforge.result import Status

pytestmark = pytest.mark.interpreter

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "kernels"
CATALOG = Catalog.discover(FIXTURES)
AXPY = CATALOG.block("toy/axpy")
SMOKE = AXPY.shapes("smoke")
HONEST = Candidate.from_template(CATALOG.baseline("toy/axpy")).source
LAUNCH = "    _axpy[(triton.cdiv(n, 256),)](x, y, out, alpha, n, BLOCK=256, num_warps=4)\n"
assert HONEST.endswith(LAUNCH)

#: Kernels a cheat uses besides the honest one: fill an output with a value, copy a tensor.
KERNELS = '''

@triton.jit
def _fill(ptr, value, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    tl.store(ptr + offs, tl.full((BLOCK,), value, tl.float32).to(ptr.dtype.element_ty), mask=offs < n)


@triton.jit
def _copy(src_ptr, dst_ptr, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    tl.store(dst_ptr + offs, tl.load(src_ptr + offs, mask=mask).to(dst_ptr.dtype.element_ty), mask=mask)


@triton.jit
def _isnan_flag(src_ptr, flag_ptr):
    first = tl.load(src_ptr).to(tl.float32)
    tl.store(flag_ptr, (first != first).to(tl.int32))


@triton.jit
def _axpy_if(x_ptr, y_ptr, out_ptr, flag_ptr, alpha, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    go = tl.load(flag_ptr + offs * 0) != 0
    mask = (offs < n) & go
    x = tl.load(x_ptr + offs, mask=mask).to(tl.float32)
    y = tl.load(y_ptr + offs, mask=mask).to(tl.float32)
    tl.store(out_ptr + offs, (alpha * x + y).to(out_ptr.dtype.element_ty), mask=mask)
'''

#: Switches off every check the worker makes about its own process: the harness snapshot, the
#: thread count, the host-compute watcher. What is left is the trusted side.
BLIND_THE_WORKER = '''
import sys
import threading
import torch


class _NoWatch:
    def __init__(self, *args):
        pass

    violation = None
    depth = 0

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return None


for _module in list(sys.modules.values()):
    if getattr(_module, "__name__", "").startswith("kernelforge."):
        if hasattr(_module, "harness_changes"):
            _module.harness_changes = lambda *args, **kwargs: []
        if hasattr(_module, "HostComputeGuard"):
            _module.HostComputeGuard = _NoWatch
threading.active_count = lambda: 1
'''


def cheat(prelude: str, body: str) -> str:
    """The honest axpy source with ``prelude`` at module level and ``run``'s body replaced."""
    head = HONEST[: HONEST.index("def run(")]
    return head + KERNELS + BLIND_THE_WORKER + prelude + "\n\ndef run(x, y, alpha, out):\n    n = x.numel()\n" + body


WRITE_CONSTANT = "    _fill[(triton.cdiv(n, 256),)](out, 3.0, n, BLOCK=256)\n"
WRITE_NAN = "    _fill[(triton.cdiv(n, 256),)](out, float('nan'), n, BLOCK=256)\n"

#: Calls before timing: the held-out calls, then the three checks of the timed shape.
CHECKED = INTERPRETER_HELD_OUT + 3
CHEATS = {
    # (a) The comparison, torch.equal and the verifier's functions, patched in the worker.
    "patches the comparison and torch.equal": (
        "torch.equal = lambda a, b: True\n"
        "import kernelforge.execute.judge.compare as _c\n"
        "import kernelforge.execute.judge.verify as _v\n"
        "_c.check = _c.compare = lambda *a, **k: (0.0, 0.0, '')\n"
        "_v.judge = lambda *a, **k: (0.0, 0.0, '')\n"
        "_v.bits_equal = lambda a, b: True\n",
        WRITE_CONSTANT, Status.WRONG, "relative error"),
    # (b) torch.Tensor methods patched through an alias of the class.
    "patches torch.Tensor through an alias": (
        "T = torch.Tensor\n"
        "T.any = lambda self, *a, **k: torch.tensor(False)\n"
        "T.sum = lambda self, *a, **k: torch.tensor(0)\n"
        "T.__ne__ = lambda self, other: torch.zeros(self.shape, dtype=torch.bool)\n",
        WRITE_NAN, Status.WRONG, "NaN"),
    # (c) Computes only when its output arrives NaN-poisoned (checked on the device).
    "computes only into a poisoned output": (
        "",
        "    flag = torch.empty(1, dtype=torch.int32, device=out.device)\n"
        "    _isnan_flag[(1,)](out, flag)\n"
        "    _axpy_if[(triton.cdiv(n, 256),)](x, y, out, flag, alpha, n, BLOCK=256)\n",
        Status.WRONG, "new values in the same buffers"),
    # (d) Computes on the held-out calls and the three checks only, then skips the work.
    "computes only on the held-out calls and the checks": (
        "_CALLS = [0]\n",
        "    _CALLS[0] += 1\n"
        f"    if _CALLS[0] <= {CHECKED}:\n"
        "        _axpy[(triton.cdiv(n, 256),)](x, y, out, alpha, n, BLOCK=256)\n"
        "    else:\n"
        "        _copy[(1,)](out, out, 0, BLOCK=256)\n",
        Status.WRONG, "(timed call 1 of 4): 1000 output element(s) left unwritten while timed"),
    # (d) Skips the work only on the timed calls (one warm-up, three repeats), then computes again
    # for the re-check after timing: every timed call is verified and has its outputs counted.
    "skips the work only while timed": (
        "_CALLS = [0]\n",
        "    _CALLS[0] += 1\n"
        f"    if _CALLS[0] <= {CHECKED} or _CALLS[0] > {CHECKED + 4}:\n"
        "        _axpy[(triton.cdiv(n, 256),)](x, y, out, alpha, n, BLOCK=256)\n"
        "    else:\n"
        "        _copy[(1,)](out, out, 0, BLOCK=256)\n",
        Status.WRONG, "(timed call 1"),
    # (e) Returns at once and finishes the work on a thread (the worker's thread count is blind).
    "finishes on a thread after returning": (
        "import time\n\n\n"
        "def _late(x, y, alpha, out, n):\n"
        "    time.sleep(1.5)\n"
        "    _axpy[(triton.cdiv(n, 256),)](x, y, out, alpha, n, BLOCK=256)\n",
        "    _copy[(triton.cdiv(n, 256),)](y, out, n, BLOCK=256)\n"
        "    threading.Thread(target=_late, args=(x, y, alpha, out, n)).start()\n",
        Status.REJECTED, "seen from outside the worker"),
    # A thread started when the module is imported.
    "starts a thread when imported": (
        "import time\n"
        "threading.Thread(target=time.sleep, args=(3.0,), daemon=True).start()\n",
        LAUNCH, Status.REJECTED, "started a thread when imported"),
    # (f) Reports a fake fast time: the worker's timer runs 1000 times slow.
    "reports a fake fast time": (
        "import time\n_real = time.perf_counter\ntime.perf_counter = lambda: _real() * 1e-3\n",
        LAUNCH, Status.REJECTED, TIMING_MISMATCH_FLAG),
    # ... and a fake slow one (a baseline made to look slow would inflate a speedup).
    "reports a fake slow time": (
        "import time\n_real = time.perf_counter\ntime.perf_counter = lambda: _real() * 1e3\n",
        LAUNCH, Status.REJECTED, TIMING_MISMATCH_FLAG),
    # Changes an input only while timed (the calls after the four checked ones).
    "modifies an input while timed": (
        "_CALLS = [0]\n",
        "    _CALLS[0] += 1\n"
        "    _axpy[(triton.cdiv(n, 256),)](x, y, out, alpha, n, BLOCK=256)\n"
        f"    if {CHECKED} < _CALLS[0] <= {CHECKED + 4}:\n"
        "        _fill[(1,)](y, 0.0, 1, BLOCK=256)\n",
        Status.REJECTED, "while timed"),
}


@pytest.fixture(scope="module")
def blind():
    """A worker with the policy off (the run-time defense is what is tested)."""
    executor = WorkerExecutor(InterpretDevice(), run_timeout=120, policy=False)
    yield executor
    executor.close()


def test_an_honest_kernel_passes_and_its_timing_carries_the_trusted_figures(blind):
    [ev] = blind.evaluate(AXPY, HONEST, SMOKE, torch.float16)
    assert ev.status is Status.OK and ev.timing is not None, ev.verification.message
    extra, timing = ev.timing.extra, ev.timing
    assert extra["reported_total_s"] == pytest.approx(timing.median_s * timing.samples) and timing.samples == 3
    # The trusted wall clock of the round holds every timed call, so at least the two calls at or
    # above the median: twice the median. Not median x 3: that exceeds the round when the load
    # slows two repeats by more than the fast one and the warm-up took (measured idle: a 22 ms
    # round against 16 ms reported, 5 ms calls).
    assert extra["round_wall_s"] >= 2 * timing.median_s > 0
    assert 0 < extra["round_cpu_s"] <= extra["round_wall_s"] + 0.02  # the worker's calling thread
    assert extra["verified_calls"] == [1, 2, 3, 4]  # every call: one warm-up and three repeats


def test_honest_rounds_pass_while_other_processes_load_every_core():
    """The clocks check must not reject honest work on a busy machine: one call a round, so the
    request, the answer and the waits to be scheduled are most of the round's wall time (the
    check reads the worker's CPU time, which they do not grow)."""
    executor = WorkerExecutor(InterpretDevice(warmup=0, repeats=1), run_timeout=300)
    burners = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(8 * (os.cpu_count() or 1))]
    try:
        for _ in range(3):
            [ev] = executor.evaluate(AXPY, HONEST, SMOKE, torch.float16)
            assert ev.status is Status.OK, ev.verification.message
        speedups = executor.pair_speedups(AXPY, HONEST, HONEST, SMOKE[0], torch.float16, 8)
        assert len(speedups) == 8 and all(s > 0 for s in speedups)
    finally:
        for burner in burners:
            burner.kill()
            burner.wait()
        executor.close()


def test_a_blinded_worker_still_judges_honest_code_ok(blind):
    [ev] = blind.evaluate(AXPY, cheat("", LAUNCH), SMOKE, torch.float16)
    assert ev.status is Status.OK, ev.verification.message


@pytest.mark.parametrize("name", sorted(CHEATS))
def test_what_a_candidate_changes_in_its_process_does_not_change_the_verdict(blind, name):
    prelude, body, status, fragment = CHEATS[name]
    evaluations = blind.evaluate(AXPY, cheat(prelude, body), SMOKE, torch.float16)
    assert [ev.status for ev in evaluations] == [status] * len(SMOKE), [ev.verification.message for ev in evaluations]
    assert fragment in evaluations[0].verification.message, evaluations[0].verification.message
    assert all(ev.timing is None for ev in evaluations)


def test_requests_to_the_worker_never_carry_a_tensor_or_the_reference(blind, monkeypatch):
    """Tensors reach the worker only through shared memory (a slot: a few integers); the
    expected output is computed in this process and exists nowhere in what the worker is sent."""
    sent: list = []
    process = blind._process
    original = process.send
    monkeypatch.setattr(process, "send", lambda message: (sent.append(message), original(message))[1])
    [ev] = blind.evaluate(AXPY, HONEST, SMOKE, torch.float16)
    assert ev.status is Status.OK, ev.verification.message

    def walk(value):
        assert not isinstance(value, torch.Tensor), f"a tensor in a request: {value!r}"[:200]
        if dataclasses.is_dataclass(value):
            for item in vars(value).values():
                walk(item)
        elif isinstance(value, dict):
            for item in value.values():
                walk(item)
        elif isinstance(value, (list, tuple)):
            for item in value:
                walk(item)

    kinds = [type(message).__name__ for message in sent]
    assert {"Load", "Call", "Sync", "Time", "Release"} <= set(kinds)
    for message in sent:
        walk(message)
        assert len(pickle.dumps(message)) < 20000, message  # the candidate's source is the largest
    # The reference of every call's inputs, as fp32 bytes and in the output dtype: in no request.
    blob = b"".join(pickle.dumps(m) for m in sent)
    for seed, distribution in ((0, "normal"), (7919, "large"), (101, "normal"), (1000, "normal")):
        for shape in (*SMOKE, *AXPY.shapes("check")):
            inputs = AXPY.make_inputs(shape, torch.float16, "cpu", seed, distribution)
            ref = AXPY.reference(**inputs)
            for tensor in (ref, ref.to(torch.float16)):
                raw = tensor.contiguous().view(torch.uint8).numpy().tobytes()
                assert len(raw) < 16 or raw not in blob


def test_the_interpreter_wall_check_accepts_honest_rounds_and_rejects_impossible_ones():
    from kernelforge.execute.timing.check import wall_problem
    from kernelforge.result import Timing

    device = InterpretDevice(warmup=1, repeats=3)

    def timing(median):
        return Timing(median, median, median, 3, "interpreter-wall", "interpreter")

    assert wall_problem(timing(0.010), 0.045, device) == ""  # 4 calls of 10 ms and 5 ms of overhead
    assert wall_problem(timing(0.010), 0.150, device) == ""  # a call slowed down by the machine
    assert "far below" not in wall_problem(timing(1e-5), 0.045, device)
    assert "trusted side's clock" in wall_problem(timing(1e-5), 0.045, device)  # reported 1000x too fast
    assert "trusted side's clock" in wall_problem(timing(0.100), 0.045, device)  # more than the round took
    # With the calling thread's CPU time, a loaded machine (the wall clock far above the work) is
    # no reason to reject; CPU time far above the reported calls is.
    assert wall_problem(timing(0.010), 2.0, device, cpu_s=0.045) == ""
    assert "CPU time" in wall_problem(timing(1e-4), 2.0, device, cpu_s=0.045)
    assert "trusted side's clock" in wall_problem(timing(0.100), 0.045, device, cpu_s=0.045)
    gpu = Timing(1e-6, 1e-6, 1e-6, 150, "cuda-events", "GPU")
    assert wall_problem(gpu, 0.5, device) == ""  # no lower bound on a GPU: launches dominate its wall time


# -- the same judge in this process (--in-process, --trusted) -------------------------------------


def test_in_process_the_judge_verifies_a_timed_call_too():
    """Without held-out shapes, calls 1-3 are the checks, 4-7 the round (one warm-up, three
    repeats) and 8 the re-check: skipping the work on the round alone is seen at the first call it
    skips, and writing a wrong result on one timed call only is seen by the full verification of
    that call (every timed call is verified in the interpreter), named in the message."""
    import random

    from kernelforge.execute.evaluate import evaluate

    source = HONEST[: HONEST.index("def run(")] + KERNELS + (
        "\n\n_CALLS = [0]\n\n\ndef run(x, y, alpha, out):\n    n = x.numel()\n    _CALLS[0] += 1\n"
        "    if 4 <= _CALLS[0] <= 7:\n        _copy[(1,)](out, out, 0, BLOCK=256)\n    else:\n"
        "        _axpy[(triton.cdiv(n, 256),)](x, y, out, alpha, n, BLOCK=256)\n")
    for seed in range(3):
        [ev] = evaluate(AXPY, source.replace("_CALLS = [0]", f"_CALLS = [0]  # {seed}"), SMOKE, torch.float16,
                        InterpretDevice(), rng=random.Random(seed))
        assert ev.status is Status.WRONG and "(timed call 1 of 4)" in ev.verification.message, ev.verification.message
    # A cheaper wrong answer (y alone) instead of skipping, on the third timed call only.
    wrong_once = HONEST[: HONEST.index("def run(")] + KERNELS + (
        "\n\n_CALLS = [0]\n\n\ndef run(x, y, alpha, out):\n    n = x.numel()\n    _CALLS[0] += 1\n"
        "    if _CALLS[0] == 6:\n        _copy[(triton.cdiv(n, 256),)](y, out, n, BLOCK=256)\n    else:\n"
        "        _axpy[(triton.cdiv(n, 256),)](x, y, out, alpha, n, BLOCK=256)\n")
    [ev] = evaluate(AXPY, wrong_once, SMOKE, torch.float16, InterpretDevice())
    assert ev.status is Status.WRONG, ev.verification.message
    assert "(timed call 3, verified after timing)" in ev.verification.message, ev.verification.message


def test_a_block_that_does_not_reset_its_inplace_inputs_is_verified_on_their_values_at_the_call():
    """The in-place input drifts with the candidate's own updates while timed (no reset): the
    worker copies its value before the verified call, and the honest router still passes."""
    from kernelforge.execute.inprocess import InProcessExecutor

    router = CATALOG.block("toy/router")
    block = type("RouterNoReset", (type(router),), {"inplace_reset": False})("toy/router")
    source = Candidate.from_template(CATALOG.baseline("toy/router")).source
    [ev] = InProcessExecutor(InterpretDevice()).evaluate(block, source, block.shapes("smoke"), torch.float16)
    assert ev.status is Status.OK and ev.timing is not None, ev.verification.message
