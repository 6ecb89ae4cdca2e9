"""The search objective and speedups, computed from stored measurements (never typed in).

:func:`time_ratio` is THE objective the search minimises; the confirmation step, the LLM prompts
and the reports rank candidates by the same metric (:func:`geomean_speedup`, :func:`rank`)."""

from __future__ import annotations

import math
from collections import defaultdict
from enum import Enum
from typing import Iterable, Mapping

from kernelforge.baseline_timing import baseline_at
from kernelforge.errors import UserError
from kernelforge.result import StoredResult


def by_candidate(results: Iterable[StoredResult]) -> dict[str, dict[str, StoredResult]]:
    """candidate id -> shape -> result (the latest when a shape was stored twice under other versions)."""
    table: dict[str, dict[str, StoredResult]] = defaultdict(dict)
    for r in results:
        table[r.candidate_id][r.shape] = r
    return table


def time_ratio(results: Iterable[StoredResult], baseline: Mapping[str, StoredResult]) -> float | None:
    """THE search objective: the geometric mean over ``results`` of the candidate's median time over
    the baseline's median time on the same shape (``baseline``: shape name -> the baseline's result;
    a :class:`~kernelforge.baseline_timing.BaselineSeries` gives each result the baseline as timed
    most recently before it, so drift of the machine between the two cannot decide a ranking).

    Lower is better; its inverse is :func:`geomean_speedup`. None when there are no results, when
    any result (the candidate's or the baseline's) failed or has no time, or when the baseline
    lacks a shape: a candidate is comparable only where both were verified and timed.
    """
    pairs = _timed_pairs(results, baseline)
    if pairs is None:
        return None
    return math.exp(sum(math.log(cand / base) for cand, base in pairs) / len(pairs))


def geomean_speedup(results: Iterable[StoredResult], baseline: Mapping[str, StoredResult]) -> float | None:
    """The geometric-mean speedup over the baseline: the inverse of :func:`time_ratio` (computed
    from the per-shape speedups, so it equals the geometric mean of :func:`speedup` exactly); None
    where time_ratio is None."""
    pairs = _timed_pairs(results, baseline)
    return None if pairs is None else geomean([base / cand for cand, base in pairs])


def _timed_pairs(results: Iterable[StoredResult], baseline: Mapping[str, StoredResult]) -> list[tuple[float, float]] | None:
    """(candidate median, baseline median) per result; None unless every result is comparable."""
    pairs = []
    for r in results:
        base = baseline_at(baseline, r)
        if base is None or not (r.ok and base.ok) or not r.median_s or not base.median_s:
            return None
        if r.timing_method != base.timing_method:  # one timing method per shape, or no comparison
            return None
        pairs.append((r.median_s, base.median_s))
    return pairs or None


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
    """The geometric mean of positive values (NaN for none)."""
    return math.exp(sum(math.log(v) for v in values) / len(values)) if values else float("nan")


def baseline_results(table: Mapping[str, Mapping[str, StoredResult]],
                     baseline_ids: Mapping[str, str]) -> dict[str, StoredResult]:
    """shape name -> the result of that shape's baseline (``baseline_ids``: shape name -> the id of
    its baseline candidate; per-shape baselines differ between shapes), for shapes where it is stored."""
    out = {}
    for shape, candidate_id in baseline_ids.items():
        row = table.get(candidate_id, {}).get(shape)
        if row is not None:
            out[shape] = row
    return out


def rank(table: dict[str, dict[str, StoredResult]], baseline: str | Mapping[str, StoredResult],
         shapes: list[str]) -> list[tuple[str, float]]:
    """Candidates that passed on every shape, by geometric-mean speedup over the baseline, best first.

    ``baseline``: the baseline's candidate id (one baseline for every shape), or shape name -> the
    baseline result of that shape (per-shape baselines, see :func:`baseline_results`)."""
    base = table.get(baseline, {}) if isinstance(baseline, str) else baseline
    ranked = []
    for candidate_id, rows in table.items():
        if not all(s in rows for s in shapes):
            continue
        value = geomean_speedup([rows[s] for s in shapes], base)
        if value is not None:
            ranked.append((candidate_id, value))
    return sorted(ranked, key=lambda item: -item[1])


class Objective(str, Enum):
    """What a job tunes for (``[job] objective``): time per call (:func:`time_ratio`), energy per
    call (:func:`energy_ratio`), or both at once (a multi-objective strategy, two values per tell)."""

    TIME = "time"
    ENERGY = "energy"
    TIME_ENERGY = "time-energy"

    def __str__(self) -> str:
        return self.value

    @classmethod
    def parse(cls, value: object, where: str) -> "Objective":
        """``value`` as an Objective; a UserError naming ``where`` and the choices otherwise."""
        try:
            return cls(value)
        except ValueError:
            choices = ", ".join(f'"{o.value}"' for o in cls)
            raise UserError(f"{where}: {value!r} is not one of {choices}") from None


def energy_ratio(results: Iterable[StoredResult], baseline: Mapping[str, StoredResult]) -> float | None:
    """The energy objective: the geometric mean over ``results`` of the candidate's joules per call
    over the baseline's on the same shape. None under the same conditions as :func:`time_ratio`,
    and also when either side has no energy (not measured: the interpreter, or no NVML)."""
    ratios = []
    for r in results:
        base = baseline.get(r.shape)
        if base is None or not (r.ok and base.ok) or r.timing_method != base.timing_method:
            return None
        if not r.joules or not base.joules or r.joules <= 0 or base.joules <= 0:
            return None
        ratios.append(r.joules / base.joules)
    return geomean(ratios) if ratios else None
