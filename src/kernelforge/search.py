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

from .block import DTYPES, Block, Shape
from .candidate import Candidate
from .catalog import Catalog
from .errors import UserError
from .evaluate import Evaluation, InProcessExecutor
from .job import Job
from .progress import Progress
from .result import Status, Verification
from .store import Store, StoredResult, env_key
from .template import Template

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


def make_device(name: str):
    """The device of a job: ``cuda``, ``interpret`` or ``replay:PATH``."""
    if name.startswith("replay:"):
        from .replay import ReplayDevice

        return ReplayDevice(name.split(":", 1)[1])
    from .device import get_device

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
                 device_name: str | None = None, compile_workers: int = 1, compile_enabled: bool = True):
        self.job = job
        self.catalog = catalog
        self.store = store
        self.progress = progress
        self.dtype_name = job.dtype
        self.dtype = DTYPES[job.dtype]
        self.device = make_device(device_name or job.device)
        self.executor = InProcessExecutor(self.device)
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
        from .strategy import make_strategy

        studies = []
        for spec in self.job.blocks:
            block = self.catalog.block(spec.id)
            shapes = block.shapes(spec.shapes)
            templates = [t for t in self.catalog.templates(spec.id)
                         if not spec.templates or t.id.rpartition("/")[2] in spec.templates]
            groups = [shapes] if self.job.tune == "all-shapes" else [[s] for s in shapes]
            for group in groups:
                budget = self.job.strategy.evaluations
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
                    studies.append(study)
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
        failure = self._compile_failure(candidate, compiled)
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
            from .aot import compile_candidate

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
        if not self.compile_enabled:
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
        outcome = SearchOutcome()
        self.device.prepare()
        self.env = self.device.describe()
        self.env_key = env_key(self.env)
        if self.compile_enabled:
            from .aot import CompilePool, default_target, parse_target

            self.target = self.job.target or default_target()
            parse_target(self.target)  # a bad target is a user error before anything runs
            self.pool = CompilePool(max_workers=self.compile_workers)
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
                from .confirm import confirm

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
        pending: deque[_Pending] = deque()
        turn = [0]
        while True:
            while len(pending) < PREFETCH and (deadline is None or time.time() < deadline):
                study = self._next_study(studies, turn)
                if study is None:
                    break
                point = study.strategy.ask()
                if point is None:
                    study.exhausted = True
                    continue
                is_base = study.template.role == "baseline" and dict(point) == dict(study.template.baseline)
                candidate = Candidate.from_template(study.template, point, origin="baseline" if is_base else
                                                    ("grid" if self.job.strategy.name == "grid" else "optuna"))
                stored = self._stored(candidate, study.shapes)
                if len(stored) == len(study.shapes):
                    # Already measured (the baseline, a resumed search, another template): free.
                    study.strategy.tell(point, _objective(list(stored.values()), self.baseline_results[study.block.id]))
                    outcome.duplicates += 1
                    self.progress.event("duplicate", block=study.block.id, candidate=candidate.id)
                    continue
                study.in_flight += 1
                pending.append(_Pending(study, point, candidate, self._submit_compile(candidate)))
            if not pending:
                if deadline is not None and time.time() >= deadline:
                    outcome.reason = "time budget reached"
                break
            item = pending.popleft()
            study = item.study
            results = self._measure(study.block, item.candidate, study.shapes, item.compiled,
                                    study.template.deterministic)
            study.in_flight -= 1
            study.spent += 1
            outcome.evaluations += 1
            ordered = [results[s.name] for s in study.shapes]
            value = _objective(ordered, self.baseline_results[study.block.id])
            study.strategy.tell(item.point, value)
            failed = next((r for r in ordered if not r.ok), None)
            self.progress.event(
                "evaluated", block=study.block.id, template=study.template.id, candidate=item.candidate.id,
                params=item.point, status=failed.status.value if failed else "ok",
                speedup=(1.0 / value) if value else None, message=failed.message if failed else "",
            )
