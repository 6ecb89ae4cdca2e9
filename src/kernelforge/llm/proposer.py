"""The LLM generator behind the search's proposer seam (:class:`kernelforge.search.proposer.Proposer`).

Whoever builds a :class:`~kernelforge.search.search.Search` (the command line, a test) passes the
proposer of :func:`for_job`: the live generator for a job's ``[llm]`` table, the replaying one for
``--llm replay[:PATH]``, none without ``[llm]``. Nothing of the generator is created before the
search starts it (after its baselines), so a job's events come in the same order either way.
"""

from __future__ import annotations

from typing import Any, Sequence

from kernelforge.errors import TemplateError
from kernelforge.job import Job
from kernelforge.llm_spec import LLMSpec
from kernelforge.llm.base import BaseGenerator, Response
from kernelforge.llm.client import ChatClient
from kernelforge.llm.context import PromptContext
from kernelforge.llm.generator import LLMGenerator
from kernelforge.llm.parse import llm_template
from kernelforge.llm.replay import ReplayGenerator
from kernelforge.search.progress import Progress
from kernelforge.search.proposer import Proposal, SearchView, Verdict
from kernelforge.store.store import Store
from kernelforge.template import Template

#: How long an idle search waits for a request in flight before it looks again (seconds).
IDLE_WAIT_S = 0.5


class LLMProposer:
    """Proposes the templates and points of an LLM (live or replayed) to a search."""

    def __init__(self, spec: LLMSpec, *, job_name: str, store: Store, progress: Progress, seed: int = 0,
                 client: ChatClient | None = None):
        self.spec = spec
        self.job_name = job_name
        self.store = store
        self.progress = progress
        self.seed = seed
        self.client = client
        self.generator: BaseGenerator | None = None
        self._responses: dict[int, Response] = {}

    def start(self, view: SearchView) -> None:
        context = PromptContext(view)
        spec = self.spec
        if spec.replay is not None:
            same = spec.replay in ("", self.store.url)
            source = self.store if same else Store(spec.replay, create=False)
            self.generator = ReplayGenerator(spec, job_name=self.job_name, store=self.store, progress=self.progress,
                                             context=context, source=source)
        else:
            self.generator = LLMGenerator(spec, job_name=self.job_name, store=self.store, progress=self.progress,
                                          context=context, client=self.client, seed=self.seed)

    def resumed(self, block_id: str) -> Sequence[tuple[Template, str | None]]:
        found = []
        for row in self.store.templates(block=block_id, job=self.job_name):
            try:
                template = llm_template(row.text, block_id, where=f"stored template {row.id}")
            except TemplateError:
                continue  # stored only after it parsed; a template module changed since: skip it
            found.append((template, row.parent))
        return found

    def poll(self) -> list[Proposal]:
        self.generator.pump()
        proposals = []
        for response in self.generator.poll():
            self._responses[response.seq] = response
            proposals.append(response.proposal)
        return proposals

    def settle(self, proposal: Proposal, verdict: Verdict) -> None:
        point = dict(verdict.point) if verdict.point is not None else None
        self.generator.settle(self._responses[proposal.seq], verdict.outcome.value, verdict.message,
                              template_id=verdict.template_id, candidate_id=verdict.candidate_id, point=point)

    def idle(self) -> bool:
        if self.generator.busy:
            self.generator.wait(IDLE_WAIT_S)
            return True
        return self.generator.can_submit()

    def stop(self, reason: str) -> None:
        self.generator.stop(reason)

    def close(self) -> None:
        if self.generator is not None:
            self.generator.close()

    def summary(self) -> dict[str, Any]:
        return self.generator.summary() if self.generator is not None else {}


def for_job(job: Job, store: Store, progress: Progress, *, client: ChatClient | None = None) -> LLMProposer | None:
    """The proposer of a job: its ``[llm]`` generator (live, or replaying ``[llm] replay``), or None
    without ``[llm]``. ``client`` replaces the endpoint's client (tests)."""
    if job.llm is None:
        return None
    return LLMProposer(job.llm, job_name=job.name, store=store, progress=progress, seed=job.seed, client=client)
