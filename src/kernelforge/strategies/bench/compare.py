"""Each strategy of a bench against the reference strategy (``tpe``, Optuna's default) on one space.

Two questions, each answered with a ratio of medians over seeds and its
:data:`~kernelforge.strategies.bench.stats.LEVEL` percentile-bootstrap interval
(:func:`~kernelforge.strategies.bench.stats.fraction_interval`: each side's seeds resampled on
their own):

- how many evaluations it needs to get within 1% of the optimum, as a fraction of the reference's
  (:class:`Relative`; a bound when a seed that missed is among one side's middle values);
- how good its best is after each checkpoint (10, 25, 50, ... evaluations): its median
  best/optimum as a fraction of the reference's (:class:`CheckpointFraction`; below 1: closer to
  the optimum). A checkpoint is compared only where every seed of both had a success by then, so
  no ratio is taken of "nothing found".
"""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass

from kernelforge.strategies.bench import anytime
from kernelforge.strategies.bench.run import (REFERENCE, THRESHOLDS, BenchRow, SpaceBench, evaluations_to,
                                          median_is_bound)
from kernelforge.strategies.bench.stats import fraction_interval


@dataclass(frozen=True)
class CheckpointFraction:
    """After ``evaluations``: a strategy's median best/optimum as a fraction of the reference's,
    and that fraction's interval (``low``, ``high``)."""

    evaluations: int
    fraction: float
    low: float
    high: float


@dataclass(frozen=True)
class Relative:
    """A strategy against the reference: its median evaluations to 1% as a fraction of the
    reference's (``bound``: "" exact, ">" or "<" when one side's median is a bound, a seed that
    missed among its middle values (:func:`~.run.median_is_bound`), so the fraction is a bound;
    "?" both), the interval of that fraction (``low``, ``high``), both
    hit rates to 1%, and the fraction at each comparable checkpoint (``at``)."""

    strategy: str
    reference: str
    fraction: float
    bound: str
    low: float
    high: float
    hit_rate: float
    reference_hit_rate: float
    at: tuple[CheckpointFraction, ...] = ()


def relative(space: SpaceBench, reference: str = REFERENCE) -> tuple[Relative, ...]:
    """Every other strategy of ``space`` against ``reference`` (empty when it was not benched)."""
    ref = next((r for r in space.rows if r.strategy == reference), None)
    if ref is None:
        return ()
    return tuple(compare(row, ref) for row in space.rows if row.strategy != reference)


def compare(row: BenchRow, ref: BenchRow) -> Relative:
    """``row`` against ``ref`` (see :class:`Relative`)."""
    t = THRESHOLDS[0]
    mine, theirs = row.median_evaluations[t], ref.median_evaluations[t]
    missed, ref_missed = median_is_bound(row, t), median_is_bound(ref, t)
    bound = "?" if missed and ref_missed else ">" if missed else "<" if ref_missed else ""
    low, high = fraction_interval(evaluations_to(row.runs, t, row.budget), evaluations_to(ref.runs, t, ref.budget))
    return Relative(strategy=row.strategy, reference=ref.strategy, fraction=mine / theirs, bound=bound, low=low,
                    high=high, hit_rate=row.hit_rate[t], reference_hit_rate=ref.hit_rate[t],
                    at=checkpoint_fractions(row, ref))


def checkpoint_fractions(row: BenchRow, ref: BenchRow) -> tuple[CheckpointFraction, ...]:
    """The :class:`CheckpointFraction` of ``row`` against ``ref`` at every checkpoint within both
    budgets where every seed of both had a success (module docstring)."""
    budget = min(row.budget, ref.budget)
    mine, theirs = (anytime.curve_matrix([r.trace for r in x.runs], x.optimum, budget) for x in (row, ref))
    out = []
    for c in anytime.checkpoints(budget):
        a, b = mine[:, c - 1].tolist(), theirs[:, c - 1].tolist()
        if not a or not b or not all(math.isfinite(v) for v in a + b):
            continue
        low, high = fraction_interval(a, b)
        out.append(CheckpointFraction(c, statistics.median(a) / statistics.median(b), low, high))
    return tuple(out)
