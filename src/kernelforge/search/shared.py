"""A worker's dealings with the job's shared ledger (:mod:`kernelforge.store.ledger`): study budgets
kept in step with it, claims made before evaluating, points a peer is evaluating waited for, and
a dead worker's claims adopted.

Every worker runs the same loop (:mod:`kernelforge.search.search`); the ledger is what makes several
of them one search. A point the worker's strategy asks that a live peer has claimed is not
evaluated again: it waits in :attr:`Shares.waiting` until the peer's results are stored (then the
strategy is told them, as for any stored result), or until the peer dies (then it is taken over).
A dead worker's claims that no one asked are adopted by whoever looks first.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any, Callable, Sequence

from kernelforge.block import Shape
from kernelforge.candidate import Candidate
from kernelforge.search.study import Study
from kernelforge.store.ledger import Budget, Claim, ClaimState, Ledger

#: How often an idle worker looks at the ledger again (its peers' results, dead workers' claims).
POLL_S = 0.25
#: How often a busy worker looks for dead workers' claims to adopt.
ADOPT_EVERY_S = 5.0


def shapes_key(shapes: Sequence[Shape]) -> str:
    """A shape group as claims name it."""
    return ",".join(s.name for s in shapes)


@dataclass(frozen=True)
class Waiting:
    """A point of ``study`` whose candidate a live peer is evaluating."""

    study: Study
    point: dict[str, Any]
    candidate: Candidate


class Shares:
    """The loop's side of the ledger. ``alone``: no other worker of the job was alive when this one
    started (its budgets then follow the job file; see :meth:`Ledger.open_budget`)."""

    def __init__(self, ledger: Ledger, alone: bool):
        self.ledger = ledger
        self.alone = alone
        #: Where the warnings go (the search sets its progress's): dead workers retired, the
        #: trials they left running closed.
        self.warn: Callable[[str], None] = lambda message: None
        self.waiting: list[Waiting] = []
        self._budgets: dict[str, int] = {}  # study name -> its budget in the ledger, as last seen
        self._next_adopt = 0.0

    # -- budgets -------------------------------------------------------------------------------

    def open(self, study: Study) -> None:
        """Put ``study``'s budget in the ledger (or take the ledger's) and its spent count. A worker
        alone on the job (no other alive, then or now) closes the trials that dead workers left
        running in the study's shared Optuna study, with a warning: nobody will tell them."""
        self._take(study, self.ledger.open_budget(study.name, study.budget, study.spent, self.alone))
        if self.alone and set(self.ledger.live_workers()) <= {self.ledger.worker}:
            closed = study.strategy.retire_orphans()
            if closed:
                self.warn(f"study {study.name}: closed {closed} trial(s) left running by killed workers of this job "
                          "(their evaluations are stored, or are asked again)")

    def _take(self, study: Study, budget: Budget) -> None:
        study.budget = budget.budget
        study.spent = max(0, budget.granted - study.in_flight)  # granted counts our own claims in flight
        self._budgets[study.name] = budget.budget

    def _sync(self, study: Study) -> None:
        known = self._budgets.get(study.name)
        if known is None:  # a study made during the run (a proposed template's)
            self._take(study, self.ledger.open_budget(study.name, study.budget, study.spent, alone=False))
        elif study.budget > known:  # a reserve handed back, a proposed point paid for
            self._take(study, self.ledger.add_budget(study.name, study.budget - known))

    # -- claims --------------------------------------------------------------------------------

    def claim(self, study: Study, candidate: Candidate, point: dict[str, Any]) -> ClaimState:
        """Claim ``candidate`` on ``study``'s shapes. On NO_BUDGET the study takes the ledger's
        numbers, so it closes; HELD is the caller's to add to :attr:`waiting`. GRANTED spends one
        unit of the budget (the caller counts it in flight); TAKEN_OVER spends none (the unit is
        already in ``study.spent``, granted to the dead worker)."""
        self._sync(study)
        state = self.ledger.claim(study.name, candidate.id, shapes_key(study.shapes), point)
        if state is ClaimState.NO_BUDGET:
            self._take(study, self.ledger.budget(study.name))
        return state

    def finish(self, study: Study, candidate: Candidate) -> None:
        """Our claim's results are stored."""
        self.ledger.finish(candidate.id, shapes_key(study.shapes))

    def refund(self, study: Study) -> None:
        """Our finished claim cost no evaluation (infeasible on the target): its budget unit goes
        back to ``study`` in the ledger, and the study takes the ledger's numbers (the caller has
        already taken the claim out of ``in_flight``)."""
        self._sync(study)  # a budget raised here since the last claim reaches the ledger first
        self._take(study, self.ledger.refund(study.name))

    def poll(self, complete: Callable[[Waiting], bool], start: Callable[[Waiting, bool], None]) -> None:
        """Look again at every waiting point: ``complete(item)`` reads and tells its stored results
        (True when they were all there); a claim released or left by a dead peer is claimed and
        handed to ``start`` (with whether it spent a budget unit); a study whose budget ran out
        withdraws the point from its strategy."""
        for item in list(self.waiting):
            if complete(item):
                self.waiting.remove(item)
                continue
            state = self.claim(item.study, item.candidate, item.point)
            if state is ClaimState.HELD:
                continue
            self.waiting.remove(item)
            if state in (ClaimState.GRANTED, ClaimState.TAKEN_OVER):
                start(item, state is ClaimState.GRANTED)
            elif not (state is ClaimState.DONE and complete(item)):
                item.study.strategy.withdraw(item.point)  # no budget left, or done without its results

    def adopt(self, studies: list[Study], candidate_for: Callable[[Study, dict[str, Any]], Candidate],
              start: Callable[[Waiting, bool], None], now: bool = False) -> bool:
        """Take over the open claims of dead workers that belong to ``studies`` and hand them to
        ``start`` (every ADOPT_EVERY_S seconds, or ``now``). True when any was taken."""
        if not now and time.time() < self._next_adopt:
            return False
        self._next_adopt = time.time() + ADOPT_EVERY_S
        by_name = {s.name: s for s in studies}
        waited = {(w.candidate.id, shapes_key(w.study.shapes)) for w in self.waiting}
        taken = False
        for claim in self.dead_claims(studies):
            if (claim.candidate_id, claim.shapes) in waited:
                continue  # our own strategy asked it: poll() takes it over
            study = by_name[claim.study]
            candidate = candidate_for(study, dict(claim.point))
            if candidate.id != claim.candidate_id:
                continue  # rendered differently here (another catalog): not ours to finish
            if self.ledger.claim(claim.study, candidate.id, claim.shapes, claim.point) is ClaimState.TAKEN_OVER:
                start(Waiting(study, dict(claim.point), candidate), False)
                taken = True
        return taken

    def settle(self, stored: Callable[[Claim], bool]) -> None:
        """Retire the dead workers' rows, with a warning naming each and its open claims (taken over
        as the search goes), and close their claims whose results are all stored (``stored``):
        killed between storing and closing them. Before the budgets are opened: such a claim is
        not to be counted twice, as stored results and as an open claim."""
        for worker, claims in self.ledger.retire_dead():
            self.warn(f"worker {worker} of this job is no longer running (killed?): its row is retired"
                      + (f" and its {claims} open claim(s) are taken over" if claims else ""))
        for claim in self.ledger.open_claims()[1]:
            if stored(claim):
                self.ledger.settle(claim)

    def dead_claims(self, studies: list[Study]) -> list[Claim]:
        """Open claims of dead workers on ``studies`` (those this worker could finish)."""
        names = {s.name for s in studies}
        return [c for c in self.ledger.open_claims()[1] if c.study in names]

    def peers_busy(self) -> bool:
        """Whether a live peer still holds open claims (it may yet die and leave them to us)."""
        return bool(self.ledger.open_claims()[0])

    def withdraw_all(self, studies: list[Study]) -> None:
        """Stopping: every point asked and not told goes back (Optuna trials closed FAIL)."""
        for study in studies:
            for key in list(study.strategy.pending):
                study.strategy.withdraw(study.strategy.point(key))
        self.waiting.clear()
