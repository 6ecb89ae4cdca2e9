"""The replaying generator: hands back the answers stored in a job database instead of asking an
endpoint, each at the tick it was taken in originally, in the same order, with the same parents,
so a replayed search (``--llm replay``) makes the same decisions offline: the same templates, the
same Optuna points, the same candidates. A diff edit is applied again to the same text the live
run offered it: the template text of the stored call's parent candidate
(:meth:`~kernelforge.llm.base.BaseGenerator.edit_text`).
"""

from __future__ import annotations

import json
from collections import deque

from kernelforge.llm_spec import LLMSpec
from kernelforge.llm.advisor import PURPOSE as ADVISER_PURPOSE
from kernelforge.llm.base import BaseGenerator, Response
from kernelforge.llm.client import Attempt, Exchange
from kernelforge.llm.context import PromptContext
from kernelforge.redact import redact_url
from kernelforge.search.proposer import Outcome
from kernelforge.store.records import LLMCall


class ReplayGenerator(BaseGenerator):
    """Serves the responses stored in ``source`` (another job database, or this one) instead of
    asking an endpoint: each at the tick it was taken in originally, with its original parent.

    When the replayed search diverges (a response's tick is never reached because the search ran
    out of work earlier), the next response is handed over when the search would otherwise wait.
    """

    def __init__(self, spec: LLMSpec, *, job_name: str, store, progress, context: PromptContext, source):
        same = source is store or getattr(source, "url", None) == store.url
        super().__init__(spec, job_name=job_name, store=store, progress=progress, context=context, record=not same)
        self._source = None if same else source
        self.source_url = redact_url(source.url)
        calls = source.llm_calls(job_name)
        if not calls:
            jobs = sorted({c.job for c in source.llm_calls()})
            if len(jobs) == 1:
                calls = source.llm_calls(jobs[0])
        # The point adviser's requests are its own to replay (kernelforge.llm.advisor).
        calls = [c for c in calls if c.purpose != ADVISER_PURPOSE]
        # One replayed request per original request, in the order they were taken in.
        grouped: dict[tuple[int, int], list[LLMCall]] = {}
        for row in calls:
            grouped.setdefault((row.run, row.seq), []).append(row)
        self._queue = deque(sorted(grouped.values(), key=lambda rows: (rows[0].run, rows[0].seq)))
        self._release_next = False
        if not self._queue:
            self.stop(f"--llm replay: {self.source_url} holds no LLM transcripts for job {job_name!r}")

    def poll(self) -> list[Response]:
        proposals = []
        while self._queue:
            rows = self._queue[0]
            if rows[-1].tick > self.context.tick and not self._release_next:
                break
            self._queue.popleft()
            self._release_next = False
            proposal = self._take_in(rows[-1].block, rows[-1].purpose, rows[-1].parent, rows[-1].depth,
                                     _exchange(rows), replayed_from=self.source_url,
                                     parent_text=self.edit_text(rows[-1].parent))
            if proposal.kind in (Outcome.TEMPLATE, Outcome.POINTS):
                proposals.append(proposal)
        if not self._queue and self.stopped is None:
            self.stop("every stored response was replayed", failure=False)
        return proposals

    def edit_text(self, candidate_id: str | None) -> str | None:
        # A replay that diverged may lack the parent candidate: the source database has it.
        text = super().edit_text(candidate_id)
        if text is None and candidate_id and self._source is not None:
            stored = self._source.candidate(candidate_id)
            if stored is not None:
                text = self._texts.get(stored.template) or next(
                    (t.text for t in self._source.templates(stored.block) if t.id == stored.template), None)
        return text

    def wait(self, timeout: float) -> None:
        # Nothing to wait for offline: the search is idle, so hand over the next response now.
        self._release_next = bool(self._queue)

    @property
    def busy(self) -> bool:
        return bool(self._queue)

    def _base_url(self) -> str:
        return f"replay of {self.source_url}"

    def close(self) -> None:
        if self._source is not None:
            self._source.close()


def _exchange(rows: list[LLMCall]) -> Exchange:
    """The exchange one stored request had: its request and every attempt's answer."""
    request = json.loads(rows[-1].request)
    messages = request.pop("messages", [])
    attempts = [Attempt(r.attempt, r.status, r.latency_s or 0.0, text=r.response,
                        finish_reason=r.finish_reason, prompt_tokens=r.prompt_tokens,
                        completion_tokens=r.completion_tokens, http_status=r.http_status, error=r.error)
                for r in rows]
    return Exchange(messages, request, attempts)
