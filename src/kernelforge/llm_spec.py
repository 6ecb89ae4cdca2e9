"""The ``[llm]`` table of a job file: the LLM candidate generator's endpoints, budgets and request
shape (:class:`LLMSpec`, one :class:`ModelSpec` per model), validated by :func:`parse_llm`.

::

    [llm]
    base_url = "http://127.0.0.1:8000/v1"   # any OpenAI-compatible chat-completions endpoint
    model = "my-model"
    api_key_env = "OPENAI_API_KEY"          # the NAME of the variable holding the key, never the key
    token_limit_field = "max_completion_tokens"
    [llm.extra_body]                        # merged into every request body
    reasoning_effort = "high"
    [llm.headers]                           # sent with every request; "${NAME}": read from $NAME
    "X-Team" = "kernels"

    [[llm.models]]                          # optional: several models, chosen by weight
    model = "big"
    weight = 3

Every mistake names the file, the field and the fix (:class:`kernelforge.errors.UserError`).
"""

from __future__ import annotations

import difflib
import os
import re
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

from kernelforge.fields import typed  # re-exported: the one check of a value's type
from kernelforge.errors import UserError
from kernelforge.redact import redact_url, register, register_url

#: The most points ``[llm] guide_points`` may ask the LLM for (one answer; a longer list is a
#: bigger prompt and answer for points the job's strategy would find anyway).
MAX_GUIDE_POINTS = 64

#: The request fields that may carry the response-token limit (``response_tokens``): OpenAI's
#: reasoning models accept only ``max_completion_tokens``, most other servers only ``max_tokens``.
TOKEN_LIMIT_FIELDS = ("max_tokens", "max_completion_tokens")

#: Request fields the generator controls: ``[llm.extra_body]`` may not set them.
RESERVED_BODY_KEYS = frozenset({"messages", "model", "stream", "n"})

#: Header names the client sets itself (the key travels in Authorization, from ``api_key_env``).
RESERVED_HEADERS = frozenset({"authorization", "content-type", "content-length", "host"})

#: A header value that names an environment variable: ``"${NAME}"`` (the whole value).
ENV_REFERENCE = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*)\}")

LLM_KEYS = {"base_url", "model", "api_key_env", "max_calls", "max_tokens", "max_minutes", "concurrency",
            "timeout_s", "max_retries", "repair_turns", "temperature", "response_tokens", "tune_share",
            "tune_evaluations", "guide_points", "token_limit_field", "extra_body", "headers", "models",
            "price_in_per_mtok", "price_out_per_mtok"}
MODEL_KEYS = {"model", "base_url", "api_key_env", "weight", "temperature", "extra_body", "price_in_per_mtok",
              "price_out_per_mtok"}


@dataclass(frozen=True)
class ModelSpec:
    """One model the generator may ask: its endpoint, the variable holding its key (empty: none),
    its share of the new requests (``weight``, relative to the other models'), its sampling
    temperature (None: not sent) and the fields merged into its request bodies (``extra_body``,
    ``(name, value)`` pairs; values are TOML values, tables as dicts). ``price_in_per_mtok`` and
    ``price_out_per_mtok``: USD per million prompt / completion tokens, from the job file (None:
    not priced; the report's cost estimate needs both)."""

    model: str
    base_url: str = ""
    api_key_env: str = ""
    weight: float = 1.0
    temperature: float | None = None
    extra_body: tuple[tuple[str, Any], ...] = ()
    price_in_per_mtok: float | None = None
    price_out_per_mtok: float | None = None

    @property
    def body(self) -> dict[str, Any]:
        """``extra_body`` as a fresh dict (safe to change)."""
        return {k: v for k, v in self.extra_body}


