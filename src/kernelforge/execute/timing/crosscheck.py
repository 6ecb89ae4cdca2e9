"""The timing cross-check: every baseline timed three ways, side by side, so a measurement method
that times the host (or anything else but the kernel) shows before a speedup is claimed.

For each (block, shape) of the jobs given, the block's human baseline at its baseline point is
timed

1. by kernelforge's own method (:func:`kernelforge.execute.timing.rounds.time_candidate`: the device's
   :meth:`~kernelforge.devices.base.Device.time`, the shape's method decided as a search decides
   it);
2. by ``triton.testing.do_bench`` (median; it flushes a 256 MB cache before every call, which
   also keeps the GPU busy ahead of the start event);
3. by ``triton.testing.do_bench_cudagraph`` (median of CUDA-graph replays: no host in it).

and the ratios of 2 and 3 to 1 are kept. A ratio outside :data:`AGREEMENT` is flagged: two sound
methods of timing one kernel agree within a few percent, so a flag means one of them times
something else (the host's launch path, a cold cache, a graph's saved launches on a launch-bound
call). On the interpreter there is no GPU: way 2 is the host's wall clock around each call and
way 3 is absent, which exercises the command without claiming anything about a GPU.

The baselines run in this process: they are the project's own shipped templates, not candidates.
"""

from __future__ import annotations

import statistics
import time
from dataclasses import asdict, dataclass
from typing import Sequence

import torch

from kernelforge.block import Block, Shape
from kernelforge.candidate import Candidate
from kernelforge.catalog import Catalog
from kernelforge.devices.base import Device
from kernelforge.execute.judge.contract import allocate
from kernelforge.execute.runner import load_candidate
from kernelforge.execute.timing.rounds import time_candidate
from kernelforge.textsafe import LINE, cut, error_text

#: Ratios within this range agree; outside it the row is flagged.
AGREEMENT = (0.85, 1.18)
#: Host wall-clock calls on the interpreter (way 2 there).
INTERPRETER_CALLS = 3


@dataclass(frozen=True)
class CrossCheckRow:
    """One baseline on one shape timed three ways (seconds; None: that way is unavailable or
    failed, with ``note`` saying why)."""

    block: str
    shape: str
    dtype: str
    kernelforge_s: float | None
    kernelforge_method: str
    do_bench_s: float | None
    cudagraph_s: float | None
    host_launch_s: float | None
    second_way: str
    note: str = ""

    @property
    def ratios(self) -> dict[str, float | None]:
        """do_bench and do_bench_cudagraph (or their interpreter stand-in) over kernelforge's time."""
        base = self.kernelforge_s
        return {way: (value / base if value and base else None)
                for way, value in (("do_bench", self.do_bench_s), ("cudagraph", self.cudagraph_s))}

    @property
    def flagged(self) -> bool:
        low, high = AGREEMENT
        return self.kernelforge_s is None or any(r is not None and not low <= r <= high for r in self.ratios.values())

    def to_json(self) -> dict:
        return {**asdict(self), "ratios": self.ratios, "flagged": self.flagged}


def _baseline_call(catalog: Catalog, block: Block, shape: Shape, dtype: torch.dtype, device: Device):
    """The baseline module's ``run`` and one prepared call of it on ``shape``."""
    template = catalog.baseline(block.id)
    candidate = Candidate.from_template(template, template.baseline_for(shape).point)
    module, failure = load_candidate(candidate.source, template.id)
    if failure is not None:
        raise RuntimeError(failure.message)
    inputs = block.make_inputs(shape, dtype, device.torch_device, seed=1000)
    outputs = allocate(block, shape, dtype, device.torch_device)
    return module.run, lambda: module.run(**inputs, **outputs)


def _wall_median(call, calls: int) -> float:
    samples = []
    for _ in range(calls):
        start = time.perf_counter()
        call()
        samples.append(time.perf_counter() - start)
    return statistics.median(samples)


def cross_check_shape(catalog: Catalog, block: Block, shape: Shape, dtype: torch.dtype, device: Device) -> CrossCheckRow:
    """One row (see the module docstring); a way that fails leaves its figure None and says why."""
    dtype_name = str(dtype).removeprefix("torch.")
    notes = []
    try:
        run, call = _baseline_call(catalog, block, shape, dtype, device)
        timing = time_candidate(block, run, shape, dtype, device, block.counts(shape, dtype))
    except Exception as exc:  # noqa: BLE001 - a broken baseline is this row's finding, not the command's end
        return CrossCheckRow(block.id, shape.name, dtype_name, None, "-", None, None, None, "-",
                             f"kernelforge's timing failed: {error_text(exc)}")
    if not device.measures_hardware:
        second, graph, way = _wall_median(call, INTERPRETER_CALLS), None, "host wall clock (interpreter)"
        notes.append("no GPU: the second way is the host's wall clock, and there are no CUDA graphs")
    else:
        import triton.testing

        way = "triton.testing.do_bench median"
        second = graph = None
        try:
            second = triton.testing.do_bench(call, return_mode="median") / 1e3
        except Exception as exc:  # noqa: BLE001
            notes.append(cut(f"do_bench failed: {error_text(exc)}", LINE))
        try:
            graph = triton.testing.do_bench_cudagraph(call, return_mode="median") / 1e3
        except Exception as exc:  # noqa: BLE001 - a call that cannot be captured
            notes.append(cut(f"do_bench_cudagraph failed: {error_text(exc)}", LINE))
    return CrossCheckRow(block.id, shape.name, dtype_name, timing.median_s, timing.method, second, graph,
                         timing.extra.get("host_launch_s"), way, "; ".join(notes))


def cross_check(catalog: Catalog, targets: Sequence[tuple[str, str]], dtype: torch.dtype,
                device: Device) -> list[CrossCheckRow]:
    """Rows for every shape of every ``(block id, shapes)`` target, in order."""
    device.prepare()
    rows = []
    for block_id, shapes in targets:
        block = catalog.block(block_id)
        rows.extend(cross_check_shape(catalog, block, shape, dtype, device) for shape in block.shapes(shapes))
    return rows
