"""A real CUDA GPU as a device.

CUDA-event timing following EVALUATION.md: warm-up outside the timed region, inputs rotated through
several freshly allocated sets (plus an L2 flush when the sets together would fit in L2), fixed
call counts, median with p20/p80, a full device synchronisation before reading the events, wall
time recorded beside event time, and joules per call from NVML's energy counter whenever it answers
(:mod:`kernelforge.devices.nvml`; without ``nvidia-ml-py`` the timing says so in
``Timing.extra["energy"]``).

The GPU is timed, not the host. An event records when the GPU reaches it: with nothing queued
ahead, the start event fires at once and the GPU then waits for the host's Python to enqueue the
call, so a launch-bound call (decode at small batch, MoE at a few tokens: 50-70 us on the GPU)
would time the host's launch path. So every event-timed call has GPU work queued ahead of its
start event (a spin of :func:`backlog_seconds` of the host's measured launch time, as
``triton.testing.do_bench``'s cache flush does by accident), and the events see only the GPU's
work. The host's launch time itself is measured apart (``Timing.extra["host_launch_s"]``): it is
what a call costs wherever it is not captured in a CUDA graph. The method (events or CUDA-graph
replays) is decided once per (block, shape, dtype) from the baseline's device-side probe and its
launch time (:func:`choose_method`: short or launch-bound calls are graph replays, as serving
engines run them), and every other candidate on the shape is timed with it. The event times are cross-checked against the
host: a call whose GPU work outlives its end event (work on a side stream the events do not see)
is flagged in ``Timing.extra["event_wall_mismatch"]``.
"""

from __future__ import annotations

import contextlib
import math
import re
import statistics
import time
from typing import Any, Iterator, Sequence

import torch

from kernelforge.devices.base import Before, Call, Device, MethodUnavailable, library_versions, quantiles
from kernelforge.devices.nvml import Nvml, energy_per_call
from kernelforge.errors import UserError
from kernelforge.result import Timing
from kernelforge.textsafe import DETAIL, cut

#: Calls shorter than this on the GPU are timed as CUDA-graph replays: launch overhead (about 5 us
#: per kernel) would otherwise dominate an event pair (EVALUATION.md).
GRAPH_THRESHOLD_S = 20e-6
#: A call whose host launch time is at least this fraction of its GPU time is launch-bound: serving
#: engines (vLLM, SGLang) capture such calls (decode, small-batch MoE) in CUDA graphs, so they are
#: timed as graph replays too.
LAUNCH_BOUND_FRACTION = 0.5
#: GPU work queued ahead of each timed call: this many times the host's launch time, plus a margin,
#: within the bounds below (the spin must outlast the enqueue, and costs device time when long).
BACKLOG_FACTOR = 2.0
BACKLOG_MARGIN_S = 20e-6
BACKLOG_MAX_S = 5e-3
#: Target length of one timing round; bounds the device time spent on very long kernels.
ROUND_SECONDS = 1.0
#: Side-stream check: the host waits for a call's GPU work after enqueuing it (``drain``). Work
#: the events see ends at the end event, so an honest drain is at most the event time plus launch
#: and synchronisation latency; a drain above ``DRAIN_FACTOR`` x event time + ``DRAIN_SLACK_S``
#: means GPU work the events did not time (EVALUATION.md #13).
DRAIN_FACTOR = 1.5
DRAIN_SLACK_S = 100e-6


#: Messages after which a CUDA context is lost: the worker that saw one is retired.
CUDA_FATAL = re.compile(r"CUDA error|illegal memory access|device-side assert|unspecified launch failure|"
                        r"misaligned address|CUDA_ERROR|cudaError|an illegal instruction", re.IGNORECASE)

#: The two methods of this device (``Timing.method``).
EVENTS = "cuda-events"
GRAPH = "cuda-graph"
METHODS = (EVENTS, GRAPH)


def choose_method(device_s: float, host_launch_s: float = 0.0) -> str:
    """THE timing-method decision of a shape, made once from its baseline's probe: ``device_s``,
    the median GPU time of 5 event-timed calls with work queued ahead (so no host time is in it),
    and ``host_launch_s``, the median time the host takes to enqueue one call. CUDA-graph replays
    when the call is short on the GPU (under :data:`GRAPH_THRESHOLD_S`) or launch-bound (its launch
    takes at least :data:`LAUNCH_BOUND_FRACTION` of its GPU time: served under CUDA graphs);
    events otherwise. Near a boundary two kernels of about the same speed could land on
    different sides: that is why every other candidate on the shape is timed with the method this
    decision gave its baseline (EVALUATION.md, one timing method per shape)."""
    if device_s < GRAPH_THRESHOLD_S or host_launch_s >= LAUNCH_BOUND_FRACTION * device_s:
        return GRAPH
    return EVENTS


