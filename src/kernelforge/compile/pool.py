"""Compiling candidates in separate processes: one at a time with a hard timeout
(:func:`compile_candidate`), or many in the background (:class:`CompilePool`).

The work runs in ``spawn``-ed children without ``TRITON_INTERPRET``: with that flag set
``@triton.jit`` makes interpreter functions that cannot be compiled, and a crashing or hanging
compile must never take the caller down.

Nothing in :mod:`kernelforge.compile` imports triton at module level: this module is imported (by
unpickling) in the compile child before the child has removed TRITON_INTERPRET, and triton must
not see the flag.
"""

from __future__ import annotations

import ast
import concurrent.futures as cf
import os
import signal
import sys
import time
import traceback
from concurrent.futures.process import BrokenProcessPool
from pathlib import Path
from typing import Any, Callable

from kernelforge.compile.messages import syntax_error_text
from kernelforge.compile.resources import CompileReport
from kernelforge.compile.spawning import spawn_context
from kernelforge.compile.step import compile_here, prepare_compiler_process
from kernelforge.targets import default_target, parse_target
from kernelforge.errors import UserError
from kernelforge.result import Status


def _dtype_name(dtype: Any) -> str:
    from kernelforge.block import DTYPES

    if isinstance(dtype, str):
        name = dtype.removeprefix("torch.")
        if name in DTYPES:
            return name
    else:
        for name, value in DTYPES.items():
            if value == dtype:
                return name
    raise UserError(f"unknown dtype {dtype!r}; choose from {', '.join(DTYPES)}")


#: Whether triton had been imported when the compile child's entry ran (see environment_probe).
_TRITON_PREIMPORTED: bool | None = None


def _child_main(conn: Any, work: Any, args: tuple) -> None:
    """Entry point of a compile child: drop the interpreter, run ``work(*args)``, answer over
    ``conn`` with ("result", value), ("user_error", message) or ("crash", text)."""
    global _TRITON_PREIMPORTED
    _TRITON_PREIMPORTED = "triton" in sys.modules
    try:
        prepare_compiler_process()
        result = ("result", work(*args))
    except UserError as exc:
        result = ("user_error", str(exc))
    except BaseException as exc:  # anything else is a bug in the compile step, not the candidate
        result = ("crash", f"{type(exc).__name__}: {exc}\n{traceback.format_exc(limit=8)}")
    try:
        conn.send(result)
    finally:
        conn.close()


def environment_probe() -> dict:
    """What a compile child sees (for tests): the interpreter flag, whether triton was imported
    before the child's entry (by spawn re-importing the parent's main module), and the class
    ``@triton.jit`` produces there."""
    from kernelforge.candidate import load_module

    module = load_module("import triton\n\n\n@triton.jit\ndef _probe(x):\n    pass\n", "probe")
    return {
        "TRITON_INTERPRET": os.environ.get("TRITON_INTERPRET"),
        "triton_preimported": _TRITON_PREIMPORTED,
        "jit_class": type(module._probe).__name__,
    }


def _describe_exit(code: int | None) -> str:
    if code is not None and code < 0:
        try:
            return f"killed by {signal.Signals(-code).name}"
        except ValueError:
            return f"killed by signal {-code}"
    return f"exit code {code}"


class ChildFailed(Exception):
    """The compile child did not answer with a report: ``status`` is ``timeout`` or ``compile_error``."""

    def __init__(self, status: Status, message: str):
        super().__init__(message)
        self.status = status


def run_in_child(work: Callable[..., Any], args: tuple, timeout: float) -> Any:
    """``work(*args)`` in a fresh spawned process without TRITON_INTERPRET; its return value.

    Raises UserError (re-raised from the child), or ChildFailed with status ``timeout`` (the
    child was killed) or ``compile_error`` (it died, or the work itself failed).
    """
    ctx = spawn_context()
    receiver, sender = ctx.Pipe(duplex=False)
    process = ctx.Process(target=_child_main, args=(sender, work, args), name="kernelforge-aot", daemon=True)
    process.start()
    sender.close()
    try:
        if not receiver.poll(timeout):
            raise ChildFailed(Status.TIMEOUT,
                              f"compile did not finish within {timeout:g} s; the compile process was killed")
        try:
            kind, value = receiver.recv()
        except (EOFError, OSError):
            process.join(5)
            raise ChildFailed(
                Status.COMPILE_ERROR, f"the compile process died ({_describe_exit(process.exitcode)}) while compiling"
            ) from None
    finally:
        receiver.close()
        if process.is_alive():
            process.kill()
        process.join(10)
    if kind == "user_error":
        raise UserError(value)
    if kind == "crash":
        raise ChildFailed(Status.COMPILE_ERROR, f"internal error in the compile step: {value}")
    return value


