"""What the live and the replaying generator share: taking in answers, recording every attempt
in the store's LLM log, settling answers with the search's verdicts (a failure may earn a repair
turn), and the summary.

Every attempt is stored in ``kf_llm_calls`` with the search's evaluation count at the moment its
response was taken in (``tick``), so a replay can hand the same answers over at the same ticks.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from kernelforge.llm_spec import LLMSpec
from kernelforge.llm.client import Attempt, Exchange
from kernelforge.llm.context import REPAIRABLE, PromptContext
from kernelforge.llm.parse import Parsed, parse_answer
from kernelforge.redact import redact_url
from kernelforge.search.proposer import Outcome, Proposal, ProposalKind
from kernelforge.textsafe import LINE, cut

if TYPE_CHECKING:
    from kernelforge.template import Template


@dataclass
class Response:
    """One answer of the model, taken in.

    ``kind`` is ``template`` or ``points`` (handed to the search as a
    :class:`~kernelforge.search.proposer.Proposal`, which settles it later), or a failure settled
    at once (``no_code``, a request's final status, ...): the text stored as its kind. ``parent`` is
    the candidate the model was asked to improve on (the failed candidate for a repair);
    ``messages`` and ``answer`` are the conversation, for a repair turn. ``parent_text`` is the
    template text the answer could edit (None: none was offered); ``edit`` the unified diff of it
    to the new template when the answer was a diff edit that applied. ``model``: the index of the
    job's model that wrote it (its repairs go to the same model; None: not known, e.g. a replay).
    """

    seq: int
    block_id: str
    kind: str
    purpose: str
    parent: str | None
    depth: int
    message: str = ""
    template: "Template | None" = None
    target: str | None = None
    points: list[dict[str, Any]] = field(default_factory=list)
    row_id: int | None = None
    messages: list[dict[str, str]] = field(default_factory=list)
    answer: str = ""
    settled: bool = False
    parent_text: str | None = None
    edit: str = ""
    model: int | None = None

    @property
    def proposal(self) -> Proposal:
        """What the search acts on (only for ``template`` and ``points`` answers)."""
        return Proposal(self.seq, self.block_id, ProposalKind(self.kind), self.parent, template=self.template,
                        target=self.target, points=tuple(self.points))


class BaseGenerator:
    """What the live and the replaying generator share: recording, settling, the summary."""

    def __init__(self, spec: LLMSpec, *, job_name: str, store, progress, context: PromptContext, record: bool = True):
        self.spec = spec
        self.job_name = job_name
        self.store = store
        self.progress = progress
        self.context = context
        self.record = record
        usage = store.llm_usage(job_name)
        self.run = usage.last_run + 1
        self._seq = usage.last_seq
        self.stopped: str | None = None
        self.kinds: Counter[str] = Counter()
        self.requests = 0
        self.attempts = 0
        self.tokens = 0
        # Every template this generator parsed, by id: a repair's parent may be a candidate of a
        # template the search did not keep (the policy rejected it), and its text is still the
        # one to edit.
        self._texts: dict[str, str] = {}

    # -- the search's side ---------------------------------------------------------------------

    def pump(self) -> None:
        """Start what can be started (live: new requests)."""

    def poll(self) -> list[Response]:
        """Answers taken in since the last poll that the search must act on (templates, points)."""
        raise NotImplementedError

    def wait(self, timeout: float) -> None:
        """Block until something may be ready (at most ``timeout`` seconds)."""

    @property
    def busy(self) -> bool:
        """Something is coming (a request in flight, a stored response not yet handed over)."""
        return False

    def can_submit(self) -> bool:
        """Whether :meth:`pump` would start a request now."""
        return False

    def settle(self, proposal: Response, kind: str, message: str = "", *, template_id: str | None = None,
               candidate_id: str | None = None, point: dict[str, Any] | None = None) -> None:
        """What the search made of an answer (``kind``: an :class:`Outcome` value): stored with the
        response; a failure may earn a repair. Only the first verdict counts (per-shape tuning
        evaluates a template once per shape)."""
        if proposal.settled:
            return
        proposal.settled = True
        self.kinds[kind] += 1
        if proposal.row_id is not None and self.record:
            self.store.set_llm_outcome(proposal.row_id, kind, message, template_id=template_id,
                                       candidate_id=candidate_id)
        self.progress.event("llm_result", block=proposal.block_id, seq=proposal.seq, outcome=kind,
                            template=template_id, candidate=candidate_id, message=cut(message, LINE))
        if kind in REPAIRABLE:
            self._repair(proposal, kind, message, template_id, candidate_id, point)

    def _repair(self, proposal: Response, kind: str, message: str, template_id: str | None,
                candidate_id: str | None, point: dict[str, Any] | None) -> None:
        """Queue a repair turn (live only)."""

    def summary(self) -> dict[str, Any]:
        return {"requests": self.requests, "attempts": self.attempts, "tokens": self.tokens,
                "kinds": dict(self.kinds), "stopped": self.stopped or ""}

    def stop(self, reason: str, *, failure: bool = True) -> None:
        if self.stopped is None:
            self.stopped = reason
            if failure:
                self.progress.event("warning", message=f"LLM generator stopped: {reason}; the search goes on "
                                                       "without it")
            else:
                self.progress.event("llm_stopped", message=reason)

    def close(self) -> None:
        pass

    # -- shared mechanics ----------------------------------------------------------------------

    def edit_text(self, candidate_id: str | None) -> str | None:
        """The template text a request whose parent is ``candidate_id`` offers for a diff edit:
        the text of that candidate's template. A repair's parent is the candidate of the failed
        answer when it made one, so the model edits its own attempt; else the original parent.
        Only stored data decides it, so a replay offers the same text. None when unknown."""
        stored = self.store.candidate(candidate_id) if candidate_id else None
        if stored is not None and stored.template in self._texts:
            return self._texts[stored.template]
        return self.context.parent_text(candidate_id)

    def _take_in(self, block_id: str, purpose: str, parent: str | None, depth: int, exchange: Exchange,
                 *, replayed_from: str | None = None, messages: list[dict[str, str]] | None = None,
                 parent_text: str | None = None, model: int | None = None) -> Response:
        """Record a finished request and turn its answer into a response; a diff edit in the
        answer applies to ``parent_text`` (the template text the request offered for editing)."""
        self._seq += 1
        self.requests += 1
        self.attempts += len(exchange.attempts)
        self.tokens += exchange.tokens
        final = exchange.final
        parsed: Parsed | None = None
        if exchange.ok:
            parsed = parse_answer(exchange.text, block_id, finish_reason=final.finish_reason,
                                  where=f"LLM answer #{self._seq}", parent_text=parent_text)
            kind, message = str(parsed.kind), parsed.message
            if parsed.template is not None:
                self._texts[parsed.template.id] = parsed.template.text
        else:
            kind = final.status if final else "error"
            message = (final.error if final else None) or exchange.fatal or "no answer"
        settled_now = kind not in (Outcome.TEMPLATE, Outcome.POINTS)
        row_id = None
        if self.record:
            rows = [self._row(block_id, purpose, parent, depth, exchange, a, i == len(exchange.attempts) - 1,
                              replayed_from) for i, a in enumerate(exchange.attempts)]
            if rows:
                rows[-1]["kind"] = kind if settled_now else None
                rows[-1]["message"] = message if settled_now else None
                if parsed is not None and parsed.template is not None:
                    rows[-1]["template_id"] = parsed.template.id
                row_id = self.store.add_llm_calls(rows)[-1]
        proposal = Response(self._seq, block_id, kind, purpose, parent, depth, message,
                            template=parsed.template if parsed else None, target=parsed.target if parsed else None,
                            points=parsed.points if parsed else [], row_id=row_id, messages=list(messages or []),
                            answer=exchange.text, parent_text=parent_text, edit=parsed.edit if parsed else "",
                            model=model)
        self.progress.event("llm", block=block_id, seq=self._seq, purpose=purpose, outcome=kind,
                            attempts=[a.status for a in exchange.attempts], tokens=exchange.tokens,
                            latency_s=round(sum(a.latency_s for a in exchange.attempts), 3),
                            template=parsed.template.id if parsed and parsed.template else None,
                            edit=bool(parsed and parsed.edit),
                            message=cut(message, LINE) if settled_now else "")
        if settled_now:
            self.kinds[kind] += 1
            if kind in REPAIRABLE:
                self._repair(proposal, kind, message, None, None, None)
        return proposal

    def _row(self, block_id: str, purpose: str, parent: str | None, depth: int, exchange: Exchange,
             attempt: Attempt, final: bool, replayed_from: str | None) -> dict[str, Any]:
        return {
            "job": self.job_name, "run": self.run, "seq": self._seq, "attempt": attempt.attempt, "final": final,
            "block": block_id, "purpose": purpose, "parent": parent, "depth": depth,
            "model": str(exchange.params.get("model", "")), "base_url": redact_url(exchange.base_url or self._base_url()),
            "request": exchange.request_json(), "request_hash": exchange.request_hash(), "response": attempt.text,
            "finish_reason": attempt.finish_reason, "status": attempt.status, "http_status": attempt.http_status,
            "error": attempt.error, "prompt_tokens": attempt.prompt_tokens,
            "completion_tokens": attempt.completion_tokens, "latency_s": attempt.latency_s,
            "tick": self.context.tick, "replayed_from": replayed_from,
        }

    def _base_url(self) -> str:
        return self.spec.base_url
