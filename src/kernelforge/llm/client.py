"""Chat-completions clients: any OpenAI-compatible endpoint (hosted APIs, local servers).

One :meth:`ChatClient.complete` call is one *request*: up to ``1 + max_retries`` HTTP *attempts*,
each recorded (status, latency, tokens, the response or the error), with backoff between them.
Retried: timeouts, connection failures, 5xx, 429 (after the server's Retry-After, or backoff when
it gives none). Not retried: 400 (this request is bad; the next one may be fine), except a 400
saying the token limit's field name or ``temperature`` is unsupported: retried at once with the
other name / without temperature, and so for the rest of the run (:func:`adapted_params`). Fatal for the
whole generator (:attr:`Exchange.fatal`): 401/403 (key), 404 (base URL or model), an endpoint that
cannot be reached at all; the generator stops with that one message and the search goes on.

The API key is held in memory only and registered with the one redactor (:mod:`kernelforge.redact`)
when a client is made. Every message is redacted just before it is sent (the key travels only in
the Authorization header), and every text that leaves this module (errors, responses) is redacted
as it arrives, because servers echo credentials in error bodies and answers. Extra headers
(``[llm.headers]``) are sent and never recorded; the recorded request is the JSON body sent.
"""

from __future__ import annotations

import email.utils
import hashlib
import json
import random
import threading
import time
from dataclasses import dataclass, field
from typing import Any, Mapping

from kernelforge.redact import redact, redact_data, register
from kernelforge.textsafe import NOTE, cut

#: Kinds of a failed attempt, and whether the generator retries it.
#: The shortest wait a request is given, even with its budget about spent.
MIN_WAIT_S = 1.0
RETRYABLE = {"request_timeout", "rate_limited", "server_error", "unreachable", "bad_response"}
FATAL = {"auth_error", "not_found"}
#: What is sent as the key when there is none (a local server): the package requires one.
NO_KEY = "no-key"
#: The two names of the response-token limit (kernelforge.llm_spec.TOKEN_LIMIT_FIELDS).
TOKEN_FIELDS = ("max_tokens", "max_completion_tokens")


@dataclass(frozen=True)
class Attempt:
    """One HTTP attempt of a request."""

    attempt: int
    status: str  # ok | request_timeout | rate_limited | server_error | unreachable | auth_error | ...
    latency_s: float
    text: str | None = None
    finish_reason: str | None = None
    prompt_tokens: int | None = None
    completion_tokens: int | None = None
    http_status: int | None = None
    error: str | None = None
    retry_after_s: float | None = None

    @property
    def tokens(self) -> int:
        return (self.prompt_tokens or 0) + (self.completion_tokens or 0)


@dataclass
class Exchange:
    """A request and every attempt made for it. ``ok`` when the last attempt returned a response."""

    messages: list[dict[str, str]]
    params: dict[str, Any]
    attempts: list[Attempt] = field(default_factory=list)
    fatal: str | None = None  # set when the endpoint cannot serve any request: stop the generator
    base_url: str = ""  # the endpoint that served it ("" when not a live request)

    @property
    def final(self) -> Attempt | None:
        return self.attempts[-1] if self.attempts else None

    @property
    def ok(self) -> bool:
        return self.final is not None and self.final.status == "ok"

    @property
    def text(self) -> str:
        return (self.final.text or "") if self.ok else ""

    @property
    def tokens(self) -> int:
        return sum(a.tokens for a in self.attempts)

    def request_json(self) -> str:
        """The request as stored: messages and sampling parameters (never credentials)."""
        return json.dumps({"messages": self.messages, **self.params}, sort_keys=True)

    def request_hash(self) -> str:
        return hashlib.sha256(self.request_json().encode("utf-8")).hexdigest()[:16]


def retry_after(headers: Any) -> float | None:
    """Seconds to wait from a response's ``retry-after-ms`` or ``retry-after`` header (seconds or
    an HTTP date); None when absent or unreadable."""
    if headers is None:
        return None
    try:
        ms = headers.get("retry-after-ms")
        if ms is not None:
            return max(0.0, float(ms) / 1000.0)
        value = headers.get("retry-after")
    except Exception:  # headers of an unexpected type: no hint
        return None
    if value is None:
        return None
    try:
        return max(0.0, float(value))
    except ValueError:
        pass
    try:
        when = email.utils.parsedate_to_datetime(value)
    except (TypeError, ValueError):
        return None
    return max(0.0, when.timestamp() - time.time())


class ChatClient:
    """Base of the clients: ``complete(messages) -> Exchange``. Safe to call from several threads."""

    model: str = ""
    base_url: str = ""

    def complete(self, messages: list[dict[str, str]]) -> Exchange:  # pragma: no cover - interface
        raise NotImplementedError

    def close(self) -> None:
        pass


