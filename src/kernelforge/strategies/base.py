"""The strategy contract: propose points of a :class:`~kernelforge.space.Space` from the history
of results, never touching a device.

The search asks a strategy for a point, evaluates the candidate there, and tells it the objective
(lower is better: seconds, or 1/speedup); ``None`` means the candidate failed (compile error,
wrong result, timeout...). Several asks may be outstanding at once (ask, ask, tell, tell), so a
search can keep a pool of compile workers busy.

Contract of every :class:`Strategy` (tests/strategies/test_strategy.py runs it on each one):

- :meth:`Strategy.ask` returns only points that satisfy the space's constraints, never the same
  point twice (also not a point told as history), the baseline point(s) first when given (a
  search passes the distinct per-shape baseline points of a study's shapes, in shape order), and
  ``None`` once it has nothing left to propose;
- :meth:`Strategy.tell` takes the objective of an asked point (``None``, NaN or infinity: it
  failed); a point told that was not asked is history (never asked, not counted); a point told
  twice keeps its first value; a point outside the space raises ValueError;
- :meth:`Strategy.infeasible` takes an asked point found unable to run before the device ran it
  (the ahead-of-time compile: shared memory over the limit, too many registers...): it is known
  (never asked again) as failed, it is a free tell, not an evaluation, and a strategy with a model
  learns to avoid its like;
- ``known`` holds every point that must not be asked again (key -> told value), ``pending`` the
  keys asked and not yet told; ``evaluations`` counts told asks, ``free_tells`` proposals the
  strategy settled itself without returning them (they cost no device time).

Implementations: :mod:`kernelforge.strategies.simple` (grid, random) and
:mod:`kernelforge.strategies.optuna.strategy` (Optuna's samplers); :mod:`kernelforge.strategies.names` is
the one table of their names.
"""

from __future__ import annotations

import math
from abc import ABC, abstractmethod
from typing import Any, Mapping, Sequence

from kernelforge.errors import UserError
from kernelforge.space import Space

#: The identity of a point: its values in the space's parameter order.
Key = tuple[Any, ...]


