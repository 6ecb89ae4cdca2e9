"""The evaluation loop of one worker's run: strategies propose, the shared ledger says who
evaluates what (:mod:`kernelforge.search.shared`), candidates compile ahead while the device
measures, results go to the store and back to the strategies.

Round-robin over the open studies, a fresh proposed template first; ``PREFETCH`` candidates
compile while the device works on the one before them, so the device does not wait on the
compiler. A point already stored (the baseline, a resumed search, another template, a peer) is
free; a point a live peer is measuring waits for its results; a dead worker's claim is taken
over. A candidate the ahead-of-time compile rejects for the target's resources (shared memory,
threads, tensor memory over the limit) is infeasible, not an evaluation: its results are stored,
its strategy is told ``infeasible``, and its budget unit goes back (issue 14). The loop ends when
every study is spent or exhausted and no live peer holds a claim (it may yet die and leave it to
us), or at the deadline.
"""

from __future__ import annotations

import time
from collections import deque
from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import Any

from kernelforge.candidate import Candidate
from kernelforge.objective import time_ratio
from kernelforge.search.energy import objective_value
from kernelforge.result import StoredResult
from kernelforge.search.context import RunContext
from kernelforge.search.pipeline import Pipeline
from kernelforge.search.proposals import Proposals, View
from kernelforge.search.reserve import Reserve
from kernelforge.search.shared import POLL_S, Shares, Waiting
from kernelforge.search.study import Study
from kernelforge.store.ledger import ClaimState
from kernelforge.store.records import Confirmation
from kernelforge.strategies.names import STRATEGIES

#: How many candidates are compiled ahead of the one on the device.
PREFETCH = 2


@dataclass
class _Pending:
    study: Study
    point: dict[str, Any]
    candidate: Candidate
    compiled: Future | None
    paid: bool  # granted a unit of the shared budget (False: a dead worker's claim taken over)


@dataclass
class SearchOutcome:
    """What a search did, for the CLI's closing line."""

    evaluations: int = 0
    duplicates: int = 0
    stopped: bool = False
    reason: str = ""
    from_peers: int = 0  # points this worker's strategy asked that a peer evaluated
    infeasible: int = 0  # points this worker's compiles found infeasible on the target (no evaluation, no budget)
    complete: bool = False  # the job was already searched and confirmed: nothing ran
    winners: dict[str, list[Confirmation]] = field(default_factory=dict)
    llm: dict[str, Any] = field(default_factory=dict)  # the proposer's summary, when one ran


