"""Anytime figures of a strategy's runs: how good the best found is after any number of evaluations.

A run's *trace* is its best time after each evaluation (None until a point has run). Over the
seeds of one strategy on one space:

- the *median curve*: at each evaluation n = 1..budget, the median over seeds of best/optimum
  (``inf`` for a seed with no success yet; a run that ended early, out of points or stopped within
  1%, keeps its last best for the evaluations it did not make);
- the *checkpoints*: that curve at :data:`CHECKPOINTS` within the budget;
- the *area*: the normalised area under the curve of optimum/best (the fraction of the optimum's
  performance reached), the mean of ``1 / median best/optimum`` over evaluations 1..budget. It is
  1.0 for a strategy that asks the optimum first and falls toward 0 for one that stays far from it
  for long, so it rewards getting close early and staying there, not one threshold. This is the
  aggregate of Willemsen et al.'s auto-tuning methodology (the mean of a normalised performance
  curve over the budget) with the optimum as the reference and no random-search baseline
  subtracted: random search is benched beside every strategy and reads on the same scale.

The :data:`~kernelforge.strategies.bench.stats.LEVEL` intervals of the area and of each checkpoint
(:func:`intervals`) resample the seeds with replacement, a fixed number of times from a fixed seed,
and take the area and the checkpoints of each resample's median curve.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Mapping, Sequence

import numpy as np

from kernelforge.strategies.bench.stats import percentile

#: Evaluations after which the median best/optimum is reported (those within the budget).
CHECKPOINTS = (10, 25, 50, 100, 200)
#: At most this many values are held at once while the resampled median curves are taken.
_RESAMPLE_VALUES = 4_000_000


def checkpoints(budget: int) -> tuple[int, ...]:
    """The :data:`CHECKPOINTS` a run with ``budget`` evaluations reaches."""
    return tuple(c for c in CHECKPOINTS if c <= budget)


def ratios(trace: Sequence[float | None], optimum: float, budget: int) -> np.ndarray:
    """best/optimum after each evaluation 1..``budget`` of one run (``inf`` before any success;
    past the run's last evaluation, its last value)."""
    out = np.full(budget, math.inf)
    for n, best in enumerate(trace[:budget]):
        if best is not None:
            out[n] = best / optimum
    if 0 < len(trace) < budget:
        out[len(trace):] = out[len(trace) - 1]
    return out


def curve_matrix(traces: Sequence[Sequence[float | None]], optimum: float, budget: int) -> np.ndarray:
    """One row of :func:`ratios` per run."""
    return np.array([ratios(t, optimum, budget) for t in traces]).reshape(len(traces), budget)


def median_curve(traces: Sequence[Sequence[float | None]], optimum: float, budget: int) -> np.ndarray:
    """The median over runs of best/optimum after each evaluation 1..``budget``."""
    return np.median(curve_matrix(traces, optimum, budget), axis=0)


def area(curve: np.ndarray) -> float:
    """The normalised area under ``1 / curve`` (a median best/optimum per evaluation): 1.0 at the
    optimum from the first evaluation, 0 for no success."""
    if len(curve) == 0:
        return 0.0
    return float(np.mean(1.0 / curve))


def at_checkpoints(curve: np.ndarray) -> dict[int, float]:
    """The curve's value after each checkpoint within its length."""
    return {c: float(curve[c - 1]) for c in checkpoints(len(curve))}


@dataclass(frozen=True)
class Intervals:
    """The :data:`~kernelforge.strategies.bench.stats.LEVEL` bootstrap intervals of one strategy's
    anytime figures: of the median curve's area (``area``) and of its value after each checkpoint
    within the budget (``at``), all from the same resamples of the runs."""

    area: tuple[float, float]
    at: Mapping[int, tuple[float, float]]


def intervals(traces: Sequence[Sequence[float | None]], optimum: float, budget: int, *, resamples: int = 2000,
              level: float = 0.95, seed: int = 0) -> Intervals:
    """The percentile-bootstrap :class:`Intervals` of the median curve: the runs resampled with
    replacement ``resamples`` times from a fixed ``seed`` (the same runs always give the same
    intervals), each resample's median curve taken, and the ``level`` interval of its area and of
    its checkpoints read off them."""
    matrix = curve_matrix(traces, optimum, budget)
    if len(matrix) == 0:
        raise ValueError("the interval needs at least one run")
    rng = np.random.default_rng(seed)
    picks = rng.integers(0, len(matrix), size=(resamples, len(matrix)))
    # The resamples' median curves, a block of them at a time: a resample is runs x budget values.
    block = max(1, _RESAMPLE_VALUES // max(1, matrix.size))
    curves = np.concatenate([np.median(matrix[picks[i:i + block]], axis=1) for i in range(0, resamples, block)])
    tail = (1 - level) / 2

    def bounds(values: np.ndarray) -> tuple[float, float]:
        ordered = sorted(values.tolist())
        return percentile(ordered, tail), percentile(ordered, 1 - tail)

    return Intervals(area=bounds(np.mean(1.0 / curves, axis=1)),
                     at={c: bounds(curves[:, c - 1]) for c in checkpoints(budget)})


def area_interval(traces: Sequence[Sequence[float | None]], optimum: float, budget: int, *, resamples: int = 2000,
                  level: float = 0.95, seed: int = 0) -> tuple[float, float]:
    """The ``level`` interval of the area of the median curve (:func:`intervals`)."""
    return intervals(traces, optimum, budget, resamples=resamples, level=level, seed=seed).area
