"""One worker process seen from its parent: started in the sandbox, talked to, killed for sure.

The process runs :mod:`kernelforge.execute.worker.main`, started with ``subprocess`` and the
environment of :func:`~kernelforge.sandbox.roles.scrubbed_environment`, in a temporary working
directory of its own, in a new session (Ctrl-C in the terminal goes to the search, which then
closes the worker). Requests and answers are the records of
:mod:`kernelforge.execute.worker.protocol` (answers are checked JSON, never unpickled here), over
two pipes on dedicated file descriptors; the worker's stdout and stderr go to a log file whose tail
explains a crash. On the CPU the process also inherits the descriptor of a fresh shared arena
(:attr:`WorkerProcess.arena`, :mod:`kernelforge.execute.worker.arena`), through which the trusted
process shares tensors with it.
"""

from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any

from kernelforge.errors import UserError
from kernelforge.execute.worker.arena import Arena
from kernelforge.execute.worker.protocol import (MAX_MESSAGE_BYTES, Exit, Init, InitError, Ready, WireError,
                                                 decode_answer, encode_request)
from kernelforge.sandbox.roles import sandbox_environment
from kernelforge.textsafe import LINE, NOTE, cut


#: How much of the end of the worker's log a crash's explanation is looked for in.
LOG_TAIL_BYTES = 20000


class WorkerGone(Exception):
    """The worker died, timed out, or broke the protocol; the parent has killed it. ``status``
    is the candidate's (``timeout`` or ``runtime_error``)."""

    def __init__(self, status: str, message: str):
        super().__init__(message)
        self.status = status


def signal_name(code: int | None) -> str:
    """How a process ended, for a message: ``SIGSEGV``, ``exit code 1``..."""
    if code is not None and code < 0:
        try:
            return signal.Signals(-code).name
        except ValueError:
            return f"signal {-code}"
    return f"exit code {code}"


