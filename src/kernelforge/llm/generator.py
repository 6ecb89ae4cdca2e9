"""The LLM generator: a strategy that writes new templates (and proposes points) while the search
evaluates, and learns from what the search stored.

Evolutionary, best-first with diversity: each new request names a parent among the best verified
candidates of its block (the one with the fewest children among the top few), shows the model the
standings, resources and earlier failures, and asks for a faster template. A template that fails
(parse, policy, compile, verification) gets up to ``repair_turns`` follow-up turns in the same
conversation with its error. Requests run on background threads (at most ``concurrency`` in
flight) while the device evaluates; the search polls, between evaluations, for what came back.

Every attempt is stored in ``kf_llm_calls`` with the search's evaluation count at the moment its
response was taken in (``tick``). :class:`ReplayGenerator` hands the stored responses back at the
same ticks, in the same order, with the same parents, so a replayed search (``--llm replay``)
makes the same decisions offline: the same templates, the same Optuna points, the same candidates.
"""

from __future__ import annotations

import ast
import os
import queue
import threading
import time
from collections import Counter, deque
from concurrent.futures import FIRST_COMPLETED, Future
from concurrent.futures import wait as wait_futures
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from kernelforge.job import LLMSpec, redact_url
from kernelforge.llm.client import Attempt, ChatClient, Exchange, OpenAIChatClient
from kernelforge.llm.parse import Parsed, parse_answer
from kernelforge.llm.prompts import device_facts, new_prompt, repair_prompt, resources, standings, system_prompt

if TYPE_CHECKING:
    from kernelforge.search.loop import Search
    from kernelforge.template import Template

#: What a response can become, beyond the evaluation statuses (ok, wrong, compile_error, ...).
ANSWER_FAILURES = ("no_code", "truncated", "invalid_template", "invalid_points")
#: Outcomes that earn the conversation a repair turn (when turns are left).
REPAIRABLE = set(ANSWER_FAILURES) | {"policy", "compile_error", "wrong", "rejected", "runtime_error", "timeout"}
#: How many of the best candidates a parent is chosen from.
PARENT_POOL = 4
#: Consecutive requests that got no answer at all before the generator gives up.
MAX_FAILED_REQUESTS = 3


class PolicyUnavailable(RuntimeError):
    """kernelforge.execute.policy cannot be imported: LLM-written code is never run without it."""


def _check_source():
    try:
        from kernelforge.execute.policy import check_source
    except ImportError as exc:
        raise PolicyUnavailable(f"kernelforge.execute.policy cannot be imported ({exc}); LLM-written code never runs "
                                "without the static policy check") from None
    return check_source


def policy_problems(source: str) -> list[str]:
    """The static policy's objections to ``source`` (empty: allowed). Imported lazily: the policy
    module is its own stage of the flow. Raises :class:`PolicyUnavailable` without it.

    A source that is not valid Python passes here: nothing of it can run, and the compile step
    reports it as the compile error it is (with the line), which is what the model needs to hear.
    """
    check = _check_source()
    try:
        ast.parse(source)
    except (SyntaxError, ValueError):
        return []
    return list(check(source))


