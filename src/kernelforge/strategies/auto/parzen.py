"""The second member of the ``auto`` strategy's portfolio: a per-parameter Parzen ratio (TPE's idea,
scored over a pool of feasible points instead of sampled).

For every parameter, the share of each value among the best told points (the top ``gamma``) and
among the others (failures included) is counted, smoothed by a uniform prior, and smoothed over
neighbouring values of a numeric parameter that acts smoothly in rank; a point's score is the sum
over parameters of ``log(share among the best) - log(share among the rest)``. Where the Gaussian
process models how parameters interact, this model only asks which values good points have: it is
robust where the landscape is a needle the GP smooths away, and it explores values the GP has
written off.

Whether a numeric parameter acts smoothly is read from the told points at each scoring: the mean
objective per value, in rank order, and von Neumann's ratio of its mean squared successive
difference to its variance (about 2 for values in no order, near 0 for a smooth trend). Above
``rough`` (1.0) the parameter is counted value by value: a block size that is fast at 32, 64 and
128 and slow at 48, 80 and 96 must not lend 48 the credit of 32 and 64.
"""

from __future__ import annotations

import numpy as np

from kernelforge.space import Space
from kernelforge.strategies.auto.surrogate import is_numeric


class ParzenRatio:
    """Scores points, given as value-index codes (one column per parameter, the index of the value
    in the parameter's declared list), by the per-parameter ratio of the best to the rest."""

    #: von Neumann's ratio above which a numeric parameter is counted value by value.
    rough = 1.0

    def __init__(self, space: Space, gamma: float = 0.15, smoothing: float = 0.5):
        self.gamma = gamma
        self.smoothing = smoothing
        #: the numeric parameters the last :meth:`scores` counted value by value.
        self.rough_params: frozenset[int] = frozenset()
        self.sizes = [len(values) for _, values in space.params]
        #: per parameter: the declared indices in rank order (numeric), or None (categorical).
        self.orders: list[np.ndarray | None] = [
            np.array(sorted(range(len(values)), key=lambda j: values[j])) if is_numeric(values) else None
            for _, values in space.params]

    def _shares(self, codes: np.ndarray, p: int) -> np.ndarray:
        size = self.sizes[p]
        counts = np.bincount(codes[:, p], minlength=size).astype(float) if len(codes) else np.zeros(size)
        order = self.orders[p]
        if order is not None and size > 2 and self.smoothing and p not in self.rough_params:
            ranked = counts[order]
            spread = ranked.copy()
            spread[1:] += self.smoothing * ranked[:-1]
            spread[:-1] += self.smoothing * ranked[1:]
            counts = np.empty(size)
            counts[order] = spread
        return (counts + 1.0 / size) / (counts.sum() + 1.0)

    def scores(self, ok_codes: np.ndarray, ok_values: np.ndarray, failed_codes: np.ndarray,
               pool_codes: np.ndarray) -> np.ndarray:
        """The log-ratio score of each pool row (higher: more like the best told points)."""
        self.rough_params = self._rough(ok_codes, ok_values)
        order = np.argsort(ok_values)
        top = max(2, int(round(self.gamma * len(order))))
        good = ok_codes[order[:top]]
        rest = np.vstack([ok_codes[order[top:]], failed_codes]) if len(failed_codes) else ok_codes[order[top:]]
        score = np.zeros(len(pool_codes))
        for p in range(len(self.sizes)):
            ratio = np.log(self._shares(good, p)) - np.log(self._shares(rest, p))
            score += ratio[pool_codes[:, p]]
        return score

    def _rough(self, ok_codes: np.ndarray, ok_values: np.ndarray) -> frozenset[int]:
        """The numeric parameters (more than two values, at least four of them told) whose mean
        objective per value, in rank order, has a von Neumann ratio above ``rough``."""
        rough = set()
        for p, order in enumerate(self.orders):
            if order is None or self.sizes[p] <= 2 or not len(ok_codes):
                continue
            sums = np.bincount(ok_codes[:, p], weights=ok_values, minlength=self.sizes[p])[order]
            counts = np.bincount(ok_codes[:, p], minlength=self.sizes[p])[order]
            means = sums[counts > 0] / counts[counts > 0]
            if len(means) >= 4 and means.var() > 0 and np.mean(np.diff(means) ** 2) / means.var() > self.rough:
                rough.add(p)
        return frozenset(rough)
