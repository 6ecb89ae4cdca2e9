"""One timing method per shape (issue 11): decided once from the baseline's probe, carried to the
device in every round of the shape, stored with each result, never mixed in a comparison.

No GPU here: the CUDA device's decision is driven through a simulated device whose event probe
answers chosen times (everything else of ``CudaDevice.time`` runs as written), and the plan's
journey through the executor runs on the interpreter with the tiny toy/axpy block.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from kernelforge.candidate import Candidate
from kernelforge.catalog import Catalog
from kernelforge.devices.base import MethodUnavailable
from kernelforge.devices.cuda import (BACKLOG_MAX_S, EVENTS, GRAPH, GRAPH_THRESHOLD_S, CudaDevice,
                                      backlog_seconds, choose_method)
from kernelforge.devices.interpret import INTERPRETER_METHOD, InterpretDevice
from kernelforge.execute.inprocess import InProcessExecutor
from kernelforge.execute.worker.executor import WorkerExecutor
from kernelforge.execute.timing.rounds import TimingPlan
from kernelforge.objective import time_ratio
from kernelforge.result import Status, StoredResult, Timing
from kf_simulated_gpu import SimulatedGpu

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "kernels"


def _time(device: CudaDevice, method: str | None = None) -> Timing:
    return device.time([lambda: None], working_set_bytes=1 << 30, method=method)


def test_choose_method_is_the_threshold_on_the_probe():
    assert choose_method(GRAPH_THRESHOLD_S * 0.95) == GRAPH
    assert choose_method(GRAPH_THRESHOLD_S) == EVENTS
    assert choose_method(1e-3) == EVENTS


def test_a_launch_bound_call_is_timed_as_graph_replays_as_serving_runs_it():
    # Decode at batch 8 or MoE at a few tokens: 60 us on the GPU, 45 us of Python to enqueue.
    assert choose_method(60e-6, host_launch_s=45e-6) == GRAPH
    assert choose_method(60e-6, host_launch_s=10e-6) == EVENTS
    assert choose_method(5e-3, host_launch_s=1e-3) == EVENTS  # long kernels: events
    timing = _time(SimulatedGpu(60e-6, launch_s=45e-6))
    assert timing.method == GRAPH and timing.extra["launch_bound"] is True
    assert timing.extra["host_launch_s"] == pytest.approx(45e-6)  # stored beside the GPU time


def test_the_gpu_work_queued_ahead_outlasts_the_hosts_launch_and_is_stored():
    device = SimulatedGpu(200e-6, launch_s=30e-6)
    timing = _time(device)
    assert timing.method == EVENTS and timing.extra["launch_bound"] is False
    assert timing.extra["backlog_s"] == pytest.approx(backlog_seconds(30e-6))
    assert backlog_seconds(30e-6) > 30e-6 and backlog_seconds(1.0) == BACKLOG_MAX_S


def test_a_candidate_across_the_threshold_keeps_the_baselines_method():
    # The baseline probes at 19 us (graph replays); a candidate probing at 21 us would, deciding for
    # itself, be timed by events: the two figures would differ by the ~5 us launch overhead alone.
    baseline = _time(SimulatedGpu(19e-6))
    assert baseline.method == GRAPH and baseline.extra["method_from"] == "probe"
    assert _time(SimulatedGpu(21e-6)).method == EVENTS  # what deciding per candidate did
    fixed = _time(SimulatedGpu(21e-6), method=baseline.method)
    assert fixed.method == GRAPH and fixed.extra["method_from"] == "the shape's baseline"
    assert fixed.extra["probe_s"] == pytest.approx(21e-6)
    # And the other way: an events baseline keeps a 19 us candidate on events.
    assert _time(SimulatedGpu(19e-6), method=EVENTS).method == EVENTS


def test_a_fixed_graph_method_that_cannot_capture_gives_no_timing():
    # Deciding for itself, an uncapturable shape falls back to events (that is then its method)...
    assert _time(SimulatedGpu(10e-6, capturable=False)).method == EVENTS
    # ...but a candidate on a graph-timed shape is never timed another way.
    with pytest.raises(MethodUnavailable, match="not be comparable"):
        _time(SimulatedGpu(10e-6, capturable=False), method=GRAPH)
    with pytest.raises(MethodUnavailable):
        _time(SimulatedGpu(10e-6), method=INTERPRETER_METHOD)


def test_energy_is_absent_with_a_reason_when_nvml_was_not_started():
    timing = _time(SimulatedGpu(50e-6))
    assert timing.joules_per_call is None
    assert timing.extra["energy"].startswith("no energy")


def test_the_interpreter_has_one_method_and_refuses_others():
    device = InterpretDevice(warmup=0, repeats=1)
    assert device.time([lambda: None]).method == INTERPRETER_METHOD
    assert device.time([lambda: None], method=INTERPRETER_METHOD).method == INTERPRETER_METHOD
    with pytest.raises(MethodUnavailable):
        device.time([lambda: None], method=GRAPH)


def test_plan_names_methods_per_shape_and_guards_its_key():
    plan = TimingPlan.of("toy/axpy", torch.float16, [("n7", GRAPH), ("n1", EVENTS), ("untimed", None)])
    assert plan.methods == (("n1", EVENTS), ("n7", GRAPH))
    assert plan.method_for("toy/axpy", "n7", torch.float16) == GRAPH
    assert plan.method_for("toy/axpy", "other", torch.float16) is None
    with pytest.raises(ValueError):
        plan.method_for("toy/router", "n7", torch.float16)
    with pytest.raises(ValueError):
        plan.method_for("toy/axpy", "n7", torch.bfloat16)


def _executor(kind: str):
    device = InterpretDevice(warmup=0, repeats=1)
    return InProcessExecutor(device, held_out=False) if kind == "in-process" else WorkerExecutor(device, held_out=False)


@pytest.mark.interpreter
@pytest.mark.parametrize("kind", ["in-process", "worker"])
def test_the_plan_travels_to_the_device_and_a_foreign_method_is_no_timing(kind):
    catalog = Catalog.discover(FIXTURES)
    block = catalog.block("toy/axpy")
    source = Candidate.from_template(catalog.baseline("toy/axpy")).source
    shape = block.shapes("check")[0]
    executor = _executor(kind)
    executor.prepare()
    try:
        # The interpreter path is unchanged: no plan, or its own method, gives interpreter-wall.
        [free] = executor.evaluate(block, source, [shape], torch.float16)
        plan = TimingPlan.of(block.id, torch.float16, [(shape.name, INTERPRETER_METHOD)])
        [same] = executor.evaluate(block, source, [shape], torch.float16, plan=plan)
        # A shape whose baseline was graph-timed cannot be timed by this device: no figure at all.
        foreign = TimingPlan.of(block.id, torch.float16, [(shape.name, GRAPH)])
        [refused] = executor.evaluate(block, source, [shape], torch.float16, plan=foreign)
    finally:
        executor.close()
    assert free.status is Status.OK and free.timing.method == INTERPRETER_METHOD
    assert same.status is Status.OK and same.timing.method == INTERPRETER_METHOD
    assert refused.timing is None and refused.status is Status.RUNTIME_ERROR
    assert "interpreter-wall" in refused.verification.message


class IgnoresMethod(InterpretDevice):
    """A device that answers with another method than the one asked for."""

    def time(self, calls, *, working_set_bytes=0, before=None, method=None):
        timing = super().time(calls, working_set_bytes=working_set_bytes, before=before)
        return Timing(timing.median_s, timing.p20_s, timing.p80_s, timing.samples, EVENTS, "lies")


@pytest.mark.interpreter
def test_a_timing_by_another_method_than_the_plans_is_rejected():
    catalog = Catalog.discover(FIXTURES)
    block = catalog.block("toy/axpy")
    source = Candidate.from_template(catalog.baseline("toy/axpy")).source
    shape = block.shapes("check")[0]
    executor = InProcessExecutor(IgnoresMethod(warmup=0, repeats=1), held_out=False)
    plan = TimingPlan.of(block.id, torch.float16, [(shape.name, INTERPRETER_METHOD)])
    [ev] = executor.evaluate(block, source, [shape], torch.float16, plan=plan)
    assert ev.timing is None and ev.status is Status.REJECTED
    assert "not comparable" in ev.verification.message


def _result(candidate: str, median_s: float, method: str) -> StoredResult:
    return StoredResult(candidate_id=candidate, block="toy/axpy", shape="n7", dtype="float16", device="cuda",
                        env_key="e", status=Status.OK, rel_error=0.0, median_s=median_s, p20_s=median_s,
                        p80_s=median_s, samples=20, timing_method=method, timing_label="", joules=None,
                        flops=1.0, bytes=1.0, message="", env={}, job="j", created=0.0, excess=0.0)


def test_results_timed_by_different_methods_are_never_compared():
    baseline = {"n7": _result("base", 20e-6, GRAPH)}
    assert time_ratio([_result("cand", 10e-6, GRAPH)], baseline) == pytest.approx(0.5)
    assert time_ratio([_result("cand", 10e-6, EVENTS)], baseline) is None
