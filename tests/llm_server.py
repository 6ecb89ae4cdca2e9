"""A small OpenAI-compatible chat-completions server for the tests: the real HTTP protocol on
127.0.0.1 at an ephemeral port, serving scripted replies in order (one per HTTP request, retries
included), so the LLM generator is tested through the real client with no mocks.

    with ScriptedServer([Reply(content="..."), Reply(status=429, headers={"Retry-After": "1"}), ...]) as server:
        server.base_url        # http://127.0.0.1:PORT/v1
        server.requests        # every request body received, in order
        server.headers         # the headers of each request (lower-case names), in order

Run it by hand to try the generator (``python tests/llm_server.py`` prints its URL and serves the
toy block's demo script: a faster kernel, a slower one and every kind of bad answer).
"""

from __future__ import annotations

import contextlib
import json
import socket
import threading
import time
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, Callable, Iterator


@contextlib.contextmanager
def refusing_port() -> Iterator[int]:
    """A loopback port bound here and never listened on while the block runs: connections to it
    are refused, and no other process can be given it meanwhile (a port closed before use can)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        yield sock.getsockname()[1]


@dataclass(frozen=True)
class Reply:
    """One scripted HTTP answer. ``status`` 200 sends a chat.completion with ``content``; others send
    an OpenAI-style error body. ``delay`` seconds pass before anything is sent (a slow model);
    ``echo_key`` puts the bearer token received into the error message (as some servers do);
    ``answer``, when given, writes the content from the bearer token received (a server that
    echoes the credential in its answer); ``message``, when given, is the error message of a
    non-200 reply (e.g. OpenAI's "Unsupported parameter: 'max_tokens' ..." with status 400)."""

    content: str = ""
    status: int = 200
    delay: float = 0.0
    headers: dict[str, str] = field(default_factory=dict)
    finish_reason: str = "stop"
    echo_key: bool = False
    label: str = ""
    answer: Callable[[str], str] | None = None
    message: str = ""


#: What the server answers once the script is used up: prose, no code.
EXHAUSTED = Reply(content="I have no further ideas for this kernel.", label="exhausted")


class ScriptedServer:
    """The server (a context manager). Thread-safe; requests are answered concurrently."""

    def __init__(self, script: list[Reply], *, loop: bool = False):
        self.script = list(script)
        self.loop = loop
        self.requests: list[dict[str, Any]] = []
        self.auth: list[str] = []
        self.headers: list[dict[str, str]] = []
        self.served: list[str] = []
        self.in_flight = 0
        self.max_in_flight = 0  # the most requests this server was answering at once
        self._lock = threading.Lock()
        self._next = 0
        self._server: ThreadingHTTPServer | None = None
        self._thread: threading.Thread | None = None

    @property
    def base_url(self) -> str:
        assert self._server is not None, "start the server first"
        return f"http://127.0.0.1:{self._server.server_address[1]}/v1"

    def _take(self, body: dict[str, Any], auth: str, headers: dict[str, str] | None = None) -> Reply:
        with self._lock:
            self.requests.append(body)
            self.auth.append(auth)
            self.headers.append(dict(headers or {}))
            if self._next < len(self.script):
                reply = self.script[self._next]
                self._next += 1
                if self.loop and self._next == len(self.script):
                    self._next = 0
            else:
                reply = EXHAUSTED
            self.served.append(reply.label or str(reply.status))
            return reply

    def start(self) -> "ScriptedServer":
        server = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args: Any) -> None:  # quiet: tests read their own output
                pass

            def _send(self, status: int, payload: dict[str, Any], headers: dict[str, str]) -> None:
                data = json.dumps(payload).encode()
                try:
                    self.send_response(status)
                    self.send_header("Content-Type", "application/json")
                    self.send_header("Content-Length", str(len(data)))
                    for key, value in headers.items():
                        self.send_header(key, value)
                    self.end_headers()
                    self.wfile.write(data)
                except (BrokenPipeError, ConnectionResetError):
                    pass  # the client gave up (its timeout): nothing to deliver

            def do_POST(self) -> None:  # noqa: N802 - http.server's naming
                length = int(self.headers.get("Content-Length") or 0)
                raw = self.rfile.read(length) if length else b""
                if self.path.rstrip("/") != "/v1/chat/completions":
                    self._send(404, {"error": {"message": f"no route {self.path}", "type": "not_found"}}, {})
                    return
                try:
                    body = json.loads(raw or b"{}")
                except json.JSONDecodeError:
                    self._send(400, {"error": {"message": "body is not JSON", "type": "invalid_request"}}, {})
                    return
                auth = self.headers.get("Authorization", "")
                reply = server._take(body, auth, {k.lower(): v for k, v in self.headers.items()})
                with server._lock:
                    server.in_flight += 1
                    server.max_in_flight = max(server.max_in_flight, server.in_flight)
                try:
                    self._answer(reply, body, auth)
                finally:
                    with server._lock:
                        server.in_flight -= 1

            def _answer(self, reply: Reply, body: dict[str, Any], auth: str) -> None:
                if reply.delay:
                    time.sleep(reply.delay)
                if reply.status != 200:
                    message = {429: "Rate limit reached, retry later", 500: "internal server error",
                               401: "Incorrect API key provided"}.get(reply.status, "error")
                    message = reply.message or message
                    if reply.echo_key:
                        message += f": {auth.removeprefix('Bearer ')}"
                    self._send(reply.status, {"error": {"message": message, "type": "error", "code": reply.status}},
                               reply.headers)
                    return
                prompt = sum(len(str(m.get("content", ""))) for m in body.get("messages", []))
                content = reply.answer(auth.removeprefix("Bearer ")) if reply.answer else reply.content
                completion = {
                    "id": f"chatcmpl-{len(server.requests)}",
                    "object": "chat.completion",
                    "created": int(time.time()),
                    "model": body.get("model", "scripted"),
                    "choices": [{"index": 0, "finish_reason": reply.finish_reason,
                                 "message": {"role": "assistant", "content": content}}],
                    # Rough token counts (4 characters a token), like a real server's usage block.
                    "usage": {"prompt_tokens": prompt // 4, "completion_tokens": len(content) // 4,
                              "total_tokens": prompt // 4 + len(content) // 4},
                }
                self._send(200, completion, reply.headers)

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._server.daemon_threads = True
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None

    def __enter__(self) -> "ScriptedServer":
        return self.start()

    def __exit__(self, *exc: Any) -> None:
        self.stop()


# -- the toy block's script: out = alpha * x + y --------------------------------------------------

_HEADER = '''{{#-
[template]
description = "{description}"

[space]
{space}

[baseline]
{baseline}
-#}}
import triton
import triton.language as tl
'''


def toy_template(description: str, space: str, baseline: str, body: str) -> str:
    """A complete template for the toy axpy block."""
    return _HEADER.format(description=description, space=space, baseline=baseline) + body


#: Correct and much faster in the interpreter: one program covers the whole vector (the
#: interpreter's time is roughly proportional to the number of programs).
FAST = toy_template(
    "one program over the whole vector", "BLOCK = [1024, 2048, 4096]\nnum_warps = [1, 2, 4]",
    "BLOCK = 1024\nnum_warps = 4", '''

@triton.jit
def _axpy_wide(x_ptr, y_ptr, out_ptr, alpha, n, BLOCK: tl.constexpr):
    start = tl.program_id(0) * BLOCK
    offs = start + tl.arange(0, BLOCK)
    mask = offs < n
    x = tl.load(x_ptr + offs, mask=mask, other=0.0).to(tl.float32)
    y = tl.load(y_ptr + offs, mask=mask, other=0.0).to(tl.float32)
    tl.store(out_ptr + offs, (alpha * x + y).to(out_ptr.dtype.element_ty), mask=mask)


def run(x, y, alpha, out):
    n = x.numel()
    _axpy_wide[(triton.cdiv(n, {{ BLOCK }}),)](x, y, out, alpha, n, BLOCK={{ BLOCK }}, num_warps={{ num_warps }})
''')

#: Correct and much slower: many tiny programs.
SLOW = toy_template(
    "tiny tiles", "BLOCK = [16, 32]\nnum_warps = [1, 2]", "BLOCK = 16\nnum_warps = 1", '''

@triton.jit
def _axpy_tiny(x_ptr, y_ptr, out_ptr, alpha, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    x = tl.load(x_ptr + offs, mask=mask).to(tl.float32)
    y = tl.load(y_ptr + offs, mask=mask).to(tl.float32)
    tl.store(out_ptr + offs, (alpha * x + y).to(out_ptr.dtype.element_ty), mask=mask)


def run(x, y, alpha, out):
    n = x.numel()
    _axpy_tiny[(triton.cdiv(n, {{ BLOCK }}),)](x, y, out, alpha, n, BLOCK={{ BLOCK }}, num_warps={{ num_warps }})
''')

#: Does not compile: the module uses ``math`` without importing it (fails when it is loaded).
BROKEN = toy_template(
    "fused with a scaled epilogue", "BLOCK = [512, 1024]", "BLOCK = 512", '''
_ONE = math.sqrt(1.0)


@triton.jit
def _axpy_broken(x_ptr, y_ptr, out_ptr, alpha, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    x = tl.load(x_ptr + offs, mask=mask).to(tl.float32)
    y = tl.load(y_ptr + offs, mask=mask).to(tl.float32)
    tl.store(out_ptr + offs, (alpha * x + y).to(out_ptr.dtype.element_ty), mask=mask)


def run(x, y, alpha, out):
    _axpy_broken[(triton.cdiv(x.numel(), {{ BLOCK }}),)](x, y, out, alpha, x.numel(), BLOCK={{ BLOCK }})
''')

#: Runs, but computes alpha * x - y.
WRONG = toy_template(
    "subtracts instead of adds", "BLOCK = [512, 1024]", "BLOCK = 1024", '''

@triton.jit
def _axpy_wrong(x_ptr, y_ptr, out_ptr, alpha, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    x = tl.load(x_ptr + offs, mask=mask).to(tl.float32)
    y = tl.load(y_ptr + offs, mask=mask).to(tl.float32)
    tl.store(out_ptr + offs, (alpha * x - y).to(out_ptr.dtype.element_ty), mask=mask)


def run(x, y, alpha, out):
    n = x.numel()
    _axpy_wrong[(triton.cdiv(n, {{ BLOCK }}),)](x, y, out, alpha, n, BLOCK={{ BLOCK }})
''')

#: Launches a do-nothing kernel for show and copies the block's own reference: correct, and
#: would pass verification; only the static policy stops it.
CHEAT = toy_template(
    "reuses the reference", "BLOCK = [1024]", "BLOCK = 1024", '''
from kernelforge.catalog import Catalog


@triton.jit
def _touch(out_ptr, BLOCK: tl.constexpr):
    pass


def run(x, y, alpha, out):
    _touch[(1,)](out, BLOCK={{ BLOCK }})
    out.copy_(Catalog.discover().block("toy/axpy").reference(x=x, y=y, alpha=alpha))
''')


def fenced(text: str, prose: str = "Here is a faster kernel.") -> str:
    """An answer as a chatty model writes it: prose, then the template in a fence, then more prose."""
    return f"{prose}\n\n```python\n{text}```\n\nThis should be faster because it launches fewer programs."


def points_answer(template_id: str, points: list[dict[str, Any]]) -> str:
    """An answer proposing parameter points for an existing template."""
    body = "\n".join("[[points]]\n" + "\n".join(f"{k} = {v}" for k, v in p.items()) for p in points)
    return f"Try these values.\n\n```toml\ntemplate = \"{template_id}\"\n{body}\n```\n"


def demo_script(*, fast_id: str | None = None, slow_delay: float = 3.0) -> list[Reply]:
    """The acceptance script, one reply per HTTP request: the faster kernel, the slower one, a
    kernel that does not compile, a wrong one, one that calls the reference, an answer with no
    code, a truncated answer, a reply slower than the client's timeout (its retry gets the 429,
    whose retry gets points for the fast template: ``fast_id``), then a 500 (its retry gets the
    exhausted answer: prose)."""
    script = [
        Reply(fenced(FAST), label="fast"),
        Reply(fenced(SLOW, "A tiled variant."), label="slow"),
        Reply(fenced(BROKEN, "A fused variant."), label="broken"),
        Reply(fenced(WRONG, "A variant."), label="wrong"),
        Reply(fenced(CHEAT, "The simplest correct kernel."), label="cheat"),
        Reply("I would try larger blocks and fewer programs; the baseline looks reasonable.", label="no_code"),
        Reply("Here is the kernel:\n\n```python\n" + FAST[: len(FAST) // 2], finish_reason="length", label="truncated"),
        Reply(fenced(SLOW), delay=slow_delay, label="timeout"),
        Reply(status=429, headers={"Retry-After": "1"}, label="429"),
    ]
    if fast_id:
        # Every other point of the fast template's space: whichever Optuna has not tried yet is new.
        others = [{"BLOCK": b, "num_warps": w} for b in (1024, 2048, 4096) for w in (1, 2, 4) if (b, w) != (1024, 4)]
        script.append(Reply(points_answer(fast_id, others), label="points"))
    script.append(Reply(status=500, label="500"))
    return script


if __name__ == "__main__":  # pragma: no cover - a manual demo
    import sys

    sys.path.insert(0, str(__import__("pathlib").Path(__file__).resolve().parents[1] / "src"))
    from kernelforge.llm.parse import template_id_for

    with ScriptedServer(demo_script(fast_id=template_id_for("toy/axpy", FAST)), loop=True) as srv:
        print(f"serving the toy script at {srv.base_url} (Ctrl-C to stop)", flush=True)
        try:
            while True:
                time.sleep(3600)
        except KeyboardInterrupt:
            pass