def backlog_seconds(host_launch_s: float) -> float:
    """How long the GPU work queued ahead of each timed call should keep the GPU busy: long enough
    that the host has enqueued the whole call before the start event is reached."""
    return min(BACKLOG_MAX_S, BACKLOG_FACTOR * host_launch_s + BACKLOG_MARGIN_S)


class CudaDevice(Device):
    """A CUDA GPU, timed with events (or CUDA-graph replays for short kernels)."""

    name = "cuda"
    measures_hardware = True
    sandbox_role = "cuda"
    jit_on_first_call = True
    fatal_errors = CUDA_FATAL
    address_space_limit = False
    rotates_input_sets = True
    prepares_every_call = False

    def __init__(self, warmup: int = 10, rounds: int = 3, calls_per_round: int = 50, index: int = 0):
        self.warmup = warmup
        self.rounds = rounds
        self.calls_per_round = calls_per_round
        self.index = index
        self.torch_device = f"cuda:{index}"
        self._flush: torch.Tensor | None = None
        self._nvml: Nvml | None = None

    def prepare(self) -> None:
        require_visible(f"cuda:{self.index}")
        torch.cuda.set_device(self.index)
        self._nvml = Nvml(self.index)

    def synchronize(self) -> None:
        torch.cuda.synchronize(self.index)

    def process_memory(self, pid: int) -> int | None:
        """GPU memory process ``pid`` holds, from NVML (None without it, or where NVML's PIDs are
        another namespace's)."""
        return self._nvml.process_memory(pid) if self._nvml is not None else None

    def memory_held(self) -> int | None:
        """GPU memory held by live tensors of this process (torch's caching allocator), after a
        garbage collection: what a candidate's module keeps alive once its session ended."""
        import gc

        gc.collect()
        return int(torch.cuda.memory_allocated(self.index))

    def round_preparations(self, n_sets: int) -> int:
        """Warm-up, the launch, probe and drain samples (5 each), then either the timed rounds
        (at most ``calls_per_round`` calls each, 5 at least) or one preparation per set before a
        graph capture (:meth:`time`)."""
        return self.warmup + 3 * 5 + max(self.rounds * max(5, self.calls_per_round), n_sets)

    def _l2_bytes(self) -> int:
        props = torch.cuda.get_device_properties(self.index)
        return int(getattr(props, "L2_cache_size", 0) or 64 * 2**20)

    def _flush_l2(self) -> None:
        if self._flush is None:
            # Writing twice the L2 size evicts everything the previous call left there.
            self._flush = torch.empty(2 * self._l2_bytes() // 4, dtype=torch.int32, device=self.torch_device)
        self._flush.zero_()

    def gpu_name(self) -> str:
        """The GPU's name as torch reports it (``NVIDIA H200``)."""
        return torch.cuda.get_device_name(self.index)

    def ceilings(self):
        from kernelforge.devices.hardware import ceilings_for

        return ceilings_for(self.gpu_name())

    def time(self, calls: Sequence[Call], *, working_set_bytes: int = 0, before: Before | None = None,
             method: str | None = None) -> Timing:
        """Time ``calls`` (see :meth:`Device.time`): with ``method`` when the shape has one fixed
        (its baseline's), else with :func:`choose_method` of this round's probe."""
        if method is not None and method not in METHODS:
            raise MethodUnavailable(f"a CUDA device times with {' or '.join(METHODS)}, not {method!r}")
        self._before = before
        self._count = 0
        for i in range(self.warmup):
            self._prepare_call()
            calls[i % len(calls)]()
        self.synchronize()
        # Rotating the input sets keeps the cache cold only if they do not fit in L2 together.
        flush = working_set_bytes * len(calls) < 2 * self._l2_bytes()
        launch_s = statistics.median(self._launch_samples(calls, 5))
        self._backlog_s = backlog_seconds(launch_s)
        probe = self._event_samples(calls, 5, flush)
        probe_s = statistics.median(probe)
        drain = {**self._drain_check(calls, probe_s), "probe_s": probe_s, "host_launch_s": launch_s,
                 "backlog_s": self._backlog_s, "launch_bound": launch_s >= LAUNCH_BOUND_FRACTION * probe_s,
                 "method_from": "probe" if method is None else "the shape's baseline"}
        chosen = method or choose_method(probe_s, launch_s)
        if chosen == GRAPH:
            try:
                return self._with_drain(self._time_graph(calls), drain)
            except RuntimeError as exc:
                if method is not None:
                    raise MethodUnavailable(
                        f"CUDA-graph capture failed ({cut(exc, DETAIL)}); this shape's baseline was timed with "
                        "CUDA graphs and a timing by events would not be comparable with it") from exc
                # The shape's own first timing cannot be captured (e.g. host synchronisation in
                # the call): events for it, and so for every candidate on the shape.
        # Counts are fixed before timing starts (never a time budget the candidate could sense);
        # long kernels (a 128k-token prefill takes ~0.1 s) get fewer calls per round.
        per_round = max(5, min(self.calls_per_round, int(ROUND_SECONDS / max(probe_s, 1e-9))))
        samples: list[float] = []
        walls: list[float] = []
        for _ in range(self.rounds):
            wall0 = time.perf_counter()
            round_samples = self._event_samples(calls, per_round, flush)
            walls.append(time.perf_counter() - wall0)
            samples.extend(round_samples)
        median, p20, p80 = quantiles(samples)
        event_total = sum(samples)
        joules, energy = self._energy_per_call(calls, median)
        return self._with_drain(Timing(
            median, p20, p80, len(samples), EVENTS,
            f"CUDA events on {self.gpu_name()}",
            joules_per_call=joules,
            wall_over_event=(sum(walls) / event_total) if event_total > 0 else None,
            extra={"l2_flush": flush, "input_sets": len(calls), "energy": energy},
        ), drain)

    def _prepare_call(self) -> None:
        before = getattr(self, "_before", None)
        if before is not None:
            before(self._count)
        self._count = getattr(self, "_count", 0) + 1

    def _drain_check(self, calls: Sequence[Call], event_median: float, count: int = 5) -> dict[str, Any]:
        """How long the host waits for a call's GPU work after enqueuing it, against the event
        time of the same calls: a side stream's work is invisible to the events but not to a
        full-device synchronisation (EVALUATION.md #13)."""
        drains = []
        for i in range(count):
            self._prepare_call()
            self.synchronize()
            calls[i % len(calls)]()
            enqueued = time.perf_counter()
            self.synchronize()
            drains.append(time.perf_counter() - enqueued)
        drain = statistics.median(drains)
        limit = DRAIN_FACTOR * event_median + DRAIN_SLACK_S
        return {"drain_s": drain, "event_wall_mismatch": drain > limit, "drain_limit_s": limit}

    @staticmethod
    def _with_drain(timing: Timing, drain: dict[str, Any]) -> Timing:
        timing.extra.update(drain)
        return timing

    def _spin(self, seconds: float) -> None:
        """Queue ``seconds`` of GPU work on the current stream (a clock spin, no memory traffic)."""
        if seconds > 0:
            torch.cuda._sleep(max(1, int(seconds * self._cycles_per_second())))

    def _cycles_per_second(self) -> float:
        """The spin's clock rate, measured once with events (the SM clock boosts, so a datasheet
        figure would be wrong)."""
        if getattr(self, "_spin_rate", None) is None:
            cycles = 2_000_000
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            torch.cuda._sleep(cycles)  # warm
            start.record()
            torch.cuda._sleep(cycles)
            end.record()
            self.synchronize()
            self._spin_rate = cycles / max(start.elapsed_time(end) / 1e3, 1e-9)
        return self._spin_rate

    def _launch_samples(self, calls: Sequence[Call], count: int) -> list[float]:
        """Host seconds to enqueue one call while the GPU is busy (so the enqueue never waits on
        it): the launch overhead a call pays wherever it is not captured in a CUDA graph."""
        samples = []
        with self._on_host_clock():
            for i in range(count):
                self._prepare_call()
                self.synchronize()
                self._spin(BACKLOG_MAX_S)
                start = time.perf_counter()
                calls[i % len(calls)]()
                samples.append(time.perf_counter() - start)
                self.synchronize()
        return samples

    @contextlib.contextmanager
    def _on_host_clock(self) -> Iterator[None]:
        """``host_clock`` set while the block measures calls on the host's clock (base.Device)."""
        self.host_clock = True
        try:
            yield
        finally:
            self.host_clock = False

    def _event_samples(self, calls: Sequence[Call], count: int, flush: bool) -> list[float]:
        """Event times of ``count`` calls, each with the L2 flush (when ``flush``) and a spin of
        the round's backlog queued ahead of its start event: the events time the GPU's work only."""
        starts = [torch.cuda.Event(enable_timing=True) for _ in range(count)]
        ends = [torch.cuda.Event(enable_timing=True) for _ in range(count)]
        backlog = getattr(self, "_backlog_s", BACKLOG_MARGIN_S)
        for i in range(count):
            self._prepare_call()
            if flush:
                self._flush_l2()
            self._spin(backlog)
            starts[i].record()
            calls[i % len(calls)]()
            ends[i].record()
        self.synchronize()  # full-device sync: work on any stream is finished before reading
        return [s.elapsed_time(e) / 1e3 for s, e in zip(starts, ends)]

    def _time_graph(self, calls: Sequence[Call]) -> Timing:
        per_graph = max(len(calls), 20)
        stream = torch.cuda.Stream()
        stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(stream):
            for call in calls:
                call()
        torch.cuda.current_stream().wait_stream(stream)
        # Values change right before capture (never inside it: the change would be captured and
        # timed), so a cache keyed on input values misses while the kernels are recorded; host
        # code does not run at replay at all. (A set used twice within one graph could still hit
        # such a cache: only kernels under GRAPH_THRESHOLD_S are timed this way.)
        for _ in range(len(calls)):
            self._prepare_call()
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            for i in range(per_graph):
                calls[i % len(calls)]()
        graph.replay()
        self.synchronize()
        samples = []
        for _ in range(self.rounds):
            starts = [torch.cuda.Event(enable_timing=True) for _ in range(10)]
            ends = [torch.cuda.Event(enable_timing=True) for _ in range(10)]
            self._spin(getattr(self, "_backlog_s", BACKLOG_MARGIN_S))  # the host's first replay is queued in time
            for s, e in zip(starts, ends):
                s.record()
                graph.replay()
                e.record()
            self.synchronize()
            samples.extend(s.elapsed_time(e) / 1e3 / per_graph for s, e in zip(starts, ends))
        median, p20, p80 = quantiles(samples)
        joules, energy = self._energy_per_call(calls, median)
        return Timing(
            median, p20, p80, len(samples) * per_graph, GRAPH,
            f"CUDA-graph replays ({per_graph} calls each) on {self.gpu_name()}",
            joules_per_call=joules,
            extra={"calls_per_graph": per_graph, "input_sets": len(calls), "energy": energy},
        )

    def _energy_per_call(self, calls: Sequence[Call], median_s: float) -> tuple[float | None, str]:
        """Joules per call from NVML's counter over a back-to-back round of at least ~0.5 s (the
        counter updates in coarse steps, so shorter rounds read zero), and where the figure comes
        from or why there is none (:func:`kernelforge.devices.nvml.energy_per_call`)."""
        count = int(min(max(50, math.ceil(0.5 / max(median_s, 1e-7))), 200_000))
        with self._on_host_clock():
            return energy_per_call(self._nvml, lambda i: calls[i % len(calls)](), count, self.synchronize)

    def describe(self) -> dict[str, Any]:
        props = torch.cuda.get_device_properties(self.index)
        facts = self._nvml.facts() if self._nvml else {"energy": "no energy: NVML was not started"}
        return {
            "device": "cuda",
            "device_name": props.name,
            "capability": f"sm_{props.major}{props.minor}",
            "sm_count": props.multi_processor_count,
            "memory_gib": round(props.total_memory / 2**30, 1),
            "cuda": torch.version.cuda,
            "timing": "CUDA events behind queued GPU work, or CUDA-graph replays, one method per shape "
                      "(median, p20/p80)",
            **facts,
            **library_versions(),
        }


def require_visible(name: str) -> None:
    """Raise UserError when ``name`` is a CUDA device and torch sees no GPU (asked by whoever is
    about to use it, before anything is written)."""
    if (name == "cuda" or name.startswith("cuda:")) and not torch.cuda.is_available():
        raise UserError(f"device {name!r}: no CUDA GPU is visible to torch; on a CPU use the interpret device "
                        "(device = \"interpret\" in the job file, --device interpret, or device='interpret' in the "
                        "Python API)")
