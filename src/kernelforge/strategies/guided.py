"""A strategy that starts from an adviser's points, then hands over to the strategy it wraps.

:class:`GuidedStrategy` asks the wrapped (*inner*) strategy for its baseline points first; at its
first ask after them it calls ``advice`` once with the standings so far and returns the valid,
new points it got, in the adviser's order, before any point of the inner strategy. Every tell goes
to the inner strategy, so its model learns from the advised points like from its own.

The search passes an ``advice`` that consults the job's LLM (:mod:`kernelforge.llm.advisor`);
this module knows nothing of LLMs or networks: any callable will do (tests pass a list).
"""

from __future__ import annotations

from collections import deque
from typing import Any, Callable, Mapping, Sequence

from kernelforge.strategies.base import Strategy, Wrapper
from kernelforge.textsafe import error_text

#: What an adviser is given: every point told so far with its objective (None: it failed), the
#: best first, failures last.
Standings = list[tuple[dict[str, Any], "float | None"]]
#: An adviser: standings -> points to evaluate next (most promising first). A point that is not
#: in the space, known or pending is dropped (listed in :attr:`GuidedStrategy.rejected`).
Advice = Callable[[Standings], Sequence[Mapping[str, Any]]]


class GuidedStrategy(Wrapper):
    """``inner`` with ``advice``'s points asked first, once, right after the baseline points.

    The whole state is the inner strategy's: ``known``, ``pending``, ``evaluations``,
    ``free_tells`` and the baselines are its own (read-through properties). An advised point is
    handed to the inner strategy as asked: through its ``enqueue`` when it has one (Optuna: an
    enqueued trial, so the sampler learns it as its own), else by marking it pending there (the
    base class's bookkeeping then counts its tell as an evaluation). ``advice`` raising counts as
    no advice (``advice_error`` keeps why): a failed consultation never stops a search.
    """

    def __init__(self, inner: Strategy, advice: Advice):
        super().__init__(inner)
        self._advice = advice
        self._queue: deque[dict[str, Any]] = deque()
        #: Whether ``advice`` has been called (it is called at most once).
        self.consulted = False
        #: The valid new points the adviser gave, in its order.
        self.advised: tuple[dict[str, Any], ...] = ()
        #: What the adviser gave that was not usable, with why.
        self.rejected: tuple[tuple[Any, str], ...] = ()
        self.advice_error: str | None = None

    @property
    def name(self) -> str:  # type: ignore[override]
        return f"guided {self.inner.name}"

    # The contract ------------------------------------------------------------------------------

    def ask(self) -> dict | None:
        if not self.consulted:
            if not self._baselines_asked():
                return self.inner.ask()  # its next baseline point
            self._consult()
        while self._queue:
            served = self._serve(self._queue.popleft())
            if served is not None:
                return served
        return self.inner.ask()

    def tell(self, point: Mapping, value: float | None) -> None:
        self.inner.tell(point, value)

    def tell_from_peer(self, point: Mapping, value: float | None) -> None:
        self.inner.tell_from_peer(point, value)

    def infeasible(self, point: Mapping[str, Any], reason: str = "") -> None:
        self.inner.infeasible(point, reason)

    def withdraw(self, point: Mapping[str, Any]) -> None:
        self.inner.withdraw(point)

    def heartbeat(self) -> None:
        self.inner.heartbeat()

    def retire_orphans(self) -> int:
        return self.inner.retire_orphans()

    def enqueue(self, point: Mapping[str, Any]) -> bool:
        """Have :meth:`ask` return ``point`` soon (a proposer's point): the inner strategy's
        ``enqueue`` when it has one, else after the advised points. False, and nothing queued, when
        it is not a valid point or is already known, pending or queued."""
        if any(name not in point for name in self.space.names):
            return False
        point = {name: point[name] for name in self.space.names}
        key = self.key(point)
        if not self.space.contains(point) or key in self.known or key in self.pending:
            return False
        inner_enqueue = getattr(self.inner, "enqueue", None)
        if inner_enqueue is not None:
            return bool(inner_enqueue(point))
        if any(self.key(p) == key for p in self._queue):
            return False
        self._queue.append(point)
        return True

    # Consulting ----------------------------------------------------------------------------------

    def _baselines_asked(self) -> bool:
        return all(self.key(b) in self.known or self.key(b) in self.pending for b in self.baselines)

    def standings(self) -> Standings:
        """Every told point with its objective: the best first, failures last."""
        told = [(self.point(key), value) for key, value in self.known.items()]
        return sorted(told, key=lambda item: (item[1] is None, item[1] if item[1] is not None else 0.0))

    def _consult(self) -> None:
        self.consulted = True
        try:
            given = list(self._advice(self.standings()))
        except Exception as exc:  # an adviser's failure is no advice, never a failed search
            self.advice_error = error_text(exc)
            return
        advised, rejected, seen = [], [], set()
        for raw in given:
            if not isinstance(raw, Mapping):
                rejected.append((raw, "not a mapping of parameter names to values"))
                continue
            problems = self.space.problems(raw)
            if problems:
                rejected.append((dict(raw), "; ".join(problems)))
                continue
            point = {name: raw[name] for name in self.space.names}
            key = self.key(point)
            if key in self.known or key in self.pending or key in seen:
                rejected.append((point, "already evaluated or proposed"))
                continue
            seen.add(key)
            advised.append(point)
        self.advised, self.rejected = tuple(advised), tuple(rejected)
        self._queue.extendleft(reversed(advised))  # before any point a proposer queued earlier

    def _serve(self, point: dict[str, Any]) -> dict[str, Any] | None:
        """Hand ``point`` to the inner strategy as asked; None when it became known meanwhile."""
        key = self.key(point)
        if key in self.known or key in self.pending:
            return None
        inner_enqueue = getattr(self.inner, "enqueue", None)
        if inner_enqueue is not None:
            # Its next ask returns the oldest enqueued point (ours, unless another came first).
            return self.inner.ask() if inner_enqueue(point) else None
        self.inner.pending.add(key)
        return dict(point)
