"""The end of a search: re-time the best few candidates interleaved with the baseline, and declare
a winner only outside the noise band.

Fast outliers are common in a search's single measurements; re-timing in baseline/candidate pairs
cancels drift of the machine, and the pairs' spread says whether the speedup is real: a candidate
is a winner on a shape only when the 20th percentile of its pair speedups is above 1.
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any

from kernelforge.objective import by_candidate, rank
from kernelforge.devices.device import quantiles

if TYPE_CHECKING:
    from kernelforge.search.loop import Search

#: How many of the best candidates per block are re-timed against the baseline (interpreter
#: pairs only exercise the mechanism, so one is enough there).
CONFIRM_TOP = {"cuda": 3, "interpret": 1}
#: Interleaved pairs per shape: interpreter pairs are slow and only exercise the mechanism.
PAIRS = {"cuda": 7, "interpret": 2}


def confirm(search: "Search", top: int | None = None) -> dict[str, list[dict[str, Any]]]:
    """Re-time the ``top`` best candidates of each block and store the pair speedups."""
    top = CONFIRM_TOP.get(search.device.name, CONFIRM_TOP["cuda"]) if top is None else top
    outcome: dict[str, list[dict[str, Any]]] = {}
    if search.device.name == "replay":
        return outcome  # nothing to re-time: the recording is all there is
    pairs = PAIRS.get(search.device.name, PAIRS["cuda"])
    for spec in search.job.blocks:
        block = search.catalog.block(spec.id)
        shapes = block.shapes(spec.shapes)
        baseline_id = search.baselines[block.id].id
        table = by_candidate(r for r in search.store.results(block=block.id, dtype=search.dtype_name)
                             if r.env_key == search.env_key)
        groups = [shapes] if search.job.tune == "all-shapes" else [[s] for s in shapes]
        for group in groups:
            ranked = [(cid, s) for cid, s in rank(table, baseline_id, [x.name for x in group])
                      if cid != baseline_id and s > 1.0][:top]
            for candidate_id, _ in ranked:
                if search.deadline is not None and time.time() > search.deadline:
                    search.progress.event("warning", message="time budget reached: remaining candidates not confirmed")
                    return outcome
                source = search.store.candidate(candidate_id).source
                for shape in group:
                    speedups = search.executor.pair_speedups(block, search.baselines[block.id].source, source,
                                                             shape, search.dtype, pairs)
                    if not speedups:
                        continue
                    median, p20, p80 = quantiles(speedups)
                    row = {"job": search.job.name, "block": block.id, "shape": shape.name,
                           "dtype": search.dtype_name, "candidate_id": candidate_id, "baseline_id": baseline_id,
                           "env_key": search.env_key, "speedups": speedups, "median": median, "p20": p20, "p80": p80}
                    search.store.add_confirmation(row)
                    winner = p20 > 1.0
                    outcome.setdefault(block.id, []).append({**row, "winner": winner})
                    search.progress.event("confirmed", block=block.id, shape=shape.name, candidate=candidate_id,
                                          median=median, p20=p20, p80=p80, winner=winner)
    return outcome
