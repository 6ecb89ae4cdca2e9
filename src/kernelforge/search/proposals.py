"""What the search does with a proposer's proposals: a new template becomes studies of its own
with budgets from its groups' reserve: its suggested point alone first (one evaluation), then,
once that point is verified correct, the job's strategy over its space (the tuning the reserve
grants then), so a template that fails costs one evaluation; points go into the named template's
studies; every proposal gets its verdict back.

The proposer (:mod:`kernelforge.search.proposer`) runs beside the search; this module is the
search's side of that seam, and :class:`View` is all the proposer sees of the search.
"""

from __future__ import annotations

from typing import Any, Callable, Mapping, Sequence

from kernelforge.block import Block
from kernelforge.candidate import Candidate
from kernelforge.objective import time_ratio
from kernelforge.result import StoredResult
from kernelforge.search.context import RunContext
from kernelforge.search.gate import PolicyUnavailable
from kernelforge.search.pipeline import Pipeline
from kernelforge.search.plan import block_spec, shape_groups, study_name
from kernelforge.search.proposer import Outcome, Proposal, ProposalKind, Proposer, Verdict
from kernelforge.search.reserve import Reserve
from kernelforge.search.study import Study, make_strategy_for
from kernelforge.template import Template


class _RenderError(Exception):
    """A proposed template that does not render at its own suggested point."""