class WorkerProcess:
    """A worker process: :meth:`start` it with ``init`` (its first request), :meth:`send`
    requests, :meth:`receive` answers within a time limit, :meth:`kill` it.

    ``memory_limit`` is the address-space limit in bytes (None: none); ``extra_secrets`` names
    more environment variables to withhold.
    """

    def __init__(self, init: Init, *, memory_limit: int | None, extra_secrets: tuple[str, ...],
                 startup_timeout: float, shared_arena: bool = True):
        self.init = init
        self.shared_arena = shared_arena
        #: the shared arena of the current process (None before it starts, or on a GPU)
        self.arena: Arena | None = None
        self.memory_limit = memory_limit
        self.extra_secrets = extra_secrets
        self.startup_timeout = startup_timeout
        #: the kernels folders the worker's sandbox lets it read (set before it starts)
        self.read_roots: tuple[str, ...] = ()
        self._proc: subprocess.Popen | None = None
        self._send: Connection | None = None
        self._recv: Connection | None = None
        self._dir: str | None = None
        self._log: Path | None = None
        self._log_offset = 0
        #: what the worker said when it was ready (pid, device, memory limit)
        self.info: Ready | None = None

    @property
    def pid(self) -> int | None:
        return None if self._proc is None else self._proc.pid

    @property
    def alive(self) -> bool:
        return self._proc is not None and self._proc.poll() is None

    @property
    def started(self) -> bool:
        """Whether a process was started and not yet killed (it may have died since)."""
        return self._proc is not None

    def start(self) -> None:
        """Start the process and wait until it is ready; a UserError when it cannot start."""
        self._dir = tempfile.mkdtemp(prefix="kernelforge-worker-")
        self._log = Path(self._dir) / "worker.log"
        to_child_r, to_child_w = os.pipe()
        to_parent_r, to_parent_w = os.pipe()
        env = sandbox_environment(self._dir, read_roots=self.read_roots, extra_secrets=self.extra_secrets)
        package_root = str(Path(__file__).resolve().parents[2])  # the folder that holds kernelforge/
        env["PYTHONPATH"] = os.pathsep.join([package_root, *filter(None, [env.get("PYTHONPATH")])])
        env["PWD"] = self._dir
        env["PYTHONFAULTHANDLER"] = "1"  # a segfault prints the Python stack (the candidate's line)
        env.pop("TRITON_INTERPRET", None)  # the worker's device decides, in prepare()
        self.arena = Arena() if self.shared_arena else None
        arena_fd = self.arena.fd if self.arena is not None else -1
        cmd = [sys.executable, "-m", "kernelforge.execute.worker.main", str(to_child_r), str(to_parent_w),
               str(os.getpid()), str(self.memory_limit or 0), str(arena_fd)]
        with open(self._log, "wb") as log:
            self._proc = subprocess.Popen(
                cmd, env=env, cwd=self._dir, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
                pass_fds=(to_child_r, to_parent_w, *([arena_fd] if arena_fd >= 0 else [])), start_new_session=True,
                close_fds=True,
            )
        os.close(to_child_r)
        os.close(to_parent_w)
        self._send = Connection(to_child_w, readable=False)
        self._recv = Connection(to_parent_r, writable=False)
        self._log_offset = 0
        try:
            self._send.send_bytes(encode_request(self.init))
            answer = self.receive(self.startup_timeout, "starting")
        except WorkerGone as exc:
            raise UserError(f"the evaluation worker could not start: {exc}; run the search with --in-process to "
                            "see the error in this process") from None
        if not isinstance(answer, Ready):
            self.kill()
            why = answer.message if isinstance(answer, InitError) else f"it answered {type(answer).__name__}"
            raise UserError(f"the evaluation worker could not start: {why}")
        self.info = answer

    def send(self, request: Any) -> None:
        """Send one request (a record of the protocol); the log tail of a later crash starts here."""
        assert self._send is not None and self._log is not None
        self._log_offset = self._log.stat().st_size
        self._send.send_bytes(encode_request(request))

    def kill(self) -> None:
        """Kill the worker's process group and forget it (its log is read before this)."""
        proc = self._proc
        if proc is not None:
            try:
                os.killpg(proc.pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass
            try:
                proc.kill()
            except ProcessLookupError:
                pass
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:  # pragma: no cover - a process SIGKILL cannot stop
                pass
        for conn in (self._send, self._recv):
            if conn is not None:
                try:
                    conn.close()
                except OSError:
                    pass
        self._proc = self._send = self._recv = None
        if self.arena is not None:
            self.arena.close()
            self.arena = None
        if self._dir is not None:
            shutil.rmtree(self._dir, ignore_errors=True)
            self._dir = None

    def close(self, polite: bool) -> None:
        """Stop the worker (with ``polite``, by asking first), then for sure; remove its directory."""
        if polite and self.alive and self._send is not None:
            try:
                self.send(Exit())
                self._proc.wait(timeout=5)
            except (OSError, subprocess.TimeoutExpired, ValueError):
                pass
        self.kill()

    def log_tail(self) -> str:
        """What the worker printed since the current request began: the fault handler's report of
        a crash, shortened to the lines that say where."""
        if self._log is None or not self._log.exists():
            return ""
        with open(self._log, "rb") as f:
            f.seek(self._log_offset)
            text = f.read()[-LOG_TAIL_BYTES:].decode("utf-8", "replace")
        lines = [line.strip() for line in text.splitlines() if line.strip()]
        candidate = [line for line in lines if "/kf_" in line and "line" in line]
        if candidate:
            match = re.search(r'line (\d+) in (\S+)', candidate[0])
            if match:
                return f"at candidate line {match.group(1)} in {match.group(2)}"
        fatal = [line for line in lines if line.startswith(("Fatal Python error", "MemoryError", "RuntimeError"))]
        return cut(fatal[-1] if fatal else (lines[-1] if lines else ""), LINE)

    def receive(self, timeout: float, step: str, limit: float | None = None) -> Any:
        """The worker's next answer (a record of the protocol, rebuilt from checked fields), or
        :class:`WorkerGone` after killing it. ``limit`` is the step's whole time
        limit, for the message when it runs out (default ``timeout``)."""
        assert self._recv is not None and self._proc is not None
        deadline = time.monotonic() + timeout
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                self.kill()
                raise WorkerGone("timeout", f"did not finish within {timeout if limit is None else limit:g} s while "
                                            f"{step}; the worker was killed")
            try:
                ready = self._recv.poll(min(left, 1.0))
            except (OSError, ValueError):
                ready = True
            if ready:
                data = None
                try:
                    data = self._recv.recv_bytes(MAX_MESSAGE_BYTES)
                except EOFError:
                    pass  # the worker is gone: below
                except OSError:
                    if self._proc.poll() is None:  # longer than any answer may be
                        self.kill()
                        raise WorkerGone("runtime_error", f"unreadable answer from the worker while {step}") from None
                if data is not None:
                    try:
                        return decode_answer(data)
                    except WireError as exc:
                        self.kill()
                        raise WorkerGone("runtime_error", cut(f"unreadable answer from the worker while {step}: {exc}",
                                                              NOTE)) from None
            if ready or self._proc.poll() is not None:
                try:
                    code = self._proc.wait(timeout=10)
                except subprocess.TimeoutExpired:
                    code = None
                detail = self.log_tail()
                self.kill()
                message = f"worker died with {signal_name(code)} while {step}"
                if code is not None and code < 0 and -code == signal.SIGKILL and self.memory_limit is None:
                    message += " (out of memory?)"
                raise WorkerGone("runtime_error", message + (f" ({detail})" if detail else ""))
