"""The search: job -> strategies propose -> render -> compile (CPU pool) -> verify and time (executor)
-> store -> strategies read the results -> ... -> confirm the best against the baseline.

One study per template and shape group (:mod:`kernelforge.search.plan`: ``tune = "all-shapes"``,
one configuration for every shape of the block, objective the geometric-mean time ratio to the
baseline; ``"per-shape"``, one study per shape, as vLLM tunes per token count). A group's
evaluation budget is shared by its templates' studies in turn. Compilation of the next candidates
runs in a process pool while the device verifies and times the current one, so the device does
not wait on the compiler. A proposer (the LLM generator) may add templates and points while the
search runs (:mod:`kernelforge.search.proposals`).

Everything goes through the store: a candidate already measured in the same conditions is never
measured again (its stored result answers), so a rerun of a killed search continues where it
stopped, and a result is stored the moment it exists (SIGKILL loses only the candidate in flight).
"""

from __future__ import annotations

import time
from collections import deque
from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import Any

from kernelforge.candidate import Candidate
from kernelforge.catalog import Catalog
from kernelforge.execute.executor import make_executor
from kernelforge.execute.sandbox import sandbox_warning
from kernelforge.job import Job
from kernelforge.objective import time_ratio
from kernelforge.result import StoredResult, env_key
from kernelforge.search.confirm import confirm
from kernelforge.search.context import RunContext
from kernelforge.search.gate import PolicyGate
from kernelforge.search.library import measure_library_for_run
from kernelforge.search.pipeline import Pipeline
from kernelforge.search.plan import already_spent, baseline_candidates, plan_studies
from kernelforge.search.progress import Progress
from kernelforge.search.proposals import Proposals, View
from kernelforge.search.proposer import Proposer
from kernelforge.search.reserve import Reserve
from kernelforge.search.study import Study, make_strategy_for
from kernelforge.store.records import Confirmation
from kernelforge.store.store import Store
from kernelforge.strategies.names import STRATEGIES

#: How many candidates are compiled ahead of the one on the device.
PREFETCH = 2


@dataclass
class _Pending:
    study: Study
    point: dict[str, Any]
    candidate: Candidate
    compiled: Future | None


@dataclass
class SearchOutcome:
    """What a search did, for the CLI's closing line."""

    evaluations: int = 0
    duplicates: int = 0
    stopped: bool = False
    reason: str = ""
    winners: dict[str, list[Confirmation]] = field(default_factory=dict)
    llm: dict[str, Any] = field(default_factory=dict)  # the proposer's summary, when one ran


