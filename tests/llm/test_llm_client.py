"""The chat client against a real (loopback) OpenAI-compatible server: answers, retries with
backoff, Retry-After, timeouts, and the endpoint failures that stop the generator, with the API key
never appearing in what is recorded."""

from __future__ import annotations

from email.utils import format_datetime
from datetime import datetime, timedelta, timezone

import pytest

from kernelforge.llm.client import OpenAIChatClient, adapted_params, retry_after
from llm_server import Reply, ScriptedServer, refusing_port

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
    with refusing_port() as port:
        exchange = client(f"http://127.0.0.1:{port}/v1", max_retries=1).complete(MESSAGES)
    assert [a.status for a in exchange.attempts] == ["unreachable", "unreachable"]
    assert exchange.fatal and "cannot connect" in exchange.fatal


def test_retry_after_header_forms():
    later = format_datetime(datetime.now(timezone.utc) + timedelta(seconds=30), usegmt=True)
    assert retry_after({"retry-after": "2"}) == 2.0
    assert retry_after({"retry-after-ms": "250", "retry-after": "9"}) == 0.25
    assert 20 < retry_after({"retry-after": later}) <= 31
    assert retry_after({"retry-after": "soon"}) is None and retry_after({}) is None


# -- compatibility: temperature, the token limit's name, extra fields and headers, no key ---------

UNSUPPORTED_MAX_TOKENS = ("Unsupported parameter: 'max_tokens' is not supported with this model. "
                          "Use 'max_completion_tokens' instead.")
UNSUPPORTED_TEMPERATURE = ("Unsupported value: 'temperature' does not support 0.5 with this model. "
                           "Only the default (1) value is supported.")


def bare(base_url: str, **kwargs) -> OpenAIChatClient:
    options = {"base_url": base_url, "model": "scripted", "api_key": KEY, "timeout_s": 5.0, "max_retries": 0,
               **kwargs}
    return OpenAIChatClient(**options)


def test_an_unset_temperature_is_not_sent_and_the_token_limit_takes_the_chosen_name():
    with ScriptedServer([Reply("a"), Reply("b")]) as server:
        bare(server.base_url, response_tokens=700).complete(MESSAGES)
        bare(server.base_url, response_tokens=700, token_limit_field="max_completion_tokens").complete(MESSAGES)
    first, second = server.requests
    assert "temperature" not in first and first["max_tokens"] == 700 and "max_completion_tokens" not in first
    assert second["max_completion_tokens"] == 700 and "max_tokens" not in second


def test_extra_body_fields_are_sent_and_stored_and_headers_are_sent_but_never_stored():
    secret = "hdr-secret-KFCLIENT-9876543210"
    with ScriptedServer([Reply("ok")]) as server:
        exchange = bare(server.base_url, temperature=0.3,
                        extra_body={"options": {"num_ctx": 16384}, "reasoning_effort": "high"},
                        headers={"X-Team": "kernels", "X-Secret": secret}).complete(MESSAGES)
    body, headers = server.requests[0], server.headers[0]
    assert body["options"] == {"num_ctx": 16384} and body["reasoning_effort"] == "high"
    assert body["temperature"] == 0.3 and body["model"] == "scripted" and body["messages"] == MESSAGES
    assert headers["x-team"] == "kernels" and headers["x-secret"] == secret
    stored = exchange.request_json()
    assert '"num_ctx": 16384' in stored and '"reasoning_effort": "high"' in stored
    assert secret not in stored and "kernels" not in stored and KEY not in stored


@pytest.mark.parametrize("max_retries", [0, 2])
def test_a_refused_token_limit_name_is_switched_at_once_and_kept_for_the_run(max_retries):
    script = [Reply(status=400, message=UNSUPPORTED_MAX_TOKENS), Reply("first"), Reply("second")]
    with ScriptedServer(script) as server:
        c = bare(server.base_url, response_tokens=500, max_retries=max_retries)
        one, two = c.complete(MESSAGES), c.complete(MESSAGES)
    assert [a.status for a in one.attempts] == ["bad_request", "ok"] and one.text == "first"
    assert one.attempts[0].http_status == 400 and "max_completion_tokens" in one.attempts[0].error
    assert [a.status for a in two.attempts] == ["ok"] and two.text == "second"
    sent = [("max_tokens" in r, r.get("max_completion_tokens")) for r in server.requests]
    assert sent == [(True, None), (False, 500), (False, 500)]
    assert '"max_completion_tokens": 500' in one.request_json()  # the stored request is the one that worked


def test_a_refused_temperature_is_dropped_and_a_plain_400_is_not_retried():
    script = [Reply(status=400, message=UNSUPPORTED_TEMPERATURE), Reply("ok"), Reply(status=400, message="bad")]
    with ScriptedServer(script) as server:
        c = bare(server.base_url, temperature=0.5, max_retries=2)
        adapted, refused = c.complete(MESSAGES), c.complete(MESSAGES)
    assert [a.status for a in adapted.attempts] == ["bad_request", "ok"]
    assert [("temperature" in r) for r in server.requests] == [True, False, False]
    assert [a.status for a in refused.attempts] == ["bad_request"] and not refused.ok and refused.fatal is None