@dataclass(frozen=True)
class LLMSpec:
    """The ``[llm]`` table: OpenAI-compatible chat-completions endpoints that write new templates.

    The API key is read from the environment variable named ``api_key_env`` when the search starts
    and is never stored, logged or reported (its value is registered with :mod:`kernelforge.redact`
    as soon as the job names the variable); empty means no key (a local server). Budgets bound
    the generator (``max_calls`` requests, ``max_tokens`` prompt + completion tokens, ``max_minutes``
    of wall time); ``concurrency`` requests are in flight at most, each with ``timeout_s`` and up
    to ``max_retries`` retries. A template that fails gets up to ``repair_turns`` follow-up turns
    with its error. ``tune_share`` of each block's evaluations is reserved for what the LLM writes
    (its templates, each tuned by the job's strategy for up to ``tune_evaluations`` more points,
    and the points it proposes); whatever the LLM leaves unused goes back to the human templates.

    Request shape: ``temperature`` is sent only when set (reasoning models refuse it);
    ``response_tokens`` is sent as ``token_limit_field``; ``extra_body`` pairs are merged into every
    request body, ``headers`` pairs sent with every request (a value ``"${NAME}"`` is read from the
    environment when the search starts: the spec holds the reference, never the value).

    ``models``: the ``[[llm.models]]`` entries with the top-level fields filled in as their
    defaults; empty when the job has none (then :meth:`endpoints` is the one top-level model).

    ``guide_points``: how many points of each study's space the LLM is asked for once, after the
    baseline points, before the job's strategy takes over (:mod:`kernelforge.llm.advisor`,
    :mod:`kernelforge.strategies.guided`); 0 (the default) asks for none.

    ``replay`` is set by ``kernelforge search --llm replay[:PATH]``: the storage URL whose stored
    transcripts answer instead of the endpoint.
    """

    base_url: str = ""
    model: str = ""
    api_key_env: str = ""
    max_calls: int = 20
    max_tokens: int = 400_000
    max_minutes: float | None = 30.0
    concurrency: int = 2
    timeout_s: float = 180.0
    max_retries: int = 3
    repair_turns: int = 2
    temperature: float | None = None
    response_tokens: int | None = None
    tune_share: float = 0.5
    tune_evaluations: int = 4
    guide_points: int = 0
    token_limit_field: str = "max_tokens"
    extra_body: tuple[tuple[str, Any], ...] = ()
    headers: tuple[tuple[str, str], ...] = ()
    models: tuple[ModelSpec, ...] = ()
    replay: str | None = None
    price_in_per_mtok: float | None = None
    price_out_per_mtok: float | None = None

    def endpoints(self) -> tuple[ModelSpec, ...]:
        """The models the generator asks: the ``[[llm.models]]`` entries, else the top-level one."""
        if self.models:
            return self.models
        return (ModelSpec(self.model, self.base_url, self.api_key_env, 1.0, self.temperature, self.extra_body,
                          self.price_in_per_mtok, self.price_out_per_mtok),)


def unknown_fields(where: str, table: dict[str, Any], allowed: set[str]) -> None:
    """Refuse a key of ``table`` not in ``allowed``, suggesting the closest allowed one."""
    for key in table:
        if key not in allowed:
            close = difflib.get_close_matches(key, sorted(allowed), n=1)
            hint = f"did you mean {close[0]}?" if close else f"allowed: {', '.join(sorted(allowed))}"
            raise UserError(f"{where}: unknown field {key!r} ({hint})")


def check_base_url(url: str, where: str) -> None:
    """An endpoint URL must be http(s)://host[...]; the message never repeats credentials in it."""
    register_url(url)
    parsed = urlsplit(url)
    if parsed.scheme not in ("http", "https") or not parsed.hostname:
        raise UserError(f"{where}: {redact_url(url)!r} is not an http(s) URL; give the endpoint's base URL, "
                        "e.g. http://127.0.0.1:8000/v1")


def _key_env(where: str, value: Any) -> str:
    key_env = typed(where, value, str, 'the name of an environment variable, e.g. "OPENAI_API_KEY"')
    if key_env and not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", key_env):
        # Never echo the value: it may be the key itself, pasted in by mistake.
        raise UserError(f"{where}: must be the NAME of an environment variable (letters, digits, _), "
                        "not the key itself; put the key in that variable")
    if key_env:
        register(os.environ.get(key_env))  # masked from the moment the job names it, before any request
    return key_env


def _temperature(where: str, value: Any) -> float | None:
    if value is None:
        return None
    typed(where, value, (int, float), "a number")
    if not 0.0 <= value <= 2.0:
        raise UserError(f"{where}: must be between 0.0 and 2.0, got {value}")
    return float(value)


