"""The storage of a stored Optuna study, shared by the workers of one job.

:class:`~kernelforge.strategies.optuna.strategy.OptunaStrategy` writes only finished trials there (one per
observed point), so nothing of a killed worker is left running and no heartbeat is needed.
"""

from __future__ import annotations

import time
from typing import Any

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
