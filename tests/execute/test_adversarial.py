"""The adversarial suite: every exploit candidate in tests/adversarial gets its expected status
through the path untrusted code takes (policy, worker process, held-out shapes, post-timing
re-check), and the run-time defense behind the policy catches it too; every honest but unusual
candidate is accepted. See tests/adversarial/README.md and expected.toml."""

from __future__ import annotations

import re
import sys
from pathlib import Path

import pytest
import torch

from kernelforge.block import DTYPES
from kernelforge.candidate import Candidate, source_id
from kernelforge.catalog import Catalog
from kernelforge.devices.interpret import InterpretDevice
from kernelforge.execute.inprocess import InProcessExecutor
from kernelforge.errors import UserError
from kernelforge.result import Status
from kernelforge.textsafe import printable
from kernelforge.template import Template
from kernelforge.execute.worker.executor import WorkerExecutor

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib

pytestmark = pytest.mark.interpreter

REPO = Path(__file__).resolve().parents[2]
ADVERSARIAL = REPO / "tests" / "adversarial"
FIXTURES = REPO / "tests" / "fixtures" / "kernels"
EXPECTED: dict = tomllib.loads((ADVERSARIAL / "expected.toml").read_text(encoding="utf-8"))
#: Exploit rows of EVALUATION.md that need a GPU (side streams; faster than the roofline): in
#: tests/execute/test_gpu_adversarial.py.
GPU_ONLY = {13, 17}


def catalog_for(block_id: str) -> Catalog:
    return Catalog.discover(FIXTURES if block_id.split("/")[0] in ("toy", "demo") else REPO / "kernels")


