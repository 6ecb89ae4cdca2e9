"""A study: one strategy over one template's space for one shape group, with its budget.

Studies of the human templates come from the job's plan (:mod:`kernelforge.search.plan`); a
template a proposer writes gets studies of its own, paid from its group's reserve
(:mod:`kernelforge.search.reserve`).
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Sequence

from kernelforge.block import Block, Shape
from kernelforge.search.energy import objectives
from kernelforge.search.warm import warm_start_points
from kernelforge.strategies.ahead import AskAhead, asks_ahead
from kernelforge.strategies.base import Strategy
from kernelforge.strategies.guided import GuidedStrategy
from kernelforge.strategies.names import STRATEGIES, make_strategy
from kernelforge.template import Template

if TYPE_CHECKING:
    from kernelforge.search.context import RunContext
    from kernelforge.search.proposer import Proposal


@dataclass
class Study:
    """One strategy over one template's space (and one shape in per-shape mode).

    ``budget`` is how many evaluations it may spend (it grows when a proposer's points are
    enqueued or a reserve is given back); ``spent`` counts evaluations done, in this run or stored
    by earlier ones; ``in_flight`` those submitted and not yet measured.

    Proposed templates: ``proposed`` marks a template a proposer wrote; ``parent`` is the candidate
    it was written from, ``root`` the id of its first candidate (the proposer's suggested point,
    origin "llm"; the strategy's points of it are its children); ``proposal`` is the proposal that
    made it (None when rebuilt on resume); ``reported`` says its verdict went back to the proposer.
    ``queued``: points a proposer suggested for this study, with the candidate they were proposed
    from; ``queue``: those points for strategies without ``enqueue``.
    """

    block: Block
    template: Template
    shapes: list[Shape]
    strategy: Strategy
    name: str
    budget: int
    spent: int = 0
    in_flight: int = 0
    exhausted: bool = False
    proposed: bool = False
    scope: str = "all"
    parent: str | None = None
    root: str | None = None
    proposal: "Proposal | None" = None
    reported: bool = True
    queued: dict = field(default_factory=dict)
    queue: deque = field(default_factory=deque)

    @property
    def open(self) -> bool:
        """Whether it may submit another evaluation now."""
        return not self.exhausted and self.spent + self.in_flight < self.budget

    def next_point(self) -> dict[str, Any] | None:
        """A queued proposed point first, else the strategy's next one (None: nothing left)."""
        return self.queue.popleft() if self.queue else self.strategy.ask()


def start_points(template: Template, shapes: Sequence[Shape]) -> list[dict[str, Any]]:
    """The points a study of ``template`` over ``shapes`` asks first: the distinct baseline points
    of its shapes in shape order (:meth:`Template.baseline_for`; a template without
    ``[[baselines]]`` rules, or no shapes: its ``[baseline]`` point)."""
    if not template.baseline_rules or not shapes:
        return [dict(template.baseline)]
    firsts: dict[tuple, dict[str, Any]] = {}
    for shape in shapes:
        point = dict(template.baseline_for(shape).point)
        firsts.setdefault(tuple(point[n] for n in template.space.names), point)
    return list(firsts.values())


def make_strategy_for(run: "RunContext", template: Template, name: str, shapes: Sequence[Shape] = ()) -> Strategy:
    """The job's strategy over ``template``'s space, starting at the baseline points of ``shapes``
    (:func:`start_points`), then, with ``[strategy] warm_start``, at the best stored points of its
    sources (:mod:`kernelforge.search.warm`; a proposed template's studies, made without shapes,
    get none), whose whole ranking a strategy that models it reads (``transfer``); a stateful
    strategy keeps its study, called ``name``, in the job's storage."""
    job = run.job
    stateful = STRATEGIES[job.strategy.name].stateful
    firsts = start_points(template, shapes)
    ranks: dict = {}
    if shapes:
        warm, ranks = warm_start_points(run, template, shapes, firsts)
        firsts += warm
    if run.objective is not job.objective:  # energy not measurable here: never mix with a measured study
        name = f"{name}|as-{run.objective}"
    strategy = make_strategy(job.strategy.name, template.space, seed=job.seed, baseline=firsts,
                             storage=run.store.url if stateful else None, study_name=name,
                             objectives=objectives(run.objective), transfer=ranks or None)
    advice = run.advisor(run, template, shapes) if run.advisor else None  # [llm] guide_points: the LLM's points first
    if advice is not None:
        strategy = GuidedStrategy(strategy, advice)
    # A strategy with a model computes its next ask while the device measures (asks_ahead decides).
    return AskAhead(strategy) if asks_ahead(job.strategy.name) else strategy
