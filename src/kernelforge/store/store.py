"""The results database: every candidate with its full source, every compile and every result.

One database per job (SQLAlchemy; a SQLite file by default, any URL such as PostgreSQL when several
workers share one search). Optuna's studies live in the same database through Optuna's own tables.
The store is the search's only feedback channel: resume, replay and reports all read it.

Durability: every write is its own transaction, so a search killed with SIGKILL loses at most the
evaluation in flight. A result is unique per (candidate, shape, dtype, device, versions): the same
candidate is never evaluated twice in the same conditions.

No secret is stored: every row passes through the one redactor (:mod:`kernelforge.redact`) as it
is written, so a registered secret (the LLM key, a storage password) inside a message, a source,
a transcript or an environment is stored as ``***``; the store's URL registers its own password.
A source stored that way differs from the one that ran (its id is the hash of the one that ran).

The pieces: :mod:`~kernelforge.store.schema` (tables; foreign, damaged and newer databases are
refused untouched), :mod:`~kernelforge.store.engine` (SQLite settings, write failures),
:mod:`~kernelforge.store.records` (what the queries return), :mod:`~kernelforge.store.llm_log`
(the LLM call log), :mod:`~kernelforge.store.baseline_log` (the baseline's re-timings),
:mod:`~kernelforge.store.ledger` (the workers of a job, their claims and
shared budgets), :mod:`~kernelforge.store.lock` (the lead worker's lock) and
:mod:`~kernelforge.store.judges` (the judge each job's verdicts of a block were given under).
"""

from __future__ import annotations

import dataclasses
import json
import time
from pathlib import Path
from typing import Any, Iterable

import sqlalchemy as sa
from sqlalchemy.exc import IntegrityError

from kernelforge.candidate import Candidate
from kernelforge.redact import redact_data, register_url
from kernelforge.result import StoredResult
from kernelforge.baseline_timing import BaselineTiming
from kernelforge.store import baseline_log, judges, llm_log, llm_stats, lock
from kernelforge.store.llm_stats import ModelStats
from kernelforge.errors import UserError
from kernelforge.store.backup import backup_sqlite
from kernelforge.store.engine import checkpoint, enable_sqlite_pragmas, make_engine
from kernelforge.store.failures import note_url
from kernelforge.store.ledger import Ledger
from kernelforge.store.lock import JobLock
from kernelforge.store.records import (Confirmation, LLMCall, LLMUsage, LockHolder, StoreCounts, StoredCandidate, StoredCompile,
                                       StoredConfirmation, StoredTemplate, candidate_record, compile_record,
                                       confirmation_record, result_record)
from kernelforge.store.witness import Witness, stamp_instance
from kernelforge.store.schema import (add_missing_tables, candidates_table, compiles_table, confirmations_table,
                                      create_schema, open_schema, results_table)

#: Results stored between two WAL checkpoints (and one at every confirmation and at close): a copy
#: of the ``.db`` file alone then lacks at most these.
CHECKPOINT_EVERY = 20