def template_text(name: str) -> str:
    """The template text of an adversarial candidate (``derive`` + ``replace``, then ``pad_bytes``
    of comment lines, or its file)."""
    spec = EXPECTED[name]
    if "derive" in spec:
        text = (REPO / spec["derive"]).read_text(encoding="utf-8")
        for old, new in spec["replace"]:
            assert old in text, f"{name}: the shipped template changed; update 'replace' in expected.toml"
            text = text.replace(old, new)
    else:
        text = (ADVERSARIAL / spec["block"] / f"{name}.py.j2").read_text(encoding="utf-8")
    return text + "# padding\n" * (spec.get("pad_bytes", 0) // 10)


def candidate(name: str) -> tuple[str, str]:
    """(source, block id) of an adversarial candidate."""
    block_id = EXPECTED[name]["block"]
    template = Template.from_text(template_text(name), template_id=f"{block_id}/{name}", block_id=block_id, where=name)
    return Candidate.from_template(template).source, block_id


@pytest.fixture(scope="module")
def executors():
    device = InterpretDevice()
    full = WorkerExecutor(device, run_timeout=120)
    trusted = WorkerExecutor(device, run_timeout=120, policy=False)
    yield {"full": full, "trusted": trusted}
    full.close()
    trusted.close()


def _check(executor: WorkerExecutor, name: str, status: str, fragment: str | None) -> None:
    spec = EXPECTED[name]
    block = catalog_for(spec["block"]).block(spec["block"])
    if status == "refused":  # the template itself: refused when loaded or rendered, nothing runs
        starts = executor.starts
        with pytest.raises(UserError) as err:
            candidate(name)
        assert fragment in str(err.value), str(err.value)
        assert executor.starts == starts
        return
    source, _ = candidate(name)
    dtype = DTYPES[spec.get("dtype", "float16")]
    evaluations = executor.evaluate(block, source, block.shapes("smoke"), dtype)
    assert len(evaluations) == len(block.shapes("smoke"))
    messages = [ev.verification.message for ev in evaluations]
    assert {ev.status for ev in evaluations} == {Status(status)}, messages
    for ev in evaluations:  # nothing a candidate wrote reaches a terminal or the store raw
        assert printable(ev.verification.message) == ev.verification.message
        assert printable(ev.verification.traceback) == ev.verification.traceback
    if Status(status) is Status.OK:
        assert all(ev.timing is not None and ev.timing.median_s > 0 for ev in evaluations)
    else:
        assert all(ev.timing is None for ev in evaluations)
    if fragment:
        assert fragment in messages[0], messages[0]


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_candidate_gets_its_status(executors, name):
    spec = EXPECTED[name]
    _check(executors["full"], name, spec["status"], spec.get("message"))


@pytest.mark.parametrize("name", sorted(n for n, s in EXPECTED.items() if "trusted_status" in s))
def test_runtime_defense_behind_the_policy(executors, name):
    spec = EXPECTED[name]
    _check(executors["trusted"], name, spec["trusted_status"], spec.get("trusted_message"))


def test_every_exploit_class_has_a_candidate():
    covered = {int(m.group(1)) for s in EXPECTED.values() if (m := re.match(r"(\d+)", s.get("exploit", "")))}
    assert set(range(1, 18)) - GPU_ONLY <= covered
    honest = [n for n, s in EXPECTED.items() if s["status"] == "ok" and n.startswith("honest")]
    assert len(honest) >= 5


def test_every_trust_class_has_a_direct_and_an_indirect_route():
    """Each class of exploit that got through the first version (issue 10) is tried at least two
    ways, so a fix of one instance does not pass for a fix of the class."""
    by_class: dict[str, list[str]] = {}
    for name, spec in EXPECTED.items():
        if "trust_class" in spec:
            by_class.setdefault(spec["trust_class"], []).append(name)
    assert set(by_class) >= {"alias_patching", "dynamic_evaluation", "host_compute", "python_in_jit",
                             "import_time_code", "poison_detection", "os_access",
                             # issue 29
                             "template_code", "unbounded_header", "judge_header", "held_out_steering",
                             "timed_call_counting", "control_characters", "low_precision_mla"}
    assert all(len(names) >= 2 for names in by_class.values()), by_class


def test_a_full_value_cache_never_hits_while_timed():
    """The memoising candidate is correct, so only its speed is at stake: one input value changes
    before every timed call, so its cache hits only on the verifier's deliberately repeated call 2
    of the timed shape (the held-out shape gets one call), never in the timing phase."""
    source, _ = candidate("caches_by_value_full")
    block = catalog_for("toy/axpy").block("toy/axpy")
    # The policy refuses it (.tolist): the run-time defense is what this test is about.
    executor = InProcessExecutor(InterpretDevice(warmup=2, repeats=3), policy=False)
    [ev] = executor.evaluate(block, source, block.shapes("smoke"), torch.float16)
    assert ev.status is Status.OK
    module = sys.modules[f"kernelforge_candidate_toy_axpy_{source_id(source)}"]
    assert len(module.HITS) == 1


def test_a_candidate_that_flips_the_interpreter_switch_does_not_judge_the_next(executors):
    """With the policy off, the knobs candidate runs (and is right), but it changed a setting of
    the worker: the worker is retired, so the next candidate's kernels are interpreted again."""
    trusted = executors["trusted"]
    block = catalog_for("toy/axpy").block("toy/axpy")
    honest, _ = candidate("honest_scratch_buffer")
    [ev] = trusted.evaluate(block, honest, block.shapes("smoke"), torch.float16)  # a worker that has served one
    assert ev.status is Status.OK, ev.verification.message
    source, _ = candidate("triton_knobs")
    [ev] = trusted.evaluate(block, source, block.shapes("smoke"), torch.float16)
    assert ev.status is Status.OK, ev.verification.message
    starts = trusted.starts
    [ev] = trusted.evaluate(block, honest, block.shapes("smoke"), torch.float16)
    assert ev.status is Status.OK, ev.verification.message
    assert trusted.starts == starts + 1


def test_policy_violations_never_reach_a_process():
    executor = WorkerExecutor(InterpretDevice())
    block = catalog_for("toy/axpy").block("toy/axpy")
    source, _ = candidate("reads_secrets")
    try:
        [ev] = executor.evaluate(block, source, block.shapes("smoke"), torch.float16)
        assert ev.status is Status.REJECTED and ev.verification.message.startswith("policy:")
        assert executor.starts == 0
    finally:
        executor.close()


# -- timing integrity, simulated on the CPU ----------------------------------------------------------
# The GPU checks themselves (side streams, the roofline of a real H200) are in
# tests/execute/test_gpu_adversarial.py; here a device that reports GPU-style timings drives evaluate()'s
# handling of them, so the logic is tested where CI runs.


class FakeGpu(InterpretDevice):
    """Runs calls like the interpreter, reports them as CUDA-event timings with a chosen median
    and side-stream verdict, against the H200's ceilings."""

    def __init__(self, median_s: float, mismatch: bool = False):
        super().__init__(warmup=0, repeats=1)
        self.median_s, self.mismatch = median_s, mismatch

    def time(self, calls, *, working_set_bytes=0, before=None):
        from kernelforge.result import Timing

        super().time(calls, working_set_bytes=working_set_bytes, before=before)
        return Timing(self.median_s, self.median_s, self.median_s, 1, "cuda-events", "fake GPU",
                      extra={"event_wall_mismatch": self.mismatch, "drain_s": 1e-3})

    def ceilings(self):
        from kernelforge.devices.hardware import ceilings_for

        return ceilings_for("NVIDIA H200")


PHASE_AT_ROOFLINE_CHECK = """
_CALLS = [0]


def run(x, y, alpha, out):
    _CALLS[0] += 1
    if _CALLS[0] <= 5:  # 3 verification calls, 1 timed call, the post-timing re-check
        axpy(x, y, alpha, out)
    else:
        _copy[(1,)](out, out, 0, BLOCK=256)
"""


def _honest_axpy() -> str:
    return candidate("honest_scratch_buffer")[0]


def test_gpu_work_the_events_missed_is_rejected():
    from kernelforge.execute.evaluate import TIMING_FLAG, evaluate

    block = catalog_for("toy/axpy").block("toy/axpy")
    [ev] = evaluate(block, _honest_axpy(), block.shapes("smoke"), torch.float16, FakeGpu(1e-3, mismatch=True))
    assert ev.status is Status.REJECTED and ev.verification.message.startswith(TIMING_FLAG) and ev.timing is None


def test_faster_than_the_roofline_is_reverified_and_flagged():
    from kernelforge.execute.evaluate import ROOFLINE_FLAG, evaluate

    block = catalog_for("toy/axpy").block("toy/axpy")
    # n1000 in fp16 moves 6000 bytes: 1.25 ns at the H200's 4.8 TB/s; 1 ps is impossible.
    [ev] = evaluate(block, _honest_axpy(), block.shapes("smoke"), torch.float16, FakeGpu(1e-12))
    assert ev.status is Status.OK and ev.verification.message.startswith(ROOFLINE_FLAG)
    assert "re-verified" in ev.verification.message and ev.timing is not None
    [plain] = evaluate(block, _honest_axpy(), block.shapes("smoke"), torch.float16, FakeGpu(1e-3))
    assert plain.status is Status.OK and plain.verification.message == ""
    prelude = _honest_axpy().split("\ndef run(")[0].rsplit("\n\n@triton.jit\ndef _scale", 1)[0]
    cheater = prelude + PHASE_AT_ROOFLINE_CHECK
    [bad] = evaluate(block, cheater, block.shapes("smoke"), torch.float16, FakeGpu(1e-12))
    assert bad.status is Status.WRONG and bad.verification.message.startswith(ROOFLINE_FLAG)
    assert "re-verification failed" in bad.verification.message and bad.timing is None


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float8_e4m3fn, torch.float8_e5m2])
def test_every_floating_input_changes_before_each_timed_call(dtype):
    """The value cache defense (touch_inputs) negates a random half of every floating-point input
    (fp8 weights included: the sign bit is flipped), a new half at each preparation, so two
    consecutive calls differ in about half of every input (a cache that updates what changed does
    the work again); the values after preparation k depend on k and the seed alone (undoing the
    previous preparation's flips), and integer inputs are left alone."""
    from kernelforge.execute.timing.calls import touch_inputs

    generated = (torch.arange(4096, dtype=torch.float32) / 512 + 0.5).to(dtype)
    w = generated.clone()
    ids = torch.arange(64, dtype=torch.int32)
    seed = 12345
    previous, before = None, w.clone()
    for call in range(3):
        touch_inputs({"w": w, "ids": ids}, call, seed, undo=previous)
        changed = (w.float() != before.float())
        assert 0.4 < changed.float().mean() < 0.6, "about half of the input changes between two calls"
        assert torch.equal(w.float().abs(), generated.float().abs()), "only signs change"
        alone = generated.clone()
        touch_inputs({"w": alone}, call, seed)
        assert torch.equal(w.view(torch.uint8), alone.view(torch.uint8)), "the values of preparation k alone"
        previous, before = call, w.clone()
    other = generated.clone()
    touch_inputs({"w": other}, 2, seed + 1)
    assert not torch.equal(other.view(torch.uint8), w.view(torch.uint8)), "another seed, other signs"
    assert torch.equal(ids, torch.arange(64, dtype=torch.int32))


