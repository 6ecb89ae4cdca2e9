"""The Executor contract (kernelforge.execute.executor), run by every implementation: in-process
and worker on the interpreter with tiny toy blocks, and replay from a recording of the in-process
answers."""

from __future__ import annotations

import time
from pathlib import Path

import pytest
import torch

from kernelforge.candidate import Candidate
from kernelforge.catalog import Catalog
from kernelforge.devices.interpret import InterpretDevice
from kernelforge.execute.executor import Executor
from kernelforge.execute.inprocess import InProcessExecutor
from kernelforge.execute.worker.executor import WorkerExecutor
from kernelforge.result import Evaluation, Status, StoredResult, env_key

pytestmark = pytest.mark.interpreter

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "kernels"
CATALOG = Catalog.discover(FIXTURES)
AXPY = CATALOG.block("toy/axpy")
ROUTER = CATALOG.block("toy/router")
HONEST = Candidate.from_template(CATALOG.baseline("toy/axpy")).source
ROUTER_HONEST = Candidate.from_template(CATALOG.baseline("toy/router")).source
WRONG = HONEST.replace("(alpha * x + y)", "(alpha * x - y)")
BROKEN = HONEST + "\nTABLE = [1, 2][5]  # fails when imported\n"
POLICY = "import os\n" + HONEST
SHAPES = AXPY.shapes("check")[:2]  # n1, n7: a few interpreter calls each
DTYPE = torch.float16


def _device() -> InterpretDevice:
    return InterpretDevice(warmup=0, repeats=1)


def _record(path: Path) -> None:
    """A recording for the replay executor: what the in-process executor answered."""
    from kernelforge.store.store import Store

    executor = InProcessExecutor(_device())
    env = executor.describe()
    store = Store(f"sqlite:///{path}")
    for block, source in ((AXPY, HONEST), (AXPY, WRONG), (ROUTER, ROUTER_HONEST)):
        shapes = SHAPES if block is AXPY else block.shapes("smoke")
        store.add_candidate(Candidate(block.id, f"{block.id}/contract", (), source))
        for ev in executor.evaluate(block, source, shapes, DTYPE):
            t, v = ev.timing, ev.verification
            store.add_result(StoredResult(
                candidate_id=Candidate(block.id, f"{block.id}/contract", (), source).id, block=block.id, shape=ev.shape.name, dtype="float16",
                device="interpret", env_key=env_key(env), status=v.status, rel_error=v.rel_error,
                median_s=t.median_s if t else None, p20_s=t.p20_s if t else None, p80_s=t.p80_s if t else None,
                samples=t.samples if t else None, timing_method=t.method if t else None,
                timing_label=t.label if t else None, joules=None, flops=ev.counts.flops, bytes=ev.counts.bytes,
                message=v.message, env=env, job="contract", created=time.time(), excess=v.excess))
    store.close()


@pytest.fixture(scope="module", params=["in-process", "worker", "replay"])
def executor(request, tmp_path_factory):
    if request.param == "in-process":
        made = InProcessExecutor(_device())
    elif request.param == "worker":
        made = WorkerExecutor(_device(), run_timeout=120)
    else:
        from kernelforge.execute.replay import ReplayExecutor

        path = tmp_path_factory.mktemp("replay") / "kernelforge.db"
        _record(path)
        made = ReplayExecutor(path)
    made.prepare()
    yield made
    made.close()


def test_it_is_an_executor_and_says_what_it_is(executor):
    assert isinstance(executor, Executor)
    assert executor.kind in ("interpret", "replay") and isinstance(executor.runs_code, bool)
    assert executor.runs_code is (executor.kind != "replay")
    env = executor.describe()
    assert isinstance(env, dict) and env["device"] == executor.kind
    if executor.runs_code:
        # the device's environment, plus the sandbox its candidates run in and the run's held-out
        # seed (recorded with every result)
        own = ("sandbox", "held_out_seed")
        assert {k: v for k, v in env.items() if k not in own} == _device().describe() and env["sandbox"]


def _check_one_per_shape(results: list, shapes: list) -> None:
    assert [type(r) for r in results] == [Evaluation] * len(shapes)
    assert [r.shape.name for r in results] == [s.name for s in shapes]


def test_an_honest_candidate_is_ok_and_timed_on_every_shape(executor):
    results = executor.evaluate(AXPY, HONEST, SHAPES, DTYPE)
    _check_one_per_shape(results, SHAPES)
    assert all(r.status is Status.OK and r.timing is not None for r in results), [r.verification.message for r in results]


def test_several_outputs_and_an_inplace_input_come_back_verified_and_timed(executor):
    shapes = ROUTER.shapes("smoke")
    [ev] = executor.evaluate(ROUTER, ROUTER_HONEST, shapes, DTYPE)
    assert ev.status is Status.OK and ev.timing is not None, ev.verification.message


@pytest.mark.parametrize("source, status", [(WRONG, Status.WRONG), (BROKEN, Status.COMPILE_ERROR),
                                            (POLICY, Status.REJECTED)], ids=["wrong", "broken", "policy"])
def test_failures_are_data_one_per_shape(executor, source, status):
    results = executor.evaluate(AXPY, source, SHAPES, DTYPE)
    _check_one_per_shape(results, SHAPES)
    if executor.runs_code:
        assert {r.status for r in results} == {status}, [r.verification.message for r in results]
        assert all(r.timing is None for r in results)
        if status is Status.COMPILE_ERROR:
            assert "IndexError" in results[0].verification.traceback
    else:  # replay answers what was recorded, and runtime_error for what was not
        expected = Status.WRONG if source == WRONG else Status.RUNTIME_ERROR
        assert {r.status for r in results} == {expected}


def test_pair_speedups_are_ratios_or_nothing(executor):
    speedups = executor.pair_speedups(AXPY, HONEST, HONEST, SHAPES[1], DTYPE, 2)
    if executor.runs_code:
        assert len(speedups) == 2 and all(s > 0 for s in speedups)
    else:
        assert speedups == []


def test_close_may_be_called_twice():
    for made in (InProcessExecutor(_device()), WorkerExecutor(_device())):
        made.close()
        made.close()
