"""The chat client against a real (loopback) OpenAI-compatible server: answers, retries with
backoff, Retry-After, timeouts, and the endpoint failures that stop the generator, with the API key
never appearing in what is recorded."""

from __future__ import annotations

import socket
from email.utils import format_datetime
from datetime import datetime, timedelta, timezone

import pytest

from kernelforge.llm.client import OpenAIChatClient, retry_after
from llm_server import Reply, ScriptedServer

KEY = "sk-test-KFCLIENT-0123456789abcdef"
MESSAGES = [{"role": "system", "content": "rules"}, {"role": "user", "content": "write a kernel"}]


def client(base_url: str, *, timeout_s: float = 5.0, max_retries: int = 2, key: str | None = KEY) -> OpenAIChatClient:
    c = OpenAIChatClient(base_url=base_url, model="scripted", api_key=key, timeout_s=timeout_s,
                         max_retries=max_retries, temperature=0.5, response_tokens=900)
    c.backoff_base = 0.01  # the backoff schedule is not what these tests measure
    return c


def test_an_answer_carries_text_tokens_and_the_request_without_credentials():
    with ScriptedServer([Reply("```python\nx = 1\n```", finish_reason="stop")]) as server:
        exchange = client(server.base_url).complete(MESSAGES)
    assert exchange.ok and exchange.fatal is None
    assert exchange.text == "```python\nx = 1\n```"
    final = exchange.final
    assert final.finish_reason == "stop" and final.http_status == 200
    assert final.prompt_tokens > 0 and final.completion_tokens > 0
    assert server.requests[0]["model"] == "scripted" and server.requests[0]["messages"] == MESSAGES
    assert server.requests[0]["max_tokens"] == 900 and server.requests[0]["temperature"] == 0.5
    assert server.auth == [f"Bearer {KEY}"]  # the key was sent...
    assert KEY not in exchange.request_json() and "write a kernel" in exchange.request_json()  # ...not stored
    assert len(exchange.request_hash()) == 16


def test_rate_limit_waits_for_retry_after_then_succeeds():
    with ScriptedServer([Reply(status=429, headers={"Retry-After": "0.2"}), Reply("done")]) as server:
        exchange = client(server.base_url).complete(MESSAGES)
    assert [a.status for a in exchange.attempts] == ["rate_limited", "ok"]
    assert exchange.attempts[0].retry_after_s == pytest.approx(0.2) and exchange.attempts[0].http_status == 429
    assert exchange.text == "done" and len(server.requests) == 2


@pytest.mark.parametrize("first, status", [(Reply(status=500), "server_error"),
                                           (Reply("late", delay=3.0), "request_timeout")])
def test_server_errors_and_timeouts_are_retried(first, status):
    with ScriptedServer([first, Reply("second try")]) as server:
        exchange = client(server.base_url, timeout_s=0.5).complete(MESSAGES)
    assert [a.status for a in exchange.attempts] == [status, "ok"]
    assert exchange.text == "second try" and exchange.fatal is None


def test_a_request_fails_once_its_retries_are_spent_without_stopping_the_generator():
    with ScriptedServer([Reply(status=500), Reply(status=500), Reply("never asked")]) as server:
        exchange = client(server.base_url, max_retries=1).complete(MESSAGES)
    assert [a.status for a in exchange.attempts] == ["server_error", "server_error"]
    assert not exchange.ok and exchange.fatal is None and len(server.requests) == 2


def test_a_refused_key_is_fatal_at_once_and_redacted():
    with ScriptedServer([Reply(status=401, echo_key=True), Reply("never asked")]) as server:
        exchange = client(server.base_url).complete(MESSAGES)
    assert [a.status for a in exchange.attempts] == ["auth_error"] and len(server.requests) == 1
    assert exchange.fatal and "api_key_env" in exchange.fatal
    assert KEY not in exchange.fatal and "***" in exchange.fatal  # the server echoed it; we did not keep it


def test_a_wrong_base_url_is_fatal_and_says_what_to_check():
    with ScriptedServer([Reply("never asked")]) as server:
        exchange = client(server.base_url.removesuffix("/v1")).complete(MESSAGES)
    assert exchange.final.status == "not_found" and "base_url" in exchange.fatal


def test_an_unreachable_endpoint_is_fatal_after_its_retries():
    with socket.socket() as sock:  # a port nobody listens on once this closes
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    exchange = client(f"http://127.0.0.1:{port}/v1", max_retries=1).complete(MESSAGES)
    assert [a.status for a in exchange.attempts] == ["unreachable", "unreachable"]
    assert exchange.fatal and "cannot connect" in exchange.fatal


def test_retry_after_header_forms():
    later = format_datetime(datetime.now(timezone.utc) + timedelta(seconds=30), usegmt=True)
    assert retry_after({"retry-after": "2"}) == 2.0
    assert retry_after({"retry-after-ms": "250", "retry-after": "9"}) == 0.25
    assert 20 < retry_after({"retry-after": later}) <= 31
    assert retry_after({"retry-after": "soon"}) is None and retry_after({}) is None
