"""The shared ledger of one job: the workers searching it, each study's budget, and the claims that
say who evaluates which candidate.

Any number of workers (processes, on any hosts that reach the database) search one job together.
Before a worker evaluates a candidate on a shape group it claims it (:meth:`Ledger.claim`), in one
transaction:

- a claim already there that is ``done`` means the results are stored: read them;
- a claim held by a live worker means a peer is on it: wait for its results;
- a claim held by a dead worker (same host: its pid is gone or reused; another host: no heartbeat
  for WORKER_STALE_S seconds) is taken over by compare-and-swap on its worker: evaluate it, at no
  cost to the budget (its budget unit was granted when it was first claimed);
- no claim: one unit of the study's budget is granted by a conditional update (``granted <
  budget``: atomic on SQLite and PostgreSQL alike), then the claim row is inserted; the key is
  unique, so of two workers claiming the same candidate at once one gets it and the other's whole
  transaction (its grant included) is rolled back.

A claim whose candidate turns out infeasible on the target (rejected by the ahead-of-time
compile for its resources: nothing ran) gets its unit back (:meth:`Ledger.refund`) and stays done.
So the budget is shared and spent exactly on device evaluations, nothing is evaluated twice under
one environment, and a killed worker's claims are finished by the others. A worker that stops
(Ctrl-C, SIGTERM) releases its open claims and their budget units (:meth:`Ledger.leave`); one that
is killed leaves them to be taken over. Every row is keyed by job: other jobs in the same database
are not affected.
"""

from __future__ import annotations

import json
import threading
import time
from dataclasses import dataclass
from enum import Enum
from typing import Any, Callable, Mapping

import sqlalchemy as sa
from sqlalchemy.engine import Engine
from sqlalchemy.exc import IntegrityError

from kernelforge.store.engine import checkpoint
from kernelforge.store.lock import process_alive, process_identity
from kernelforge.store.schema import budgets_table, claims_table, finished_table, workers_table

#: A worker refreshes its heartbeat this often; on another host it counts as dead once its heartbeat
#: is WORKER_STALE_S old (on the same host its pid is checked at once).
WORKER_HEARTBEAT_S = 10.0
WORKER_STALE_S = 60.0


class ClaimState(Enum):
    """What :meth:`Ledger.claim` found."""

    GRANTED = "granted"  # a new claim, one budget unit spent: evaluate it
    TAKEN_OVER = "taken_over"  # a dead worker's claim, now ours: evaluate it (no budget spent)
    HELD = "held"  # a live worker (a peer, or this one) is evaluating it: wait for its results
    DONE = "done"  # evaluated and stored: read the results
    NO_BUDGET = "no_budget"  # the study's budget is spent


@dataclass(frozen=True)
class Claim:
    """One claim row: ``candidate_id`` on the shape group ``shapes`` (comma-joined names) under
    ``env_key``, for ``study``'s ``point``, held by ``worker``."""

    job: str
    env_key: str
    candidate_id: str
    shapes: str
    study: str
    point: Mapping[str, Any]
    worker: str
    state: str
    claimed: float


@dataclass(frozen=True)
class Budget:
    """A study's shared budget: what it may spend and what has been granted to claims so far."""

    budget: int
    granted: int

    @property
    def left(self) -> int:
        return max(0, self.budget - self.granted)


