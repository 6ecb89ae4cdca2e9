"""Compiler failures as a few readable lines, not tracebacks.

Triton reports a kernel it cannot compile as a CompilationError whose text is a page of kernel
source, an MLIR pass failure as diagnostics printed to the process's stderr, and a ptxas failure
as its whole log; a candidate's author needs the line and the reason. These helpers turn each
into a short message for a :class:`~kernelforge.compile.resources.CompileReport`.
"""

from __future__ import annotations

import os
import re
import sys
import tempfile
import traceback
from contextlib import contextmanager
from typing import Callable, Iterator


def syntax_error_text(exc: SyntaxError) -> str:
    """A candidate source's syntax error as its compile report says it (the line and the reason)."""
    return f"candidate source has a syntax error at line {exc.lineno}: {exc.msg}"


def first_lines(text: str, limit: int = 12, chars: int = 1500) -> str:
    """The first ``limit`` non-blank lines of ``text`` (and how many more there were), at most
    ``chars`` characters."""
    lines = [line.rstrip() for line in str(text).strip().splitlines() if line.strip()]
    out = "\n".join(lines[:limit])
    if len(lines) > limit:
        out += f"\n... ({len(lines) - limit} more lines)"
    return out[:chars]


def _compilation_error_text(exc: BaseException) -> str | None:
    """Triton's CompilationError as 'at line L of kernel: <code>' plus the reason. Its str() is 12
    lines of kernel source and a caret with the reason last; a nested error (an inlined
    @triton.jit helper) is chained through __cause__, so the innermost one is reported."""
    try:
        from triton.compiler.errors import CompilationError
    except ImportError:
        return None
    chain, seen = [], set()
    current: BaseException | None = exc
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        chain.append(current)
        current = current.__cause__ or (None if current.__suppress_context__ else current.__context__)
    errors = [e for e in chain if isinstance(e, CompilationError)]
    if not errors:
        return None
    inner = errors[-1]
    where = ""
    lineno = getattr(inner.node, "lineno", None)
    if lineno and inner.src:
        lines = inner.src.split("\n")
        code = lines[lineno - 1].strip() if 0 < lineno <= len(lines) else ""
        func = re.match(r"\s*def\s+(\w+)", inner.src)
        where = f" at line {lineno} of {func.group(1) if func else 'the kernel'}: {code}"
    reason = next((e.error_message for e in reversed(errors) if e.error_message), None)
    if reason is None:
        others = [e for e in chain if not isinstance(e, CompilationError)]
        reason = f"{type(others[-1]).__name__}: {others[-1]}" if others else ""
    return f"{type(inner).__name__}{where}\n{reason}".strip()


def error_text(exc: BaseException, captured: str = "") -> str:
    """The compiler's message, not its traceback. MLIR pass failures print their diagnostics to
    stderr (``captured``) and raise a bare 'PassManager::run failed'; ptxas failures carry the
    ptxas log in the exception."""
    text = _compilation_error_text(exc) or f"{type(exc).__name__}: {exc}"
    diagnostics = [
        line for line in captured.splitlines()
        if re.search(r"\berror\b|LLVM ERROR|Assertion", line, re.IGNORECASE)
    ]
    if diagnostics:
        text += "\n" + "\n".join(diagnostics[:6])
    return first_lines(text)


def where_in(exc: BaseException, path: str | None) -> str:
    """' (candidate line N: code)' for the innermost traceback frame in the candidate's file."""
    if not path:
        return ""
    frames = [f for f in traceback.extract_tb(exc.__traceback__) if f.filename == path]
    if not frames:
        return ""
    frame = frames[-1]
    return f" (candidate line {frame.lineno}: {(frame.line or '').strip()})"


@contextmanager
def captured_output() -> Iterator[Callable[[], str]]:
    """Send fds 1 and 2 to a temp file (the C++ compiler prints diagnostics there and Triton prints
    whole PTX listings on ptxas failures); yields a function returning what was written."""
    sys.stdout.flush()
    sys.stderr.flush()
    saved = [os.dup(1), os.dup(2)]
    with tempfile.TemporaryFile(mode="w+b") as sink:
        os.dup2(sink.fileno(), 1)
        os.dup2(sink.fileno(), 2)

        def read() -> str:
            sys.stdout.flush()
            sys.stderr.flush()
            sink.seek(0)
            return sink.read().decode("utf-8", "replace")

        try:
            yield read
        finally:
            sys.stdout.flush()
            sys.stderr.flush()
            os.dup2(saved[0], 1)
            os.dup2(saved[1], 2)
            os.close(saved[0])
            os.close(saved[1])