class Proposals:
    """The search's side of one proposer: the proposed templates, their studies, the verdicts."""

    def __init__(self, run: RunContext, pipeline: Pipeline, reserve: Reserve, proposer: Proposer):
        self.run = run
        self.pipeline = pipeline
        self.reserve = reserve
        self.proposer = proposer
        #: Every proposed template of this run by id (resumed ones included).
        self.templates: dict[str, Template] = {}

    # -- studies of proposed templates ---------------------------------------------------------

    def _register(self, template: Template) -> None:
        self.templates[template.id] = template
        self.pipeline.gate.distrust(template.id)

    def resumed_studies(self, block: Block) -> list[Study]:
        """Studies of the templates the proposer wrote in earlier runs of this job."""
        groups = shape_groups(self.run.job, self.run.catalog, block.id)
        studies = []
        for template, parent in self.proposer.resumed(block.id):
            self._register(template)
            root = Candidate.from_template(template, template.baseline)
            first = self.pipeline.stored(root, [s for g in groups for s in g.shapes])
            if any(not r.ok for r in first.values()):
                continue  # its own point failed: nothing to tune
            studies.extend(self.new_studies(block, template, parent=parent, proposal=None, spent_from_store=True))
        return studies

    def new_studies(self, block: Block, template: Template, *, parent: str | None, proposal: Proposal | None,
                    spent_from_store: bool = False) -> list[Study]:
        """Studies of a proposed template, one per shape group, each with a budget from the
        group's reserve: its suggested point alone (tuning is granted by :meth:`observe` once that
        point is verified); a template of an earlier run (``spent_from_store``, its point passed)
        gets its tuning at once, and at least what it already spent."""
        run = self.run
        root = Candidate.from_template(template, template.baseline).id
        created = []
        for group in shape_groups(run.job, run.catalog, block.id):
            spent = 0
            if spent_from_store:
                spent = len(run.store.evaluated(run.job.name, block.id, template.id, group.shape_filter,
                                                run.dtype_name))
            budget = max(self.reserve.verification_budget(block.id, group.scope, verified=spent_from_store), spent)
            if budget <= 0:
                continue
            name = study_name(run.job, template.id, group.scope)
            study = Study(block, template, list(group.shapes), make_strategy_for(run, template, name), name, budget,
                          spent=spent, proposed=True, scope=group.scope, parent=parent, root=root,
                          proposal=proposal, reported=proposal is None)
            self.reserve.track(study)
            created.append(study)
        return created

    # -- acting on proposals -------------------------------------------------------------------

    def settle(self, proposal: Proposal, outcome: Outcome, message: str = "", **about: Any) -> None:
        self.proposer.settle(proposal, Verdict(outcome, message, **about))

    def step(self, studies: list[Study]) -> None:
        """Take in what the proposer has ready and act on each proposal."""
        blocks = {b.id for b in self.run.job.blocks}
        for proposal in self.proposer.poll():
            try:
                if proposal.block_id not in blocks:
                    # A replayed transcript of another job: its block is not searched here.
                    self.settle(proposal, Outcome.SKIPPED, f"block {proposal.block_id} is not in this job")
                elif proposal.kind is ProposalKind.TEMPLATE:
                    self._add_template(proposal, studies)
                else:
                    self._add_points(proposal, studies)
            except _RenderError as exc:  # the template fails to render at its own point
                self.settle(proposal, Outcome.INVALID_TEMPLATE, str(exc), template_id=proposal.template.id)
            except PolicyUnavailable as exc:
                self.settle(proposal, Outcome.REJECTED, str(exc))
                self.proposer.stop(str(exc))

    def _add_template(self, proposal: Proposal, studies: list[Study]) -> None:
        run = self.run
        template = proposal.template
        block = run.catalog.block(proposal.block_id)
        if template.id in self.templates:
            self.settle(proposal, Outcome.DUPLICATE, f"the same template as {template.id}", template_id=template.id)
            return
        try:
            candidate = Candidate.from_template(template, template.baseline, origin="llm", parent=proposal.parent)
        except Exception as exc:  # Jinja expressions can raise anything (a division by zero...)
            raise _RenderError(f"the template does not render at its [baseline] point: "
                               f"{type(exc).__name__}: {exc}") from None
        shapes = block.shapes(block_spec(run.job, block.id).shapes)
        self._register(template)
        failure = self.pipeline.gate.failure(candidate)
        if failure is not None:
            # Stored, with its source, as rejected on every shape: nothing of it ever ran.
            del self.templates[template.id]
            self.pipeline.store_rejected(block, candidate, shapes, failure[1])
            self.settle(proposal, Outcome.POLICY, failure[1], template_id=template.id, candidate_id=candidate.id,
                        point=dict(template.baseline))
            return
        run.store.add_template(template.id, block.id, template.text, origin="llm", parent=proposal.parent,
                               call_seq=proposal.seq, job=run.job.name)
        created = self.new_studies(block, template, parent=proposal.parent, proposal=proposal)
        if not created:
            self.settle(proposal, Outcome.NO_BUDGET, "the block's LLM reserve of evaluations is spent",
                        template_id=template.id)
            return
        studies.extend(created)
        run.progress.event("llm_template", block=block.id, template=template.id, parent=proposal.parent,
                           budget=sum(s.budget for s in created), description=template.description)

    def _add_points(self, proposal: Proposal, studies: list[Study]) -> None:
        targets = [s for s in studies if s.template.id == proposal.target and s.block.id == proposal.block_id]
        if targets and all(s.proposed and not s.reported for s in targets):
            # Its own point is not verified yet: a point paid now would run before the verdict,
            # a second evaluation of a template that may not work.
            self.settle(proposal, Outcome.INVALID_POINTS, f"template {proposal.target} is not verified yet: "
                                                          "propose points for it once its own point passed")
            return
        if not targets:
            known = sorted({s.template.id for s in studies if s.block.id == proposal.block_id})
            self.settle(proposal, Outcome.INVALID_POINTS, f"no template {proposal.target} in this search; it has "
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
            scope_left = self.reserve.left(study.block.id, study.scope)
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
                self.reserve.pay_point(study)
                scope_left -= 1
                enqueued += 1
        message = (f"{enqueued} point(s) enqueued into {template.id}"
                   + (f", {known} already evaluated" if known else "")
                   + ("; no evaluations left in the LLM reserve" if no_budget else "")
                   + (f"; {'; '.join(problems)}" if problems else ""))
        outcome = (Outcome.POINTS if enqueued else Outcome.INVALID_POINTS if problems
                   else Outcome.NO_BUDGET if no_budget else Outcome.DUPLICATE)
        self.settle(proposal, outcome, message, template_id=template.id)

    # -- verdicts --------------------------------------------------------------------------------

    @staticmethod
    def fresh_study(studies: list[Study]) -> Study | None:
        """A proposed template's study that has not evaluated anything yet: it goes first, its
        proposer is waiting for the verdict."""
        return next((s for s in studies if s.proposed and not s.reported and s.open and s.spent + s.in_flight == 0),
                    None)

    def observe(self, study: Study, candidate: Candidate, ordered: list[StoredResult],
                baseline: Mapping[str, StoredResult]) -> None:
        """Tell the proposer how a template it wrote did at its own point. A verified template's
        study is granted its tuning from the reserve (as far as the pool allows); a failed one is
        not tuned (its study closes, having cost its one evaluation)."""
        if not study.proposed or study.reported or candidate.id != study.root:
            return
        study.reported = True
        failed = next((r for r in ordered if not r.ok), None)
        if failed is not None:
            study.exhausted = True
        else:
            granted = self.reserve.grant_tuning(study)
            self.run.progress.event("llm_tuning", block=study.block.id, template=study.template.id,
                                    scope=study.scope, granted=granted)
        if study.proposal is None:
            return
        value = time_ratio(ordered, baseline)
        outcome = Outcome.of(failed.status) if failed else Outcome.OK
        message = failed.message if failed else (f"speedup {1.0 / value:.3f}x (geometric mean)" if value else "ok")
        self.settle(study.proposal, outcome, message, template_id=study.template.id, candidate_id=candidate.id,
                    point=dict(study.template.baseline))


class View:
    """The running search as a proposer sees it (implements
    :class:`~kernelforge.search.proposer.SearchView`)."""

    def __init__(self, run: RunContext, reserve: Reserve, templates: Mapping[str, Template],
                 baselines: Mapping[str, Mapping[str, StoredResult]], tick: Callable[[], int]):
        self._run = run
        self._reserve = reserve
        self._templates = templates
        self._baselines = baselines
        self._tick = tick

    @property
    def run(self) -> RunContext:
        return self._run

    @property
    def tick(self) -> int:
        return self._tick()

    def capacity(self, block_id: str) -> int:
        return self._reserve.capacity(block_id)

    def baseline_results(self, block_id: str) -> Mapping[str, StoredResult]:
        return self._baselines.get(block_id, {})

    def template(self, template_id: str) -> Template | None:
        if template_id in self._templates:
            return self._templates[template_id]
        try:
            return self._run.catalog.template(template_id)
        except Exception:  # a template removed since it was stored: show no source
            return None

    def proposed_templates(self, block_id: str) -> Sequence[str]:
        return [s.template.id for s in self._reserve.studies_of(block_id)]
