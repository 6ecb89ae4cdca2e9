"""A shared Optuna study's storage and its trials' heartbeats: how the workers of one job tell a
peer's live trial from a killed one's.

A worker asks a trial, evaluates its point (seconds to minutes on a GPU) and tells it. While it
runs, the trial is RUNNING in the shared study. Optuna's RDB storage records a heartbeat per trial
and fails the trials whose heartbeat is older than a grace period (``fail_stale_trials``); its
``Study.optimize`` beats from a thread, which an ask-and-tell search has not. :class:`TrialBeats`
does that part: it beats for the trials its strategy holds (the worker's heartbeat thread calls
:meth:`TrialBeats.beat`) and fails stale ones. So a killed worker's trials are closed FAIL after
TRIAL_GRACE_S, and a live peer's trials are never touched.
"""

from __future__ import annotations

import time
import warnings
from typing import Any

#: A shared study's trials beat this often (seconds; Optuna takes an int) and are failed once their
#: heartbeat is TRIAL_GRACE_S old.
TRIAL_HEARTBEAT_S = 10
TRIAL_GRACE_S = 60
#: Tries at opening a shared storage (see :func:`shared_storage`).
STORAGE_ATTEMPTS = 5


def shared_storage(optuna: Any, url: str) -> Any:
    """Optuna's RDB storage at ``url`` with trial heartbeats enabled.

    Workers starting together on a new database race to create Optuna's tables (seen: "UNIQUE
    constraint failed: alembic_version.version_num" for all but one of three): the loser retries,
    and finds them made."""
    # Optuna warns that heartbeats are meant for Study.optimize: TrialBeats beats for ask-and-tell.
    warnings.filterwarnings("ignore", message="Heartbeat of storage is supposed to be used with Study.optimize")
    warnings.filterwarnings("ignore", message=r"Argument ``(heartbeat_interval|grace_period)`` is an experimental")
    warnings.filterwarnings("ignore", message=r"optuna\.storages\._heartbeat\.fail_stale_trials is experimental")
    for attempt in range(STORAGE_ATTEMPTS):
        try:
            return optuna.storages.RDBStorage(url, heartbeat_interval=TRIAL_HEARTBEAT_S, grace_period=TRIAL_GRACE_S)
        except Exception:  # noqa: BLE001 - whatever the race raised; the last attempt's error is the caller's
            if attempt == STORAGE_ATTEMPTS - 1:
                raise
            time.sleep(0.2 * (attempt + 1))


class TrialBeats:
    """The heartbeats of the trials one strategy holds in ``study``, whose storage is ``storage``
    (a no-op unless that is an RDB storage: in memory, nobody else can see the trials)."""

    def __init__(self, optuna: Any, storage: Any, study: Any):
        self._optuna = optuna
        self._study = study
        self._storage = storage if isinstance(storage, optuna.storages.RDBStorage) else None
        self._study_id = self._storage.get_study_id_from_name(study.study_name) if self._storage else None
        self._held: dict[int, int] = {}  # trial number -> trial id

    def hold(self, number: int) -> None:
        """A trial this strategy asked: beat for it until :meth:`drop`."""
        if self._storage is None:
            return
        trial_id = self._storage.get_trial_id_from_study_id_trial_number(self._study_id, number)
        self._held[number] = trial_id
        self._storage.record_heartbeat(trial_id)

    def drop(self, number: int) -> None:
        self._held.pop(number, None)

    def held(self) -> tuple[int, ...]:
        """The numbers of the trials beaten for."""
        return tuple(self._held)

    def beat(self) -> None:
        """Record a heartbeat for every held trial, and fail the stale trials of the study (those
        of killed workers). Called from the worker's heartbeat thread."""
        if self._storage is None:
            return
        for trial_id in tuple(self._held.values()):  # a copy: the search thread adds and drops
            self._storage.record_heartbeat(trial_id)
        self._optuna.storages.fail_stale_trials(self._study)
