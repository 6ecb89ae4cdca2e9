"""The search: job -> strategies propose -> render -> compile (CPU pool) -> verify and time (device)
-> store -> strategies read the results -> ... -> confirm the best against the baseline.

One study per template (``tune = "all-shapes"``: one configuration for every shape of the block,
objective the geometric-mean time ratio to the baseline) or per template and shape
(``tune = "per-shape"``, as vLLM tunes per token count). A block's evaluation budget is shared by
its templates' studies in turn. Compilation of the next candidates runs in a process pool while the
device verifies and times the current one, so the device does not wait on the compiler.

Everything goes through the store: a candidate already measured in the same conditions is never
measured again (its stored result answers), so a rerun of a killed search continues where it
stopped, and a result is stored the moment it exists (SIGKILL loses only the candidate in flight).
"""

from __future__ import annotations

import math
import time
from collections import deque
from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import Any

from kernelforge.block import DTYPES, Block, Shape
from kernelforge.candidate import Candidate
from kernelforge.catalog import Catalog
from kernelforge.errors import UserError
from kernelforge.execute.evaluate import InProcessExecutor
from kernelforge.result import Evaluation
from kernelforge.job import Job
from kernelforge.search.progress import Progress
from kernelforge.result import Status, Verification
from kernelforge.store.store import Store, StoredResult, env_key
from kernelforge.template import Template

#: How many candidates are compiled ahead of the one on the device.
PREFETCH = 2


@dataclass
class Study:
    """One strategy over one template's space (and one shape in per-shape mode)."""

    block: Block
    template: Template
    shapes: list[Shape]
    strategy: Any
    name: str
    budget: int
    spent: int = 0
    in_flight: int = 0
    exhausted: bool = False
    #: LLM generator: ``llm`` marks a template the LLM wrote; ``parent`` is the candidate it was
    #: written from, ``root`` the id of its first candidate (the LLM's suggested point, origin
    #: "llm"; Optuna's points of it are its children); ``proposal`` is the response that made it
    #: (None when rebuilt on resume). ``queued``: points the LLM proposed for this study, with the
    #: candidate they were proposed from; ``queue``: those points for strategies without enqueue.
    llm: bool = False
    scope: str = "all"
    parent: str | None = None
    root: str | None = None
    proposal: Any = None
    reported: bool = True
    queued: dict = field(default_factory=dict)
    queue: deque = field(default_factory=deque)

    @property
    def open(self) -> bool:
        return not self.exhausted and self.spent + self.in_flight < self.budget


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
    winners: dict[str, list[dict[str, Any]]] = field(default_factory=dict)
    llm: dict[str, Any] = field(default_factory=dict)  # the LLM generator's summary, when it ran


class _RenderError(Exception):
    """A generated template that does not render at its own suggested point."""


def make_device(name: str):
    """The device of a job: ``cuda``, ``interpret`` or ``replay:PATH``."""
    if name.startswith("replay:"):
        from kernelforge.execute.replay import ReplayDevice

        return ReplayDevice(name.split(":", 1)[1])
    from kernelforge.devices.device import get_device

    return get_device(name)


def _objective(results: list[StoredResult], baseline: dict[str, StoredResult]) -> float | None:
    """Geometric mean of candidate/baseline median time over the study's shapes (lower is
    better; 1/objective is the speedup). None when any shape failed."""
    logs = []
    for r in results:
        base = baseline.get(r.shape)
        if not r.ok or r.median_s is None or base is None or base.median_s is None:
            return None
        logs.append(math.log(r.median_s / base.median_s))
    return math.exp(sum(logs) / len(logs)) if logs else None


