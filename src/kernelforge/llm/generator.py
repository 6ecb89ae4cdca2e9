"""The live LLM generator: a strategy that writes new templates (and proposes points) while the
search evaluates, and learns from what the search stored.

Evolutionary, best-first with diversity: each new request names a parent from the block's archive of
elites (:mod:`kernelforge.llm.archive`: the least-used of the fastest few, or the elite of the
least-used family/behaviour cell), shows the model the
standings, resources and earlier failures, and asks for a faster template. A template that fails
(parse, policy, compile, verification) gets up to ``repair_turns`` follow-up turns in the same
conversation with its error. Requests run on background threads (at most ``concurrency`` in
flight) while the device evaluates; the search polls, between evaluations, for what came back.
:mod:`kernelforge.llm.replay` hands stored answers back instead; :mod:`kernelforge.llm.proposer`
puts either behind the search's proposer seam.
"""

from __future__ import annotations

import time
from collections import deque
from concurrent.futures import FIRST_COMPLETED, Future
from concurrent.futures import wait as wait_futures
from dataclasses import dataclass
from typing import Any

from kernelforge.llm_spec import LLMSpec
from kernelforge.llm.base import BaseGenerator, Response
from kernelforge.llm.client import Attempt, ChatClient, Exchange
from kernelforge.llm.endpoints import EndpointUnusable, WeightedChoice, api_key, headers, make_clients
from kernelforge.llm.archive import ParentPicker, archive_for
from kernelforge.llm.context import PromptContext
from kernelforge.llm.diff import unified_diff
from kernelforge.llm.prompts import capped_answer, dims, estimate_tokens, first_turn, repair_prompt, system_prompt
from kernelforge.llm.workers import RequestThreads
from kernelforge.search.gate import PolicyUnavailable, require_policy
from kernelforge.search.proposer import Outcome
from kernelforge.textsafe import error_text

#: Consecutive requests that got no answer at all before the generator gives up.
MAX_FAILED_REQUESTS = 3


@dataclass
class _Request:
    block_id: str
    purpose: str  # new | repair
    parent: str | None
    depth: int
    messages: list[dict[str, str]]
    order: int
    parent_text: str | None = None  # the template text a diff edit in the answer applies to
    model: int | None = None  # the index of the model (client) that serves it; None: chosen when sent