class EvaluationLoop:
    """The evaluation loop of one run: keeps ``PREFETCH`` candidates compiling ahead of the one
    being measured, round-robin over the open studies, a fresh proposed template first."""

    def __init__(self, run: RunContext, pipeline: Pipeline, reserve: Reserve, proposals: Proposals | None,
                 baselines: dict[str, dict[str, StoredResult]], outcome: SearchOutcome, shares: Shares):
        self.run = run
        self.shares = shares
        self.pipeline = pipeline
        self.reserve = reserve
        self.proposals = proposals
        self.baselines = baselines
        self.outcome = outcome
        self._turn = 0

    def execute(self, studies: list[Study], deadline: float | None) -> None:
        """Evaluate until every study is spent or exhausted (or ``deadline``), the proposer running beside."""
        if self.proposals is None:
            self._loop(studies, deadline)
            return
        proposer = self.proposals.proposer
        proposer.start(View(self.run, self.reserve, self.proposals.templates, self.baselines,
                            lambda: self.outcome.evaluations))
        try:
            self._loop(studies, deadline)
        finally:
            proposer.close()
            self.outcome.llm = proposer.summary()

    def _next_study(self, studies: list[Study]) -> Study | None:
        for _ in range(len(studies)):
            study = studies[self._turn % len(studies)]
            self._turn += 1
            if study.open:
                return study
        return None

    def _observe(self, study: Study, point: dict[str, Any], candidate: Candidate,
                 ordered: list[StoredResult], infeasible: str | None, peer: bool = False) -> float | None:
        """Tell the strategy a point's stored results (and the proposer how its template's own
        point did): their objective, or ``infeasible`` with its reason when they are a resource
        rejection (:meth:`Pipeline.infeasible`: nothing ran). Returns the time ratio (the speedup's
        inverse, whatever the run's objective: energy or a (time, energy) pair are told, not shown)."""
        # The baseline as timed most recently before these results (kernelforge.baseline_timing).
        baseline = self.pipeline.series(study.block.id, self.baselines[study.block.id])
        value = None
        if infeasible is not None:
            study.strategy.infeasible(point, infeasible)
        else:
            tell = study.strategy.tell_from_peer if peer else study.strategy.tell  # a live peer measured it
            tell(point, objective_value(self.run.objective, ordered, baseline))
            value = time_ratio(ordered, baseline)
        if self.proposals is not None:
            self.proposals.observe(study, candidate, ordered, baseline)
        return value

    def recall(self, studies: list[Study]) -> None:
        """Tell each study's stateful strategy, as history, this job's stored points of its template
        that it does not know (nor holds as a baseline): a run killed between storing a point's
        results and telling its strategy leaves such a point, and the stored study (a view of the
        store) gets it here even when no budget is left to ask it again. A fresh run has none."""
        job = self.run.job
        if not STRATEGIES[job.strategy.name].stateful:
            return
        for study in studies:
            strategy, space = study.strategy, study.template.space
            baseline = self.pipeline.series(study.block.id, self.baselines[study.block.id])  # as when it was stored
            skip = set(strategy.known) | {strategy.key(p) for p in strategy.baselines}
            for stored in self.run.store.candidates(study.block.id):
                point = {name: stored.params.get(name) for name in space.names}
                if stored.template != study.template.id or stored.job != job.name or not space.contains(point) \
                        or strategy.key(point) in skip:
                    continue
                candidate = Candidate.from_template(study.template, point)
                results = self.pipeline.stored(candidate, study.shapes) if candidate.id == stored.id else {}
                if len(results) == len(study.shapes):
                    ordered = [results[s.name] for s in study.shapes]
                    reason = self.pipeline.infeasible(candidate, ordered)
                    if reason is not None:
                        strategy.infeasible(point, reason)
                    else:
                        strategy.tell(point, objective_value(self.run.objective, ordered, baseline))

    def _loop(self, studies: list[Study], deadline: float | None) -> None:
        self.recall(studies)
        pending: deque[_Pending] = deque()
        outcome, shares = self.outcome, self.shares

        def start(item: Waiting, paid: bool = False) -> None:  # a claimed point: compile ahead, then measure
            if paid:  # a new grant: in flight until measured (a taken-over claim is already spent)
                item.study.in_flight += 1
            pending.append(_Pending(item.study, item.point, item.candidate,
                                    self.pipeline.submit_compile(item.candidate), paid))

        while True:
            if self.proposals is not None:
                self.proposals.step(studies)
            shares.poll(self._from_store, start)
            if len(pending) < PREFETCH:
                shares.adopt(studies, self._candidate_for, start)
            while len(pending) < PREFETCH and (deadline is None or time.time() < deadline):
                # A template a proposer just wrote goes first: the proposer is waiting for its verdict.
                study = Proposals.fresh_study(studies) or self._next_study(studies)
                if study is None:
                    break
                point = study.next_point()
                if point is None:
                    study.exhausted = True
                    continue
                try:
                    candidate = self._candidate_for(study, point)
                except Exception as exc:
                    if not study.proposed:
                        raise  # a human template that fails to render is the user's to fix
                    # A proposed template whose Jinja fails at this point (a runtime error in an
                    # expression): a failed point, like any other failure of its code.
                    study.strategy.tell(point, None)
                    self.run.progress.event("warning", message=f"{study.template.id} at {point}: cannot render "
                                                               f"({type(exc).__name__}: {exc})")
                    continue
                item = Waiting(study, point, candidate)
                # Already measured (the baseline, a resumed search, another template, a peer): free.
                if self._from_store(item, peer=False):
                    continue
                state = shares.claim(study, candidate, point)
                if state in (ClaimState.GRANTED, ClaimState.TAKEN_OVER):
                    start(item, paid=state is ClaimState.GRANTED)
                elif state is ClaimState.HELD:
                    shares.waiting.append(item)  # a live peer is measuring it: its results will answer
                elif not (state is ClaimState.DONE and self._from_store(item, measuring=False)):
                    study.strategy.withdraw(point)  # the shared budget is spent
            if not pending:
                if deadline is not None and time.time() >= deadline:
                    outcome.reason = "time budget reached"
                    break
                if self.proposals is not None and self.proposals.proposer.idle():
                    continue
                if shares.waiting or shares.peers_busy():
                    time.sleep(POLL_S)  # peers are measuring: wait for their results (or their death)
                    continue
                if shares.adopt(studies, self._candidate_for, start, now=True):
                    continue
                if self.reserve.give_back(studies, self.run.progress):
                    continue
                break
            self._measure(pending.popleft())

    def _from_store(self, item: Waiting, peer: bool = True, measuring: bool = True) -> bool:
        """Tell the strategy ``item``'s stored results when all its shapes have one (True): a peer's
        (``peer``), one that was ``measuring`` it (it writes its shared strategy state), or not."""
        study = item.study
        stored = self.pipeline.stored(item.candidate, study.shapes)
        if len(stored) < len(study.shapes):
            return False
        ordered = [stored[s.name] for s in study.shapes]
        # A stored resource rejection is told ``infeasible``, as where it was compiled.
        self._observe(study, item.point, item.candidate, ordered, self.pipeline.infeasible(item.candidate, ordered),
                      peer and measuring)
        if peer:
            self.outcome.from_peers += 1
        else:
            self.outcome.duplicates += 1
        self.run.progress.event("duplicate", block=study.block.id, candidate=item.candidate.id)
        return True

    def _measure(self, item: _Pending) -> None:
        study = item.study
        self.run.progress.event("measuring", block=study.block.id, candidate=item.candidate.id, params=item.point)
        results = self.pipeline.measure(study.block, item.candidate, study.shapes, item.compiled)
        self.shares.finish(study, item.candidate)
        ordered = [results[s.name] for s in study.shapes]
        reason = self.pipeline.infeasible(item.candidate, ordered)
        if item.paid:
            study.in_flight -= 1
        if reason is not None:
            # Infeasible on the target (the device never ran it): stored, but no evaluation; the
            # unit its claim was granted goes back (a dead worker's claim taken over included).
            self.shares.refund(study)
            self.outcome.infeasible += 1
            self._observe(study, item.point, item.candidate, ordered, reason)
            self.run.progress.event(
                "infeasible", block=study.block.id, template=study.template.id, candidate=item.candidate.id,
                params=item.point, status=ordered[0].status.value, message=reason, origin=item.candidate.origin,
            )
            return
        if item.paid:
            study.spent += 1
        self.outcome.evaluations += 1
        value = self._observe(study, item.point, item.candidate, ordered, None)
        failed = next((r for r in ordered if not r.ok), None)
        self.run.progress.event(
            "evaluated", block=study.block.id, template=study.template.id, candidate=item.candidate.id,
            params=item.point, status=failed.status.value if failed else "ok",
            speedup=(1.0 / value) if value else None, message=failed.message if failed else "",
            origin=item.candidate.origin,
        )

    def _candidate_for(self, study: Study, point: dict[str, Any]) -> Candidate:
        """The candidate of a study's point, with its origin and parent."""
        key = tuple(point[name] for name in study.template.space.names)
        if study.proposed and dict(point) == dict(study.template.baseline):
            return Candidate.from_template(study.template, point, origin="llm", parent=study.parent)
        if key in study.queued:
            return Candidate.from_template(study.template, point, origin="llm", parent=study.queued.pop(key))
        candidate = Candidate.from_template(study.template, point, origin=STRATEGIES[self.run.job.strategy.name].origin,
                                            parent=study.root)
        # A shape's baseline point asked by the study is that baseline (same source, same id).
        return next((c for c in self.run.baselines[study.block.id].values() if c.id == candidate.id), candidate)