def test_a_cache_that_updates_what_changed_since_its_last_call_does_all_the_work_again():
    """``incremental_cache`` keeps A, B and C = A @ B of its last call per pointer, finds the
    elements of A and B that changed with a diff kernel, and when one of each changed (what the
    preparation of a timed call used to change) updates one row and one column of C: O(MN) work
    per call instead of O(MNK), every result right. The preparation now negates a random half of
    every input, so the update path never runs after the verification call that repeats the same
    inputs (one hit)."""
    source, block_id = candidate_from_file("incremental_cache", "demo/matmul")
    block = catalog_for(block_id).block(block_id)
    executor = InProcessExecutor(InterpretDevice(), policy=True)  # in-process: its hit counter is readable
    executor.prepare()
    [ev] = executor.evaluate(block, source, block.shapes("smoke"), torch.float16)
    hits = sys.modules[f"kernelforge_candidate_{block_id.replace('/', '_')}_{source_id(source)}"]._INCREMENTAL[0]
    assert ev.status is Status.OK, ev.verification.message  # it is a correct kernel...
    assert hits <= 1, f"...whose incremental path served {hits} calls"


def candidate_from_file(name: str, block_id: str) -> tuple[str, str]:
    """(source, block id) of a candidate file under tests/adversarial/<block>/ not listed in
    expected.toml (its test asserts more than a status)."""
    text = (ADVERSARIAL / block_id / f"{name}.py.j2").read_text(encoding="utf-8")
    template = Template.from_text(text, template_id=f"{block_id}/{name}", block_id=block_id, where=name)
    return Candidate.from_template(template).source, block_id