class OpenAIChatClient(ChatClient):
    """The ``openai`` package against ``base_url`` (``.../v1``), with kernelforge's own retry loop.

    The package's retries are turned off (``max_retries=0``) so that every attempt is seen and
    recorded, Retry-After is honoured without the package's 60 s ceiling, and backoff respects
    the generator's wall-time budget (``deadline``, a ``time.monotonic()`` value).
    """

    #: First backoff in seconds; doubles per retry (with +-25% jitter), capped at :attr:`backoff_max`.
    backoff_base = 1.0
    backoff_max = 30.0
    #: A Retry-After longer than this is not waited for: the attempt counts as failed.
    max_retry_after = 300.0

    def __init__(self, *, base_url: str, model: str, api_key: str | None, timeout_s: float, max_retries: int,
                 temperature: float | None = None, response_tokens: int | None = None, seed: int = 0,
                 deadline: float | None = None, token_limit_field: str = "max_tokens",
                 extra_body: Mapping[str, Any] | None = None, headers: Mapping[str, str] | None = None):
        import openai  # lazily: the GPU image has no openai

        self._openai = openai
        self.base_url = base_url
        self.model = model
        self.timeout_s = timeout_s
        self.max_retries = max_retries
        self.deadline = deadline
        register(api_key)
        # The body: the job's extra fields, then what the generator controls (never overridden).
        self.params: dict[str, Any] = {**(extra_body or {}), "model": model}
        if temperature is not None:  # unset: not sent (reasoning models refuse any temperature)
            self.params["temperature"] = temperature
        if response_tokens is not None:
            self.params[token_limit_field] = response_tokens
        # Sent, never recorded (Exchange.params holds the body only): values may be secrets.
        self._headers = dict(headers or {})
        self._lock = threading.Lock()
        self._adapted: set[str] = set()  # fields given up on after a server refused them
        self._rng = random.Random(seed)
        # A local server needs no key, but the package insists on one (and would otherwise read
        # OPENAI_API_KEY from the environment): send a placeholder that is no secret.
        self._client = openai.OpenAI(api_key=api_key or NO_KEY, base_url=base_url, timeout=timeout_s,
                                     max_retries=0)

    def complete(self, messages: list[dict[str, str]]) -> Exchange:
        # What is sent is what is recorded: both without any registered secret.
        messages = redact_data(messages)
        with self._lock:
            exchange = Exchange(messages=messages, params=dict(self.params), base_url=self.base_url)
        number, last = 0, self.max_retries
        while number <= last:
            attempt = self._attempt(messages, number, exchange.params)
            exchange.attempts.append(attempt)
            if attempt.status == "ok":
                break
            if attempt.status == "bad_request":
                changed = self._adapt(exchange.params, attempt.error or "")
                if changed is not None:
                    # At once, one more attempt, and for the rest of the run: the server said what
                    # it refuses. The stored request is the body last sent.
                    exchange.params = changed
                    number, last = number + 1, last + 1
                    continue
            if attempt.status in FATAL:
                exchange.fatal = attempt.error
                break
            if attempt.status not in RETRYABLE or number == self.max_retries:
                if attempt.status == "unreachable":
                    exchange.fatal = attempt.error
                break
            wait = attempt.retry_after_s if attempt.retry_after_s is not None else self._backoff(number)
            if wait > self.max_retry_after or (self.deadline is not None and time.monotonic() + wait > self.deadline):
                break  # waiting would outlast the budget: this request has failed
            time.sleep(wait)
            number += 1
        return exchange

    def _adapt(self, sent: dict[str, Any], error: str) -> dict[str, Any] | None:
        """The body to retry with when a 400 says a field of ``sent`` is unsupported (the token
        limit's name, or temperature), also kept for later requests; None when it says nothing of
        the kind."""
        fixed = adapted_params(sent, error)
        if fixed is None:
            return None
        with self._lock:
            # Each fix once per client: a server that refuses both names cannot make it flip forever.
            kinds = {k for k in ("temperature", *TOKEN_FIELDS) if k in sent and k not in fixed}
            if kinds & self._adapted:
                return None
            self._adapted |= kinds
            self.params = dict(fixed)
        return fixed

    def _backoff(self, number: int) -> float:
        base = min(self.backoff_max, self.backoff_base * 2 ** number)
        return base * (0.75 + 0.5 * self._rng.random())

    def _attempt(self, messages: list[dict[str, str]], number: int, params: dict[str, Any]) -> Attempt:
        openai = self._openai
        start = time.monotonic()

        def failed(status: str, error: str, http_status: int | None = None, wait: float | None = None) -> Attempt:
            return Attempt(number, status, time.monotonic() - start, http_status=http_status,
                           error=cut(redact(error)), retry_after_s=wait)

        # A request waits at most timeout_s, and never past the generator's wall-time budget.
        limit = self.timeout_s
        if self.deadline is not None:
            limit = max(MIN_WAIT_S, min(limit, self.deadline - start))
        try:
            # Every field but the model travels as extra_body: the package's keyword arguments do
            # not know a local server's fields, and the body must be exactly what is recorded.
            body = {k: v for k, v in params.items() if k != "model"}
            response = self._client.chat.completions.create(model=params["model"], messages=messages,
                                                            extra_body=body, extra_headers=self._headers or None,
                                                            timeout=limit)
        except openai.APITimeoutError:
            if limit < self.timeout_s:
                return failed("request_timeout", f"no response before the wall-time budget ran out ({limit:.0f} s "
                                                 "left of [llm] max_minutes)")
            return failed("request_timeout", f"no response within {self.timeout_s:g} s (timeout_s)")
        except openai.APIConnectionError as exc:
            return failed("unreachable", f"cannot connect to {self.base_url}: {_cause(exc)}; "
                                         "check [llm] base_url and that the server is running")
        except openai.RateLimitError as exc:
            return failed("rate_limited", f"429 rate limited: {_body(exc)}", 429, retry_after(exc.response.headers))
        except openai.AuthenticationError as exc:
            return failed("auth_error", f"{exc.status_code} the endpoint refused the credentials: {_body(exc)}; "
                                        "set [llm] api_key_env to the variable holding a valid key", exc.status_code)
        except openai.PermissionDeniedError as exc:
            return failed("auth_error", f"{exc.status_code} permission denied: {_body(exc)}", exc.status_code)
        except openai.NotFoundError as exc:
            return failed("not_found", f"404 at {self.base_url}/chat/completions for model {self.model!r}: "
                                       f"{_body(exc)}; check [llm] base_url (it usually ends in /v1) and model", 404)
        except openai.APIStatusError as exc:
            status = exc.status_code
            if status >= 500 or status in (408, 409):
                return failed("server_error", f"{status} server error: {_body(exc)}", status,
                              retry_after(exc.response.headers))
            return failed("bad_request", f"{status} request refused: {_body(exc)}", status)
        except openai.APIError as exc:  # a malformed body, an unexpected answer
            return failed("bad_response", f"unusable response: {type(exc).__name__}: {exc}")
        latency = time.monotonic() - start
        try:
            choice = response.choices[0]
            text = choice.message.content or ""
            finish = choice.finish_reason
        except (AttributeError, IndexError, TypeError):
            return failed("bad_response", "the response has no choices[0].message")
        usage = getattr(response, "usage", None)
        return Attempt(number, "ok", latency, text=redact(text), finish_reason=finish,
                       prompt_tokens=getattr(usage, "prompt_tokens", None),
                       completion_tokens=getattr(usage, "completion_tokens", None), http_status=200)

    def close(self) -> None:
        try:
            self._client.close()
        except Exception:  # closing a client must never fail a search
            pass


