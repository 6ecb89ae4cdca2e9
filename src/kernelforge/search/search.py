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

Any number of workers run one job together through the store's ledger (:mod:`kernelforge.search.
shared`, :mod:`kernelforge.store.ledger`): claims, shared budgets, a dead worker's claims taken
over. The evaluation loop itself is :mod:`kernelforge.search.evaluation_loop`.
"""

from __future__ import annotations

import time

from kernelforge.catalog import Catalog
from kernelforge.execute.executor import make_executor
from kernelforge.errors import Terminated, UserError
from kernelforge.sandbox.roles import sandbox_warning
from kernelforge.job import Job
from kernelforge.result import env_key
from kernelforge.search.confirm import confirm
from kernelforge.search.context import JobClock, RunContext
from kernelforge.search.gate import PolicyGate
from kernelforge.search.library import measure_library_for_run
from kernelforge.search.pipeline import Pipeline
from kernelforge.search.plan import already_spent, baseline_candidates, plan_studies
from kernelforge.search.progress import Progress
from kernelforge.search.proposer import AdvisorFactory, Proposer
from kernelforge.search.evaluation_loop import EvaluationLoop, SearchOutcome
from kernelforge.search.proposals import Proposals
from kernelforge.search.reserve import Reserve
from kernelforge.search.shared import Shares
from kernelforge.search.energy import objective_in_effect
from kernelforge.search.study import Study, make_strategy_for
from kernelforge.store.failures import clean_up
from kernelforge.store.lock import JobLock
from kernelforge.store.store import Store

class Search:
    """Runs one job against one store. Construct, then :meth:`run`.

    ``proposer``: proposes templates and points beside the job's strategy (the LLM generator,
    built by :func:`kernelforge.llm.proposer.for_job`); without one, a reserve the job keeps for
    it goes back to the human templates. ``advisor``: builds each study's point adviser
    (:data:`kernelforge.search.proposer.AdvisorFactory`; the LLM's ``advice_for``). Both are given
    by whoever wires the run (:mod:`kernelforge.start`): the search imports neither's package.
    """

    def __init__(self, job: Job, catalog: Catalog, store: Store, progress: Progress, *,
                 device_name: str | None = None, compile_workers: int = 1, compile_enabled: bool = True,
                 in_process: bool = False, proposer: Proposer | None = None, advisor: AdvisorFactory | None = None,
                 reconfirm: bool = False, accept_block_change: bool = False,
                 pool=None):
        self.job = job
        self.accept_block_change = accept_block_change
        self.catalog = catalog
        self.store = store
        self.progress = progress
        self.proposer = proposer
        self.advisor = advisor
        # Candidates run in a worker process (crash, hang and memory isolation, no secrets:
        # kernelforge.execute.worker.executor); ``in_process`` (CLI --in-process) is for debugging trusted
        # templates. The worker never sees the LLM's key.
        secrets = tuple(filter(None, [job.llm.api_key_env if job.llm else None]))
        self.executor = make_executor(device_name or job.device, in_process=in_process, secrets=secrets,
                                      storage=store.url)
        # An executor that runs no code (replay) compiles nothing either.
        self.compile_enabled = compile_enabled and self.executor.runs_code
        self.compile_workers = compile_workers
        self.reconfirm = reconfirm
        self.run_context: RunContext | None = None
        self.given_pool = pool  # a ready compile pool (Ray's CPU workers), used instead of a local one
        self.pool = None
        self.lock: JobLock | None = None

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
            from kernelforge.targets import default_target, parse_target
            from kernelforge.compile.sandboxed import SandboxedCompilePool

            target = self.job.target or default_target()
            parse_target(target)  # a bad target is a user error before anything runs
            # Compiling runs the candidate's host code: the same policy, secrets and limits apply.
            self.pool = self.given_pool or SandboxedCompilePool(max_workers=self.compile_workers)
        objective, energy_warning = objective_in_effect(self.job, env)  # decided once per run
        if energy_warning:
            self.progress.event("warning", message=energy_warning)
        self.run_context = RunContext(
            job=self.job, catalog=self.catalog, store=self.store, executor=self.executor, progress=self.progress,
            env=env, env_key=env_key(env), ledger=self.store.ledger(self.job.name, env_key(env)), target=target,
            objective=objective, advisor=self.advisor,
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
                if proposals is not None:  # the lead keeps the reserve: only it runs the proposer
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
        """Search the job as one of its workers (any number run at once, on any hosts that reach
        the store: :mod:`kernelforge.search.shared`). The first to start is the lead (it holds the
        job lock): it runs the proposer, and the worker that ends holding the lock confirms."""
        outcome = SearchOutcome()
        first: BaseException | None = None
        shares: Shares | None = None
        studies: list[Study] = []
        try:
            run = self.prepare()
            self._check_judges()
            shares = Shares(run.ledger, alone=not run.ledger.live_workers())
            shares.warn = lambda message: self.progress.event("warning", message=message)
            shares.settle(lambda claim: all(
                self.store.find_result(claim.candidate_id, name, run.dtype_name, run.env_key) is not None
                for name in claim.shapes.split(",")))
            self._take_lead()
            run.ledger.join(on_heartbeat=lambda: [s.strategy.heartbeat() for s in list(studies)])
            pipeline = Pipeline(run, PolicyGate(), self.pool)
            reserve = Reserve(self.job.llm.tune_evaluations if self.job.llm else 0)
            lead_proposer = self.proposer if self.lock is not None else None
            proposals = Proposals(run, pipeline, reserve, lead_proposer) if lead_proposer is not None else None
            studies.extend(self._studies(run, reserve, proposals))
            for s in studies:
                shares.open(s)
            if self._complete(run, shares, studies):
                outcome.complete = True
                return outcome
            self._start_events(run, studies)
            baselines = pipeline.measure_baselines()
            measure_library_for_run(run, pipeline.plans)  # issue 11: library reference lines (GPU only)
            clock = JobClock.start(self.job.strategy.max_minutes)  # the cap counts from here (issue 28)
            loop = EvaluationLoop(run, pipeline, reserve, proposals, baselines, outcome, shares)
            loop.execute(studies, clock.proposals_end)
            if not outcome.stopped:
                self._finish(run, outcome, clock)
        except KeyboardInterrupt as exc:
            outcome.stopped, outcome.reason = True, "terminated" if isinstance(exc, Terminated) else "interrupted"
            self.progress.event("stopped", message=f"{outcome.reason}: everything measured is stored, open claims "
                                                   "were released; rerun the same command to continue")
        except BaseException as exc:
            first = exc
            raise
        finally:
            # Each step runs whatever the others did; after a first error (a full disk, say) a
            # step's own failure is dropped, never put in its place. Claims left open count as
            # dead once this process is gone, to be taken over.
            clean_up(first, [lambda: shares and shares.withdraw_all(studies), lambda: shares and shares.ledger.leave(),
                             lambda: self.lock and self.lock.release(), self.close])
        return outcome

    def _check_judges(self) -> None:
        """Before anything is answered from the store: each block's code must be the one its stored
        verdicts were given under (:meth:`Catalog.judge`), else the search stops, saying which
        block changed; ``accept_block_change`` (``--accept-block-change``) records the new one."""
        for spec in self.job.blocks:
            now = self.catalog.judge(spec.id)
            before = self.store.judge_of(self.job.name, spec.id)
            if before is not None and before != now and not self.accept_block_change:
                path = self.catalog.root / spec.id / "block.py"
                raise UserError(
                    f"block {spec.id} ({path}) changed since job {self.job.name}'s results of it were stored: its "
                    "reference, inputs, shapes or tolerances may differ, so the stored verdicts may not hold. Start "
                    "afresh (kernelforge backup JOB, then give the search another --storage or job name), or, when "
                    "the change cannot alter a verdict (a new shape set), rerun with --accept-block-change")
            if before != now:
                self.store.record_judge(self.job.name, spec.id, now)

    def _take_lead(self) -> None:
        """Become the lead if no live worker is (the job lock; a dead lead's is taken over)."""
        got = self.store.take_job_lock(self.job.name)
        if not isinstance(got, JobLock):
            return
        self.lock = got
        if got.taken_over:
            self.progress.event("warning", message=f"took over the lock of job {self.job.name} from "
                                                   f"{got.taken_over}, which is no longer running")
        got.start_heartbeat()

    def _complete(self, run: RunContext, shares: Shares, studies: list[Study]) -> bool:
        """A rerun of a finished job: every budget spent, nothing left to adopt, winners confirmed
        under this environment. Then nothing runs and nothing stored changes (``reconfirm``: re-time)."""
        finished = run.ledger.finished()
        if self.reconfirm or finished is None or any(s.open for s in studies) or shares.dead_claims(studies):
            return False
        when = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(finished))
        self.progress.event("end", message=f"job {self.job.name} is complete on {run.device_name} (confirmed {when}): "
                                           "nothing to do; raise its budget to search on, or rerun with --reconfirm "
                                           "to re-time its winners")
        return True

    def _start_events(self, run: RunContext, studies: list[Study]) -> None:
        budgets: dict[str, int] = {}
        for s in studies:
            budgets[s.block.id] = budgets.get(s.block.id, 0) + s.budget
        self.progress.event("start", job=self.job.name, device=run.device_name, dtype=run.dtype_name,
                            strategy=self.job.strategy.name, budgets=budgets,
                            resumed={s.name: s.spent for s in studies if s.spent},
                            lead=self.lock is not None)
        for s in studies:
            for _ in range(s.spent):
                self.progress.event("evaluated", block=s.block.id, status="resumed", speedup=None)

    def _finish(self, run: RunContext, outcome: SearchOutcome, clock: "JobClock") -> None:
        """The end of this worker's search: the lead (or, the lead dead, whoever takes its lock)
        confirms the winners once every claim is settled; the others leave that to it."""
        if self.lock is None:
            self._take_lead()
        if self.lock is None:
            self.progress.event("end", message=f"done: {outcome.evaluations} evaluations, {outcome.duplicates} "
                                               "duplicates answered from the store; the lead worker confirms")
            return
        outcome.winners = confirm(run, deadline=clock.end)
        run.ledger.mark_finished()
        self.progress.event("end", message=f"done: {outcome.evaluations} evaluations, {outcome.duplicates} "
                                           "duplicates answered from the store")