@dataclass
class Proposal:
    """One response as the search sees it.

    ``kind`` is ``template`` or ``points`` (the search acts on it and then calls
    :meth:`BaseGenerator.settle`), or a failure already settled. ``parent`` is the candidate the
    model was asked to improve on (the failed candidate for a repair).
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
    messages: list[dict[str, str]] = field(default_factory=list)  # the conversation, for a repair turn
    answer: str = ""
    settled: bool = False


@dataclass
class _Request:
    block_id: str
    purpose: str  # new | repair
    parent: str | None
    depth: int
    messages: list[dict[str, str]]
    order: int


class SearchContext:
    """What the generator reads from the running search (through the store, mostly)."""

    def __init__(self, search: "Search"):
        self.search = search

    @property
    def blocks(self) -> list[str]:
        return [spec.id for spec in self.search.job.blocks]

    @property
    def tick(self) -> int:
        return self.search._llm_tick

    def capacity(self, block_id: str) -> int:
        return self.search._llm_capacity(block_id)

    def _shapes(self, block_id: str):
        spec = next(s for s in self.search.job.blocks if s.id == block_id)
        return self.search.catalog.block(block_id).shapes(spec.shapes)

    def standings(self, block_id: str, limit: int = PARENT_POOL) -> list[dict[str, Any]]:
        s = self.search
        return standings(s.store, block_id, [x.name for x in self._shapes(block_id)], s.dtype_name, s.env_key,
                         s.baselines[block_id].id, limit)

    def template(self, template_id: str) -> "Template | None":
        s = self.search
        if template_id in s._llm_templates:
            return s._llm_templates[template_id]
        try:
            return s.catalog.template(template_id)
        except Exception:  # a template removed since it was stored: show no source
            return None

    def prompt(self, block_id: str, parent_id: str | None) -> str:
        s = self.search
        block = s.catalog.block(block_id)
        shapes = self._shapes(block_id)
        baseline = s.catalog.baseline(block_id)
        rows = self.standings(block_id, limit=5)
        parent = None
        stored = s.store.candidate(parent_id) if parent_id else None
        if stored is not None:
            template = self.template(stored.template)
            parent = {"template_id": stored.template, "origin": stored.origin, "id": stored.id,
                      "point": " ".join(f"{k}={v}" for k, v in stored.params.items()),
                      "text": (template.text.rstrip() if template else stored.source.rstrip())}
        base_times = {r.shape: r.median_s for r in s.baseline_results.get(block_id, {}).values() if r.median_s}
        failures = [{"what": c["template_id"] or f"answer #{c['seq']}", "status": c["kind"],
                     "message": c["message"] or ""}
                    for c in s.store.llm_calls(s.job.name, final_only=True)
                    if c["block"] == block_id and c["kind"] in REPAIRABLE]
        template_ids = [st.template.id for st in s._llm_studies_of(block_id)] or [baseline.id]
        template_ids = list(dict.fromkeys([baseline.id, *template_ids]))
        return new_prompt(
            block=block, dtype_name=s.dtype_name, shapes=shapes, baseline=baseline,
            baseline_point=dict(baseline.baseline), parent=parent, standings_rows=rows,
            resource_lines=resources(s.store, [r["id"] for r in rows], s.target, s.dtype_name),
            failures=failures, device=device_facts(s.env, block, shapes, s.dtype, base_times), target=s.target,
            template_ids=template_ids,
        )


class _Workers:
    """A few daemon threads running requests: unlike a ThreadPoolExecutor, a request still waiting
    on a slow server never holds up the exit of an interrupted search."""

    def __init__(self, count: int):
        self._queue: queue.Queue = queue.Queue()
        self._threads = [threading.Thread(target=self._work, daemon=True, name=f"kf-llm-{i}") for i in range(count)]
        for thread in self._threads:
            thread.start()

    def submit(self, fn, *args) -> Future:
        future: Future = Future()
        self._queue.put((future, fn, args))
        return future

    def _work(self) -> None:
        while True:
            item = self._queue.get()
            if item is None:
                return
            future, fn, args = item
            if not future.set_running_or_notify_cancel():
                continue
            try:
                future.set_result(fn(*args))
            except BaseException as exc:  # handed to the search thread, which records it
                future.set_exception(exc)

    def close(self) -> None:
        for _ in self._threads:
            self._queue.put(None)


class BaseGenerator:
    """What the live and the replaying generator share: recording, settling, the summary."""

    def __init__(self, spec: LLMSpec, *, job_name: str, store, progress, context: SearchContext, record: bool = True):
        self.spec = spec
        self.job_name = job_name
        self.store = store
        self.progress = progress
        self.context = context
        self.record = record
        usage = store.llm_usage(job_name)
        self.run = usage["last_run"] + 1
        self._seq = usage["last_seq"]
        self.stopped: str | None = None
        self.kinds: Counter[str] = Counter()
        self.requests = 0
        self.attempts = 0
        self.tokens = 0

    # -- the search's side ---------------------------------------------------------------------

    def pump(self) -> None:
        """Start what can be started (live: new requests)."""

    def poll(self) -> list[Proposal]:
        """Responses taken in since the last poll that the search must act on."""
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

    def settle(self, proposal: Proposal, kind: str, message: str = "", *, template_id: str | None = None,
               candidate_id: str | None = None, point: dict[str, Any] | None = None) -> None:
        """What the search made of a proposal: stored with the response; a failure may earn a repair.
        Only the first verdict counts (per-shape tuning evaluates a template once per shape)."""
        if proposal.settled:
            return
        proposal.settled = True
        self.kinds[kind] += 1
        if proposal.row_id is not None and self.record:
            self.store.set_llm_outcome(proposal.row_id, kind, message, template_id=template_id,
                                       candidate_id=candidate_id)
        self.progress.event("llm_result", block=proposal.block_id, seq=proposal.seq, outcome=kind,
                            template=template_id, candidate=candidate_id, message=message[:300])
        if kind in REPAIRABLE:
            self._repair(proposal, kind, message, template_id, candidate_id, point)

    def _repair(self, proposal: Proposal, kind: str, message: str, template_id: str | None,
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

    def _take_in(self, block_id: str, purpose: str, parent: str | None, depth: int, exchange: Exchange,
                 *, replayed_from: str | None = None, messages: list[dict[str, str]] | None = None) -> Proposal:
        """Record a finished request and turn its answer into a proposal."""
        self._seq += 1
        self.requests += 1
        self.attempts += len(exchange.attempts)
        self.tokens += exchange.tokens
        final = exchange.final
        parsed: Parsed | None = None
        if exchange.ok:
            parsed = parse_answer(exchange.text, block_id, finish_reason=final.finish_reason,
                                  where=f"LLM answer #{self._seq}")
            kind, message = parsed.kind, parsed.message
        else:
            kind = final.status if final else "error"
            message = (final.error if final else None) or exchange.fatal or "no answer"
        settled_now = kind not in ("template", "points")
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
        proposal = Proposal(self._seq, block_id, kind, purpose, parent, depth, message,
                            template=parsed.template if parsed else None, target=parsed.target if parsed else None,
                            points=parsed.points if parsed else [], row_id=row_id, messages=list(messages or []),
                            answer=exchange.text)
        self.progress.event("llm", block=block_id, seq=self._seq, purpose=purpose, outcome=kind,
                            attempts=[a.status for a in exchange.attempts], tokens=exchange.tokens,
                            latency_s=round(sum(a.latency_s for a in exchange.attempts), 3),
                            template=parsed.template.id if parsed and parsed.template else None,
                            message=message[:300] if settled_now else "")
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
            "model": str(exchange.params.get("model", "")), "base_url": redact_url(self._base_url()),
            "request": exchange.request_json(), "request_hash": exchange.request_hash(), "response": attempt.text,
            "finish_reason": attempt.finish_reason, "status": attempt.status, "http_status": attempt.http_status,
            "error": attempt.error, "prompt_tokens": attempt.prompt_tokens,
            "completion_tokens": attempt.completion_tokens, "latency_s": attempt.latency_s,
            "tick": self.context.tick, "replayed_from": replayed_from,
        }

    def _base_url(self) -> str:
        return self.spec.base_url


class LLMGenerator(BaseGenerator):
    """Asks a live endpoint for templates (see the module docstring)."""

    def __init__(self, spec: LLMSpec, *, job_name: str, store, progress, context: SearchContext,
                 client: ChatClient | None = None, seed: int = 0):
        super().__init__(spec, job_name=job_name, store=store, progress=progress, context=context)
        usage = store.llm_usage(job_name)
        # Budgets carry over a resumed search: calls and tokens already spent by this job count.
        self.calls_left = max(0, spec.max_calls - usage["requests"])
        self.tokens_before = usage["tokens"]
        self.started: float | None = None
        self.deadline: float | None = None
        self._client = client
        self._seed = seed
        self._workers: _Workers | None = None
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
            if not key:
                self.stop(f"[llm] api_key_env: the environment variable {self.spec.api_key_env} is not set; "
                          "set it to the endpoint's API key")
                return False
        try:
            _check_source()
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
        self._workers = _Workers(self.spec.concurrency)
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

    def _repair(self, proposal: Proposal, kind: str, message: str, template_id: str | None,
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

    def poll(self) -> list[Proposal]:
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
            if proposal.kind in ("template", "points"):
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


class ReplayGenerator(BaseGenerator):
    """Serves the responses stored in ``source`` (another job database, or this one) instead of
    asking an endpoint: each at the tick it was taken in originally, with its original parent.

    When the replayed search diverges (a response's tick is never reached because the search ran
    out of work earlier), the next response is handed over when the search would otherwise wait.
    """

    def __init__(self, spec: LLMSpec, *, job_name: str, store, progress, context: SearchContext, source):
        same = source is store or getattr(source, "url", None) == store.url
        super().__init__(spec, job_name=job_name, store=store, progress=progress, context=context, record=not same)
        self._source = None if same else source
        self.source_url = redact_url(source.url)
        calls = source.llm_calls(job_name)
        if not calls:
            jobs = sorted({c["job"] for c in source.llm_calls()})
            if len(jobs) == 1:
                calls = source.llm_calls(jobs[0])
        # One replayed request per original request, in the order they were taken in.
        grouped: dict[tuple[int, int], list[dict[str, Any]]] = {}
        for row in calls:
            grouped.setdefault((row["run"], row["seq"]), []).append(row)
        self._queue = deque(sorted(grouped.values(), key=lambda rows: (rows[0]["run"], rows[0]["seq"])))
        self._release_next = False
        if not self._queue:
            self.stop(f"--llm replay: {self.source_url} holds no LLM transcripts for job {job_name!r}")

    def poll(self) -> list[Proposal]:
        proposals = []
        while self._queue:
            rows = self._queue[0]
            if rows[-1]["tick"] > self.context.tick and not self._release_next:
                break
            self._queue.popleft()
            self._release_next = False
            proposal = self._take_in(rows[-1]["block"], rows[-1]["purpose"], rows[-1]["parent"], rows[-1]["depth"],
                                     _exchange(rows), replayed_from=self.source_url)
            if proposal.kind in ("template", "points"):
                proposals.append(proposal)
        if not self._queue and self.stopped is None:
            self.stop("every stored response was replayed", failure=False)
        return proposals

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


def _exchange(rows: list[dict[str, Any]]) -> Exchange:
    import json

    request = json.loads(rows[-1]["request"])
    messages = request.pop("messages", [])
    attempts = [Attempt(r["attempt"], r["status"], r["latency_s"] or 0.0, text=r["response"],
                        finish_reason=r["finish_reason"], prompt_tokens=r["prompt_tokens"],
                        completion_tokens=r["completion_tokens"], http_status=r["http_status"], error=r["error"])
                for r in rows]
    return Exchange(messages, request, attempts)
