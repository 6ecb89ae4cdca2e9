"""The two strategies without a model: every point in grid order, and uniform random sampling.

They keep no state of their own between runs: a resumed search tells them its history (see
:mod:`kernelforge.strategies.base` for the contract they implement).
"""

from __future__ import annotations

import random
from typing import Any, Iterator, Mapping

from kernelforge.space import Space
from kernelforge.strategies.base import Key, Strategy


class GridStrategy(Strategy):
    """Every valid point in grid order (the space's declaration order); the baseline first."""

    name = "grid"

    def __init__(self, space: Space, *, seed: int = 0, baseline: Mapping | None = None):
        super().__init__(space, seed=seed, baseline=baseline)
        self._order: Iterator[dict[str, Any]] = space.points()

    def ask(self) -> dict | None:
        first = self._ask_baseline_once()
        if first is not None:
            return first
        for point in self._order:
            key = self.key(point)
            if key not in self.known and key not in self.pending:
                self.pending.add(key)
                return point
        return None

    def tell(self, point: Mapping, value: float | None) -> None:
        self._record(point, value)


class RandomStrategy(Strategy):
    """Uniform sampling without replacement over the valid points, seeded; the baseline first.

    Spaces up to ``enumerate_limit`` points (before constraints), or with a feasible set
    (``Space.feasible``) up to that size, are enumerated and shuffled once; larger ones are sampled
    by rejection, falling back to enumerating what is left once rejection keeps failing (a nearly
    exhausted or mostly infeasible space).
    """

    name = "random"
    enumerate_limit = 200_000

    def __init__(self, space: Space, *, seed: int = 0, baseline: Mapping | None = None):
        super().__init__(space, seed=seed, baseline=baseline)
        self._rng = random.Random(seed)
        self._queue: list[Key] | None = None
        # A small feasible set in a huge grid is listed directly: rejection would rarely hit it.
        small = space.feasible is not None and len(space.feasible) <= self.enumerate_limit
        if space.size <= self.enumerate_limit or small:
            self._fill_queue()

    def _fill_queue(self) -> None:
        keys = [self.key(p) for p in self.space.points()]
        keys = [k for k in keys if k not in self.known and k not in self.pending]
        self._rng.shuffle(keys)
        self._queue = keys[::-1]  # pop() from the end keeps the shuffled order

    def ask(self) -> dict | None:
        first = self._ask_baseline_once()
        if first is not None:
            return first
        if self._queue is None:
            for _ in range(10_000):
                key = tuple(self._rng.choice(values) for _, values in self.space.params)
                if key in self.known or key in self.pending:
                    continue
                if self.space.contains(self.point(key)):
                    self.pending.add(key)
                    return self.point(key)
            self._fill_queue()
        while self._queue:
            key = self._queue.pop()
            if key not in self.known and key not in self.pending:
                self.pending.add(key)
                return self.point(key)
        return None

    def tell(self, point: Mapping, value: float | None) -> None:
        self._record(point, value)
