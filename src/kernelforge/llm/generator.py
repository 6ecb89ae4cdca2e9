"""The live LLM generator: a strategy that writes new templates (and proposes points) while the
search evaluates, and learns from what the search stored.

Evolutionary, best-first with diversity: each new request names a parent among the best verified
candidates of its block (the one with the fewest children among the top few), shows the model the
standings, resources and earlier failures, and asks for a faster template. A template that fails
(parse, policy, compile, verification) gets up to ``repair_turns`` follow-up turns in the same
conversation with its error. Requests run on background threads (at most ``concurrency`` in
flight) while the device evaluates; the search polls, between evaluations, for what came back.
:mod:`kernelforge.llm.replay` hands stored answers back instead; :mod:`kernelforge.llm.proposer`
puts either behind the search's proposer seam.
"""

from __future__ import annotations

import os
import time
from collections import Counter, deque
from concurrent.futures import FIRST_COMPLETED, Future
from concurrent.futures import wait as wait_futures
from dataclasses import dataclass
from typing import Any

from kernelforge.job import LLMSpec
from kernelforge.llm.base import BaseGenerator, Response
from kernelforge.llm.client import Attempt, ChatClient, Exchange, OpenAIChatClient
from kernelforge.llm.context import PARENT_POOL, PromptContext
from kernelforge.llm.prompts import repair_prompt, system_prompt
from kernelforge.llm.workers import RequestThreads
from kernelforge.redact import redact_url, register
from kernelforge.search.gate import PolicyUnavailable, require_policy
from kernelforge.search.proposer import Outcome

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
        self._client = client
        self._seed = seed
        self._workers: RequestThreads | None = None
        self._inflight: dict[Future, _Request] = {}
        self._order = 0
        self._repairs: dict[str, deque[_Request]] = {}
        self._children: Counter[str] = Counter()
        self._turn = 0
        self._failed_in_a_row = 0
        if self.calls_left == 0:
            self.stop(f"the call budget ([llm] max_calls = {spec.max_calls}) was spent by earlier runs",
                      failure=False)

    def _start(self) -> bool:
        """Create the client on first use; False (and stopped) when the configuration is unusable."""
        if self._workers is not None:
            return True
        if self.stopped:
            return False
        if not self.spec.base_url or not self.spec.model:
            self.stop("[llm] needs base_url and model (or --llm URL --llm-model NAME)")
            return False
        key = None
        if self.spec.api_key_env:
            key = os.environ.get(self.spec.api_key_env)
            register(key)  # from now on, masked in everything this process writes
            if not key:
                self.stop(f"[llm] api_key_env: the environment variable {self.spec.api_key_env} is not set; "
                          "set it to the endpoint's API key")
                return False
        try:
            require_policy()  # the search's policy gate: no policy, no LLM-written code
        except PolicyUnavailable as exc:
            self.stop(str(exc))
            return False
        self.started = time.monotonic()
        if self.spec.max_minutes:
            self.deadline = self.started + 60 * self.spec.max_minutes
        if self._client is None:
            try:
                self._client = OpenAIChatClient(
                    base_url=self.spec.base_url, model=self.spec.model, api_key=key, timeout_s=self.spec.timeout_s,
                    max_retries=self.spec.max_retries, temperature=self.spec.temperature,
                    response_tokens=self.spec.response_tokens, seed=self._seed, deadline=self.deadline)
            except Exception as exc:  # the openai package missing or refusing the settings
                message = str(exc).replace(key, "***") if key else str(exc)
                self.stop(f"cannot create the chat client for {redact_url(self.spec.base_url)}: "
                          f"{type(exc).__name__}: {message}")
                return False
        self._workers = RequestThreads(self.spec.concurrency)
        return True

    def _budget_reason(self) -> str | None:
        if self.calls_left <= 0:
            return f"call budget spent ([llm] max_calls = {self.spec.max_calls})"
        if self.tokens_before + self.tokens >= self.spec.max_tokens:
            return f"token budget spent ([llm] max_tokens = {self.spec.max_tokens})"
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
        while self.can_submit():
            if not self._start():
                return
            block_id = self._next_block()
            if block_id is None:
                return
            pending = self._repairs.get(block_id)
            request = pending.popleft() if pending else self._new_request(block_id)
            self.calls_left -= 1
            self._inflight[self._workers.submit(self._client.complete, request.messages)] = request
        if not self._inflight and not self.stopped:
            reason = self._budget_reason()
            if reason:
                self.stop(reason, failure=False)

    def _new_request(self, block_id: str) -> _Request:
        ranked = [row["id"] for row in self.context.standings(block_id, PARENT_POOL)]
        # Best-first with diversity: among the best few, the one that has had the fewest children
        # (ties: the better one), so one lucky candidate does not absorb every request.
        parent = min(ranked, key=lambda cid: (self._children[cid], ranked.index(cid))) if ranked else None
        if parent is not None:
            self._children[parent] += 1
        messages = [{"role": "system", "content": system_prompt()},
                    {"role": "user", "content": self.context.prompt(block_id, parent)}]
        self._order += 1
        return _Request(block_id, "new", parent, 0, messages, self._order)

    def _repair(self, proposal: Response, kind: str, message: str, template_id: str | None,
                candidate_id: str | None, point: dict[str, Any] | None) -> None:
        if proposal.depth >= self.spec.repair_turns or not proposal.messages:
            return
        evaluated = candidate_id is not None and kind != "policy"
        follow_up = repair_prompt(kind="evaluated" if evaluated else "answer", status=kind, message=message,
                                  template_id=template_id or "", point=" ".join(f"{k}={v}" for k, v in
                                                                                (point or {}).items()))
        messages = [*proposal.messages, {"role": "assistant", "content": proposal.answer},
                    {"role": "user", "content": follow_up}]
        self._order += 1
        parent = candidate_id or proposal.parent
        self._repairs.setdefault(proposal.block_id, deque()).append(
            _Request(proposal.block_id, "repair", parent, proposal.depth + 1, messages, self._order))

    def poll(self) -> list[Response]:
        done = sorted((f for f in self._inflight if f.done()), key=lambda f: self._inflight[f].order)
        proposals = []
        for future in done:
            request = self._inflight.pop(future)
            try:
                exchange = future.result()
            except Exception as exc:  # a bug in the client: this request is lost, the search is not
                exchange = Exchange(request.messages, {"model": self.spec.model},
                                    [Attempt(0, "error", 0.0, error=f"{type(exc).__name__}: {exc}"[:500])])
            proposal = self._take_in(request.block_id, request.purpose, request.parent, request.depth, exchange,
                                     messages=request.messages)
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
        if not out["stopped"] and not self._inflight:
            out["stopped"] = self._budget_reason() or ""
            if not out["stopped"] and all(self.context.capacity(b) <= 0 for b in self.context.blocks):
                out["stopped"] = "no evaluations left in the LLM reserve ([llm] tune_share of each block's budget)"
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
        if self._client is not None:
            self._client.close()
