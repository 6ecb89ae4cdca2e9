"""``kernelforge backup``: a consistent copy of a job's SQLite results database, safe while a
search writes it (SQLite's online backup API copies a snapshot, write-ahead log included)."""

from __future__ import annotations

import sqlite3
from pathlib import Path
from urllib.parse import quote

from kernelforge.errors import StorageError, UserError


def backup_sqlite(source: Path | None, destination: str | Path) -> Path:
    """Copy the SQLite database file ``source`` to ``destination`` (a new file; a folder gets the
    database's file name); returns the copy's path. Raises UserError for no file (a PostgreSQL
    store: use pg_dump) or an existing destination file, StorageError when the copy cannot be
    written (nothing half-written stays)."""
    if source is None:
        raise UserError("kernelforge backup copies SQLite databases; back up a PostgreSQL database with pg_dump")
    target = Path(destination)
    if target.is_dir() or str(destination).endswith(("/", "\\")):  # "dest/" means a folder, there or not
        target = target / source.name
    if target.exists():
        raise UserError(f"{target} exists; give backup a new file name (it never overwrites)")
    if target.resolve() == source.resolve():
        raise UserError(f"{target} is the database itself; give backup another path")
    if not target.parent.is_dir():  # a mistyped path creates no folders
        raise UserError(f"{target}: folder {target.parent} does not exist; create it first or fix the path")
    partial = target.with_name(target.name + ".partial")
    try:
        reader = sqlite3.connect(f"file:{quote(str(source.resolve()))}?mode=ro", uri=True, timeout=30)
        try:
            with sqlite3.connect(partial) as copy:
                reader.backup(copy)
            copy.close()
        finally:
            reader.close()
        partial.replace(target)
    except (OSError, sqlite3.Error) as exc:
        partial.unlink(missing_ok=True)
        raise StorageError(f"cannot write the backup {target}: {exc}; free disk space or choose a writable folder "
                           "(the database itself is untouched)") from None
    return target