def _prices(where: str, table: dict[str, Any], top: dict[str, Any]) -> tuple[float | None, float | None]:
    """The (prompt, completion) prices of ``table`` in USD per million tokens, ``top``'s as defaults."""
    prices = []
    for name in ("price_in_per_mtok", "price_out_per_mtok"):
        value = table.get(name, top.get(name))
        if value is not None:
            typed(f"{where} {name}", value, (int, float), "a number of USD per million tokens, e.g. 2.5")
            if value < 0:
                raise UserError(f"{where} {name}: must be 0 or more (USD per million tokens), got {value}")
            value = float(value)
        prices.append(value)
    if (prices[0] is None) != (prices[1] is None):
        raise UserError(f"{where}: give both price_in_per_mtok and price_out_per_mtok (USD per million prompt / "
                        "completion tokens; 0 for a free side) or neither")
    return prices[0], prices[1]


def _extra_body(where: str, value: Any) -> tuple[tuple[str, Any], ...]:
    typed(where, value, dict, 'a table, e.g. [llm.extra_body] reasoning_effort = "high"')
    for key in value:
        if key in RESERVED_BODY_KEYS:
            raise UserError(f"{where}: {key!r} is set by the generator and cannot be overridden; remove it "
                            f"(reserved: {', '.join(sorted(RESERVED_BODY_KEYS))})")
    return tuple(value.items())


#: An HTTP header name: RFC 9110's token characters.
_HEADER_NAME = re.compile(r"[A-Za-z0-9!#$%&'*+.^_`|~-]+")


def _headers(where: str, value: Any) -> tuple[tuple[str, str], ...]:
    typed(where, value, dict, 'a table of strings, e.g. [llm.headers] "X-Team" = "kernels"')
    for name, text in value.items():
        if name.lower() in RESERVED_HEADERS:
            raise UserError(f"{where}: {name!r} is set by the client; the key goes in the variable named by "
                            "api_key_env")
        if not _HEADER_NAME.fullmatch(name):
            raise UserError(f"{where}: {name!r} is not an HTTP header name (letters, digits and !#$%&'*+-.^_`|~, no "
                            "spaces or colons), e.g. \"X-Team\"")
        # Never echo the value: it may be a secret.
        if not isinstance(text, str):
            raise UserError(f'{where} {name}: expected a string (or "${{NAME}}" to read it from $NAME)')
        if any(c in text for c in "\r\n\x00"):
            raise UserError(f"{where} {name}: a header value cannot hold a line break or a NUL character")
        reference = ENV_REFERENCE.fullmatch(text)
        if reference:
            register(os.environ.get(reference.group(1)))
        elif "${" in text:
            raise UserError(f'{where} {name}: "${{NAME}}" is read from $NAME only as the whole value (it is sent as '
                            "written otherwise); put the whole value in the variable, e.g. "
                            f'{name} = "${{MY_HEADER}}"')
    return tuple(value.items())


def _models(where: str, entries: Any, top: dict[str, Any], require_endpoint: bool) -> tuple[ModelSpec, ...]:
    typed(where, entries, list, 'an array of tables, e.g. [[llm.models]] model = "gpt-4.1"')
    models = []
    for index, entry in enumerate(entries, start=1):
        at = f"{where} #{index}"
        typed(at, entry, dict, "a table")
        unknown_fields(at, entry, MODEL_KEYS)
        if "model" not in entry:
            raise UserError(f'{at}: missing model, e.g. model = "gpt-4.1"')
        model = typed(f"{at} model", entry["model"], str, 'a model name such as "gpt-4.1"')
        if not model:
            raise UserError(f'{at} model: must not be empty, e.g. model = "gpt-4.1"')
        base_url = typed(f"{at} base_url", entry.get("base_url", top["base_url"]), str, 'a URL')
        if base_url:
            check_base_url(base_url, f"{at} base_url")
        elif require_endpoint:
            raise UserError(f'{at}: missing base_url (here or in [llm]), e.g. base_url = "https://api.openai.com/v1"')
        weight = typed(f"{at} weight", entry.get("weight", 1.0), (int, float), "a positive number")
        if not weight > 0:
            raise UserError(f"{at} weight: must be above 0 (its share of the new requests), got {weight}")
        extra = _extra_body(f"{at} extra_body", entry["extra_body"]) if "extra_body" in entry else top["extra_body"]
        temperature = _temperature(f"{at} temperature", entry["temperature"]) if "temperature" in entry \
            else top["temperature"]
        key_env = _key_env(f"{at} api_key_env", entry["api_key_env"]) if "api_key_env" in entry \
            else top["api_key_env"]
        models.append(ModelSpec(model, base_url, key_env, float(weight), temperature, extra, *_prices(at, entry, top)))
    if not models:
        raise UserError(f"{where}: an empty list; list at least one model or remove it")
    return tuple(models)


