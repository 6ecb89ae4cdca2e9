"""The store knows where it writes: the results database a search opened is the one it keeps
writing, or the search stops.

SQLite: a file deleted, moved or replaced under a running search is still open, and SQLite goes on
writing into it silently; everything then written is lost with the last handle. So the store
records the file's identity (device and inode) when it opens it, and before every transaction
(:meth:`Witness.check`, a ``stat`` of the path) compares it with the file now at the path. When
they differ, the search stops with one StorageError saying what happened, and what the opened file
held is first copied (SQLite's backup API, through a read-only connection kept open from the
start, so it still reaches the unlinked file) to a ``.rescued-TIME`` file beside the path.

PostgreSQL: every new connection (and :meth:`Witness.check` at the end) reads the database's
instance token from ``kf_meta``: another server, or another database at the same URL, has none or
another, and the search stops the same way.
"""

from __future__ import annotations

import os
import sqlite3
import time
import uuid
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import quote

import sqlalchemy as sa
from sqlalchemy.engine import Engine

from kernelforge.errors import StorageError
from kernelforge.redact import redact_url
from kernelforge.storage_url import sqlite_file

#: The kf_meta key of a database's instance token (written once, on first open).
INSTANCE_KEY = "instance"


@dataclass(frozen=True)
class FileIdentity:
    """A file's device and inode numbers."""

    device: int
    inode: int

    @classmethod
    def of(cls, path: Path) -> "FileIdentity | None":
        try:
            st = os.stat(path)
        except OSError:
            return None
        return cls(st.st_dev, st.st_ino)


class Witness:
    """Watches that ``engine`` still writes the database it opened (see the module docstring).

    Attach once the database is known to be ours and stamped (:meth:`attach`); :meth:`check`
    raises the StorageError (the same one every time) once it is not."""

    def __init__(self, url: str, engine: Engine):
        self.url = url
        self.engine = engine
        self.failed: StorageError | None = None
        self.path: Path | None = None
        self.identity: FileIdentity | None = None
        self.token: str | None = None
        self._reader: sqlite3.Connection | None = None

    @classmethod
    def attach(cls, url: str, engine: Engine) -> "Witness":
        witness = cls(url, engine)
        if engine.dialect.name == "sqlite":
            path = sqlite_file(url)
            if path is not None:
                witness._watch_file(path)
        else:
            witness.token = instance_token(engine)
            sa.event.listen(engine, "connect", witness._check_connection)
        return witness

    def _watch_file(self, path: Path) -> None:
        self.path = path
        self.identity = FileIdentity.of(path)
        try:  # opened now, so it still reaches the file if it is unlinked later
            self._reader = sqlite3.connect(f"file:{quote(str(path.resolve()))}?mode=ro", uri=True, check_same_thread=False)
            self._reader.execute("select count(*) from sqlite_master").fetchall()
        except sqlite3.Error:
            self._reader = None
        sa.event.listen(self.engine, "begin", lambda _conn: self.check())

    # -- the check -----------------------------------------------------------------------------

    def check(self) -> None:
        """Raise the StorageError of a database that is no longer the one opened (and keep raising
        it); a no-op while it is."""
        if self.failed is not None:
            raise self.failed
        if self.path is not None:
            now = FileIdentity.of(self.path)
            if now != self.identity:
                self._fail_file("was deleted" if now is None else "was replaced by another file")
        elif self.token is not None:
            try:
                token = instance_token(self.engine)
            except StorageError:
                raise
            except Exception:  # noqa: BLE001 - unreadable: a lost server is the engine hook's to name
                return
            if token != self.token:
                self._fail_server()

    def failure(self) -> StorageError | None:
        """The StorageError :meth:`check` would raise now, or None."""
        try:
            self.check()
        except StorageError as exc:
            return exc
        return None

    def _check_connection(self, dbapi_connection, _record) -> None:
        cursor = dbapi_connection.cursor()
        try:
            cursor.execute(f"select value from kf_meta where key = '{INSTANCE_KEY}'")
            row = cursor.fetchone()
        except Exception:  # noqa: BLE001 - no kf_meta: another database
            row = None
        finally:
            cursor.close()
            dbapi_connection.rollback()  # leave the new connection as it came, outside any transaction
        if (row[0] if row else None) != self.token:
            self._fail_server()

    def _fail_server(self) -> None:
        self.failed = StorageError(
            f"the results database {redact_url(self.url)} is no longer the one this search opened (another server "
            "or database answers at that URL); stopped, nothing more written: everything stored before is on the "
            "server it opened; point --storage at it and rerun to continue")
        raise self.failed

    def _fail_file(self, what: str) -> None:
        kept = self._rescue()
        self.failed = StorageError(f"the results database {self.path} {what} while the search ran; stopped, nothing "
                                   f"more written; {kept}")
        raise self.failed

    def _rescue(self) -> str:
        """Copy what the opened file holds beside its path; says where (or why nothing could be)."""
        assert self.path is not None
        if self._reader is None:
            return "what it held could not be saved (it could not be read); rerun to start again"
        target = self.path.with_name(f"{self.path.name}.rescued-{time.strftime('%Y%m%d-%H%M%S')}-{uuid.uuid4().hex[:6]}")
        try:
            target.parent.mkdir(parents=True, exist_ok=True)
            with sqlite3.connect(target) as copy:
                self._reader.backup(copy)
            copy.close()
        except (OSError, sqlite3.Error) as exc:
            return f"what it held could not be saved ({exc}); rerun to start again"
        return (f"everything it held is saved in {target}: move that file to {self.path} (or pass "
                f"--storage sqlite:///{target}) and rerun to continue")

    def close(self) -> None:
        if self._reader is not None:
            self._reader.close()
            self._reader = None


def instance_token(engine: Engine) -> str | None:
    """The database's instance token from kf_meta (None when it has none)."""
    from kernelforge.store.schema import meta_table

    with engine.connect() as conn:
        return conn.execute(sa.select(meta_table.c.value).where(meta_table.c.key == INSTANCE_KEY)).scalar()


def stamp_instance(engine: Engine) -> None:
    """Give the database an instance token if it has none (once; concurrent stamps keep the first)."""
    from sqlalchemy.exc import IntegrityError

    from kernelforge.store.schema import meta_table

    if instance_token(engine) is not None:
        return
    try:
        with engine.begin() as conn:
            conn.execute(meta_table.insert(), {"key": INSTANCE_KEY, "value": uuid.uuid4().hex})
    except IntegrityError:
        pass  # another worker stamped it at the same moment