class Search:
    """Runs one job against one store. Construct, then :meth:`run`."""

    def __init__(self, job: Job, catalog: Catalog, store: Store, progress: Progress, *,
                 device_name: str | None = None, compile_workers: int = 1, compile_enabled: bool = True,
                 in_process: bool = False):
        self.job = job
        self.catalog = catalog
        self.store = store
        self.progress = progress
        self.dtype_name = job.dtype
        self.dtype = DTYPES[job.dtype]
        self.device = make_device(device_name or job.device)
        # Candidates run in a worker process (crash, hang and memory isolation, no secrets:
        # kernelforge.execute.worker); ``in_process`` (CLI --in-process) is for debugging trusted templates.
        # A replay device runs nothing.
        if in_process or self.device.name == "replay":
            self.executor = InProcessExecutor(self.device)
        else:
            from kernelforge.execute.worker import WorkerExecutor

            llm = getattr(job, "llm", None)
            secrets = tuple(filter(None, [getattr(llm, "api_key_env", None)]))
            self.executor = WorkerExecutor(self.device, extra_secrets=secrets)
        self.lock = None
        self.compile_enabled = compile_enabled and self.device.name != "replay"
        self.compile_workers = compile_workers
        self.target: str | None = None
        self.env: dict[str, Any] = {}
        self.env_key = ""
        self.baselines: dict[str, Candidate] = {}
        self.baseline_results: dict[str, dict[str, StoredResult]] = {}
        self.pool = None
        self.deadline: float | None = None

    # -- set-up --------------------------------------------------------------------------------

    def _studies(self) -> list[Study]:
        from kernelforge.strategies.strategy import make_strategy

        self._llm_init()
        studies = []
        for spec in self.job.blocks:
            block = self.catalog.block(spec.id)
            shapes = block.shapes(spec.shapes)
            templates = [t for t in self.catalog.templates(spec.id)
                         if not spec.templates or t.id.rpartition("/")[2] in spec.templates]
            groups = [shapes] if self.job.tune == "all-shapes" else [[s] for s in shapes]
            for group in groups:
                # With [llm], a share of the block's evaluations is kept for what the LLM writes.
                reserve = self._llm_reserve()
                self._llm_pools[(block.id, "all" if self.job.tune == "all-shapes" else group[0].name)] = reserve
                budget = self.job.strategy.evaluations - reserve
                shares = [budget // len(templates) + (i < budget % len(templates)) for i in range(len(templates))]
                for template, share in zip(templates, shares):
                    if share == 0:
                        continue
                    scope = "all" if self.job.tune == "all-shapes" else group[0].name
                    name = f"{self.job.name}|{template.id}|{scope}|{self.dtype_name}"
                    strategy = make_strategy(
                        self.job.strategy.name, template.space, seed=self.job.seed, baseline=template.baseline,
                        storage=self.store.url if self.job.strategy.name not in ("grid", "random") else None,
                        study_name=name,
                    )
                    study = Study(block, template, group, strategy, name, share)
                    shape = group[0].name if len(group) == 1 and self.job.tune == "per-shape" else None
                    study.spent = len(self.store.evaluated(self.job.name, block.id, template.id, shape, self.dtype_name)
                                      - {self._baseline_candidate(block).id})
                    study.scope = scope
                    studies.append(study)
            studies.extend(self._llm_resumed_studies(block, groups))
        return studies

    def _baseline_candidate(self, block: Block) -> Candidate:
        if block.id not in self.baselines:
            self.baselines[block.id] = Candidate.from_template(self.catalog.baseline(block.id), origin="baseline")
        return self.baselines[block.id]

    # -- evaluation ----------------------------------------------------------------------------

    def _stored(self, candidate: Candidate, shapes: list[Shape]) -> dict[str, StoredResult]:
        found = {}
        for shape in shapes:
            row = self.store.find_result(candidate.id, shape.name, self.dtype_name, self.env_key)
            if row is not None:
                found[shape.name] = row
        return found

    def _measure(self, block: Block, candidate: Candidate, shapes: list[Shape],
                 compiled: Future | None, deterministic: bool) -> dict[str, StoredResult]:
        """Results of ``candidate`` on ``shapes``: stored ones, else compile/verify/time and store."""
        self.store.add_candidate(candidate, self.job.name)
        results = self._stored(candidate, shapes)
        missing = [s for s in shapes if s.name not in results]
        if not missing:
            return results
        evaluations: list[Evaluation]
        # LLM-written code passes the static policy check before anything of it runs.
        failure = self._policy_failure(candidate) or self._compile_failure(candidate, compiled)
        if failure is not None:
            status, message = failure
            evaluations = [Evaluation(s, Verification(status, message=message), block.counts(s, self.dtype))
                           for s in missing]
        elif self.device.name == "replay":
            evaluations = self.device.evaluate(block, candidate.id, missing, self.dtype_name)
        else:
            evaluations = self.executor.evaluate(block, candidate.source, missing, self.dtype,
                                                 deterministic=deterministic)
        for ev in evaluations:
            row = self._row(candidate, ev)
            self.store.add_result(row)
            results[ev.shape.name] = row
        return results

    def _compile_failure(self, candidate: Candidate, compiled: Future | None) -> tuple[Status, str] | None:
        if compiled is None:
            return None
        try:
            report = compiled.result()
        except Exception:
            # A crashed pool worker fails every pending future, not only the culprit's: compile
            # this candidate again alone, in its own process, so the verdict is its own.
            from kernelforge.compile.aot import compile_candidate

            report = compile_candidate(candidate.source, candidate.block_id, self.catalog.root,
                                       self.dtype_name, self.target)
        from dataclasses import asdict

        self.store.add_compile(candidate.id, report.target, self.dtype_name, report.status, report.message,
                               [asdict(k) for k in report.kernels])
        if report.status == "ok":
            return None
        return Status(report.status), f"{report.target}: {report.message}"

    def _row(self, candidate: Candidate, ev: Evaluation) -> StoredResult:
        t, v = ev.timing, ev.verification
        return StoredResult(
            candidate_id=candidate.id, block=candidate.block_id, shape=ev.shape.name, dtype=self.dtype_name,
            device=str(self.env.get("device_name", self.device.name)), env_key=self.env_key, status=v.status,
            rel_error=v.rel_error, median_s=t.median_s if t else None, p20_s=t.p20_s if t else None,
            p80_s=t.p80_s if t else None, samples=t.samples if t else None, timing_method=t.method if t else None,
            timing_label=t.label if t else None, joules=t.joules_per_call if t else None,
            flops=ev.counts.flops, bytes=ev.counts.bytes, message=v.message, env=self.env, job=self.job.name,
            created=time.time(), excess=v.excess,
        )

    # -- the loop ------------------------------------------------------------------------------

    def _submit_compile(self, candidate: Candidate) -> Future | None:
        if not self.compile_enabled or self._policy_failure(candidate) is not None:
            return None
        return self.pool.submit(candidate.source, candidate.block_id, self.catalog.root, self.dtype_name, self.target)

    def _baselines(self) -> None:
        for spec in self.job.blocks:
            block = self.catalog.block(spec.id)
            shapes = block.shapes(spec.shapes)
            candidate = self._baseline_candidate(block)
            template = self.catalog.baseline(block.id)
            results = self._measure(block, candidate, shapes, self._submit_compile(candidate), template.deterministic)
            failed = [r for r in results.values() if not r.ok]
            if failed:
                raise UserError(
                    f"the human baseline of {block.id} failed on {failed[0].shape} ({failed[0].status.value}: "
                    f"{failed[0].message}); a search needs a working baseline: fix it first "
                    f"(`kernelforge check {block.id}`)"
                )
            self.baseline_results[block.id] = results
            self.progress.event("baseline", block=block.id, candidate=candidate.id,
                                times={k: r.median_s for k, r in results.items()})

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
        self.device.prepare()
        self.env = self.device.describe()
        self.env_key = env_key(self.env)
        if self.compile_enabled:
            from kernelforge.compile.aot import default_target, parse_target
            from kernelforge.execute.worker import SandboxedCompilePool

            self.target = self.job.target or default_target()
            parse_target(self.target)  # a bad target is a user error before anything runs
            # Compiling runs the candidate's host code: the same policy, secrets and limits apply.
            self.pool = SandboxedCompilePool(max_workers=self.compile_workers)
        # A wall-clock cap covers the whole job: proposals stop at 80% of it so the confirmation
        # re-timing still fits (it also stops at the cap).
        cap = 60 * self.job.strategy.max_minutes if self.job.strategy.max_minutes else None
        self.deadline = time.time() + cap if cap else None
        deadline = time.time() + 0.8 * cap if cap else None
        try:
            studies = self._studies()
            budgets: dict[str, int] = {}
            for s in studies:
                budgets[s.block.id] = budgets.get(s.block.id, 0) + s.budget
            self.progress.event("start", job=self.job.name, device=self.env.get("device_name", self.device.name),
                                dtype=self.dtype_name, strategy=self.job.strategy.name, budgets=budgets,
                                resumed={s.name: s.spent for s in studies if s.spent})
            for s in studies:
                for _ in range(s.spent):
                    self.progress.event("evaluated", block=s.block.id, status="resumed", speedup=None)
            self._baselines()
            self._loop(studies, outcome, deadline)
            if not outcome.stopped:
                from kernelforge.search.confirm import confirm

                outcome.winners = confirm(self)
            self.progress.event("end", message=f"done: {outcome.evaluations} evaluations, {outcome.duplicates} "
                                               "duplicates answered from the store")
        except KeyboardInterrupt:
            outcome.stopped, outcome.reason = True, "interrupted"
            self.progress.event("stopped", message="interrupted: everything measured is stored; "
                                                   "rerun the same command to continue")
        finally:
            if self.pool is not None:
                self.pool.shutdown(wait=False, cancel_futures=True)
            self.executor.close()
        return outcome

    def _next_study(self, studies: list[Study], turn: list[int]) -> Study | None:
        for _ in range(len(studies)):
            study = studies[turn[0] % len(studies)]
            turn[0] += 1
            if study.open:
                return study
        return None

    def _loop(self, studies: list[Study], outcome: SearchOutcome, deadline: float | None) -> None:
        llm = self._llm_start()
        try:
            self._run_loop(studies, outcome, deadline, llm)
        finally:
            if llm is not None:
                llm.close()
                outcome.llm = llm.summary()

    def _run_loop(self, studies: list[Study], outcome: SearchOutcome, deadline: float | None, llm) -> None:
        pending: deque[_Pending] = deque()
        turn = [0]
        while True:
            if llm is not None:
                self._llm_step(llm, studies)
            while len(pending) < PREFETCH and (deadline is None or time.time() < deadline):
                # A template the LLM just wrote goes first: the generator is waiting for its verdict.
                study = self._fresh_llm_study(studies) or self._next_study(studies, turn)
                if study is None:
                    break
                point = study.queue.popleft() if study.queue else study.strategy.ask()
                if point is None:
                    study.exhausted = True
                    continue
                try:
                    candidate = self._candidate_for(study, point)
                except Exception as exc:
                    if not study.llm:
                        raise  # a human template that fails to render is the user's to fix
                    # An LLM template whose Jinja fails at this point (a runtime error in an
                    # expression): a failed point, like any other failure of its code.
                    study.strategy.tell(point, None)
                    self.progress.event("warning", message=f"{study.template.id} at {point}: cannot render "
                                                           f"({type(exc).__name__}: {exc})")
                    continue
                stored = self._stored(candidate, study.shapes)
                if len(stored) == len(study.shapes):
                    # Already measured (the baseline, a resumed search, another template): free.
                    study.strategy.tell(point, _objective(list(stored.values()), self.baseline_results[study.block.id]))
                    self._llm_observe(llm, study, candidate, [stored[s.name] for s in study.shapes])
                    outcome.duplicates += 1
                    self.progress.event("duplicate", block=study.block.id, candidate=candidate.id)
                    continue
                study.in_flight += 1
                pending.append(_Pending(study, point, candidate, self._submit_compile(candidate)))
            if not pending:
                if deadline is not None and time.time() >= deadline:
                    outcome.reason = "time budget reached"
                    break
                if llm is not None and self._llm_idle(llm, studies):
                    continue
                break
            item = pending.popleft()
            study = item.study
            results = self._measure(study.block, item.candidate, study.shapes, item.compiled,
                                    study.template.deterministic)
            study.in_flight -= 1
            study.spent += 1
            outcome.evaluations += 1
            self._llm_tick += 1
            ordered = [results[s.name] for s in study.shapes]
            value = _objective(ordered, self.baseline_results[study.block.id])
            study.strategy.tell(item.point, value)
            self._llm_observe(llm, study, item.candidate, ordered)
            failed = next((r for r in ordered if not r.ok), None)
            self.progress.event(
                "evaluated", block=study.block.id, template=study.template.id, candidate=item.candidate.id,
                params=item.point, status=failed.status.value if failed else "ok",
                speedup=(1.0 / value) if value else None, message=failed.message if failed else "",
                origin=item.candidate.origin,
            )

    def _candidate_for(self, study: Study, point: dict[str, Any]) -> Candidate:
        """The candidate of a study's point, with its origin and parent."""
        key = tuple(point[name] for name in study.template.space.names)
        if study.llm and dict(point) == dict(study.template.baseline):
            return Candidate.from_template(study.template, point, origin="llm", parent=study.parent)
        if key in study.queued:
            return Candidate.from_template(study.template, point, origin="llm", parent=study.queued.pop(key))
        is_base = study.template.role == "baseline" and dict(point) == dict(study.template.baseline)
        origin = "baseline" if is_base else ("grid" if self.job.strategy.name == "grid" else "optuna")
        return Candidate.from_template(study.template, point, origin=origin, parent=study.root)

    # -- the LLM generator -----------------------------------------------------------------------
    #
    # The generator (kernelforge.llm) runs requests in the background and hands back templates
    # and points between evaluations. A template becomes a Study of its own (its suggested point
    # first, then the job's strategy over its space) with a budget taken from the block's LLM
    # reserve; points go into the named template's study. What the LLM leaves of the reserve goes
    # back to the human templates once it has stopped.

    def _llm_init(self) -> None:
        self._llm_pools: dict[tuple[str, str], int] = {}
        self._llm_points_used: dict[tuple[str, str], int] = {}
        self._llm_templates: dict[str, Template] = {}
        self._llm_all: list[Study] = []
        self._llm_tick = 0
        self._policy_cache: dict[str, str | None] = {}

    def _llm_reserve(self) -> int:
        """Evaluations of each block (and shape, per-shape) kept for the LLM's templates and points."""
        if self.job.llm is None:
            return 0
        return min(self.job.strategy.evaluations, round(self.job.strategy.evaluations * self.job.llm.tune_share))

    def _llm_pool_left(self, block_id: str, scope: str) -> int:
        committed = sum(s.budget if s.open else s.spent + s.in_flight
                        for s in self._llm_all if s.block.id == block_id and s.scope == scope)
        used = committed + self._llm_points_used.get((block_id, scope), 0)
        return self._llm_pools.get((block_id, scope), 0) - used

    def _llm_capacity(self, block_id: str) -> int:
        """How many more LLM templates of ``block_id`` could be evaluated now (the generator asks
        for no more than that)."""
        return max([self._llm_pool_left(b, scope) for b, scope in self._llm_pools if b == block_id], default=0)

    def _llm_studies_of(self, block_id: str) -> list[Study]:
        return [s for s in self._llm_all if s.block.id == block_id]

    def _llm_start(self):
        """The generator of this job (live or replay), or None without ``[llm]``."""
        if self.job.llm is None:
            return None
        from kernelforge.llm.generator import LLMGenerator, ReplayGenerator, SearchContext

        spec = self.job.llm
        context = SearchContext(self)
        if spec.replay is not None:
            source = self.store if spec.replay in ("", self.store.url) else Store(spec.replay, create=False)
            return ReplayGenerator(spec, job_name=self.job.name, store=self.store, progress=self.progress,
                                   context=context, source=source)
        return LLMGenerator(spec, job_name=self.job.name, store=self.store, progress=self.progress,
                            context=context, seed=self.job.seed)

    def _llm_new_studies(self, block: Block, template: Template, *, parent: str | None, proposal: Any,
                         spent_from_store: bool = False) -> list[Study]:
        """Studies of a generated template, one per shape group, each with a budget from the
        group's LLM reserve (its suggested point plus ``tune_evaluations``)."""
        from kernelforge.strategies.strategy import make_strategy

        spec = next(s for s in self.job.blocks if s.id == block.id)
        shapes = block.shapes(spec.shapes)
        groups = [shapes] if self.job.tune == "all-shapes" else [[s] for s in shapes]
        root = Candidate.from_template(template, template.baseline).id
        created = []
        for group in groups:
            scope = "all" if self.job.tune == "all-shapes" else group[0].name
            shape = group[0].name if self.job.tune == "per-shape" else None
            spent = 0
            if spent_from_store:
                spent = len(self.store.evaluated(self.job.name, block.id, template.id, shape, self.dtype_name))
            budget = min(1 + self.job.llm.tune_evaluations, self._llm_pool_left(block.id, scope))
            budget = max(budget, spent)
            if budget <= 0:
                continue
            name = f"{self.job.name}|{template.id}|{scope}|{self.dtype_name}"
            strategy = make_strategy(
                self.job.strategy.name, template.space, seed=self.job.seed, baseline=template.baseline,
                storage=self.store.url if self.job.strategy.name not in ("grid", "random") else None,
                study_name=name,
            )
            study = Study(block, template, group, strategy, name, budget, spent=spent, llm=True, scope=scope,
                          parent=parent, root=root, proposal=proposal, reported=proposal is None)
            self._llm_all.append(study)
            created.append(study)
        return created

    def _llm_resumed_studies(self, block: Block, groups: list[list[Shape]]) -> list[Study]:
        """Studies of the templates the LLM wrote in earlier runs of this job (from kf_templates)."""
        if self.job.llm is None:
            return []
        from kernelforge.errors import TemplateError
        from kernelforge.llm.parse import llm_template

        studies = []
        for row in self.store.templates(block=block.id, job=self.job.name):
            try:
                template = llm_template(row["text"], block.id, where=f"stored template {row['id']}")
            except TemplateError:
                continue  # stored only after it parsed; a template module changed since: skip it
            self._llm_templates[template.id] = template
            root = Candidate.from_template(template, template.baseline)
            first = self._stored(root, [s for g in groups for s in g])
            if any(not r.ok for r in first.values()):
                continue  # its own point failed: nothing to tune
            studies.extend(self._llm_new_studies(block, template, parent=row["parent"], proposal=None,
                                                 spent_from_store=True))
        return studies

    def _fresh_llm_study(self, studies: list[Study]) -> Study | None:
        return next((s for s in studies if s.llm and not s.reported and s.open and s.spent + s.in_flight == 0), None)

    def _policy_failure(self, candidate: Candidate) -> tuple[Status, str] | None:
        """(rejected, why) when LLM-written code breaks the static policy; None otherwise (and for
        human templates, which are trusted)."""
        # LLM-written code is exactly the code of the LLM's templates (a point the LLM proposed
        # for a human template renders human code).
        if candidate.template_id not in getattr(self, "_llm_templates", {}):
            return None
        cache = self.__dict__.setdefault("_policy_cache", {})
        if candidate.id not in cache:
            from kernelforge.llm.generator import policy_problems

            problems = policy_problems(candidate.source)
            cache[candidate.id] = "; ".join(problems) if problems else None
        message = cache[candidate.id]
        return (Status.REJECTED, f"policy: {message}") if message else None

    def _llm_step(self, llm, studies: list[Study]) -> None:
        """Start requests, then act on what came back: new templates and proposed points."""
        from kernelforge.llm.generator import PolicyUnavailable

        llm.pump()
        for proposal in llm.poll():
            try:
                if proposal.block_id not in {b.id for b in self.job.blocks}:
                    # A replayed transcript of another job: its block is not searched here.
                    llm.settle(proposal, "skipped", f"block {proposal.block_id} is not in this job")
                elif proposal.kind == "template":
                    self._llm_add_template(llm, proposal, studies)
                else:
                    self._llm_add_points(llm, proposal, studies)
            except _RenderError as exc:  # the model's template fails to render at its own point
                llm.settle(proposal, "invalid_template", str(exc), template_id=proposal.template.id)
            except PolicyUnavailable as exc:
                llm.settle(proposal, "rejected", str(exc))
                llm.stop(str(exc))

    def _llm_add_template(self, llm, proposal: Any, studies: list[Study]) -> None:
        template = proposal.template
        block = self.catalog.block(proposal.block_id)
        if template.id in self._llm_templates:
            llm.settle(proposal, "duplicate", f"the same template as {template.id}", template_id=template.id)
            return
        try:
            candidate = Candidate.from_template(template, template.baseline, origin="llm", parent=proposal.parent)
        except Exception as exc:  # Jinja expressions can raise anything (a division by zero...)
            raise _RenderError(f"the template does not render at its [baseline] point: "
                               f"{type(exc).__name__}: {exc}") from None
        spec = next(s for s in self.job.blocks if s.id == block.id)
        shapes = block.shapes(spec.shapes)
        self._llm_templates[template.id] = template
        failure = self._policy_failure(candidate)
        if failure is not None:
            # Stored, with its source, as rejected on every shape: nothing of it ever ran.
            del self._llm_templates[template.id]
            self._store_rejected(block, candidate, shapes, failure[1])
            llm.settle(proposal, "policy", failure[1], template_id=template.id, candidate_id=candidate.id,
                       point=dict(template.baseline))
            return
        self.store.add_template(template.id, block.id, template.text, origin="llm", parent=proposal.parent,
                                call_seq=proposal.seq, job=self.job.name)
        created = self._llm_new_studies(block, template, parent=proposal.parent, proposal=proposal)
        if not created:
            llm.settle(proposal, "no_budget", "the block's LLM reserve of evaluations is spent",
                       template_id=template.id)
            return
        studies.extend(created)
        self.progress.event("llm_template", block=block.id, template=template.id, parent=proposal.parent,
                            budget=sum(s.budget for s in created), description=template.description)

    def _store_rejected(self, block: Block, candidate: Candidate, shapes: list[Shape], message: str) -> None:
        self.store.add_candidate(candidate, self.job.name)
        for shape in shapes:
            if self.store.find_result(candidate.id, shape.name, self.dtype_name, self.env_key) is None:
                ev = Evaluation(shape, Verification(Status.REJECTED, message=message), block.counts(shape, self.dtype))
                self.store.add_result(self._row(candidate, ev))

    def _llm_add_points(self, llm, proposal: Any, studies: list[Study]) -> None:
        targets = [s for s in studies if s.template.id == proposal.target and s.block.id == proposal.block_id]
        if not targets:
            known = sorted({s.template.id for s in studies if s.block.id == proposal.block_id})
            llm.settle(proposal, "invalid_points", f"no template {proposal.target} in this search; it has "
                                                   f"{', '.join(known)}")
            return
        template = targets[0].template
        valid, problems, no_budget = [], [], False
        for raw in proposal.points:
            point = {**template.baseline, **raw}  # parameters left out keep their suggested values
            wrong = template.space.problems(point)
            if wrong:
                problems.append(f"{raw}: {'; '.join(wrong)}")
            else:
                valid.append({name: point[name] for name in template.space.names})
        enqueued = known = 0
        for study in targets:
            scope_left = self._llm_pool_left(study.block.id, study.scope)
            for point in valid:
                key = study.strategy.key(point)
                if key in study.strategy.known or key in study.strategy.pending or key in study.queued:
                    known += 1
                    continue
                if scope_left <= 0:
                    no_budget = True
                    continue
                enqueue = getattr(study.strategy, "enqueue", None)
                if enqueue is None:
                    study.queue.append(point)
                elif not enqueue(point):
                    continue
                study.queued[key] = proposal.parent
                study.budget += 1  # paid from the LLM reserve
                study.exhausted = False
                scope_left -= 1
                if not study.llm:  # an LLM study's budget already counts against the reserve
                    self._llm_points_used[(study.block.id, study.scope)] = (
                        self._llm_points_used.get((study.block.id, study.scope), 0) + 1)
                enqueued += 1
        message = (f"{enqueued} point(s) enqueued into {template.id}" + (f", {known} already evaluated" if known else "")
                   + ("; no evaluations left in the LLM reserve" if no_budget else "")
                   + (f"; {'; '.join(problems)}" if problems else ""))
        kind = ("points" if enqueued else "invalid_points" if problems else "no_budget" if no_budget
                else "duplicate")
        llm.settle(proposal, kind, message, template_id=template.id)

    def _llm_observe(self, llm, study: Study, candidate: Candidate, ordered: list[StoredResult]) -> None:
        """Tell the generator how a template it wrote did at its own point; a failed template is
        not tuned (its study closes and its reserve goes back to the pool)."""
        if not study.llm or study.reported or candidate.id != study.root:
            return
        study.reported = True
        failed = next((r for r in ordered if not r.ok), None)
        if failed is not None:
            study.exhausted = True
        if llm is None or study.proposal is None:
            return
        value = _objective(ordered, self.baseline_results[study.block.id])
        kind = failed.status.value if failed else "ok"
        message = failed.message if failed else (f"speedup {1.0 / value:.3f}x (geometric mean)" if value else "ok")
        llm.settle(study.proposal, kind, message, template_id=study.template.id, candidate_id=candidate.id,
                   point=dict(study.template.baseline))

    def _llm_idle(self, llm, studies: list[Study]) -> bool:
        """Nothing to evaluate: wait for the generator if it is working; once it has stopped for
        good, give the unused reserve back to the human templates. True: keep looping."""
        if llm.busy:
            llm.wait(0.5)
            return True
        if llm.can_submit():
            return True
        reopened = False
        for (block_id, scope), pool in list(self._llm_pools.items()):
            if any(s.open for s in self._llm_all if s.block.id == block_id and s.scope == scope):
                continue
            left = self._llm_pool_left(block_id, scope)
            humans = [s for s in studies if not s.llm and s.block.id == block_id and s.scope == scope
                      and not s.exhausted]
            if left <= 0 or not humans:
                continue
            self._llm_pools[(block_id, scope)] = pool - left
            for i in range(left):
                humans[i % len(humans)].budget += 1
            reopened = True
            self.progress.event("llm_reserve", block=block_id, scope=scope, returned=left)
        return reopened