def parse_llm(table: dict[str, Any], where: str, *, require_endpoint: bool = True) -> LLMSpec:
    """Validate an ``[llm]`` table (``where`` names it in messages). Without ``require_endpoint``
    base_url and model may be missing (the command line supplies them)."""
    unknown_fields(where, table, LLM_KEYS)
    defaults = LLMSpec()
    base_url = typed(f"{where} base_url", table.get("base_url", ""), str, 'a URL such as "http://127.0.0.1:8000/v1"')
    register_url(base_url)
    model = typed(f"{where} model", table.get("model", ""), str, 'a model name such as "gpt-4.1"')
    several = "models" in table
    if require_endpoint and not base_url and not several:
        raise UserError(f'{where}: missing base_url, e.g. base_url = "https://api.openai.com/v1"')
    if base_url:
        check_base_url(base_url, f"{where} base_url")
    if require_endpoint and not model and not several:
        raise UserError(f'{where}: missing model, e.g. model = "gpt-4.1"')
    key_env = _key_env(f"{where} api_key_env", table.get("api_key_env", ""))

    def integer(name: str, low: int) -> int:
        value = typed(f"{where} {name}", table.get(name, getattr(defaults, name)), int, "an integer")
        if value < low:
            raise UserError(f"{where} {name}: must be at least {low}, got {value}")
        return value

    def number(name: str, low: float, high: float | None = None, *, allow_zero: bool = False) -> float:
        value = typed(f"{where} {name}", table.get(name, getattr(defaults, name)), (int, float), "a number")
        if value < low or (value == low and not allow_zero) or (high is not None and value > high):
            bound = f"between {low} and {high}" if high is not None else f"above {low}"
            raise UserError(f"{where} {name}: must be {bound}, got {value}")
        return float(value)

    max_minutes = table.get("max_minutes", defaults.max_minutes)
    if "max_minutes" in table:
        max_minutes = number("max_minutes", 0.0)
    guide_points = integer("guide_points", 0)
    if guide_points > MAX_GUIDE_POINTS:
        raise UserError(f"{where} guide_points: must be between 0 and {MAX_GUIDE_POINTS} (points the LLM is asked "
                        f"for once per study; 0 asks for none), got {guide_points}")
    response_tokens = table.get("response_tokens")
    if response_tokens is not None:
        response_tokens = integer("response_tokens", 1)
    limit_field = typed(f"{where} token_limit_field", table.get("token_limit_field", defaults.token_limit_field),
                        str, '"max_tokens" or "max_completion_tokens"')
    if limit_field not in TOKEN_LIMIT_FIELDS:
        raise UserError(f"{where} token_limit_field: {limit_field!r} is not one of {', '.join(TOKEN_LIMIT_FIELDS)} "
                        "(the request field that carries response_tokens)")
    temperature = _temperature(f"{where} temperature", table.get("temperature"))
    extra_body = _extra_body(f"{where} extra_body", table["extra_body"]) if "extra_body" in table else ()
    headers = _headers(f"{where} headers", table["headers"]) if "headers" in table else ()
    price_in, price_out = _prices(where, table, {})
    top = {"base_url": base_url, "api_key_env": key_env, "temperature": temperature, "extra_body": extra_body,
           "price_in_per_mtok": price_in, "price_out_per_mtok": price_out}
    models_at = where.replace("[llm]", "[[llm.models]]") if "[llm]" in where else f"{where} models"
    models = _models(models_at, table["models"], top, require_endpoint) if several else ()
    return LLMSpec(
        base_url=base_url, model=model, api_key_env=key_env,
        max_calls=integer("max_calls", 1), max_tokens=integer("max_tokens", 1), max_minutes=max_minutes,
        concurrency=integer("concurrency", 1), timeout_s=number("timeout_s", 0.0),
        max_retries=integer("max_retries", 0), repair_turns=integer("repair_turns", 0),
        temperature=temperature, response_tokens=response_tokens,
        tune_share=number("tune_share", 0.0, 1.0), tune_evaluations=integer("tune_evaluations", 0),
        guide_points=guide_points, token_limit_field=limit_field, extra_body=extra_body, headers=headers,
        models=models, price_in_per_mtok=price_in, price_out_per_mtok=price_out,
    )