def test_a_keyless_local_server_gets_no_real_key(monkeypatch):
    # The package would read OPENAI_API_KEY when given no key: it must not be sent anywhere.
    env_key = "sk-env-KFCLIENT-shouldnotbesent-01234"
    monkeypatch.setenv("OPENAI_API_KEY", env_key)
    monkeypatch.setenv("OPENAI_ADMIN_KEY", env_key)
    with ScriptedServer([Reply("local answer")]) as server:
        exchange = bare(server.base_url, api_key=None).complete(MESSAGES)
    assert exchange.ok and exchange.text == "local answer"
    assert env_key not in server.auth[0] and all(env_key not in v for v in server.headers[0].values())


def test_adapted_params_reads_openai_messages_only():
    sent = {"model": "m", "max_tokens": 9, "temperature": 0.5}
    assert adapted_params(sent, UNSUPPORTED_MAX_TOKENS) == {"model": "m", "max_completion_tokens": 9,
                                                            "temperature": 0.5}
    assert adapted_params(sent, UNSUPPORTED_TEMPERATURE) == {"model": "m", "max_tokens": 9}
    back = {"model": "m", "max_completion_tokens": 9}
    assert adapted_params(back, "Unsupported parameter: 'max_completion_tokens'; use 'max_tokens'") == \
        {"model": "m", "max_tokens": 9}
    assert adapted_params(sent, "400 request refused: messages must not be empty") is None
    assert adapted_params({"model": "m"}, UNSUPPORTED_TEMPERATURE) is None  # nothing to drop


# -- endpoints: the secrets read when the search starts, one client per model, the weighted choice --

def test_header_references_are_read_from_the_environment_registered_and_a_missing_one_is_named(monkeypatch):
    from kernelforge.llm.endpoints import EndpointUnusable, make_clients
    from kernelforge.llm_spec import LLMSpec, ModelSpec
    from kernelforge.redact import redact

    token = "tok-KFCLIENT-header-5566778899"
    monkeypatch.setenv("KF_TEST_HEADER_TOKEN", token)
    monkeypatch.delenv("KF_TEST_UNSET_VAR", raising=False)
    with ScriptedServer([Reply("a"), Reply("b")]) as server:
        spec = LLMSpec(max_retries=0, timeout_s=5.0, headers=(("X-Token", "${KF_TEST_HEADER_TOKEN}"),),
                       models=(ModelSpec("first", server.base_url, extra_body=(("num_ctx", 8192),)),
                               ModelSpec("second", server.base_url, temperature=0.2, weight=2.0)))
        clients = make_clients(spec, seed=0, deadline=None)
        exchanges = [c.complete(MESSAGES) for c in clients]
    assert [c.model for c in clients] == ["first", "second"]
    assert [h["x-token"] for h in server.headers] == [token, token]
    assert server.requests[0]["num_ctx"] == 8192 and "temperature" not in server.requests[0]
    assert server.requests[1]["temperature"] == 0.2 and "num_ctx" not in server.requests[1]
    assert redact(f"sent {token}") == "sent ***"  # registered as a secret when read
    assert all(token not in e.request_json() for e in exchanges)
    with pytest.raises(EndpointUnusable, match="KF_TEST_UNSET_VAR is not set"):
        make_clients(LLMSpec(base_url="http://127.0.0.1:9/v1", model="m",
                             headers=(("X-Token", "${KF_TEST_UNSET_VAR}"),)), seed=0, deadline=None)
    with pytest.raises(EndpointUnusable, match="KF_TEST_UNSET_VAR is not set"):
        make_clients(LLMSpec(base_url="http://127.0.0.1:9/v1", model="m", api_key_env="KF_TEST_UNSET_VAR"),
                     seed=0, deadline=None)


def test_the_weighted_choice_follows_the_weights_in_the_same_order_every_run():
    from kernelforge.llm.endpoints import WeightedChoice

    first = WeightedChoice([3, 1], seed=0)
    order = [first.next() for _ in range(8)]
    assert order.count(0) == 6 and order.count(1) == 2
    again = WeightedChoice([3, 1], seed=0)
    assert [again.next() for _ in range(8)] == order
    assert [WeightedChoice([1], seed=5).next() for _ in range(3)] == [0, 0, 0]
    with pytest.raises(ValueError):
        WeightedChoice([1, 0])


def test_a_request_in_flight_is_cut_off_at_the_wall_time_budget():
    import time

    with ScriptedServer([Reply("too late", delay=4.0)]) as server:
        c = OpenAIChatClient(base_url=server.base_url, model="scripted", api_key=KEY, timeout_s=60.0,
                             max_retries=0, deadline=time.monotonic() + 1.0)
        exchange = c.complete(MESSAGES)
    assert [a.status for a in exchange.attempts] == ["request_timeout"] and not exchange.ok
    assert "before the wall-time budget ran out" in exchange.attempts[0].error
