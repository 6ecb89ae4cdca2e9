"""The LLM as a point adviser: one question per study, "which points of this space first?".

:class:`PointAdvisor` builds one prompt (the block and what it computes, its shapes, the template
and its space, the device's ceilings, the study's standings), asks the job's endpoint once through
the existing client (:mod:`kernelforge.llm.client`: its retries, timeouts and redaction), keeps the
valid points of the answer (a JSON list of ``{parameter: value}``) and records the exchange in the
store's LLM log (``kf_llm_calls``, purpose ``advise``; redacted as written, the key never sent in
a message). It is the ``advice`` of :class:`kernelforge.strategies.guided.GuidedStrategy`, which
asks those points first, then hands over to the job's strategy. The answer is only parameter
values, checked against the space: no code of the model runs.

A failed request, an unusable answer or a spent budget is no advice (:attr:`Advice.error` says
why), never an error of the search. ``--llm replay`` sends nothing: the advice stored for the same
prompt is handed back (none when the replayed search asks something else).
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any, Callable, Mapping, Sequence

from kernelforge.llm_spec import LLMSpec
from kernelforge.llm.client import Attempt, ChatClient, Exchange
from kernelforge.llm.endpoints import EndpointUnusable, make_clients
from kernelforge.llm.parse import fenced_blocks
from kernelforge.llm.prompts import block_facts, device_facts
from kernelforge.redact import redact_url
from kernelforge.textsafe import NOTE, cut, error_text

if TYPE_CHECKING:
    from kernelforge.block import Block, Shape
    from kernelforge.search.context import RunContext
    from kernelforge.store.store import Store
    from kernelforge.template import Template

#: The ``purpose`` of the adviser's rows in ``kf_llm_calls`` (the replaying generator skips them).
PURPOSE = "advise"
#: Bounds that keep the prompt a few thousand tokens whatever the history.
MAX_STANDINGS = 12
MAX_FAILED = 6
MAX_TEMPLATE_CHARS = 8000
#: Retries of the one request: the search waits for it (after its baselines), so fewer than the
#: generator's background requests get.
MAX_RETRIES = 1

SYSTEM = ("You are an expert GPU kernel engineer tuning the parameters of a Triton kernel template. You "
          "know how tile sizes, warps and pipeline stages interact with the hardware. Answer with one JSON "
          "list of points in a ```json fence, nothing else.")


@dataclass(frozen=True)
class Advice:
    """What one consultation gave: ``points`` (valid points of the space, new, in the model's order,
    at most the number asked for), ``invalid`` (what was proposed and refused, with why), the
    ``tokens`` spent, and ``error``: None, or why there is no advice (the request failed, the
    answer held no list, the budget was spent)."""

    points: tuple[dict[str, Any], ...] = ()
    invalid: tuple[tuple[Any, str], ...] = ()
    tokens: int = 0
    error: str | None = None
    replayed: bool = False


def parse_points(text: str) -> list[Any] | None:
    """The list of points in an answer: the last fenced block that parses as a JSON list (or an
    object with a ``points`` list), else the whole text, else the outermost ``[...]``; None when
    there is none."""
    blocks, _ = fenced_blocks(text)
    candidates = [body for _, body in reversed(blocks)] + [text]
    start, end = text.find("["), text.rfind("]")
    if 0 <= start < end:
        candidates.append(text[start:end + 1])
    for body in candidates:
        try:
            value = json.loads(body)
        except ValueError:
            continue
        if isinstance(value, dict) and isinstance(value.get("points"), list):
            value = value["points"]
        if isinstance(value, list):
            return value
    return None


def as_point(raw: Any, template: "Template") -> tuple[dict[str, Any] | None, str]:
    """``raw`` as a point of the template's space, its values the space's own objects (JSON's 1.0
    is the space's 1; a list is a tuple), or None and why not."""
    if not isinstance(raw, dict):
        return None, "not an object mapping parameter names to values"
    space = template.space
    point: dict[str, Any] = {}
    for name, value in raw.items():
        value = tuple(value) if isinstance(value, list) else value
        allowed = space.values(name) if name in space.names else ()
        point[name] = allowed[allowed.index(value)] if value in allowed else value
    problems = space.problems(point)
    return (None, "; ".join(problems)) if problems else (point, "")


class PointAdvisor:
    """Asks the job's LLM for up to ``count`` points of ``template``'s space (see the module
    docstring). Call :meth:`advise` (a typed :class:`Advice`), or the instance itself (the points
    only: the ``advice`` of a guided strategy); :attr:`last` keeps the latest advice."""

    def __init__(self, spec: LLMSpec, *, job_name: str, store: "Store", block: "Block", template: "Template",
                 shapes: Sequence["Shape"], dtype_name: str, env: Mapping[str, Any], count: int,
                 progress=None, client: ChatClient | None = None, seed: int = 0):
        self.spec = spec
        self.job_name = job_name
        self.store = store
        self.block = block
        self.template = template
        self.shapes = list(shapes)
        self.dtype_name = dtype_name
        self.env = dict(env)
        self.count = count
        self.progress = progress
        self.seed = seed
        self._client = client
        # The generator numbers its run when it starts, after the studies are built: the same number.
        self.run = store.llm_usage(job_name).last_run + 1
        self.last: Advice | None = None

    def __call__(self, standings: Sequence[tuple[Mapping[str, Any], float | None]]) -> list[dict[str, Any]]:
        return list(self.advise(standings).points)

    # -- the prompt ----------------------------------------------------------------------------

    def messages(self, standings: Sequence[tuple[Mapping[str, Any], float | None]]) -> list[dict[str, str]]:
        """The request: the system rules and the one question (see the module docstring)."""
        from kernelforge.block import DTYPES

        facts = block_facts(self.block, self.dtype_name)
        device = device_facts(self.env, self.block, self.shapes, DTYPES[self.dtype_name], {})
        space = self.template.space
        lines = [
            f"Block {self.block.id}: {self.block.description}",
            "", "What it computes (the PyTorch reference):", "```python", facts["reference"], "```",
            "", f"Data type: {self.dtype_name}. Production shapes (one configuration serves them all):",
            *[f"- {s.name} {s.as_dict()}" for s in self.shapes],
            "", f"Device: {device['description']} Timing: {device['timing']}.",
            "", f"Template {self.template.id} (a Jinja2 template; the parameters below fill it):",
            "```", _cut(self.template.text.rstrip(), MAX_TEMPLATE_CHARS), "```",
            "", "Its parameters and their allowed values:",
            *[f"- {name}: {json.dumps(list(values), default=str)}" for name, values in space.params],
        ]
        if space.constraints:
            lines += ["Constraints every point must satisfy:", *[f"- {c.text}" for c in space.constraints]]
        if space.feasible is not None:
            lines.append(f"Only {len(space.feasible)} of these combinations exist; others are rejected.")
        told = [(p, v) for p, v in standings if v is not None][:MAX_STANDINGS]
        failed = [p for p, v in standings if v is None][:MAX_FAILED]
        lines += ["", "Measured so far (objective: time relative to the baseline, lower is faster; 1.0 is the "
                      "baseline):" if told else "Nothing measured yet besides the baseline's own point."]
        lines += [f"- {_compact(p)} -> {v:.4g}" for p, v in told]
        if failed:
            lines += ["Points that failed (compile error, wrong result, out of resources):",
                      *[f"- {_compact(p)}" for p in failed]]
        lines += ["", f"Propose up to {self.count} points not listed above, the most promising first, for these "
                      "shapes on this device. Each point maps EVERY parameter to one of its allowed values. Answer "
                      "with only a JSON list, e.g. ```json\n[" + _compact(dict(self.template.baseline)) + "]\n```"]
        return [{"role": "system", "content": SYSTEM}, {"role": "user", "content": "\n".join(lines)}]

    # -- the consultation ----------------------------------------------------------------------

    def advise(self, standings: Sequence[tuple[Mapping[str, Any], float | None]]) -> Advice:
        """Ask once; never raises for the endpoint's or the answer's failures (see :class:`Advice`)."""
        messages = self.messages(standings)
        if self.spec.replay is not None:
            advice = self._replayed(messages, standings)
        else:
            advice = self._live(messages, standings)
        self.last = advice
        if self.progress is not None:
            self.progress.event("llm_advice", block=self.block.id, template=self.template.id,
                                points=len(advice.points), invalid=len(advice.invalid), tokens=advice.tokens,
                                replayed=advice.replayed, message=advice.error or "")
        return advice

    def _live(self, messages: list[dict[str, str]], standings) -> Advice:
        usage = self.store.llm_usage(self.job_name)
        if usage.requests >= self.spec.max_calls:
            return Advice(error=f"call budget spent ([llm] max_calls = {self.spec.max_calls})")
        if usage.tokens >= self.spec.max_tokens:
            return Advice(error=f"token budget spent ([llm] max_tokens = {self.spec.max_tokens})")
        client, error = self._client_or_error()
        if client is None:
            return Advice(error=error)
        try:
            exchange = client.complete(messages)
        except Exception as exc:  # a bug in a client: no advice, the search goes on
            return Advice(error=error_text(exc))
        finally:
            if self._client is None:
                client.close()
        advice = self._read(exchange, standings)
        self._record(exchange, advice, len(standings), usage.last_seq + 1, None)
        return advice

    def _client_or_error(self) -> tuple[ChatClient | None, str]:
        if self._client is not None:
            return self._client, ""
        spec = self.spec
        model = spec.endpoints()[0]  # one answer per study: the first model of the job asks it
        if not model.base_url or not model.model:
            return None, "[llm] needs base_url and model (or --llm URL --llm-model NAME)"
        try:  # the job's request shape too: temperature, token limit name, extra body and headers
            [client] = make_clients(replace(spec, models=(model,)), seed=self.seed, deadline=None,
                                    max_retries=min(spec.max_retries, MAX_RETRIES))
        except EndpointUnusable as exc:
            return None, str(exc)
        return client, ""

    def _read(self, exchange: Exchange, standings) -> Advice:
        if not exchange.ok:
            final = exchange.final
            why = (final.error if final else None) or exchange.fatal or "no answer"
            return Advice(tokens=exchange.tokens, error=cut(f"{final.status if final else 'error'}: {why}", NOTE))
        proposed = parse_points(exchange.text)
        if proposed is None:
            return Advice(tokens=exchange.tokens, error="the answer holds no JSON list of points")
        told = {tuple(p.get(n) for n in self.template.space.names) for p, _ in standings}
        points, invalid, seen = [], [], set(told)
        for raw in proposed:
            point, why = as_point(raw, self.template)
            if point is None:
                invalid.append((raw, why))
                continue
            key = tuple(point[n] for n in self.template.space.names)
            if key in seen:
                invalid.append((point, "already measured or proposed"))
                continue
            seen.add(key)
            if len(points) < self.count:
                points.append(point)
        error = None if points else "no valid new point in the answer"
        return Advice(tuple(points), tuple(invalid), exchange.tokens, error)

    def _record(self, exchange: Exchange, advice: Advice, tick: int, seq: int, replayed_from: str | None) -> None:
        """Store every attempt like the generator does (:mod:`kernelforge.llm.base`); the final row's
        ``kind`` is ``advice`` (points taken) or ``no_advice``, its message what was taken."""
        rows = []
        for i, attempt in enumerate(exchange.attempts):
            final = i == len(exchange.attempts) - 1
            rows.append({
                "job": self.job_name, "run": self.run, "seq": seq, "attempt": attempt.attempt, "final": final,
                "block": self.block.id, "purpose": PURPOSE, "parent": None, "depth": 0,
                "model": str(exchange.params.get("model", "")),
                "base_url": f"replay of {replayed_from}" if replayed_from else redact_url(self.spec.base_url),
                "request": exchange.request_json(), "request_hash": exchange.request_hash(),
                "response": attempt.text, "finish_reason": attempt.finish_reason, "status": attempt.status,
                "http_status": attempt.http_status, "error": attempt.error, "prompt_tokens": attempt.prompt_tokens,
                "completion_tokens": attempt.completion_tokens, "latency_s": attempt.latency_s, "tick": tick,
                "replayed_from": replayed_from, "template_id": self.template.id,
                "kind": ("advice" if advice.points else "no_advice") if final else None,
                "message": _summary(advice) if final else None,
            })
        if rows:
            self.store.add_llm_calls(rows)

    def _replayed(self, messages: list[dict[str, str]], standings) -> Advice:
        """The advice stored for exactly this request (``[llm] replay``'s source), sent nowhere."""
        from kernelforge.store.store import Store

        same = self.spec.replay in ("", self.store.url)
        source = self.store if same else Store(self.spec.replay, create=False)
        try:
            calls = [c for c in source.llm_calls() if c.purpose == PURPOSE and c.block == self.block.id
                     and c.template_id == self.template.id]
        finally:
            if not same:
                source.close()
        groups: dict[tuple[str, int, int], list] = {}
        for call in calls:
            groups.setdefault((call.job, call.run, call.seq), []).append(call)
        for rows in groups.values():
            if json.loads(rows[-1].request).get("messages") == messages:
                exchange = _stored_exchange(rows)
                advice = self._read(exchange, standings)
                if not same:
                    self._record(exchange, advice, len(standings), self.store.llm_usage(self.job_name).last_seq + 1,
                                 redact_url(self.spec.replay))
                return Advice(advice.points, advice.invalid, 0, advice.error, replayed=True)
        return Advice(error="--llm replay: no stored advice for this prompt", replayed=True)


def advice_for(run: "RunContext", template: "Template", shapes: Sequence["Shape"]) -> Callable | None:
    """The adviser of one study of a search run: a :class:`PointAdvisor` over the job's ``[llm]``
    endpoint, or None when the job has no ``[llm]``, ``[llm] guide_points`` is 0, or the study has no
    shapes (a template the LLM just wrote: its own point comes first, the job's strategy tunes it)."""
    spec = run.job.llm
    if spec is None or spec.guide_points <= 0 or not shapes:
        return None
    return PointAdvisor(spec, job_name=run.job.name, store=run.store, block=run.catalog.block(template.block_id),
                        template=template, shapes=shapes, dtype_name=run.dtype_name, env=run.env,
                        count=spec.guide_points, progress=run.progress, seed=run.job.seed)


def _stored_exchange(rows: list) -> Exchange:
    """The exchange one stored request had (as the replaying generator rebuilds it)."""
    request = json.loads(rows[-1].request)
    messages = request.pop("messages", [])
    return Exchange(messages, request, [Attempt(r.attempt, r.status, r.latency_s or 0.0, text=r.response,
                                                finish_reason=r.finish_reason, prompt_tokens=r.prompt_tokens,
                                                completion_tokens=r.completion_tokens, http_status=r.http_status,
                                                error=r.error) for r in rows])


def _compact(point: Mapping[str, Any]) -> str:
    return json.dumps(dict(point), default=str)


def _cut(text: str, limit: int) -> str:
    return text if len(text) <= limit else text[:limit] + "\n... (cut)"


def _summary(advice: Advice) -> str:
    text = f"{len(advice.points)} point(s) taken, {len(advice.invalid)} refused"
    if advice.invalid:
        text += ": " + "; ".join(f"{_compact(p) if isinstance(p, dict) else p!r}: {why}"
                                 for p, why in advice.invalid[:5])
    if advice.error:
        text += f" ({advice.error})"
    return cut(re.sub(r"\s+", " ", text), 2 * NOTE)