class Ledger:
    """This process's place in the ledger of ``job`` under ``env_key``. :meth:`join` before the
    first claim, :meth:`leave` at the end (both safe to call more than once)."""

    def __init__(self, engine: Engine, job: str, env_key: str):
        self.engine = engine
        self.job = job
        self.env_key = env_key
        self.worker, self.host, self.pid = process_identity()
        self._stop: threading.Event | None = None
        self._beats: list[Callable[[], None]] = []

    # -- workers -------------------------------------------------------------------------------

    def join(self, on_heartbeat: Callable[[], None] | None = None) -> None:
        """Register this worker and keep its heartbeat fresh from a daemon thread (calling
        ``on_heartbeat`` at each beat too: a shared Optuna study's trials beat with it)."""
        now = time.time()
        with self.engine.begin() as conn:
            conn.execute(workers_table.delete().where(self._me()))
            conn.execute(workers_table.insert(), {"job": self.job, "worker": self.worker, "host": self.host,
                                                  "pid": self.pid, "started": now, "heartbeat": now})
        if on_heartbeat is not None:
            self._beats.append(on_heartbeat)
        if self._stop is None:
            self._stop = threading.Event()
            threading.Thread(target=self._beat, args=(self._stop,), name="kernelforge-worker-heartbeat",
                             daemon=True).start()

    def _beat(self, stop: threading.Event) -> None:
        while not stop.wait(WORKER_HEARTBEAT_S):
            try:
                with self.engine.begin() as conn:
                    conn.execute(workers_table.update().where(self._me()).values(heartbeat=time.time()))
                for beat in self._beats:
                    beat()
            except Exception:  # a full disk or an unreachable server: the search itself will say so
                pass

    def leave(self) -> None:
        """Stop the heartbeat, release this worker's open claims (their budget units go back) and
        remove its worker row. Its finished claims stay: they record who evaluated what."""
        if self._stop is not None:
            self._stop.set()
            self._stop = None
        for claim in self.claims(worker=self.worker, state="claimed"):
            self.release(claim.candidate_id, claim.shapes)
        with self.engine.begin() as conn:
            conn.execute(workers_table.delete().where(self._me()))

    def _me(self):
        return (workers_table.c.job == self.job) & (workers_table.c.worker == self.worker)

    def retire_dead(self) -> list[tuple[str, int]]:
        """Remove the rows of this job's workers that are no longer alive (killed: they never
        left); returns (worker, its open claims) for each. Their claims stay, to be taken over
        (a claim whose worker has no row is a dead worker's)."""
        with self.engine.connect() as conn:
            rows = conn.execute(sa.select(workers_table).where(workers_table.c.job == self.job)).mappings().all()
        dead = [r["worker"] for r in rows if not self._alive_row(r)]
        retired = []
        for worker in dead:
            with self.engine.begin() as conn:
                gone = conn.execute(workers_table.delete().where(
                    (workers_table.c.job == self.job) & (workers_table.c.worker == worker)
                    & (workers_table.c.heartbeat == next(r["heartbeat"] for r in rows if r["worker"] == worker))))
            if gone.rowcount == 1:  # not beaten to it by another worker, nor revived
                retired.append((worker, len(self.claims(worker=worker, state="claimed"))))
        return retired

    def live_workers(self) -> list[str]:
        """The identities of the workers of this job that are alive now (this one included)."""
        with self.engine.connect() as conn:
            rows = conn.execute(sa.select(workers_table).where(workers_table.c.job == self.job)).mappings().all()
        return [r["worker"] for r in rows if self._alive_row(r)]

    def _alive_row(self, row: Mapping[str, Any]) -> bool:
        return row["worker"] == self.worker or process_alive(row["worker"], row["host"], int(row["pid"]),
                                                             float(row["heartbeat"]), WORKER_STALE_S)

    def _alive(self, conn, worker: str) -> bool:
        row = conn.execute(sa.select(workers_table).where(
            (workers_table.c.job == self.job) & (workers_table.c.worker == worker))).mappings().first()
        return row is not None and self._alive_row(row)

    # -- budgets -------------------------------------------------------------------------------

    def open_budget(self, study: str, budget: int, spent: int, alone: bool) -> Budget:
        """The shared budget of ``study``, created with ``budget`` and ``spent`` granted (the
        evaluations already stored) when new. A worker ``alone`` on the job makes it the job's
        ``budget`` now (the job file may have changed) and counts ``spent`` plus the open claims (a
        killed worker's, to be taken over) as granted; a worker joining peers takes the larger budget."""
        try:
            with self.engine.begin() as conn:
                row = conn.execute(sa.select(budgets_table).where(self._study(study))).mappings().first()
                if row is None:
                    conn.execute(budgets_table.insert(), {"job": self.job, "study": study, "budget": budget,
                                                          "granted": spent})
                elif alone:
                    # Open claims under this environment: this run takes them over; another
                    # environment's are that one's to finish.
                    open_claims = conn.execute(sa.select(sa.func.count()).select_from(claims_table).where(
                        (claims_table.c.job == self.job) & (claims_table.c.study == study)
                        & (claims_table.c.env_key == self.env_key) & (claims_table.c.state == "claimed"))).scalar_one()
                    conn.execute(budgets_table.update().where(self._study(study)).values(
                        budget=budget, granted=spent + open_claims))
                elif row["budget"] < budget:
                    conn.execute(budgets_table.update().where(self._study(study)).values(budget=budget))
        except IntegrityError:
            pass  # created by a peer at the same moment: its row stands
        return self.budget(study)

    def add_budget(self, study: str, extra: int) -> Budget:
        """Give ``study`` ``extra`` more evaluations (a reserve handed back, a proposed point)."""
        with self.engine.begin() as conn:
            conn.execute(budgets_table.update().where(self._study(study)).values(budget=budgets_table.c.budget + extra))
        return self.budget(study)

    def refund(self, study: str) -> Budget:
        """Give back one unit granted to ``study``: a claimed candidate that cost no evaluation
        (the ahead-of-time compile found it infeasible on the target, so the device never ran it).
        Its claim stays ``done`` (its results are stored: no peer evaluates it again). One
        conditional update (``granted > 0``), atomic on SQLite and PostgreSQL alike."""
        with self.engine.begin() as conn:
            conn.execute(budgets_table.update().where(self._study(study) & (budgets_table.c.granted > 0))
                         .values(granted=budgets_table.c.granted - 1))
        return self.budget(study)

    def budget(self, study: str) -> Budget:
        with self.engine.connect() as conn:
            row = conn.execute(sa.select(budgets_table).where(self._study(study))).mappings().first()
        return Budget(int(row["budget"]), int(row["granted"])) if row else Budget(0, 0)

    def _study(self, study: str):
        return (budgets_table.c.job == self.job) & (budgets_table.c.study == study)

    # -- claims --------------------------------------------------------------------------------

    def claim(self, study: str, candidate_id: str, shapes: str, point: Mapping[str, Any], *,
              free: bool = False) -> ClaimState:
        """Claim ``candidate_id`` on ``shapes`` for ``study`` (see the module docstring); ``free``
        claims cost no budget (the baselines' measurements)."""
        for _ in range(5):
            try:
                outcome = self._try_claim(study, candidate_id, shapes, point, free)
            except IntegrityError:
                continue  # a peer claimed it first: the whole transaction, our grant included, is undone
            if outcome is not None:
                return outcome
        return ClaimState.HELD

    def _try_claim(self, study: str, candidate_id: str, shapes: str, point: Mapping[str, Any],
                   free: bool) -> ClaimState | None:
        """One claim transaction; None when the row changed under it (look again). Raises
        IntegrityError when a peer inserted the same claim first (the transaction is rolled back)."""
        with self.engine.begin() as conn:
            row = conn.execute(sa.select(claims_table).where(self._claim(candidate_id, shapes))).mappings().first()
            if row is not None:
                if row["state"] == "done":
                    return ClaimState.DONE
                if row["worker"] == self.worker:
                    return ClaimState.HELD  # this worker is on it already (asked again, or adopted)
                if self._alive(conn, row["worker"]):
                    return ClaimState.HELD
                taken = conn.execute(claims_table.update().where(
                    self._claim(candidate_id, shapes) & (claims_table.c.worker == row["worker"])
                    & (claims_table.c.state == "claimed")).values(worker=self.worker, claimed=time.time()))
                return ClaimState.TAKEN_OVER if taken.rowcount == 1 else None
            if not free:
                granted = conn.execute(budgets_table.update().where(
                    self._study(study) & (budgets_table.c.granted < budgets_table.c.budget)).values(
                    granted=budgets_table.c.granted + 1))
                if granted.rowcount != 1:
                    return ClaimState.NO_BUDGET
            conn.execute(claims_table.insert(), {
                "job": self.job, "env_key": self.env_key, "candidate_id": candidate_id, "shapes": shapes,
                "study": study, "point": json.dumps(dict(point)), "worker": self.worker,
                "state": "claimed", "claimed": time.time()})
        return ClaimState.GRANTED

    def finish(self, candidate_id: str, shapes: str) -> None:
        """Mark this worker's claim done: its results are stored."""
        with self.engine.begin() as conn:
            conn.execute(claims_table.update().where(
                self._claim(candidate_id, shapes) & (claims_table.c.worker == self.worker)).values(state="done"))

    def settle(self, claim: Claim) -> None:
        """Mark a dead worker's open claim done: it was killed after storing its results."""
        with self.engine.begin() as conn:
            conn.execute(claims_table.update().where(
                self._claim(claim.candidate_id, claim.shapes) & (claims_table.c.worker == claim.worker)
                & (claims_table.c.state == "claimed")).values(state="done"))

    def release(self, candidate_id: str, shapes: str) -> None:
        """Give up this worker's open claim (stopped before its results existed): the row goes and its
        study gets the budget unit back, so a peer or a rerun evaluates it."""
        with self.engine.begin() as conn:
            row = conn.execute(sa.select(claims_table).where(
                self._claim(candidate_id, shapes) & (claims_table.c.worker == self.worker)
                & (claims_table.c.state == "claimed"))).mappings().first()
            if row is None:
                return
            conn.execute(claims_table.delete().where(
                self._claim(candidate_id, shapes) & (claims_table.c.worker == self.worker)))
            conn.execute(budgets_table.update().where(self._study(row["study"]) & (budgets_table.c.granted > 0))
                         .values(granted=budgets_table.c.granted - 1))

    def claims(self, *, worker: str | None = None, state: str | None = None) -> list[Claim]:
        """This job's claims under this environment (of one worker, in one state)."""
        query = sa.select(claims_table).where((claims_table.c.job == self.job) & (claims_table.c.env_key == self.env_key))
        if worker is not None:
            query = query.where(claims_table.c.worker == worker)
        if state is not None:
            query = query.where(claims_table.c.state == state)
        with self.engine.connect() as conn:
            rows = conn.execute(query.order_by(claims_table.c.claimed)).mappings().all()
        return [Claim(**{**r, "point": json.loads(r["point"])}) for r in rows]

    def open_claims(self) -> tuple[list[Claim], list[Claim]]:
        """The open claims of other workers: (those of live workers, those of dead ones)."""
        live = set(self.live_workers())
        others = [c for c in self.claims(state="claimed") if c.worker != self.worker]
        return [c for c in others if c.worker in live], [c for c in others if c.worker not in live]

    def _claim(self, candidate_id: str, shapes: str):
        return ((claims_table.c.job == self.job) & (claims_table.c.env_key == self.env_key)
                & (claims_table.c.candidate_id == candidate_id) & (claims_table.c.shapes == shapes))

    # -- the end -------------------------------------------------------------------------------

    def mark_finished(self) -> None:
        """The job is searched and confirmed under this environment (and its SQLite file holds
        it all: the write-ahead log is checkpointed)."""
        with self.engine.begin() as conn:
            conn.execute(finished_table.delete().where(self._finished()))
            conn.execute(finished_table.insert(), {"job": self.job, "env_key": self.env_key, "finished": time.time()})
        checkpoint(self.engine)

    def finished(self) -> float | None:
        """When the job was last confirmed under this environment (None: never)."""
        with self.engine.connect() as conn:
            value = conn.execute(sa.select(finished_table.c.finished).where(self._finished())).scalar()
        return float(value) if value is not None else None

    def _finished(self):
        return (finished_table.c.job == self.job) & (finished_table.c.env_key == self.env_key)
