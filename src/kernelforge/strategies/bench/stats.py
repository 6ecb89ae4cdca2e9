"""The strategy bench's statistics that know nothing of runs: a nearest-rank percentile, and the
bootstrap interval of a ratio of two medians (:mod:`kernelforge.strategies.bench.run` re-exports both).
"""

from __future__ import annotations

import math
import random
import statistics
from typing import Sequence

#: Bootstrap resamples behind the interval of a fraction, and that interval's coverage.
RESAMPLES = 2000
LEVEL = 0.95


def percentile(ordered: Sequence[float], q: float) -> float:
    """The nearest-rank ``q`` quantile of sorted values (0.0 for none)."""
    if not ordered:
        return 0.0
    return ordered[max(0, math.ceil(q * len(ordered)) - 1)]


def fraction_interval(mine: Sequence[float], theirs: Sequence[float], *, resamples: int = RESAMPLES,
                      level: float = LEVEL, seed: int = 0) -> tuple[float, float]:
    """The ``level`` percentile-bootstrap interval of ``median(mine) / median(theirs)``.

    Each side's runs are resampled with replacement on its own (seed i of one strategy has nothing
    to do with seed i of the other), ``resamples`` times from a fixed ``seed``, so the same runs
    always give the same interval. Twenty seeds of a strategy whose runs either find the optimum's
    basin early or sit in another one for a hundred evaluations give a wide interval: a fraction
    whose interval straddles a goal has not shown it.
    """
    if not mine or not theirs:
        raise ValueError("both sides need at least one run")
    rng = random.Random(seed)
    fractions = sorted(
        statistics.median(rng.choices(mine, k=len(mine))) / statistics.median(rng.choices(theirs, k=len(theirs)))
        for _ in range(resamples))
    tail = (1 - level) / 2
    return percentile(fractions, tail), percentile(fractions, 1 - tail)
