"""The SQLAlchemy engine of a results database: its SQLite file and folder, the SQLite settings,
and write failures turned into one clear UserError.

A database that cannot be written (full disk, read-only file or folder, a lock held past the busy
timeout) is one UserError naming the file; each write is its own transaction, so what was stored
before stays.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import sqlalchemy as sa
from sqlalchemy.engine import Engine

from kernelforge.errors import UserError
from kernelforge.redact import redact, redact_url

#: SQLite error texts that mean "nothing can be written here", turned into one clear UserError.
WRITE_FAILURES = ("database or disk is full", "readonly database", "read-only", "disk i/o error",
                  "unable to open database file", "no space left")


def make_engine(url: str, create: bool) -> Engine:
    """An engine for ``url`` (a SQLite file's folder is created when ``create``); raises UserError
    for a bad URL, a missing driver, or a missing SQLite file when not ``create``."""
    _prepare_sqlite_path(url, create)
    try:
        engine = sa.create_engine(url, future=True)
    except Exception as exc:  # bad URL, missing driver
        raise UserError(f"storage {redact_url(url)!r}: {redact(str(exc))}; use a SQLAlchemy URL such as sqlite:///reports/job/kernelforge.db") from None
    sa.event.listen(engine, "handle_error", lambda context: _write_failure(url, context))
    return engine


def enable_sqlite_pragmas(engine: Engine) -> None:
    """WAL mode, a busy timeout and foreign keys on every new SQLite connection.

    Call only once the file is known to be ours: WAL mode rewrites the file header, and a foreign
    or damaged file must be left byte-for-byte untouched.
    """
    if engine.dialect.name == "sqlite":
        engine.dispose()
        sa.event.listen(engine, "connect", _sqlite_pragmas)


def _sqlite_pragmas(dbapi_connection, _record) -> None:
    cursor = dbapi_connection.cursor()
    # WAL lets a report read while a search writes; busy_timeout makes a second writer wait
    # rather than fail at once; synchronous=NORMAL in WAL mode is still crash-safe for the DB.
    cursor.execute("PRAGMA journal_mode=WAL")
    cursor.execute("PRAGMA busy_timeout=30000")
    cursor.execute("PRAGMA synchronous=NORMAL")
    cursor.execute("PRAGMA foreign_keys=ON")
    cursor.close()


def _prepare_sqlite_path(url: str, create: bool) -> None:
    if not url.startswith("sqlite:///"):
        return
    path = Path(url[len("sqlite:///"):])
    if str(path) in ("", ":memory:"):
        return
    if not path.exists() and not create:
        raise UserError(f"no results database at {path}; run the search first")
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise UserError(f"cannot create {path.parent} for the results database ({exc.strerror})") from None


def _write_failure(url: str, context: Any) -> None:
    """SQLAlchemy ``handle_error`` hook: a full disk or a read-only file or folder becomes one
    UserError naming the database (each write is its own transaction, so everything stored
    before it stays stored)."""
    text = str(getattr(context, "original_exception", "") or "").lower()
    locked = "database is locked" in text
    if not locked and not any(marker in text for marker in WRITE_FAILURES):
        return
    where = redact_url(url)  # a database error names the database, never its password
    if url.startswith("sqlite:///"):
        path = Path(url[len("sqlite:///"):])
        where = f"{path} (folder {path.parent.resolve()})"
    if locked:
        raise UserError(
            f"the results database {where} stayed locked by another process for 30 s; wait for it (another "
            "job's search or report writing to the same file) and rerun: everything stored so far is kept"
        ) from None
    raise UserError(
        f"cannot write the results database {where}: {redact(str(context.original_exception))}; free disk space or make "
        "the file and its folder writable, then rerun: everything stored so far is kept"
    ) from None
