"""The measuring pipeline of a search: a candidate's results on a shape group, from the store when
it was measured before under the same environment, else compiled ahead of time, verified and
timed by the executor, and stored the moment they exist.

Order of the checks, each ending in stored results (failures are data): the policy gate
(proposed code only; rejected, nothing runs), the ahead-of-time compile (submitted to the compile
pool while the device works on an earlier candidate), then the executor.
"""

from __future__ import annotations

import time
from concurrent.futures import Future
from dataclasses import asdict

from kernelforge.baseline_timing import BaselineSeries
from kernelforge.block import Block, Shape
from kernelforge.candidate import Candidate
from kernelforge.errors import UserError
from kernelforge.execute.timing.rounds import TimingPlan
from kernelforge.targets import parse_target
from kernelforge.result import Evaluation, Status, StoredResult, Verification, resource_rejected
from kernelforge.search.context import RunContext
from kernelforge.search.gate import PolicyGate
from kernelforge.search.retime import BaselineRetimer
from kernelforge.search.shared import shapes_key
from kernelforge.store.ledger import ClaimState

#: How often a worker looks again at a baseline a peer is measuring.
BASELINE_POLL_S = 0.25


class Pipeline:
    """Measures candidates for one run. ``pool`` is the compile pool (None: nothing is compiled
    ahead of time, as with ``--no-compile`` or an executor that runs no code)."""

    def __init__(self, run: RunContext, gate: PolicyGate, pool=None):
        self.run = run
        self.gate = gate
        self.pool = pool
        #: block id -> the timing method of each shape, its baseline's (set by measure_baselines)
        self.plans: dict[str, TimingPlan] = {}
        self.retimer = BaselineRetimer(run)

    def stored(self, candidate: Candidate, shapes: list[Shape]) -> dict[str, StoredResult]:
        """The candidate's results already stored under this run's environment, by shape name."""
        found = {}
        for shape in shapes:
            row = self.run.store.find_result(candidate.id, shape.name, self.run.dtype_name, self.run.env_key)
            if row is not None:
                found[shape.name] = row
        return found

    def infeasible(self, candidate: Candidate, results: list[StoredResult]) -> str | None:
        """Why ``candidate`` cannot run here when its ``results`` are a resource rejection (the
        ahead-of-time compile for this run's target, or for any target when this run compiles
        nothing, rejected it: :func:`kernelforge.result.resource_rejected`): the compile's
        message, e.g. ``sm_90: kernel _matmul needs 393216 bytes of shared memory...``. None when
        they are an evaluation (ok, or a failure of the candidate's own)."""
        if not results or any(r.status is not Status.REJECTED for r in results):
            return None  # the common case, decided without a query
        target = parse_target(self.run.target).name if self.run.target else None
        records = self.run.store.compiles([candidate.id], self.run.dtype_name)
        rejected = next((c for c in records if (target is None or c.target == target)
                         and resource_rejected(c.status, results)), None)
        return f"{rejected.target}: {rejected.message}" if rejected is not None else None

    def submit_compile(self, candidate: Candidate) -> Future | None:
        """Start compiling ``candidate`` ahead of time (None: not compiled, or refused by the gate)."""
        if self.pool is None or self.gate.failure(candidate) is not None:
            return None
        return self.pool.submit(candidate.source, candidate.block_id, self.run.catalog.root, self.run.dtype_name,
                                self.run.target)

    def measure(self, block: Block, candidate: Candidate, shapes: list[Shape],
                compiled: Future | None) -> dict[str, StoredResult]:
        """Results of ``candidate`` on ``shapes``: stored ones, else compile/verify/time and store."""
        self.run.store.add_candidate(candidate, self.run.job.name)
        results = self.stored(candidate, shapes)
        missing = [s for s in shapes if s.name not in results]
        if not missing:
            return results
        evaluations: list[Evaluation]
        # Proposed code passes the static policy check before anything of it runs.
        failure = self.gate.failure(candidate) or self._compile_failure(candidate, compiled)
        if failure is not None:
            status, message = failure
            evaluations = [Evaluation(s, Verification(status, message=message), block.counts(s, self.run.dtype))
                           for s in missing]
        else:
            # The baseline beside the candidates; then the view shows the candidate again.
            if candidate.id not in self.run.baseline_ids(block.id) and self.retimer.before(
                    block, missing, self.plans.get(block.id)):
                self.run.progress.event("measuring", block=block.id, candidate=candidate.id, params=candidate.point)
            evaluations = self.run.executor.evaluate(block, candidate.source, missing, self.run.dtype,
                                                     plan=self.plans.get(block.id))
        for ev in evaluations:
            row = self.row(candidate, ev)
            self.run.store.add_result(row)
            results[ev.shape.name] = row
        return results

    def series(self, block_id: str, baseline: dict[str, StoredResult]) -> BaselineSeries:
        """``baseline`` (shape name -> the baseline's first result) with every stored re-timing of
        it in this run's conditions: what candidates' results are compared with."""
        run = self.run
        return BaselineSeries(baseline, run.store.baseline_timings(block_id, run.dtype_name, run.env_key))

    def store_rejected(self, block: Block, candidate: Candidate, shapes: list[Shape], message: str) -> None:
        """Store ``candidate``, with its source, as rejected on every shape: nothing of it ran."""
        self.run.store.add_candidate(candidate, self.run.job.name)
        for shape in shapes:
            if self.run.store.find_result(candidate.id, shape.name, self.run.dtype_name, self.run.env_key) is None:
                verdict = Verification(Status.REJECTED, message=message)
                ev = Evaluation(shape, verdict, block.counts(shape, self.run.dtype))
                self.run.store.add_result(self.row(candidate, ev))

    def measure_baselines(self) -> dict[str, dict[str, StoredResult]]:
        """Measure (or find) every block's human baselines: each distinct baseline candidate on the
        shapes it is the baseline of. Returns block id -> shape name -> that shape's baseline
        result. A failing baseline is the user's to fix before any search (the error names the
        shape and the baseline's source)."""
        run = self.run
        measured = {}
        for spec in run.job.blocks:
            block = run.catalog.block(spec.id)
            template = run.catalog.baseline(block.id)
            shapes = block.shapes(spec.shapes)
            by_shape = run.baselines[block.id]
            groups: dict[str, list[Shape]] = {}
            for shape in shapes:
                groups.setdefault(by_shape[shape.name].id, []).append(shape)
            measured[block.id] = {}
            for group in groups.values():
                candidate = by_shape[group[0].name]
                source = "; ".join(dict.fromkeys(template.baseline_for(s).source for s in group))
                results = self._measure_baseline(block, candidate, group)
                failed = [results[s.name] for s in group if not results[s.name].ok]
                if failed:
                    raise UserError(
                        f"the human baseline of {block.id} on shape {failed[0].shape} ({source}) failed "
                        f"({failed[0].status.value}: {failed[0].message}); a search needs a working baseline: "
                        f"fix it first (`{run.catalog.command(f'check {block.id}')}`)"
                    )
                measured[block.id].update(results)
                run.progress.event("baseline", block=block.id, candidate=candidate.id, source=source,
                                   params=candidate.point, shapes=[s.name for s in group],
                                   times={k: r.median_s for k, r in results.items()})
            # One timing method per shape: the baseline's, for every candidate measured after it.
            self.plans[block.id] = TimingPlan.of(block.id, run.dtype, ((name, r.timing_method)
                                                                       for name, r in measured[block.id].items()))
        return measured

    def _measure_baseline(self, block: Block, candidate: Candidate, group: list[Shape]) -> dict[str, StoredResult]:
        """A baseline's results on ``group``, measured once among the job's workers: claimed (at no
        cost to any budget) and measured here, or a peer's claim waited for (taken over if it dies)."""
        shapes = shapes_key(group)
        while True:
            stored = self.stored(candidate, group)
            if len(stored) == len(group):
                return stored
            state = self.run.ledger.claim("baselines", candidate.id, shapes, candidate.point, free=True)
            if state in (ClaimState.GRANTED, ClaimState.TAKEN_OVER):
                results = self.measure(block, candidate, group, self.submit_compile(candidate))
                self.run.ledger.finish(candidate.id, shapes)
                return results
            if state is ClaimState.DONE:  # stored by a peer since we looked (or its results are lost)
                stored = self.stored(candidate, group)
                return stored if len(stored) == len(group) else self.measure(block, candidate, group, None)
            time.sleep(BASELINE_POLL_S)  # a peer is measuring it

    def _compile_failure(self, candidate: Candidate, compiled: Future | None) -> tuple[Status, str] | None:
        if compiled is None:
            return None
        try:
            report = compiled.result()
        except Exception:
            # A crashed pool worker fails every pending future, not only the culprit's: compile
            # this candidate again alone, in a process of the pool's own kind (sandboxed for
            # untrusted code), so the verdict is its own.
            report = self.pool.compile_alone(candidate.source, candidate.block_id, self.run.catalog.root,
                                             self.run.dtype_name, self.run.target)
        self.run.store.add_compile(candidate.id, report.target, self.run.dtype_name, str(report.status),
                                   report.message, [asdict(k) for k in report.kernels])
        if report.status == "ok":
            return None
        return Status(report.status), f"{report.target}: {report.message}"

    def row(self, candidate: Candidate, ev: Evaluation) -> StoredResult:
        """The stored form of one evaluation."""
        run = self.run
        return StoredResult.of(candidate.id, candidate.block_id, ev, dtype=run.dtype_name, device=run.device_name,
                               env=dict(run.env), env_key=run.env_key, job=run.job.name)