class Strategy(ABC):
    """Proposes points of a Space from the history of results; never touches a device.

    ``evaluations`` counts points returned by :meth:`ask` and then told; ``free_tells`` counts
    points a strategy settled internally without returning them (duplicates of known points,
    constraint violations): those cost no device time.

    ``baseline``: one point, or a sequence of points, asked first (in order, each once, unless
    already known); ``baselines`` holds them all, ``baseline`` the first (None without any).
    """

    name: str = "strategy"
    #: How many objectives :meth:`tell` takes per point (2: a (time, energy) tuple).
    objectives: int = 1

    def __init__(self, space: Space, *, seed: int = 0, baseline: Mapping | Sequence[Mapping] | None = None):
        self.space = space
        self.seed = seed
        given = [] if baseline is None else [baseline] if isinstance(baseline, Mapping) else list(baseline)
        firsts: dict[Key, dict[str, Any]] = {}
        for point in given:
            problems = space.problems(point)
            if problems:
                raise UserError(f"baseline point {dict(point)} is not in the space: {'; '.join(problems)}")
            firsts.setdefault(tuple(point[name] for name in space.names), {name: point[name] for name in space.names})
        #: The distinct baseline points, asked first in this order.
        self.baselines: tuple[dict[str, Any], ...] = tuple(firsts.values())
        self.baseline: dict[str, Any] | None = self.baselines[0] if self.baselines else None
        self.evaluations = 0
        self.free_tells = 0
        #: point key -> told value (None: failed); every point that must not be asked again.
        self.known: dict[Key, float | None] = {}
        #: keys asked and not yet told.
        self.pending: set[Key] = set()
        self._baselines_left = list(self.baselines)

    def key(self, point: Mapping[str, Any]) -> Key:
        """The identity of a point: its values in parameter order."""
        return tuple(point[name] for name in self.space.names)

    def point(self, key: Key) -> dict[str, Any]:
        """The point whose identity is ``key``."""
        return dict(zip(self.space.names, key))

    @abstractmethod
    def ask(self) -> dict | None:
        """The next point to evaluate, or None when the strategy has nothing left.

        Never a point that violates the space's constraints, never a point already asked
        (duplicates and invalid points are handled internally without returning them).
        """

    @abstractmethod
    def tell(self, point: Mapping, value: float | None) -> None:
        """The objective of an asked point (lower is better, e.g. seconds or 1/speedup).

        None means it failed (compile error, wrong, timeout...); a NaN or infinite value counts
        as a failure too. Telling a point that was not asked records it as history: it will not
        be asked (and it does not count as an evaluation); a point told twice keeps its first
        value. A point outside the space raises ValueError.
        """

    def infeasible(self, point: Mapping[str, Any], reason: str = "") -> None:
        """An asked point that cannot run on the target, found before the device ran it (``reason``
        says why, e.g. the compile's resource verdict). Known as failed, so never asked again; a
        free tell (``free_tells``), not an evaluation. Strategies with a model override
        :meth:`_learn_infeasible` to learn from it."""
        key = self.key(point)
        if key in self.known and key not in self.pending:
            return
        self.pending.discard(key)
        self.known[key] = None
        self.free_tells += 1
        self._learn_infeasible(key, reason)

    def _learn_infeasible(self, key: Key, reason: str) -> None:
        """Hook of :meth:`infeasible`: the point ``key`` cannot run (nothing to learn by default)."""

    def withdraw(self, point: Mapping[str, Any]) -> None:
        """Forget an asked point that will not be evaluated (a peer's budget took it, or the search
        stopped): no longer pending, not known, so it may be asked again. Not an evaluation."""
        self.pending.discard(self.key(point))

    def tell_from_peer(self, point: Mapping, value: float | None) -> None:
        """As :meth:`tell`, for an asked point whose results a live peer measured and stored: a
        strategy whose state the workers share leaves recording it there to that peer, which does
        when it tells its own (two writers would record it twice). The others: :meth:`tell`."""
        self.tell(point, value)

    def heartbeat(self) -> None:
        """Say, from the worker's heartbeat thread, that the asked points are still being
        evaluated (a strategy whose state other workers share; nothing to do for the others)."""

    def retire_orphans(self) -> int:
        """Close what dead workers left open in this strategy's shared state (an Optuna study's
        RUNNING trials); call only when no other worker of the job is alive. Returns how many
        (nothing to do for a strategy without shared state)."""
        return 0

    # Helpers shared by the implementations -------------------------------------------------

    def _ask_baseline_once(self) -> dict | None:
        """The next baseline point not yet asked (each once, skipping known ones), else None."""
        while self._baselines_left:
            point = self._baselines_left.pop(0)
            key = self.key(point)
            if key not in self.known and key not in self.pending:
                self.pending.add(key)
                return dict(point)
        return None

    def _record(self, point: Mapping, value: float | None) -> tuple[Key, float | None, bool] | None:
        """Common bookkeeping of :meth:`tell`; None when the point was already told (ignored)."""
        problems = self.space.problems(point)
        if problems:
            raise ValueError(f"told point {dict(point)} is not in the space: {'; '.join(problems)}")
        key = self.key(point)
        value = clean_value(value)
        asked = key in self.pending
        if not asked and key in self.known:
            return None  # told twice: the first value stands
        self.pending.discard(key)
        self.known[key] = value
        if asked:
            self.evaluations += 1
        return key, value, asked


def clean_value(value: float | Sequence[float] | None) -> float | tuple[float, ...] | None:
    """A told objective as a float (a tuple of floats for a strategy of several objectives), or
    None when it failed (None, or any element NaN or infinite)."""
    if value is None:
        return None
    if isinstance(value, (tuple, list)):
        values = tuple(float(v) if v is not None else math.nan for v in value)
        return values if values and all(math.isfinite(v) for v in values) else None
    value = float(value)
    return value if math.isfinite(value) else None


class ReadThrough:
    """An attribute of a :class:`Wrapper` that reads the same attribute of its ``inner`` strategy;
    assigning it on the wrapper is an error (the state is the inner strategy's)."""

    def __set_name__(self, owner: type, name: str) -> None:
        self.attribute = name

    def __get__(self, wrapper: Any, owner: type | None = None) -> Any:
        return self if wrapper is None else getattr(wrapper.inner, self.attribute)

    def __set__(self, wrapper: Any, value: Any) -> None:
        raise AttributeError(f"{self.attribute} is the inner strategy's: set it there")


class Wrapper(Strategy):
    """A strategy that adds behaviour around ``inner`` (asking ahead, asking advised points first)
    and keeps none of the state: its name, space, seed, baselines, ``known``, ``pending`` and
    counters read through to ``inner``, so the contract's bookkeeping stays in one place. A
    subclass implements the contract's methods, passing them on to ``inner``."""

    name = ReadThrough()
    space = ReadThrough()
    seed = ReadThrough()
    objectives = ReadThrough()
    baselines = ReadThrough()
    baseline = ReadThrough()
    known = ReadThrough()
    pending = ReadThrough()
    evaluations = ReadThrough()
    free_tells = ReadThrough()

    def __init__(self, inner: Strategy):
        # Not Strategy.__init__: every counter and table is the inner strategy's.
        self.inner = inner
