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

The area's :data:`~kernelforge.strategies.bench.stats.LEVEL` interval (:func:`area_interval`) resamples
the seeds with replacement, a fixed number of times from a fixed seed, and takes the area of each
resample's median curve.
"""

from __future__ import annotations

import math
from typing import Sequence

import numpy as np

from kernelforge.strategies.bench.stats import percentile

#: Evaluations after which the median best/optimum is reported (those within the budget).
CHECKPOINTS = (10, 25, 50, 100, 200)


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


def area_interval(traces: Sequence[Sequence[float | None]], optimum: float, budget: int, *, resamples: int = 2000,
                  level: float = 0.95, seed: int = 0) -> tuple[float, float]:
    """The ``level`` percentile-bootstrap interval of the area of the median curve: the runs
    resampled with replacement ``resamples`` times from a fixed ``seed`` (the same runs always give
    the same interval)."""
    matrix = curve_matrix(traces, optimum, budget)
    if len(matrix) == 0:
        raise ValueError("the interval needs at least one run")
    rng = np.random.default_rng(seed)
    picks = rng.integers(0, len(matrix), size=(resamples, len(matrix)))
    areas = sorted(np.mean(1.0 / np.median(matrix[picks], axis=1), axis=1).tolist())
    tail = (1 - level) / 2
    return percentile(areas, tail), percentile(areas, 1 - tail)