def compile_candidate(
    source: str,
    block_id: str,
    kernels_root: str | Path,
    dtype: Any,
    target: str | None = None,
    timeout: float = 120,
) -> CompileReport:
    """Compile candidate ``source`` of block ``block_id`` (found under ``kernels_root``) in
    ``dtype`` for ``target`` (default :func:`default_target`) in a fresh child process, and report
    its kernels' resources.

    The child is started with multiprocessing's ``spawn``: nothing of the caller's state is
    inherited, and the child removes TRITON_INTERPRET before it imports triton, so this works
    from a process running the interpreter (the test suite). The child never re-runs the caller's
    main module (:mod:`kernelforge.compile.spawning`), so a script needs no ``__main__`` guard. The child is killed
    after ``timeout`` seconds (status ``timeout``; the budget includes about 3 s of process start
    and torch import). A child that crashes (a segfault in the compiler) gives ``compile_error``;
    the caller is never taken down.

    Raises UserError for mistakes of the caller: unknown target, block or dtype.
    """
    start = time.perf_counter()
    tgt = parse_target(target if target is not None else default_target())
    args = (source, block_id, str(Path(kernels_root).resolve()), _dtype_name(dtype), tgt.name)
    try:
        report = run_in_child(compile_here, args, timeout)
    except ChildFailed as exc:
        return CompileReport.failed(tgt.name, exc.status, str(exc), seconds=time.perf_counter() - start)
    return report.replace_seconds(time.perf_counter() - start)


class _Timeout(BaseException):
    """Raised by the pool worker's alarm; a BaseException so that host code's ``except Exception``
    cannot swallow it."""


def prepare_pool_worker() -> None:
    """Prepare a pool worker: no interpreter, and everything a compile imports imported now, so
    that a task's timeout never lands in the middle of an import (torch's lazy imports cannot be
    retried once interrupted: the next task in that worker would fail)."""
    prepare_compiler_process()
    import torch  # noqa: F401
    import triton.compiler  # noqa: F401
    import triton.runtime.jit  # noqa: F401

    from kernelforge import block, candidate, catalog  # noqa: F401


def _pool_task(args: tuple, timeout: float) -> CompileReport:
    """One compile in a pool worker, with a soft timeout (an alarm that interrupts Python code:
    a hanging host loop, a slow pass returning to Python) and a hard one 30 s later (faulthandler
    exits the worker if a native call never returns; the pool then breaks, see CompilePool)."""
    import faulthandler

    start = time.perf_counter()

    def on_alarm(signum, frame):
        raise _Timeout()

    previous = signal.signal(signal.SIGALRM, on_alarm)
    signal.setitimer(signal.ITIMER_REAL, timeout)
    faulthandler.dump_traceback_later(timeout + 30, exit=True)
    try:
        return compile_here(*args)
    except _Timeout:
        return CompileReport.failed(args[4], Status.TIMEOUT, f"compile did not finish within {timeout:g} s",
                                    seconds=time.perf_counter() - start)
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)
        faulthandler.cancel_dump_traceback_later()


