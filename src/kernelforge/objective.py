"""Speedups computed from stored measurements (never typed in): the search's confirmation step and
the reports both rank candidates with these functions."""

from __future__ import annotations

import math
from collections import defaultdict
from typing import Iterable

from kernelforge.store.store import StoredResult


def by_candidate(results: Iterable[StoredResult]) -> dict[str, dict[str, StoredResult]]:
    """candidate id -> shape -> result (the latest when a shape was stored twice under other versions)."""
    table: dict[str, dict[str, StoredResult]] = defaultdict(dict)
    for r in results:
        table[r.candidate_id][r.shape] = r
    return table


def speedup(base: StoredResult | None, cand: StoredResult | None) -> float | None:
    """Baseline median time over candidate median time, when both verified and were timed."""
    if base is None or cand is None or not (base.ok and cand.ok) or not base.median_s or not cand.median_s:
        return None
    return base.median_s / cand.median_s


def speedup_spread(base: StoredResult, cand: StoredResult) -> tuple[float, float] | None:
    """A conservative (low, high) band of the speedup from the two p20-p80 timing bands."""
    if not (base.p20_s and base.p80_s and cand.p20_s and cand.p80_s):
        return None
    return base.p20_s / cand.p80_s, base.p80_s / cand.p20_s


def geomean(values: list[float]) -> float:
    return math.exp(sum(math.log(v) for v in values) / len(values)) if values else float("nan")


def rank(table: dict[str, dict[str, StoredResult]], baseline_id: str, shapes: list[str]) -> list[tuple[str, float]]:
    """Candidates that passed on every shape, by geometric-mean speedup over the baseline, best first."""
    base = table.get(baseline_id, {})
    ranked = []
    for candidate_id, rows in table.items():
        speedups = [speedup(base.get(s), rows.get(s)) for s in shapes]
        if speedups and all(v is not None for v in speedups):
            ranked.append((candidate_id, geomean(speedups)))  # type: ignore[arg-type]
    return sorted(ranked, key=lambda item: -item[1])
