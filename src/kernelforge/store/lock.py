"""The job lock (a kf_locks row), its heartbeat, the take-over of a dead holder's lock, and the
liveness check of a process that locks and claims name.

Several workers search one job together (:mod:`kernelforge.store.ledger`); the lock names the lead
among them: the worker that runs the job's proposer and confirms the winners at the end.
:func:`take_job_lock` takes it when it is free or its holder is dead (same host: the pid is gone,
a zombie, or reused by another process; another host: no heartbeat for LOCK_STALE_S seconds) and
otherwise returns the live holder; :func:`acquire_job_lock` refuses with a message naming it.
Other jobs in the same database are not affected.
"""

from __future__ import annotations

import os
import socket
import threading
import time

import sqlalchemy as sa
from sqlalchemy.engine import Engine
from sqlalchemy.exc import IntegrityError, OperationalError

from kernelforge.errors import UserError
from kernelforge.redact import redact_data, redact_url
from kernelforge.store.records import LockHolder, lock_record
from kernelforge.store.schema import locks_table, metadata

#: A lock whose holder runs on another host is taken over when its heartbeat is older than this
#: (the holder refreshes it every LOCK_HEARTBEAT_S seconds; on the same host the pid is checked).
LOCK_STALE_S = 300.0
LOCK_HEARTBEAT_S = 30.0


class JobLock:
    """A held job lock: :meth:`refresh` it while running (a background heartbeat does), then
    :meth:`release`. ``taken_over`` names the dead holder it replaced, if any."""

    def __init__(self, engine: Engine, job: str, holder: str, taken_over: str | None):
        self.engine = engine
        self.job = job
        self.holder = holder
        self.taken_over = taken_over
        self._stop: threading.Event | None = None

    def _mine(self):
        return (locks_table.c.job == self.job) & (locks_table.c.holder == self.holder)

    def refresh(self) -> None:
        with self.engine.begin() as conn:
            conn.execute(locks_table.update().where(self._mine()).values(heartbeat=time.time()))

    def start_heartbeat(self, interval: float = LOCK_HEARTBEAT_S) -> None:
        """Refresh the heartbeat every ``interval`` seconds from a daemon thread (for holders on
        other hosts, whose pid cannot be checked)."""
        stop = threading.Event()
        self._stop = stop

        def beat() -> None:
            while not stop.wait(interval):
                try:
                    self.refresh()
                except Exception:  # a full disk or a locked file: the search itself will say so
                    pass

        threading.Thread(target=beat, name="kernelforge-lock-heartbeat", daemon=True).start()

    def release(self) -> None:
        if self._stop is not None:
            self._stop.set()
        try:
            with self.engine.begin() as conn:
                conn.execute(locks_table.delete().where(self._mine()))
        except (UserError, OperationalError):
            pass  # unwritable now: the next search sees a dead holder and takes over


def acquire_job_lock(engine: Engine, url: str, job: str) -> JobLock:
    """Take the lock of ``job`` for this process, or raise UserError naming the live holder.

    A dead holder's lock (same host: its pid is gone or was reused; another host: no heartbeat
    for LOCK_STALE_S seconds) is taken over. Re-entrant for the holding process.
    """
    got = take_job_lock(engine, job)
    if isinstance(got, JobLock):
        return got
    where = redact_url(url)  # messages name the database, never its password
    if got is None:
        raise UserError(f"job {job!r}: could not take its lock in {where} (another search is starting); retry")
    since = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(got.started))
    raise UserError(
        f"job {job!r} is being searched by process {got.pid} on host {got.host} (since {since}) "
        f"in {where}; wait for it to finish or stop it (a killed search's lock is taken over "
        "automatically), or give this run another job name or --storage"
    )


def take_job_lock(engine: Engine, job: str) -> JobLock | LockHolder | None:
    """Take the lock of ``job`` if it is free or its holder dead: the held JobLock; else the live
    holder's row (None when it changed hands three times in a row: someone else is starting)."""
    metadata.create_all(engine, tables=[locks_table])
    me, host, pid = process_identity()
    now = time.time()
    row = redact_data({"job": job, "holder": me, "host": host, "pid": pid, "started": now, "heartbeat": now})
    me = row["holder"]  # as stored: every later comparison is with the stored row
    for _ in range(3):
        try:
            with engine.begin() as conn:
                conn.execute(locks_table.insert(), row)
            return JobLock(engine, job, me, taken_over=None)
        except IntegrityError:
            pass
        held = job_lock(engine, job)
        if held is None:
            continue  # released in between: try again
        if held.holder == me:
            return JobLock(engine, job, me, taken_over=None)
        if holder_alive(held):
            return held
        with engine.begin() as conn:
            taken = conn.execute(locks_table.update().where(
                (locks_table.c.job == job) & (locks_table.c.holder == held.holder)).values(**row))
        if taken.rowcount == 1:
            return JobLock(engine, job, me, taken_over=f"process {held.pid} on {held.host}")
    return None


def job_lock(engine: Engine, job: str) -> LockHolder | None:
    """The lock row of ``job``, or None when no search holds it."""
    metadata.create_all(engine, tables=[locks_table])
    with engine.connect() as conn:
        row = conn.execute(sa.select(locks_table).where(locks_table.c.job == job)).mappings().first()
    return lock_record(row) if row else None


def holder_alive(held: LockHolder) -> bool:
    """Whether the process holding a lock still runs (on another host: whether its heartbeat is
    recent). A zombie or a reused pid counts as dead."""
    return process_alive(held.holder, held.host, int(held.pid), float(held.heartbeat), LOCK_STALE_S)


def process_alive(identity: str, host: str, pid: int, heartbeat: float, stale_s: float) -> bool:
    """Whether the process ``identity`` (:func:`process_identity`: host:pid:start time) still runs.

    On this host the pid is checked: gone, a zombie, or reused by another process (its start time
    differs) is dead. On another host only the heartbeat can tell: older than ``stale_s`` is dead.
    """
    if host != socket.gethostname():
        return time.time() - heartbeat < stale_s
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        pass  # alive, another user's
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            if f.read().rsplit(b")", 1)[1].split()[0] == b"Z":
                return False  # killed, not yet reaped by its parent
    except (OSError, IndexError):
        pass
    started = str(identity).rsplit(":", 1)[-1]
    return not started or _process_start(pid) in ("", started)


def _process_start(pid: int) -> str:
    """The start time of process ``pid`` in clock ticks since boot (Linux), '' elsewhere: with the
    pid, it identifies a process even after its pid is reused."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            fields = f.read().rsplit(b")", 1)[1].split()
        return fields[19].decode()
    except (OSError, IndexError):
        return ""


def process_identity() -> tuple[str, str, int]:
    """This process as locks and claims name it: (host:pid:start time, host, pid)."""
    host, pid = socket.gethostname(), os.getpid()
    return f"{host}:{pid}:{_process_start(pid)}", host, pid