class CompilePool:
    """Worker processes that compile candidates in the background while others are verified.

    ``submit`` returns a Future of a :class:`CompileReport`. Workers are spawned without the
    interpreter flag and reused (one torch import each, then about 0.4-1.3 s per new config and
    1 ms per Triton cache hit). A compile that hangs in Python code is stopped after ``timeout``
    with status ``timeout``; one that hangs in native code, or crashes its worker, kills the
    worker: every future pending in the pool then fails with
    ``concurrent.futures.process.BrokenProcessPool`` (not a verdict on those candidates: compile
    each again with :meth:`compile_alone`, in a process of the same kind as the pool's, so its
    verdict is its own), and the next ``submit`` replaces the broken pool with a fresh one. A
    UserError of the caller (unknown block, dtype or target) is the future's exception.
    """

    def __init__(self, max_workers: int | None = None, timeout: float = 120):
        self.max_workers = max_workers or max(1, (os.cpu_count() or 2) - 1)
        self.timeout = timeout
        self._executor: cf.ProcessPoolExecutor | None = None

    def _new_executor(self) -> cf.ProcessPoolExecutor:
        return cf.ProcessPoolExecutor(
            max_workers=self.max_workers,
            mp_context=spawn_context(),
            initializer=prepare_pool_worker,
        )

    def submit(
        self, source: str, block_id: str, kernels_root: str | Path, dtype: Any, target: str | None = None
    ) -> cf.Future:
        """Queue one compile; see :func:`compile_candidate` for the arguments."""
        tgt = parse_target(target if target is not None else default_target())
        args = (source, block_id, str(Path(kernels_root).resolve()), _dtype_name(dtype), tgt.name)
        if self._executor is None:
            self._executor = self._new_executor()
        try:
            return self._executor.submit(_pool_task, args, self.timeout)
        except BrokenProcessPool:
            self._executor.shutdown(wait=False, cancel_futures=True)
            self._executor = self._new_executor()
            return self._executor.submit(_pool_task, args, self.timeout)

    def single(self) -> "CompilePool":
        """A new pool of one process of this pool's kind and settings (for :meth:`compile_alone`)."""
        return CompilePool(max_workers=1, timeout=self.timeout)

    def compile_alone(self, source: str, block_id: str, kernels_root: str | Path, dtype: Any,
                      target: str | None = None) -> CompileReport:
        """Compile one candidate in a single-use process of this pool's kind (:meth:`single`: a
        sandboxed pool's is sandboxed, with its memory limit), and wait for its report: the
        verdict of a candidate whose compile failed with the pool (a worker crashed while it was
        pending). A process that dies again is this candidate's ``compile_error``."""
        pool = self.single()
        try:
            return pool.submit(source, block_id, kernels_root, dtype, target).result()
        except BrokenProcessPool:
            name = parse_target(target if target is not None else default_target()).name
            return CompileReport.failed(name, Status.COMPILE_ERROR, "the compile process died while compiling this "
                                        "candidate alone (a crash in the compiler, or over the compile's memory "
                                        "limit)")
        finally:
            pool.shutdown(wait=False, cancel_futures=True)

    def shutdown(self, wait: bool = True, cancel_futures: bool = False) -> None:
        if self._executor is not None:
            self._executor.shutdown(wait=wait, cancel_futures=cancel_futures)
            self._executor = None

    def __enter__(self) -> "CompilePool":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.shutdown(wait=True, cancel_futures=True)


#: How many compile processes a worker's pool gets (set by the launcher for each worker).
COMPILE_WORKERS_ENV = "KERNELFORGE_COMPILE_WORKERS"


def compile_workers_from_env(default: int = 1) -> int:
    """The compile pool size a launcher chose for this worker (:data:`COMPILE_WORKERS_ENV`), else
    ``default``."""
    text = os.environ.get(COMPILE_WORKERS_ENV, "")
    return int(text) if text.isdigit() and int(text) > 0 else default


def refused_compile(source: str, target: str | None) -> cf.Future | None:
    """A finished Future of the report of a source the static policy refuses (the compile pools'
    wall: :func:`kernelforge.policy.wall.refusal`), or None when it may compile. A source that is
    not Python is the ``compile_error`` it would be in the compiler, with its line: ``rejected``
    here would read as a configuration over the target's limits, which costs a search nothing
    (:func:`kernelforge.result.resource_rejected`)."""
    from kernelforge.policy.wall import refusal

    why = refusal(source)
    if why is None:
        return None
    status, message = Status.REJECTED, why
    try:
        ast.parse(source)
    except SyntaxError as exc:
        status, message = Status.COMPILE_ERROR, syntax_error_text(exc)
    except (ValueError, RecursionError, MemoryError):
        pass
    future: cf.Future = cf.Future()
    future.set_result(CompileReport.failed(parse_target(target if target is not None else default_target()).name,
                                           status, message))
    return future