class Store:
    """A results database at a SQLAlchemy URL (created on first use unless ``create`` is False).

    Raises UserError for a database that is not kernelforge's, damaged, or of a newer schema
    (leaving it untouched), and for any write that fails (full disk, read-only file).
    """

    def __init__(self, url: str, *, create: bool = True):
        register_url(url)
        self.url = url
        self.engine = make_engine(url, create)
        ours = open_schema(self.engine, url, create)
        enable_sqlite_pragmas(self.engine)
        if ours:
            add_missing_tables(self.engine)
        else:
            create_schema(self.engine, url)
        if self.engine.dialect.name != "sqlite":
            stamp_instance(self.engine)
        self.witness = Witness.attach(url, self.engine)
        note_url(url, self.witness.failure)
        self._unsaved = 0  # results stored since the last WAL checkpoint

    def verify(self) -> None:
        """Raise StorageError unless this store still writes the database it opened (the SQLite
        file at its path, the PostgreSQL database at its URL: :mod:`kernelforge.store.witness`);
        checked before every transaction, and by the commands before they say where results are."""
        self.witness.check()

    def checkpoint(self, truncate: bool = False) -> None:
        """Copy SQLite's write-ahead log into the database file (:func:`kernelforge.store.engine.
        checkpoint`): every CHECKPOINT_EVERY results, at each confirmation, when the job is marked
        finished, and at :meth:`close` (``truncate``)."""
        checkpoint(self.engine, truncate)
        self._unsaved = 0

    def close(self) -> None:
        """Checkpoint the WAL (no big ``-wal`` stays behind) and release the database. A store that
        no longer writes its database (or cannot) is released without the checkpoint."""
        try:
            if self.witness.failed is None:
                self.checkpoint(truncate=True)
        except UserError:
            pass  # closing never replaces the error that ended the run; what was stored is stored
        finally:
            self.witness.close()
            self.engine.dispose()

    def backup(self, destination: str | Path) -> Path:
        """A consistent copy of this SQLite database at ``destination`` (SQLite's online backup:
        safe while a search writes it; the copy holds the write-ahead log's content too); returns
        its path (:func:`kernelforge.store.backup.backup_sqlite`)."""
        self.verify()
        return backup_sqlite(self.witness.path, destination)

    # -- candidates --------------------------------------------------------------------------

    def add_candidate(self, candidate: Candidate, job: str | None = None) -> None:
        """Store a candidate (its full source); a no-op when it is already stored."""
        row = {
            "id": candidate.id, "block": candidate.block_id, "template": candidate.template_id,
            "params": json.dumps(candidate.point), "origin": candidate.origin, "parent": candidate.parent,
            "source": candidate.source, "job": job, "created": time.time(),
        }
        with self.engine.begin() as conn:
            exists = conn.execute(sa.select(candidates_table.c.id).where(candidates_table.c.id == candidate.id)).first()
            if exists is None:
                try:
                    conn.execute(candidates_table.insert(), redact_data(row))
                except IntegrityError:
                    pass  # inserted concurrently by another worker

    def candidate(self, candidate_id: str) -> StoredCandidate | None:
        with self.engine.connect() as conn:
            row = conn.execute(sa.select(candidates_table).where(candidates_table.c.id == candidate_id)).mappings().first()
        return candidate_record(row) if row else None

    def candidates(self, block: str | None = None) -> list[StoredCandidate]:
        """Stored candidates (of one block), oldest first."""
        query = sa.select(candidates_table).order_by(candidates_table.c.created)
        if block:
            query = query.where(candidates_table.c.block == block)
        with self.engine.connect() as conn:
            return [candidate_record(r) for r in conn.execute(query).mappings()]

    # -- compiles ------------------------------------------------------------------------------

    def add_compile(self, candidate_id: str, target: str, dtype: str, status: str, message: str,
                    kernels: list[dict[str, Any]]) -> None:
        """Store (or replace) the compile of a candidate for ``target`` and ``dtype``."""
        row = {"candidate_id": candidate_id, "target": target, "dtype": dtype, "status": status,
               "message": message, "kernels": json.dumps(kernels), "created": time.time()}
        with self.engine.begin() as conn:
            conn.execute(compiles_table.delete().where(
                (compiles_table.c.candidate_id == candidate_id) & (compiles_table.c.target == target)
                & (compiles_table.c.dtype == dtype)))
            conn.execute(compiles_table.insert(), redact_data(row))

    def compile(self, candidate_id: str, target: str, dtype: str) -> StoredCompile | None:
        with self.engine.connect() as conn:
            row = conn.execute(sa.select(compiles_table).where(
                (compiles_table.c.candidate_id == candidate_id) & (compiles_table.c.target == target)
                & (compiles_table.c.dtype == dtype))).mappings().first()
        return compile_record(row) if row else None

    def compiles(self, candidate_ids: Iterable[str], dtype: str) -> list[StoredCompile]:
        """The compiles of these candidates for ``dtype`` on every target, by target."""
        ids = list(candidate_ids)
        if not ids:
            return []
        query = (sa.select(compiles_table).where(compiles_table.c.candidate_id.in_(ids))
                 .where(compiles_table.c.dtype == dtype)
                 .order_by(compiles_table.c.target, compiles_table.c.candidate_id))
        with self.engine.connect() as conn:
            return [compile_record(r) for r in conn.execute(query).mappings()]

    # -- results -------------------------------------------------------------------------------

    def add_result(self, result: StoredResult) -> bool:
        """Store a result; False (and nothing written) when the same one is already stored."""
        row = {
            "candidate_id": result.candidate_id, "block": result.block, "shape": result.shape,
            "dtype": result.dtype, "device": result.device, "env_key": result.env_key,
            "status": result.status.value, "rel_error": _finite(result.rel_error), "excess": _finite(result.excess),
            "median_s": result.median_s, "p20_s": result.p20_s, "p80_s": result.p80_s, "samples": result.samples,
            "timing_method": result.timing_method, "timing_label": result.timing_label, "joules": result.joules,
            "flops": result.flops, "bytes": result.bytes, "message": result.message,
            "env": json.dumps(result.env, sort_keys=True, default=str), "job": result.job, "created": result.created,
            "host_launch_s": _finite(result.host_launch_s),
        }
        try:
            with self.engine.begin() as conn:
                conn.execute(results_table.insert(), redact_data(row))
        except IntegrityError:
            return False
        self._unsaved += 1
        if self._unsaved >= CHECKPOINT_EVERY:
            self.checkpoint()
        return True

    def find_result(self, candidate_id: str, shape: str, dtype: str, env_key_: str) -> StoredResult | None:
        query = sa.select(results_table).where(
            (results_table.c.candidate_id == candidate_id) & (results_table.c.shape == shape)
            & (results_table.c.dtype == dtype) & (results_table.c.env_key == env_key_))
        with self.engine.connect() as conn:
            row = conn.execute(query).mappings().first()
        return result_record(row) if row else None

    def results(self, block: str | None = None, candidate_id: str | None = None,
                dtype: str | None = None) -> list[StoredResult]:
        """Stored results in the order they were stored."""
        query = sa.select(results_table).order_by(results_table.c.id)
        if block:
            query = query.where(results_table.c.block == block)
        if candidate_id:
            query = query.where(results_table.c.candidate_id == candidate_id)
        if dtype:
            query = query.where(results_table.c.dtype == dtype)
        with self.engine.connect() as conn:
            return [result_record(r) for r in conn.execute(query).mappings()]

    def evaluated(self, job: str, block: str, template: str | None = None, shape: str | None = None,
                  dtype: str | None = None) -> set[str]:
        """Ids of the candidates this job evaluated on ``block`` (optionally one template or shape)."""
        query = (sa.select(results_table.c.candidate_id).distinct()
                 .join(candidates_table, candidates_table.c.id == results_table.c.candidate_id)
                 .where((results_table.c.job == job) & (results_table.c.block == block)))
        if template:
            query = query.where(candidates_table.c.template == template)
        if shape:
            query = query.where(results_table.c.shape == shape)
        if dtype:
            query = query.where(results_table.c.dtype == dtype)
        with self.engine.connect() as conn:
            return {row[0] for row in conn.execute(query)}

    def jobs(self) -> list[str]:
        """The names of the jobs that stored results here, sorted."""
        query = sa.select(results_table.c.job).distinct().where(results_table.c.job.is_not(None))
        with self.engine.connect() as conn:
            return sorted(row[0] for row in conn.execute(query))

    def counts(self) -> StoreCounts:
        with self.engine.connect() as conn:
            return StoreCounts(
                candidates=conn.execute(sa.select(sa.func.count()).select_from(candidates_table)).scalar_one(),
                results=conn.execute(sa.select(sa.func.count()).select_from(results_table)).scalar_one(),
            )

    # -- confirmations -------------------------------------------------------------------------

    def add_confirmation(self, confirmation: Confirmation) -> None:
        """Store one interleaved re-timing of a candidate against the baseline on one shape."""
        row = {**dataclasses.asdict(confirmation), "speedups": json.dumps(list(confirmation.speedups)),
               "pair_times": json.dumps([list(p) for p in confirmation.pair_times]), "created": time.time()}
        with self.engine.begin() as conn:
            conn.execute(confirmations_table.insert(), redact_data(row))
        self.checkpoint()  # a confirmed winner: the .db file alone holds the job's results

    def confirmations(self, job: str | None = None) -> list[StoredConfirmation]:
        """Stored confirmations (of one job) in the order they were stored."""
        query = sa.select(confirmations_table).order_by(confirmations_table.c.id)
        if job:
            query = query.where(confirmations_table.c.job == job)
        with self.engine.connect() as conn:
            return [confirmation_record(r) for r in conn.execute(query).mappings()]

    # -- the baseline's re-timings (kernelforge.store.baseline_log) ----------------------------

    def add_baseline_timing(self, timing: BaselineTiming) -> None:
        """Store one re-timing of a shape's baseline taken during a search."""
        baseline_log.add_baseline_timing(self.engine, timing)

    def baseline_timings(self, block: str, dtype: str | None = None, env_key: str | None = None) -> list[BaselineTiming]:
        """The stored re-timings of ``block``'s baselines (of one dtype and environment), oldest first."""
        return baseline_log.baseline_timings(self.engine, block, dtype, env_key)

    def judge_of(self, job: str, block: str) -> str | None:
        """The judge hash ``job``'s stored verdicts of ``block`` were given under (None: not recorded)."""
        return judges.judge_of(self.engine, job, block)

    def record_judge(self, job: str, block: str, judge: str) -> None:
        """Record the judge hash ``job``'s verdicts of ``block`` are given under (:mod:`.judges`)."""
        judges.record_judge(self.engine, job, block, judge)

    # -- LLM templates and transcripts (kernelforge.store.llm_log) -----------------------------

    def add_template(self, template_id: str, block: str, text: str, *, origin: str = "llm",
                     parent: str | None = None, call_seq: int | None = None, job: str | None = None) -> None:
        """Store a generated template's full text; a no-op when it is already stored."""
        llm_log.add_template(self.engine, template_id, block, text, origin=origin, parent=parent,
                             call_seq=call_seq, job=job)

    def templates(self, block: str | None = None, job: str | None = None) -> list[StoredTemplate]:
        """Stored generated templates, oldest first."""
        return llm_log.templates(self.engine, block, job)

    def add_llm_calls(self, rows: list[dict[str, Any]]) -> list[int]:
        """Store the attempts of one request (one transaction); returns their row ids."""
        return llm_log.add_llm_calls(self.engine, rows)

    def set_llm_outcome(self, row_id: int, kind: str, message: str | None = None, *,
                        template_id: str | None = None, candidate_id: str | None = None) -> None:
        """Record what became of a response (its final attempt's row)."""
        llm_log.set_llm_outcome(self.engine, row_id, kind, message, template_id=template_id,
                                candidate_id=candidate_id)

    def llm_calls(self, job: str | None = None, *, final_only: bool = False) -> list[LLMCall]:
        """Stored LLM attempts in the order they were taken in (run, seq, attempt)."""
        return llm_log.llm_calls(self.engine, job, final_only=final_only)

    def llm_usage(self, job: str) -> LLMUsage:
        """What the live generator spent on ``job`` and its last run and sequence numbers."""
        return llm_log.llm_usage(self.engine, job)

    def llm_model_stats(self, job: str) -> list[ModelStats]:
        """Per model and endpoint: what ``job``'s live calls cost and became (kernelforge.store.llm_stats)."""
        return llm_stats.llm_model_stats(self.engine, job)

    # -- job locks (kernelforge.store.lock) -----------------------------------------------------

    def acquire_job_lock(self, job: str) -> JobLock:
        """Take the lock of ``job`` for this process, or raise UserError naming the live holder
        (a dead holder's lock is taken over; re-entrant for the holding process)."""
        return lock.acquire_job_lock(self.engine, self.url, job)

    def take_job_lock(self, job: str) -> JobLock | LockHolder | None:
        """Take the lock of ``job`` if free or its holder is dead; else the live holder's row (None:
        it changed hands under us). The lead of a job's workers holds it."""
        return lock.take_job_lock(self.engine, job)

    def job_lock(self, job: str) -> LockHolder | None:
        """The lock row of ``job``, or None."""
        return lock.job_lock(self.engine, job)

    def ledger(self, job: str, env_key_: str) -> Ledger:
        """This process's place among the workers of ``job`` under ``env_key_``
        (:mod:`kernelforge.store.ledger`)."""
        return Ledger(self.engine, job, env_key_)


def _finite(value: float | None) -> float | None:
    if value is None or value != value or value in (float("inf"), float("-inf")):
        return None
    return value