class LLMGenerator(BaseGenerator):
    """Asks a live endpoint for templates (see the module docstring)."""

    def __init__(self, spec: LLMSpec, *, job_name: str, store, progress, context: PromptContext,
                 client: ChatClient | None = None, seed: int = 0):
        super().__init__(spec, job_name=job_name, store=store, progress=progress, context=context)
        usage = store.llm_usage(job_name)
        # Budgets carry over a resumed search: calls and tokens already spent by this job count.
        self.calls_left = max(0, spec.max_calls - usage.requests)
        self.tokens_before = usage.tokens
        self.started: float | None = None
        self.deadline: float | None = None
        # One client per model (kernelforge.llm.endpoints); a given client serves every request.
        self._clients: list[ChatClient] = [client] if client is not None else []
        self._choice = WeightedChoice([m.weight for m in spec.endpoints()], seed)
        self._seed = seed
        self._workers: RequestThreads | None = None
        self._inflight: dict[Future, _Request] = {}
        self._order = 0
        self._repairs: dict[str, deque[_Request]] = {}
        self._parents = ParentPicker.from_store(store, job_name, seed)
        self._turn = 0
        self._failed_in_a_row = 0
        if self.calls_left == 0:
            self.stop(f"the call budget ([llm] max_calls = {spec.max_calls}) was spent by earlier runs",
                      failure=False)

    def _start(self) -> bool:
        """Create the clients on first use; False (and stopped) when the configuration is unusable."""
        if self._workers is not None:
            return True
        if self.stopped:
            return False
        models = self.spec.endpoints()
        if not all(m.base_url and m.model for m in models):
            self.stop("[llm] needs base_url and model (or --llm URL --llm-model NAME)")
            return False
        try:
            for model in models:
                api_key(model)  # read and registered before anything else can print it
            headers(self.spec)
        except EndpointUnusable as exc:
            self.stop(str(exc))
            return False
        try:
            require_policy()  # the search's policy gate: no policy, no LLM-written code
        except PolicyUnavailable as exc:
            self.stop(str(exc))
            return False
        self.started = time.monotonic()
        if self.spec.max_minutes:
            self.deadline = self.started + 60 * self.spec.max_minutes
        if not self._clients:
            try:
                self._clients = list(make_clients(self.spec, seed=self._seed, deadline=self.deadline))
            except EndpointUnusable as exc:
                self.stop(str(exc))
                return False
        self._workers = RequestThreads(self.spec.concurrency)
        return True

    def _budget_reason(self, next_tokens: int = 0) -> str | None:
        """Why no request may be sent now (None: the budgets allow one). ``next_tokens``: the
        estimate of the request about to be sent (:func:`estimate_tokens`): it must fit in
        ``max_tokens`` beside the tokens spent and the estimates of the requests in flight."""
        if self.calls_left <= 0:
            return f"call budget spent ([llm] max_calls = {self.spec.max_calls})"
        spent = self.tokens_before + self.tokens
        if spent >= self.spec.max_tokens:
            return f"token budget spent ([llm] max_tokens = {self.spec.max_tokens})"
        if next_tokens:
            flying = sum(estimate_tokens(r.messages, self.spec.response_tokens) for r in self._inflight.values())
            if spent + flying + next_tokens > self.spec.max_tokens:
                return (f"token budget spent ([llm] max_tokens = {self.spec.max_tokens}): the next request, about "
                        f"{next_tokens} tokens (its prompt estimated at 4 characters a token"
                        f"{' plus response_tokens' if self.spec.response_tokens else ''}), would overrun it "
                        f"({spent} spent" + (f", about {flying} in flight)" if flying else ")"))
        if self.deadline is not None and time.monotonic() >= self.deadline:
            return f"time budget spent ([llm] max_minutes = {self.spec.max_minutes:g})"
        return None

    def _inflight_for(self, block_id: str) -> int:
        return sum(1 for r in self._inflight.values() if r.block_id == block_id)

    def _next_block(self) -> str | None:
        blocks = self.context.blocks
        for i in range(len(blocks)):
            block_id = blocks[(self._turn + i) % len(blocks)]
            if self.context.capacity(block_id) - self._inflight_for(block_id) > 0:
                self._turn = (self._turn + i + 1) % len(blocks)
                return block_id
        return None

    def can_submit(self) -> bool:
        if self.stopped or len(self._inflight) >= self.spec.concurrency or self._budget_reason():
            return False
        return any(self.context.capacity(b) - self._inflight_for(b) > 0 for b in self.context.blocks)

    def pump(self) -> None:
        """Send requests while the budgets (calls, tokens with the next prompt estimated, time),
        the concurrency and the evaluations left for LLM templates allow. The generator stops
        (not a failure) once a budget is spent and nothing is in flight."""
        while self.can_submit():
            if not self._start():
                return
            block_id = self._next_block()
            if block_id is None:
                return
            # Waiting requests (repair turns, or a request held back for the token budget) go first.
            waiting = self._repairs.setdefault(block_id, deque())
            request = waiting.popleft() if waiting else self._new_request(block_id)
            reason = self._budget_reason(estimate_tokens(request.messages, self.spec.response_tokens))
            if reason:
                # Not sent: it would overrun max_tokens. It waits for the requests in flight, whose
                # real counts may leave room for it; with none in flight it never will.
                waiting.appendleft(request)
                if not self._inflight:
                    self.stop(reason, failure=False)
                return
            self.calls_left -= 1
            if request.model is None or request.model >= len(self._clients):
                request.model = self._choice.next() % len(self._clients)  # a new request: by weight
            self._inflight[self._workers.submit(self._clients[request.model].complete, request.messages)] = request
        if not self._inflight and not self.stopped:
            reason = self._budget_reason()
            if reason:
                self.stop(reason, failure=False)

    def _new_request(self, block_id: str) -> _Request:
        # The archive of elites (kernelforge.llm.archive): the least-used of the fastest few, or
        # for diversity the elite of the least-used (family, behaviour) cell; counts its children.
        parent = self._parents.choose(archive_for(self.context, block_id)).parent
        messages = [{"role": "system", "content": system_prompt()},
                    {"role": "user", "content": self.context.prompt(block_id, parent)}]
        self._order += 1
        return _Request(block_id, "new", parent, 0, messages, self._order, self.edit_text(parent))

    def _repair(self, proposal: Response, kind: str, message: str, template_id: str | None,
                candidate_id: str | None, point: dict[str, Any] | None) -> None:
        if proposal.depth >= self.spec.repair_turns or not proposal.messages:
            return
        evaluated = candidate_id is not None and kind != "policy"
        failing = self.context.failing_shape(proposal.block_id, message) if evaluated else None
        diff = ""
        if proposal.template is not None and proposal.parent_text is not None:
            # What the model's template changed against the text it was given (a diff edit's own diff).
            diff = proposal.edit or unified_diff(proposal.parent_text, proposal.template.text,
                                                 parent_name=proposal.parent or "parent",
                                                 new_name=proposal.template.id)
        follow_up = repair_prompt(kind="evaluated" if evaluated else "answer", status=kind, message=message,
                                  template_id=template_id or "", point=" ".join(f"{k}={v}" for k, v in
                                                                                (point or {}).items()),
                                  shape=dims(failing) if failing else "", diff=diff, parent=proposal.parent or "")
        # No text sent twice: the conversation's first prompt once, then the failed answer (cut to
        # MAX_ANSWER characters, with a note) and what went wrong; earlier repair turns are not resent.
        messages = [*first_turn(proposal.messages), {"role": "assistant", "content": capped_answer(proposal.answer)},
                    {"role": "user", "content": follow_up}]
        self._order += 1
        parent = candidate_id or proposal.parent
        self._repairs.setdefault(proposal.block_id, deque()).append(
            _Request(proposal.block_id, "repair", parent, proposal.depth + 1, messages, self._order,
                     self.edit_text(parent), model=proposal.model))

    def poll(self) -> list[Response]:
        done = sorted((f for f in self._inflight if f.done()), key=lambda f: self._inflight[f].order)
        proposals = []
        for future in done:
            request = self._inflight.pop(future)
            try:
                exchange = future.result()
            except Exception as exc:  # a bug in the client: this request is lost, the search is not
                client = self._clients[request.model or 0]
                exchange = Exchange(request.messages, {"model": client.model},
                                    [Attempt(0, "error", 0.0, error=error_text(exc))],
                                    base_url=client.base_url)
            proposal = self._take_in(request.block_id, request.purpose, request.parent, request.depth, exchange,
                                     messages=request.messages, parent_text=request.parent_text,
                                     model=request.model or 0)
            if exchange.fatal:
                self.stop(exchange.fatal)
            elif exchange.ok:
                self._failed_in_a_row = 0
            else:
                self._failed_in_a_row += 1
                if self._failed_in_a_row >= MAX_FAILED_REQUESTS:
                    self.stop(f"{self._failed_in_a_row} requests in a row got no answer (last: {proposal.kind}: "
                              f"{proposal.message})")
            if proposal.kind in (Outcome.TEMPLATE, Outcome.POINTS):
                proposals.append(proposal)
        return proposals

    def summary(self) -> dict[str, Any]:
        out = super().summary()
        # Per model (all runs of the job): "model @ url" -> requests (kernelforge.store.llm_stats).
        out["models"] = {f"{m.model} @ {m.base_url}": m.requests for m in self.store.llm_model_stats(self.job_name)}
        if not out["stopped"] and not self._inflight:
            out["stopped"] = self._budget_reason() or ""
            if not out["stopped"] and all(self.context.capacity(b) <= 0 for b in self.context.blocks):
                out["stopped"] = ("evaluations spent: the job's evaluations for LLM templates ([llm] tune_share of "
                                  f"each block's budget) are all used, {self.calls_left} of [llm] max_calls = "
                                  f"{self.spec.max_calls} calls left")
        return out

    def wait(self, timeout: float) -> None:
        if self._inflight:
            wait_futures(list(self._inflight), timeout=timeout, return_when=FIRST_COMPLETED)

    @property
    def busy(self) -> bool:
        return bool(self._inflight)

    def _base_url(self) -> str:
        return self.spec.base_url

    def close(self) -> None:
        for future in self._inflight:
            future.cancel()
        self._inflight.clear()
        if self._workers is not None:
            self._workers.close()
        for client in self._clients:
            client.close()
