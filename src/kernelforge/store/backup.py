"""``kernelforge backup``: a consistent copy of a job's SQLite results database, safe while a
search writes it (SQLite's online backup API copies a snapshot, write-ahead log included)."""

from __future__ import annotations

import sqlite3
from pathlib import Path
from urllib.parse import quote
from typing import TYPE_CHECKING

from kernelforge.errors import StorageError, UserError

if TYPE_CHECKING:
    from kernelforge.store.store import Store


def backup_sqlite(store: "Store", destination: str | Path) -> Path:
    """Copy ``store``'s SQLite database to ``destination`` (a new file; a folder gets the
    database's file name). Raises UserError for a PostgreSQL store (use pg_dump) or an existing
    destination file, StorageError when the copy cannot be written (nothing half-written stays)."""
    if store.witness.path is None:
        raise UserError("kernelforge backup copies SQLite databases; back up a PostgreSQL database with pg_dump")
    store.verify()
    target = Path(destination)
    if target.is_dir():
        target = target / store.witness.path.name
    if target.exists():
        raise UserError(f"{target} exists; give backup a new file name (it never overwrites)")
    if target.resolve() == store.witness.path.resolve():
        raise UserError(f"{target} is the database itself; give backup another path")
    partial = target.with_name(target.name + ".partial")
    try:
        target.parent.mkdir(parents=True, exist_ok=True)
        source = sqlite3.connect(f"file:{quote(str(store.witness.path.resolve()))}?mode=ro", uri=True, timeout=30)
        try:
            with sqlite3.connect(partial) as copy:
                source.backup(copy)
            copy.close()
        finally:
            source.close()
        partial.replace(target)
    except (OSError, sqlite3.Error) as exc:
        partial.unlink(missing_ok=True)
        raise StorageError(f"cannot write the backup {target}: {exc}; free disk space or choose a writable folder "
                           "(the database itself is untouched)") from None
    return target
