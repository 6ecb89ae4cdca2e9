"""The baseline timed through a search: each re-timing of a shape's baseline, and the one rule
for which of a baseline's timings a candidate's result is compared with.

A search times each shape's baseline first, then again beside the candidates
(:mod:`kernelforge.search.retime`), and the confirmation times it once more in every pair. A
machine that drifts (clocks, temperature, load) then cannot decide a ranking: a candidate's
result is compared with the baseline as timed most recently at or before that result was taken
(:meth:`BaselineSeries.at`), never with a timing taken under other conditions long before. The
search's objective, the confirmation's ranking and the report's search figures all read it.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Iterable, Iterator, Mapping

from kernelforge.result import StoredResult


@dataclass(frozen=True)
class BaselineTiming:
    """One re-timing of a shape's baseline during a search (the first timing is its stored result)."""

    job: str
    block: str
    shape: str
    dtype: str
    env_key: str
    baseline_id: str
    median_s: float
    p20_s: float | None
    p80_s: float | None
    timing_method: str | None
    created: float


class BaselineSeries(Mapping[str, StoredResult]):
    """Each shape's baseline result (shape name -> result, as a plain mapping: its first timing)
    with every later timing of the same baseline in the same conditions (same candidate, dtype,
    environment and timing method; others are ignored)."""

    def __init__(self, first: Mapping[str, StoredResult], timings: Iterable[BaselineTiming] = ()):
        self._first = dict(first)
        self._later: dict[str, list[BaselineTiming]] = {}
        for t in sorted(timings, key=lambda t: t.created):
            base = self._first.get(t.shape)
            if (base is not None and t.baseline_id == base.candidate_id and t.dtype == base.dtype
                    and t.env_key == base.env_key and t.timing_method == base.timing_method and t.median_s > 0):
                self._later.setdefault(t.shape, []).append(t)

    def __getitem__(self, shape: str) -> StoredResult:
        return self._first[shape]

    def __iter__(self) -> Iterator[str]:
        return iter(self._first)

    def __len__(self) -> int:
        return len(self._first)

    def at(self, shape: str, when: float) -> StoredResult | None:
        """The shape's baseline as timed most recently at or before ``when`` (``time.time()``
        seconds: a candidate result's ``created``); its first timing when none preceded ``when``.
        The result's record with that timing's median and p20-p80 band; None for an unknown shape."""
        base = self._first.get(shape)
        if base is None:
            return None
        chosen = None
        for t in self._later.get(shape, ()):
            if t.created > when:
                break
            if t.created >= base.created:
                chosen = t
        if chosen is None:
            return base
        return dataclasses.replace(base, median_s=chosen.median_s, p20_s=chosen.p20_s, p80_s=chosen.p80_s,
                                   created=chosen.created)

    def timings(self, shape: str) -> tuple[float, ...]:
        """Every median time of the shape's baseline in this series, in the order taken."""
        base = self._first.get(shape)
        first = (base.median_s,) if base is not None and base.median_s else ()
        return first + tuple(t.median_s for t in self._later.get(shape, ()))


def baseline_at(baseline: Mapping[str, StoredResult], result: StoredResult) -> StoredResult | None:
    """The baseline result ``result`` (a candidate's, on one shape) is compared with: the timing
    of a :class:`BaselineSeries` taken most recently before it, or the plain mapping's entry. The
    one place this is decided."""
    if isinstance(baseline, BaselineSeries):
        return baseline.at(result.shape, result.created)
    return baseline.get(result.shape)