def adapted_params(sent: dict[str, Any], error: str) -> dict[str, Any] | None:
    """``sent`` fixed as a 400's ``error`` asks, or None when it does not ask for what can be fixed:
    the token limit under its other name (OpenAI: "Unsupported parameter: 'max_tokens' ... Use
    'max_completion_tokens' instead.") or no temperature ("Unsupported value: 'temperature' ...")."""
    text = error.lower()
    if "unsupported" not in text and "not supported" not in text:
        return None
    for name, other in (TOKEN_FIELDS, TOKEN_FIELDS[::-1]):
        if name in sent and name in text and other in text.replace(name, ""):
            fixed = {k: v for k, v in sent.items() if k != name}
            fixed[other] = sent[name]
            return fixed
    if "temperature" in sent and "temperature" in text:
        return {k: v for k, v in sent.items() if k != "temperature"}
    return None


def _cause(exc: BaseException) -> str:
    cause = exc.__cause__ or exc.__context__
    return f"{type(cause).__name__}: {cause}" if cause else str(exc)


def _body(exc: Any) -> str:
    body = getattr(exc, "body", None)
    if isinstance(body, dict):
        message = body.get("message") or body.get("error", {})
        if isinstance(message, dict):
            message = message.get("message")
        if message:
            return cut(redact(str(message)), NOTE)  # masked before it is cut: no piece of a key survives
    return cut(redact(str(getattr(exc, "message", exc))), NOTE)
