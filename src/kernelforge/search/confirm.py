"""The end of a search: re-time the best few candidates interleaved with the baseline of each shape
they are confirmed on (per-shape baselines: :func:`kernelforge.search.plan.baseline_candidates`),
and declare a winner only outside the noise band. A baseline candidate is never confirmed: it is
what the candidates are compared with.

Fast outliers are common in a search's single measurements; re-timing in baseline/candidate pairs
cancels drift of the machine, and the pairs' spread says whether the speedup is real: a candidate
is a winner on a shape only when the 20th percentile of its pair speedups is above 1.
"""

from __future__ import annotations

import time

from kernelforge.baseline_timing import BaselineSeries
from kernelforge.devices.base import quantiles
from kernelforge.objective import baseline_results, by_candidate, rank
from kernelforge.search.context import RunContext
from kernelforge.store.records import Confirmation

#: How many of the best candidates per block are re-timed against the baseline, by executor kind
#: (interpreter pairs only exercise the mechanism, so one is enough there).
CONFIRM_TOP = {"cuda": 3, "interpret": 1}
#: Interleaved pairs per shape: interpreter pairs are slow and only exercise the mechanism.
PAIRS = {"cuda": 7, "interpret": 2}


def confirm(run: RunContext, top: int | None = None, *, deadline: float | None = None) -> dict[str, list[Confirmation]]:
    """Re-time the ``top`` best candidates of each block and store the pair speedups; no new
    candidate is re-timed after ``deadline`` (``time.time()`` seconds, the job's cap)."""
    executor = run.executor
    top = CONFIRM_TOP.get(executor.kind, CONFIRM_TOP["cuda"]) if top is None else top
    outcome: dict[str, list[Confirmation]] = {}
    if not executor.runs_code:
        return outcome  # nothing to re-time (a replay: the recording is all there is)
    pairs = PAIRS.get(executor.kind, PAIRS["cuda"])
    for spec in run.job.blocks:
        block = run.catalog.block(spec.id)
        shapes = block.shapes(spec.shapes)
        baselines = run.baselines[block.id]  # shape name -> that shape's baseline candidate
        base_ids = run.baseline_ids(block.id)
        table = by_candidate(r for r in run.store.results(block=block.id, dtype=run.dtype_name)
                             if r.env_key == run.env_key)
        # Each candidate ranked against the baseline as timed most recently before it.
        base = BaselineSeries(baseline_results(table, {name: c.id for name, c in baselines.items()}),
                              run.store.baseline_timings(block.id, run.dtype_name, run.env_key))
        for group in run.job.tune.groups(shapes):
            ranked = [(cid, s) for cid, s in rank(table, base, [x.name for x in group])
                      if cid not in base_ids and s > 1.0][:top]
            for candidate_id, _ in ranked:
                if deadline is not None and time.time() > deadline:
                    run.progress.event("warning", message="time budget reached: remaining candidates not confirmed")
                    return outcome
                source = run.store.candidate(candidate_id).source
                for shape in group:
                    # Paired with the baseline of the shape being confirmed.
                    baseline = baselines[shape.name]
                    speedups = executor.pair_speedups(block, baseline.source, source, shape, run.dtype, pairs)
                    if not speedups:
                        continue
                    median, p20, p80 = quantiles(speedups)
                    done = Confirmation(job=run.job.name, block=block.id, shape=shape.name, dtype=run.dtype_name,
                                        candidate_id=candidate_id, baseline_id=baseline.id, env_key=run.env_key,
                                        speedups=tuple(float(s) for s in speedups), median=median, p20=p20, p80=p80,
                                        pair_times=_pair_times(speedups))
                    run.store.add_confirmation(done)
                    outcome.setdefault(block.id, []).append(done)
                    run.progress.event("confirmed", block=block.id, shape=shape.name, candidate=candidate_id,
                                       median=median, p20=p20, p80=p80, winner=done.winner)
    return outcome


def _pair_times(speedups: list[float]) -> tuple[tuple[float, float], ...]:
    """The (baseline_s, candidate_s) of each pair when the executor reported them (every executor
    that re-times does: :class:`kernelforge.execute.evaluate.PairSpeedup`), else ()."""
    if not all(hasattr(s, "baseline_s") for s in speedups):
        return ()
    return tuple((s.baseline_s, s.candidate_s) for s in speedups)  # type: ignore[attr-defined]
