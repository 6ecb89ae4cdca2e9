"""The one storage-failure path: every failure to write (or read) the results database, from the
store, from Optuna's storage in the same database or from the dashboard mirror, becomes one
:class:`~kernelforge.errors.StorageError` naming the database and the fix (the CLI prints it as one
line and exits 1); and a clean-up after a first error never replaces it.

:func:`classify` is the only place that reads a database error's text to decide what it means.
"""

from __future__ import annotations

import re
import sqlite3
from typing import Callable, Iterable

from kernelforge.errors import StorageError
from kernelforge.redact import redact, redact_url
from kernelforge.storage_url import sqlite_file

#: Error texts (lower case) and what they mean: the first kind whose marker is in the text wins.
KINDS = (
    ("locked", ("database is locked", "database table is locked")),
    ("full", ("database or disk is full", "no space left", "file too large", "disk quota")),
    ("damaged", ("database disk image is malformed", "file is not a database", "file is encrypted or is not a database",
                 "malformed database schema")),
    ("read-only", ("readonly database", "read-only", "attempt to write a readonly", "permission denied")),
    ("io", ("disk i/o error", "unable to open database file")),
    ("lost", ("server closed the connection", "connection refused", "terminating connection", "could not connect",
              "connection is closed", "connection already closed", "ssl connection has been closed",
              "could not receive data", "could not send data", "no connection to the server")),
)

#: What to do about each kind (the message's fix).
FIXES = {
    "full": "free disk space (or give --storage a disk with room), then rerun: everything stored so far is kept",
    "read-only": "make the file and its folder writable, then rerun: everything stored so far is kept",
    "io": "check the disk and that the file and its folder exist and are writable, then rerun: everything "
          "stored so far is kept",
    "damaged": "the file is damaged: restore it from a backup (kernelforge backup JOB makes one), or recover what "
               "it holds with `sqlite3 FILE .recover | sqlite3 NEW.db` and point --storage at NEW.db",
    "lost": "check that the database server is running and reachable, then rerun: everything stored so far is kept",
    "locked": "wait for it (another job's search or report writing to the same file) and rerun: everything stored "
              "so far is kept",
}

_last_url: list[str] = []
_last_witness: list[Callable[[], StorageError | None]] = []


def note_url(url: str, witness: Callable[[], StorageError | None] | None = None) -> None:
    """Remember the database this process opened last, and how to ask whether it is still the one
    opened (``witness``): a failure raised without naming its database (Optuna's) is reported
    against it, and a database error of no known kind (Optuna finding no tables in a file that
    replaced the one it opened) as the witness's failure when it has one."""
    _last_url[:] = [url]
    _last_witness[:] = [witness] if witness is not None else []


def where(url: str) -> str:
    """The database as a message names it: a SQLite file with its folder, else the URL without
    its password."""
    path = sqlite_file(url)
    if path is not None:
        return f"{path} (folder {path.parent.resolve()})"
    return redact_url(url)


def _chain(exc: BaseException) -> Iterable[BaseException]:
    """``exc`` and everything it wraps (causes, contexts, a driver's ``orig``), each once."""
    seen: set[int] = set()
    stack: list[BaseException | None] = [exc]
    while stack:
        item = stack.pop()
        if item is None or id(item) in seen:
            continue
        seen.add(id(item))
        yield item
        stack.extend([getattr(item, "orig", None), item.__cause__, item.__context__])


def _texts(exc: BaseException) -> Iterable[str]:
    """The texts of ``exc`` and of everything it wraps."""
    return (str(item) for item in _chain(exc))


def classify(exc: BaseException) -> tuple[str, str] | None:
    """(kind, the database's own words) of a storage failure, or None when ``exc`` is not one."""
    for text in _texts(exc):
        lowered = text.lower()
        for kind, markers in KINDS:
            if any(marker in lowered for marker in markers):
                # SQLAlchemy's "(sqlite3.OperationalError) attempt to write...": the words, not the class.
                return kind, re.sub(r"^\([\w.]+\)\s*", "", text.strip().splitlines()[0]) if text.strip() else kind
    return None


def storage_error(exc: BaseException, url: str | None = None, *, from_driver: bool = False) -> StorageError | None:
    """``exc`` as one StorageError naming the database (``url``, else the last opened) and the fix;
    ``exc`` itself when it is one already; None when it is no storage failure. ``from_driver``: the
    database driver raised ``exc`` (SQLAlchemy's error hook says so), whatever its class."""
    if isinstance(exc, StorageError):
        return exc
    if not isinstance(exc, Exception) or isinstance(exc, (KeyboardInterrupt, SystemExit)):
        return None
    if not from_driver and not _is_database_error(exc):
        return None
    found = classify(exc)
    if found is None:
        # Asked once at the top (never from the driver's error hook, where IntegrityErrors are routine).
        return _last_witness[0]() if _last_witness and not from_driver else None
    kind, words = found
    url = url or (_last_url[0] if _last_url else "")
    return failure(kind, url, words)


def failure(kind: str, url: str, words: str) -> StorageError:
    """The StorageError of one kind of failure of the database at ``url``."""
    place = where(url) if url else "the results database"
    if kind == "locked":
        error = StorageError(f"the results database {place} stayed locked by another process for 30 s; {FIXES[kind]}")
    else:
        verb = {"damaged": "read", "lost": "reach", "io": "open"}.get(kind, "write")
        fix = FIXES[kind].replace("FILE", str(sqlite_file(url) or "FILE"))
        error = StorageError(f"cannot {verb} the results database {place}: {redact(words)}; {fix}")
    error.kind = kind  # type: ignore[attr-defined]
    return error


def _is_database_error(exc: BaseException) -> bool:
    """Whether ``exc`` (or what it wraps) came from a database driver, SQLAlchemy, Optuna's
    storage: only those are read as storage failures (a report file that cannot be written is not one)."""
    import sqlalchemy.exc

    kinds: tuple[type, ...] = (sqlite3.Error, sqlalchemy.exc.SQLAlchemyError)
    try:
        import optuna.exceptions

        kinds += (optuna.exceptions.StorageInternalError,)
    except ImportError:  # the GPU image has no Optuna
        pass
    return any(isinstance(item, kinds) for item in _chain(exc))


def clean_up(first: BaseException | None, steps: Iterable[Callable[[], object]]) -> None:
    """Run every clean-up step, in order, each whatever the others did.

    With ``first`` (the error already on its way to the user), a step's own failure is dropped:
    the first error is the one reported, never a later one from the clean-up. Without, the first
    step's failure is raised once every step ran (a storage failure as its StorageError)."""
    raised: BaseException | None = None
    for step in steps:
        try:
            step()
        except Exception as exc:  # noqa: BLE001 - see the contract: kept or dropped, never lost silently
            if first is None and raised is None:
                raised = storage_error(exc) or exc
    if raised is not None:
        raise raised
