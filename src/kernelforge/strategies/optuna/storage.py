"""The storage of a stored Optuna study, shared by the workers of one job.

:class:`~kernelforge.strategies.optuna.strategy.OptunaStrategy` writes only finished trials there (one per
observed point), so nothing of a killed worker is left running and no heartbeat is needed.
"""

from __future__ import annotations

import contextlib
import fcntl
import time
from typing import Any, Iterator

from kernelforge.storage_url import sqlite_file

#: Tries at opening a shared storage (see :func:`shared_storage`).
STORAGE_ATTEMPTS = 5


def shared_storage(optuna: Any, url: str) -> Any:
    """Optuna's RDB storage at ``url``.

    Workers starting together on a new database race to create Optuna's tables (seen: "UNIQUE
    constraint failed: alembic_version.version_num" for all but one of three): the loser retries,
    and finds them made."""
    for attempt in range(STORAGE_ATTEMPTS):
        try:
            return optuna.storages.RDBStorage(url)
        except Exception:  # noqa: BLE001 - whatever the race raised; the last attempt's error is the caller's
            if attempt == STORAGE_ATTEMPTS - 1:
                raise
            time.sleep(0.2 * (attempt + 1))


@contextlib.contextmanager
def trial_write_lock(storage: Any) -> Iterator[None]:
    """Held while a worker reads the stored study and writes a point's trial, so two workers of one
    job never both write the same point (each reads the other's trial first). A SQLite storage
    (``sqlite:///PATH``, the workers of one host) is locked with ``flock`` on ``PATH.optuna-lock``
    beside it; other storages are not locked here (two writes of one point need two workers telling
    it within the same moment)."""
    path = sqlite_file(str(getattr(storage, "url", storage or "")))
    if path is None:
        yield
        return
    try:
        lock = open(f"{path}.optuna-lock", "a")
    except OSError:  # a read-only folder: the write itself fails next, on the storage-failure path
        yield
        return
    with lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)