class Search:
    """Runs one job against one store. Construct, then :meth:`run`.

    ``proposer``: proposes templates and points beside the job's strategy (the LLM generator,
    built by :func:`kernelforge.llm.proposer.for_job`); without one, a reserve the job keeps for
    it goes back to the human templates.
    """

    def __init__(self, job: Job, catalog: Catalog, store: Store, progress: Progress, *,
                 device_name: str | None = None, compile_workers: int = 1, compile_enabled: bool = True,
                 in_process: bool = False, proposer: Proposer | None = None):
        self.job = job
        self.catalog = catalog
        self.store = store
        self.progress = progress
        self.proposer = proposer
        # Candidates run in a worker process (crash, hang and memory isolation, no secrets:
        # kernelforge.execute.worker); ``in_process`` (CLI --in-process) is for debugging trusted
        # templates. The worker never sees the LLM's key.
        secrets = tuple(filter(None, [job.llm.api_key_env if job.llm else None]))
        self.executor = make_executor(device_name or job.device, in_process=in_process, secrets=secrets)
        # An executor that runs no code (replay) compiles nothing either.
        self.compile_enabled = compile_enabled and self.executor.runs_code
        self.compile_workers = compile_workers
        self.run_context: RunContext | None = None
        self.pool = None
        self.lock = None

    # -- set-up --------------------------------------------------------------------------------

    def prepare(self) -> RunContext:
        """Prepare the executor (and the compile pool), describe the environment, and fix the run
        context every stage shares. :meth:`run` calls it; :meth:`close` undoes it."""
        self.executor.prepare()
        env = dict(self.executor.describe())
        warning = sandbox_warning(env)
        if warning:  # said once, at the start; every result records its sandbox too
            self.progress.event("warning", message=warning)
        target = None
        if self.compile_enabled:
            from kernelforge.compile.targets import default_target, parse_target
            from kernelforge.compile.sandboxed import SandboxedCompilePool

            target = self.job.target or default_target()
            parse_target(target)  # a bad target is a user error before anything runs
            # Compiling runs the candidate's host code: the same policy, secrets and limits apply.
            self.pool = SandboxedCompilePool(max_workers=self.compile_workers)
        # A wall-clock cap covers the whole job, confirmation included.
        cap = 60 * self.job.strategy.max_minutes if self.job.strategy.max_minutes else None
        self.run_context = RunContext(
            job=self.job, catalog=self.catalog, store=self.store, executor=self.executor, progress=self.progress,
            env=env, env_key=env_key(env), target=target, deadline=time.time() + cap if cap else None,
            baselines={spec.id: baseline_candidates(self.catalog, spec.id, self.catalog.block(spec.id).shapes(spec.shapes))
                       for spec in self.job.blocks},
        )
        return self.run_context

    def close(self) -> None:
        """Stop the compile pool and the executor (safe to call more than once)."""
        if self.pool is not None:
            self.pool.shutdown(wait=False, cancel_futures=True)
            self.pool = None
        self.executor.close()

    def _studies(self, run: RunContext, reserve: Reserve, proposals: Proposals | None) -> list[Study]:
        """The planned studies (those with a budget), each block followed by the studies of the
        templates the proposer wrote for it in earlier runs."""
        studies = []
        planned = plan_studies(self.job, self.catalog)
        for spec in self.job.blocks:
            block = self.catalog.block(spec.id)
            for p in (p for p in planned if p.block_id == spec.id):
                reserve.add_pool(p.block_id, p.scope, p.reserve)
                if p.budget == 0:
                    continue
                template = self.catalog.template(p.template_id)
                study = Study(block, template, list(p.shapes), make_strategy_for(run, template, p.name, p.shapes),
                              p.name, p.budget, scope=p.scope)
                study.spent = already_spent(self.store, self.job, self.catalog, p)
                studies.append(study)
            if proposals is not None:
                studies.extend(proposals.resumed_studies(block))
        return studies

    # -- the run -------------------------------------------------------------------------------

    def run(self) -> SearchOutcome:
        # One search per job and database at a time: a second one refuses with the holder's pid
        # and host; a dead holder's lock (SIGKILL) is taken over (Store.acquire_job_lock).
        self.lock = self.store.acquire_job_lock(self.job.name)
        if self.lock.taken_over:
            self.progress.event("warning", message=f"took over the lock of job {self.job.name} from "
                                                   f"{self.lock.taken_over}, which is no longer running")
        self.lock.start_heartbeat()
        try:
            return self._run()
        finally:
            self.lock.release()

    def _run(self) -> SearchOutcome:
        outcome = SearchOutcome()
        try:
            run = self.prepare()
            # Proposals stop at 80% of the cap so the confirmation re-timing still fits.
            cap = 60 * self.job.strategy.max_minutes if self.job.strategy.max_minutes else None
            deadline = time.time() + 0.8 * cap if cap else None
            pipeline = Pipeline(run, PolicyGate(), self.pool)
            reserve = Reserve(self.job.llm.tune_evaluations if self.job.llm else 0)
            proposals = Proposals(run, pipeline, reserve, self.proposer) if self.proposer is not None else None
            studies = self._studies(run, reserve, proposals)
            budgets: dict[str, int] = {}
            for s in studies:
                budgets[s.block.id] = budgets.get(s.block.id, 0) + s.budget
            self.progress.event("start", job=self.job.name, device=run.device_name, dtype=run.dtype_name,
                                strategy=self.job.strategy.name, budgets=budgets,
                                resumed={s.name: s.spent for s in studies if s.spent})
            for s in studies:
                for _ in range(s.spent):
                    self.progress.event("evaluated", block=s.block.id, status="resumed", speedup=None)
            baselines = pipeline.measure_baselines()
            measure_library_for_run(run, pipeline.plans)  # issue 11: library reference lines (GPU only)
            loop = _Loop(run, pipeline, reserve, proposals, baselines, outcome)
            loop.execute(studies, deadline)
            if not outcome.stopped:
                outcome.winners = confirm(run)
            self.progress.event("end", message=f"done: {outcome.evaluations} evaluations, {outcome.duplicates} "
                                               "duplicates answered from the store")
        except KeyboardInterrupt:
            outcome.stopped, outcome.reason = True, "interrupted"
            self.progress.event("stopped", message="interrupted: everything measured is stored; "
                                                   "rerun the same command to continue")
        finally:
            self.close()
        return outcome


class _Loop:
    """The evaluation loop of one run: keeps ``PREFETCH`` candidates compiling ahead of the one
    being measured, round-robin over the open studies, a fresh proposed template first."""

    def __init__(self, run: RunContext, pipeline: Pipeline, reserve: Reserve, proposals: Proposals | None,
                 baselines: dict[str, dict[str, StoredResult]], outcome: SearchOutcome):
        self.run = run
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
                 ordered: list[StoredResult]) -> float | None:
        """Tell the strategy the objective of a point (and the proposer how its template's own
        point did); returns the objective."""
        baseline = self.baselines[study.block.id]
        value = time_ratio(ordered, baseline)
        study.strategy.tell(point, value)
        if self.proposals is not None:
            self.proposals.observe(study, candidate, ordered, baseline)
        return value

    def _loop(self, studies: list[Study], deadline: float | None) -> None:
        pending: deque[_Pending] = deque()
        outcome = self.outcome
        while True:
            if self.proposals is not None:
                self.proposals.step(studies)
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
                stored = self.pipeline.stored(candidate, study.shapes)
                if len(stored) == len(study.shapes):
                    # Already measured (the baseline, a resumed search, another template): free.
                    self._observe(study, point, candidate, [stored[s.name] for s in study.shapes])
                    outcome.duplicates += 1
                    self.run.progress.event("duplicate", block=study.block.id, candidate=candidate.id)
                    continue
                study.in_flight += 1
                pending.append(_Pending(study, point, candidate, self.pipeline.submit_compile(candidate)))
            if not pending:
                if deadline is not None and time.time() >= deadline:
                    outcome.reason = "time budget reached"
                    break
                if self.proposals is not None and self.proposals.proposer.idle():
                    continue
                if self.reserve.give_back(studies, self.run.progress):
                    continue
                break
            item = pending.popleft()
            study = item.study
            results = self.pipeline.measure(study.block, item.candidate, study.shapes, item.compiled,
                                            study.template.deterministic)
            study.in_flight -= 1
            study.spent += 1
            outcome.evaluations += 1
            ordered = [results[s.name] for s in study.shapes]
            value = self._observe(study, item.point, item.candidate, ordered)
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
