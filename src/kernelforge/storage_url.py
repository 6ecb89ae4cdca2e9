"""The one reading of a storage URL's SQLite file.

A job's results, a recording to replay and Optuna's mirror are SQLAlchemy URLs; where one of them
is a SQLite file (``sqlite:///PATH``, ``sqlite:////ABS`` or with ``?options``), everything that
needs the file (its folder, its lock, its backup, the report beside it, a message naming it) asks
:func:`sqlite_file`, so a query string or an in-memory database is read the same way everywhere.
"""

from __future__ import annotations

from pathlib import Path

__all__ = ["sqlite_file"]

_PREFIX = "sqlite:///"


def sqlite_file(url: str) -> Path | None:
    """The file of a SQLite URL (``sqlite:///PATH``, its ``?query`` dropped); None for another
    database, one in memory, or a SQLite URI (``sqlite:///file:...``) whose file only SQLite reads."""
    if not url.startswith(_PREFIX):
        return None
    text = url[len(_PREFIX):].partition("?")[0]
    if text in ("", ":memory:", ".") or text.startswith("file:"):
        return None
    return Path(text)
