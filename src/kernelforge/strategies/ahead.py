"""Asks issued ahead of the device: a strategy's next proposal is computed in a background thread
while the device measures the one before it.

A search measures on its own thread: whatever the strategy spends in ``ask()`` between two
measurements is time the device waits. A strategy that models its history pays for it: Optuna's
TPE on the job's SQLite storage costs about 40 ms an ask on an idle host and 0.3-0.9 s (spikes of
seconds) on a loaded one (``benchmarks/ask_time.py`` measures it). :class:`AskAhead` hides that
cost behind the measurement; :func:`asks_ahead` is the one decision of which strategies get it.
"""

from __future__ import annotations

import threading
from typing import Any, Mapping

from kernelforge.strategies.base import Key, Strategy, Wrapper

#: Strategies without a model of the history: their asks take microseconds, nothing to hide.
MODEL_FREE = ("grid", "random")

_NOTHING: Any = object()  # no proposal computed ahead


def asks_ahead(name: str) -> bool:
    """Whether the strategy called ``name`` is run through :class:`AskAhead` by a search (every
    strategy that models its history; not the instant, model-free ones of :data:`MODEL_FREE`)."""
    return name not in MODEL_FREE


class AskAhead(Wrapper):
    """``inner`` with one proposal always computed ahead, in a background thread.

    Right after :meth:`ask` hands out a point it starts computing the next one (while the caller's
    device measures); the next :meth:`ask` returns it at once when it is ready and waits for it
    otherwise. The proposal computed ahead is asked from ``inner`` before the caller's tell of the
    point just handed out, as with one more ask outstanding (the sampler's constant liar covers
    it); the sequence of points is still a function of the caller's calls, so seeded runs repeat.

    Contract, beyond :class:`Strategy`'s:

    - every call into ``inner`` is serialised by one lock (strategies are not thread-safe), held
      by the background ask while it runs: a tell, withdraw, enqueue or a read of ``known``,
      ``pending``, ``evaluations`` or ``free_tells`` waits for it. :meth:`heartbeat` is the
      exception: it is made to run beside an ask (from the worker's heartbeat thread), and waiting
      behind a slow ask would let the trials go stale;
    - the proposal computed ahead is pending in ``inner`` (so ``pending`` holds it: a search's
      final withdraw of every pending point withdraws it too, see :meth:`Shares.withdraw_all`);
      :meth:`withdraw` of it drops it, :meth:`close` withdraws it if still unused and joins the
      thread;
    - a point enqueued (``enqueue``, present when ``inner`` has one) is asked before the proposal
      computed ahead, which is handed out after it;
    - an exception raised by the background ask is raised by the next :meth:`ask`, on the
      caller's thread;
    - a proposal computed ahead that was None (``inner`` had nothing left) is not trusted: points
      told or withdrawn since may have changed that, so the next :meth:`ask` asks again.

    One caller thread (the search's), besides :meth:`heartbeat`'s.
    """

    def __init__(self, inner: Strategy):
        super().__init__(inner)  # the state is the inner strategy's, read through the properties
        self._lock = threading.Lock()
        self._thread: threading.Thread | None = None
        self._ahead: Any = _NOTHING  # the proposal computed ahead: a point, or None
        self._error: BaseException | None = None
        self._enqueued = 0  # points enqueued while a proposal was held: asked before it
        self._closed = False
        if callable(getattr(inner, "enqueue", None)):
            # Only then: the search tells strategies with ``enqueue`` from those without by getattr.
            self.enqueue = self._enqueue

    # The inner strategy's state, read under the lock (a background ask may be changing it) ----

    @property
    def known(self) -> dict[Key, float | None]:  # type: ignore[override]
        """A copy of the inner strategy's ``known``, once the background ask is done."""
        with self._lock:
            return dict(self.inner.known)

    @property
    def pending(self) -> set[Key]:  # type: ignore[override]
        """A copy of the inner strategy's ``pending`` (with the proposal computed ahead)."""
        with self._lock:
            return set(self.inner.pending)

    @property
    def evaluations(self) -> int:  # type: ignore[override]
        with self._lock:
            return self.inner.evaluations

    @property
    def free_tells(self) -> int:  # type: ignore[override]
        with self._lock:
            return self.inner.free_tells

    # Ask ahead ---------------------------------------------------------------------------------

    def ask(self) -> dict | None:
        """The proposal computed ahead (waiting for it if needed), or an enqueued point before it;
        then the next one is computed in the background."""
        self._join()
        if self._error is not None:
            error, self._error = self._error, None
            raise error
        held = self._ahead if isinstance(self._ahead, dict) else None
        if held is not None and not self._enqueued:
            point, self._ahead = held, _NOTHING
        else:
            with self._lock:
                point = self.inner.ask()
            if self._enqueued:
                self._enqueued -= 1
            if held is None:
                self._ahead = _NOTHING  # a stale None, or nothing held
            elif point is None:  # the enqueued points were used up otherwise: the held one is next
                point, self._ahead, self._enqueued = held, _NOTHING, 0
        if point is not None and self._ahead is _NOTHING:
            self._start()
        return point

    def _start(self) -> None:
        """Compute the next proposal in a background thread, holding the lock until it is done."""
        if self._closed:
            return
        self._lock.acquire()  # taken here, released by the thread: nothing reaches inner before it
        thread = threading.Thread(target=self._run, name=f"ask-ahead-{self.inner.name}", daemon=True)
        try:
            thread.start()
        except BaseException:
            self._lock.release()
            raise
        self._thread = thread

    def _run(self) -> None:
        try:
            self._ahead = self.inner.ask()
        except BaseException as exc:  # noqa: BLE001 - raised again by the next ask, on the caller's thread
            self._error = exc
        finally:
            self._lock.release()

    def _join(self) -> None:
        thread, self._thread = self._thread, None
        if thread is not None:
            thread.join()

    # Delegated -----------------------------------------------------------------------------------

    def tell(self, point: Mapping, value: float | None) -> None:
        with self._lock:
            self._drop_held(point)  # told before it was handed out: history, as for any strategy
            self.inner.tell(point, value)

    def tell_from_peer(self, point: Mapping, value: float | None) -> None:
        with self._lock:
            self._drop_held(point)
            self.inner.tell_from_peer(point, value)

    def infeasible(self, point: Mapping[str, Any], reason: str = "") -> None:
        with self._lock:
            self._drop_held(point)  # never hand out a point already known
            self.inner.infeasible(point, reason)

    def withdraw(self, point: Mapping[str, Any]) -> None:
        """As :meth:`Strategy.withdraw`; the proposal computed ahead may be withdrawn too."""
        with self._lock:
            self._drop_held(point)
            self.inner.withdraw(point)

    def _drop_held(self, point: Mapping[str, Any]) -> None:
        """Withdraw the proposal held ahead when it is ``point`` (under the lock)."""
        held = self._ahead
        if isinstance(held, dict) and all(point.get(name, _NOTHING) == held[name] for name in self.space.names):
            self.inner.withdraw(held)
            self._ahead, self._enqueued = _NOTHING, 0

    def heartbeat(self) -> None:
        self.inner.heartbeat()  # without the lock: see the class docstring

    def retire_orphans(self) -> int:
        with self._lock:  # not while a proposal asked ahead is between its ask and its hold
            return self.inner.retire_orphans()

    def _enqueue(self, point: Mapping[str, Any]) -> bool:
        """The inner strategy's ``enqueue``; the point is asked before the proposal held ahead."""
        with self._lock:
            accepted = bool(self.inner.enqueue(point))  # type: ignore[attr-defined]
            if accepted and isinstance(self._ahead, dict):
                self._enqueued += 1
        return accepted

    def close(self) -> None:
        """Stop asking ahead: wait for the background ask, and withdraw its proposal if it was never
        handed out. Later asks are computed on the caller's thread. Idempotent."""
        self._closed = True
        self._join()
        self._error = None
        with self._lock:
            if isinstance(self._ahead, dict):
                self.inner.withdraw(self._ahead)
            self._ahead, self._enqueued = _NOTHING, 0
