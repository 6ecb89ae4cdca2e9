"""From the ``[llm]`` table to chat clients: the secrets read from the environment when the search
starts (each model's key, ``"${NAME}"`` header values), one client per model, and which model a
new request goes to (by weight, deterministically).

A secret is registered with :mod:`kernelforge.redact` the moment it is read and lives only in the
client that sends it; a missing variable is one :class:`EndpointUnusable` message naming it.
"""

from __future__ import annotations

import os
from typing import Sequence

from kernelforge.llm.client import OpenAIChatClient
from kernelforge.llm_spec import ENV_REFERENCE, LLMSpec, ModelSpec
from kernelforge.redact import redact, redact_url, register


class EndpointUnusable(Exception):
    """The configuration cannot make a client (a variable not set, the package refusing it):
    the generator stops with this message and the search goes on."""


def api_key(model: ModelSpec) -> str | None:
    """The key of ``model`` from the variable its ``api_key_env`` names (None: it names none)."""
    if not model.api_key_env:
        return None
    key = os.environ.get(model.api_key_env)
    register(key)  # from now on, masked in everything this process writes
    if not key:
        raise EndpointUnusable(f"[llm] api_key_env: the environment variable {model.api_key_env} is not set; "
                               "set it to the endpoint's API key")
    return key


def headers(spec: LLMSpec) -> dict[str, str]:
    """``[llm.headers]`` with every ``"${NAME}"`` value read from $NAME (and registered as a secret)."""
    out = {}
    for name, value in spec.headers:
        reference = ENV_REFERENCE.fullmatch(value)
        if reference:
            variable = reference.group(1)
            value = os.environ.get(variable) or ""
            register(value)
            if not value:
                raise EndpointUnusable(f"[llm.headers] {name}: the environment variable {variable} is not set; "
                                       f"set it to the header's value")
        out[name] = value
    return out


def make_clients(spec: LLMSpec, *, seed: int, deadline: float | None,
                 max_retries: int | None = None) -> list[OpenAIChatClient]:
    """One client per model of ``spec`` (:meth:`LLMSpec.endpoints`), in order. Every key and
    header is read (and registered) before any client is made, so a missing one is reported
    before anything is sent. Raises :class:`EndpointUnusable`."""
    models = spec.endpoints()
    keys = [api_key(m) for m in models]
    extra_headers = headers(spec)
    clients = []
    for model, key in zip(models, keys):
        try:
            clients.append(OpenAIChatClient(
                base_url=model.base_url, model=model.model, api_key=key, timeout_s=spec.timeout_s,
                max_retries=spec.max_retries if max_retries is None else max_retries,
                temperature=model.temperature, response_tokens=spec.response_tokens, seed=seed, deadline=deadline,
                token_limit_field=spec.token_limit_field, extra_body=model.body, headers=extra_headers))
        except Exception as exc:  # the openai package missing or refusing the settings
            for made in clients:
                made.close()
            raise EndpointUnusable(f"cannot create the chat client for {redact_url(model.base_url)}: "
                                   f"{type(exc).__name__}: {redact(str(exc))}") from None
    return clients


class WeightedChoice:
    """Which model each new request goes to: smooth weighted round robin (nginx's), so over any
    stretch of requests each model's share follows its weight as closely as whole requests allow,
    and the order is the same in every run (``seed`` only rotates where the cycle starts)."""

    def __init__(self, weights: Sequence[float], seed: int = 0):
        if not weights or any(w <= 0 for w in weights):
            raise ValueError("weights must be positive")
        self.weights = [float(w) for w in weights]
        self._current = [0.0] * len(self.weights)
        for _ in range(seed % max(1, len(self.weights))):
            self.next()

    def next(self) -> int:
        total = sum(self.weights)
        for i, w in enumerate(self.weights):
            self._current[i] += w
        best = max(range(len(self.weights)), key=lambda i: (self._current[i], -i))
        self._current[best] -= total
        return best
