"""The SQLAlchemy engine of a results database: its SQLite file and folder, the SQLite settings,
and write failures turned into one clear UserError.

A database that cannot be written (full disk, read-only file or folder, a damaged file, a lost
server, a lock held past the busy timeout) is one StorageError naming the file
(:mod:`kernelforge.store.failures`); each write is its own transaction, so what was stored
before stays.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import sqlalchemy as sa
from sqlalchemy.engine import Engine

from kernelforge.errors import UserError
from kernelforge.redact import redact, redact_url
from kernelforge.store.failures import storage_error
from kernelforge.storage_url import sqlite_file

def make_engine(url: str, create: bool) -> Engine:
    """An engine for ``url`` (a SQLite file's folder is created when ``create``); raises UserError
    for a bad URL, a missing driver, or a missing SQLite file when not ``create``."""
    _prepare_sqlite_path(url, create)
    try:
        engine = sa.create_engine(url, future=True)
    except ModuleNotFoundError as exc:  # a valid URL whose database driver is not installed
        raise UserError(f"storage {redact_url(url)!r}: its database driver is not installed ({exc.name}); install "
                        "it in this environment (PostgreSQL's, psycopg2, comes with the dev extra), or use "
                        "sqlite:///PATH") from None
    except Exception as exc:  # a bad URL
        raise UserError(f"storage {redact_url(url)!r}: {redact(str(exc))}; use a SQLAlchemy URL such as "
                        "sqlite:///reports/job/kernelforge.db") from None
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


def checkpoint(engine: Engine, truncate: bool = False) -> None:
    """Copy a SQLite file's write-ahead log into the file, so that a copy of the ``.db`` alone holds
    everything (``truncate``: and empty the ``-wal`` file, as at exit). A no-op on other databases;
    a passive checkpoint never waits for other connections (it copies what it can)."""
    if engine.dialect.name != "sqlite" or str(engine.url.database or ":memory:") == ":memory:":
        return
    with engine.connect() as conn:
        conn.exec_driver_sql(f"PRAGMA wal_checkpoint({'TRUNCATE' if truncate else 'PASSIVE'})").fetchall()


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
    path = sqlite_file(url)
    if path is None:
        return
    if not path.exists() and not create:
        raise UserError(f"no results database at {path}; run the search first")
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise UserError(f"cannot create {path.parent} for the results database ({exc.strerror})") from None


def _write_failure(url: str, context: Any) -> None:
    """SQLAlchemy ``handle_error`` hook: a full disk, a read-only file or folder, a damaged file, a
    lost server or a lock held too long becomes one StorageError naming the database
    (:mod:`kernelforge.store.failures`; each write is its own transaction, so everything stored
    before it stays stored)."""
    original = getattr(context, "original_exception", None)
    if original is None:
        return
    error = storage_error(original, url, from_driver=True)
    if error is not None:
        raise error from None
