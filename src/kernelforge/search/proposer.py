"""The proposer seam: something besides the job's strategy that proposes work while the search
runs (the LLM generator of :mod:`kernelforge.llm` is one), and what it may see of the search.

A proposer hands the search :class:`Proposal` records (a new template, or points for a template
of the search) between evaluations; the search acts on each and tells the proposer its
:class:`Verdict`. The search owns everything it builds from a proposal (studies, budgets from the
reserve, the policy gate); the proposer owns how it proposes. The search never imports a
proposer's package: whoever builds the :class:`~kernelforge.search.search.Search` passes one in.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import Enum
from typing import TYPE_CHECKING, Any, Callable, Mapping, Protocol, Sequence

from kernelforge.result import Status
from kernelforge.template import Template

if TYPE_CHECKING:
    from kernelforge.result import StoredResult
    from kernelforge.search.context import RunContext


class Outcome(str, Enum):
    """What became of one proposal (or one answer of the proposer), as stored in the LLM log
    (``kf_llm_calls.kind``): the text values are part of the stored data and never change.

    The evaluation statuses (:class:`~kernelforge.result.Status`: ok, wrong, compile_error, ...)
    are outcomes too: the verdict on a proposed template is how its own point did.
    """

    # answers before the search sees them
    TEMPLATE = "template"
    POINTS = "points"
    NO_CODE = "no_code"
    TRUNCATED = "truncated"
    INVALID_TEMPLATE = "invalid_template"
    INVALID_POINTS = "invalid_points"
    INVALID_DIFF = "invalid_diff"  # search/replace blocks that do not apply to the parent's template
    # the search's verdicts on a proposal
    SKIPPED = "skipped"  # its block is not in this job (a replayed transcript of another job)
    DUPLICATE = "duplicate"  # the same template, or only points already evaluated
    POLICY = "policy"  # the template's code breaks the static policy: stored as rejected, never run
    NO_BUDGET = "no_budget"  # the group's reserve of evaluations is spent
    # how a proposed template's own point did (Status values)
    OK = "ok"
    WRONG = "wrong"
    REJECTED = "rejected"
    COMPILE_ERROR = "compile_error"
    RUNTIME_ERROR = "runtime_error"
    TIMEOUT = "timeout"

    def __str__(self) -> str:
        return self.value

    @classmethod
    def of(cls, status: Status) -> "Outcome":
        """The outcome of an evaluation status."""
        return cls(status.value)


class ProposalKind(str, Enum):
    TEMPLATE = "template"  # a new template of the block (its own baseline point first)
    POINTS = "points"  # points for a template the search already has

    def __str__(self) -> str:
        return self.value


@dataclass(frozen=True)
class Proposal:
    """One proposal for the search to act on.

    ``seq`` identifies it within the proposer (stored with the template it made); ``parent`` is
    the candidate it was proposed from. A template proposal carries ``template``; a points
    proposal ``target`` (a template id) and ``points`` (parameters left out keep the target's
    suggested values).
    """

    seq: int
    block_id: str
    kind: ProposalKind
    parent: str | None
    template: Template | None = None
    target: str | None = None
    points: tuple[Mapping[str, Any], ...] = field(default_factory=tuple)


@dataclass(frozen=True)
class Verdict:
    """What the search made of a proposal: its outcome and why, with the template and candidate
    concerned and the point evaluated (for a repair turn)."""

    outcome: Outcome
    message: str = ""
    template_id: str | None = None
    candidate_id: str | None = None
    point: Mapping[str, Any] | None = None


class SearchView(Protocol):
    """What a proposer may read of the running search (everything else it reads from the store).

    ``run`` is the run's fixed context; the rest changes as the search goes on.
    """

    @property
    def run(self) -> "RunContext": ...

    @property
    def tick(self) -> int:
        """Evaluations measured so far in this run (a replay hands answers over at the same tick)."""
        ...

    def capacity(self, block_id: str) -> int:
        """How many more proposed templates of ``block_id`` could be evaluated now (ask no more)."""
        ...

    def baseline_results(self, block_id: str) -> Mapping[str, "StoredResult"]:
        """The baseline's results on the block's shapes (shape name -> result)."""
        ...

    def template(self, template_id: str) -> Template | None:
        """A template of the search (proposed or human) by id; None when it is unknown."""
        ...

    def proposed_templates(self, block_id: str) -> Sequence[str]:
        """Ids of the proposed templates of ``block_id`` the search is tuning, in order."""
        ...


class Proposer(Protocol):
    """Proposes templates and points while the search runs.

    Contract: :meth:`start` is called once, after the baselines are measured, before any other
    call. :meth:`poll` is called between evaluations and must not block; it starts what can be
    started and returns the proposals the search must act on. :meth:`settle` is called once per
    proposal with the search's verdict (later verdicts on the same proposal are ignored). When
    the search has nothing to evaluate it calls :meth:`idle`. :meth:`stop` ends proposing for good
    (the search cannot take what it proposes); :meth:`close` releases threads and connections and
    is called exactly once at the end, then :meth:`summary`.
    """

    def start(self, view: SearchView) -> None: ...

    def resumed(self, block_id: str) -> Sequence[tuple[Template, str | None]]:
        """Templates this proposer wrote for the job in earlier runs, with their parents (the
        search rebuilds their studies before :meth:`start`)."""
        ...

    def poll(self) -> list[Proposal]: ...

    def settle(self, proposal: Proposal, verdict: Verdict) -> None: ...

    def idle(self) -> bool:
        """The search is idle: wait a little if something is coming. True: something may still
        come (keep looping); False: nothing more will come until the search changes (then the
        unused reserve goes back to the human templates)."""
        ...

    def stop(self, reason: str) -> None: ...

    def close(self) -> None: ...

    def summary(self) -> dict[str, Any]:
        """What it did, for the closing line (requests, attempts, tokens, kinds, stopped)."""
        ...


#: The point adviser of one study (``[llm] guide_points``), built by whoever wires the run (the LLM's
#: :func:`kernelforge.llm.advisor.advice_for`): given the run, the study's template and shapes, the
#: points to ask first, as a callable the guided strategy calls, or None (no advice for that study).
#: A seam like :class:`Proposer`: the search never imports the package that advises.
AdvisorFactory = Callable[..., Any]
