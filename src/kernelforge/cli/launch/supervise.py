"""Supervising the worker processes of one job, for the local and the Ray launchers
(:mod:`kernelforge.cli.launch.local`, :mod:`kernelforge.cli.launch.ray_cluster`): what a worker is
(:class:`WorkerSpec`), whether its database can be shared, the launcher's signals (:class:`Stop`)
and exit status, and the relay of the workers' output (:class:`Relay`).
"""

from __future__ import annotations

import json
import os
import signal
import sys
import threading
from dataclasses import dataclass
from typing import IO, Any, Callable

from kernelforge.cli.common import STORAGE_ENV
from kernelforge.errors import UserError

#: A worker's --storage: passed in its environment, never on its command line (``ps`` shows every
#: command line on the host, and a URL may hold a password).


@dataclass(frozen=True)
class WorkerSpec:
    """One worker to start: ``argv`` run with the launcher's environment plus ``env``."""

    index: int  # 1-based
    argv: tuple[str, ...]
    env: tuple[tuple[str, str], ...] = ()

    @property
    def label(self) -> str:
        return f"w{self.index}"

    def environment(self, base: dict[str, str]) -> dict[str, str]:
        return {**base, "PYTHONUNBUFFERED": "1", **dict(self.env)}




def compile_share(workers: int, cpus: int | None = None) -> int:
    """Each of ``workers`` workers' share of the host's compile processes: max(1, cpus // workers)."""
    return max(1, (cpus or os.cpu_count() or 1) // max(1, workers))


def check_shareable_storage(url: str, *, many_hosts: bool = False) -> None:
    """Raise UserError unless workers can share the database at ``url``: not an in-memory SQLite;
    not SQLite at all when the workers run on ``many_hosts``."""
    from sqlalchemy.engine import make_url

    from kernelforge.redact import redact_url

    parsed = make_url(url)
    if not parsed.drivername.startswith("sqlite"):
        return
    if parsed.database in (None, "", ":memory:") or parsed.query.get("mode") == "memory":
        raise UserError(f"--storage {redact_url(url)}: an in-memory SQLite database cannot be shared by workers; "
                        "give a SQLite file (sqlite:///path/kernelforge.db) or a server URL (postgresql+psycopg://...)")
    if many_hosts:
        raise UserError(f"--storage {redact_url(url)}: a SQLite file is on one host and the workers run on several; "
                        "give a database URL every host can reach (--storage postgresql+psycopg://USER@HOST/DB)")


class Stop:
    """SIGINT and SIGTERM while the launcher runs: recorded (the first one decides the exit
    status), never raised; the launcher's loop forwards them (a second signal kills)."""

    def __init__(self) -> None:
        self.signum: int | None = None
        self.count = 0
        self.event = threading.Event()
        self._previous: dict[int, Any] = {}

    def install(self) -> None:
        for signum in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
            self._previous[signum] = signal.signal(signum, self._on_signal)

    def reclaim(self) -> None:
        """Handle the signals again after a library replaced the handlers (``ray.init`` does)."""
        for signum in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
            signal.signal(signum, self._on_signal)

    def uninstall(self) -> None:
        for signum, handler in self._previous.items():
            signal.signal(signum, handler)
        self._previous.clear()

    def _on_signal(self, signum: int, frame: Any) -> None:
        if self.signum is None:
            self.signum = signum
        self.count += 1
        self.event.set()

    def forward_signal(self) -> int:
        """The signal to send the workers now: the one received, SIGKILL after the second."""
        return signal.SIGKILL if self.count > 1 else (self.signum or signal.SIGTERM)


def exit_status(stop: Stop, failures: list[int]) -> int:
    """130 after SIGINT, 143 after SIGTERM, 129 after SIGHUP, else the first failure's status (a worker killed by a
    signal counts as 128 + the signal), else 0."""
    if stop.signum is not None:
        return 128 + stop.signum
    for code in failures:
        return 128 - code if code < 0 else code
    return 0


class Relay:
    """Writes the workers' output lines: JSON progress lines as JSON lines with ``worker`` added
    (``jsonl``), as ``[w1] event ...`` text (``live``) or not at all (``quiet``); any other line to
    stderr prefixed ``[w1]``. Counts the evaluations and duplicates the workers report."""

    def __init__(self, mode: str, out: IO[str] | None = None, err: IO[str] | None = None):
        self.mode = mode
        self.out = sys.stdout if out is None else out
        self.err = sys.stderr if err is None else err
        self.evaluations = 0
        self.duplicates = 0
        self._lock = threading.Lock()

    def line(self, label: str, stream: str, text: str) -> None:
        text = text.rstrip("\n")
        event = _json_object(text) if stream == "stdout" else None
        with self._lock:
            if event is None:
                self.err.write(f"[{label}] {text}\n")
                self.err.flush()
                return
            kind = event.get("event")
            self.evaluations += kind == "evaluated" and event.get("status") != "resumed"
            self.duplicates += kind == "duplicate"
            if self.mode == "jsonl":
                self.out.write(json.dumps({**event, "worker": label}) + "\n")
            elif self.mode == "live":
                detail = event.get("message") or " ".join(str(event[k]) for k in ("block", "status") if event.get(k))
                self.out.write(f"[{label}] {kind} {detail}".rstrip() + "\n")
            else:
                return
            self.out.flush()


def _json_object(text: str) -> dict[str, Any] | None:
    try:
        value = json.loads(text) if text.startswith("{") else None
    except ValueError:
        return None
    return value if isinstance(value, dict) else None


def pump(stream: IO[str], emit: Callable[[str], None]) -> threading.Thread:
    """A daemon thread calling ``emit`` with each line of ``stream`` until it ends."""
    def run() -> None:
        for text in stream:
            emit(text)
        stream.close()

    thread = threading.Thread(target=run, name="kernelforge-relay", daemon=True)
    thread.start()
    return thread


def die_with_launcher() -> None:
    """In a worker, before exec: SIGTERM it when the launcher dies (a SIGKILLed launcher cannot
    forward anything; the worker then stops as after SIGTERM)."""
    try:
        import ctypes

        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):  # not Linux
        pass
