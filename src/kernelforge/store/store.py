"""The results database: every candidate with its full source, every compile and every result.

One database per job (SQLAlchemy; a SQLite file by default, any URL such as PostgreSQL when several
workers share one search). Optuna's studies live in the same database through Optuna's own tables.
The store is the search's only feedback channel: resume, replay and reports all read it.

Durability: every write is its own transaction, so a search killed with SIGKILL loses at most the
evaluation in flight. A result is unique per (candidate, shape, dtype, device, versions): the same
candidate is never evaluated twice in the same conditions.

One search per job at a time: ``kf_locks`` holds a row per running job with its holder's host, pid
and process start time. A second search of the job refuses with a message naming the holder while
it is alive, and takes the lock over when it is dead (same host: the pid is gone, a zombie, or
reused by another process; another host: no heartbeat for LOCK_STALE_S seconds). Searches of
other jobs in the same database are not affected. A database that cannot be written (full disk,
read-only file or folder) is one UserError naming the file; what was stored before stays.
"""

from __future__ import annotations

import hashlib
import json
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterable

import sqlalchemy as sa
from sqlalchemy.exc import IntegrityError, OperationalError, DatabaseError

from kernelforge.candidate import Candidate
from kernelforge.errors import UserError
from kernelforge.result import Status

SCHEMA_VERSION = 1
APPLICATION = "kernelforge"

metadata = sa.MetaData()

meta_table = sa.Table(
    "kf_meta", metadata,
    sa.Column("key", sa.String(64), primary_key=True),
    sa.Column("value", sa.Text, nullable=False),
)

candidates_table = sa.Table(
    "kf_candidates", metadata,
    sa.Column("id", sa.String(32), primary_key=True),
    sa.Column("block", sa.String(200), nullable=False, index=True),
    sa.Column("template", sa.String(300), nullable=False),
    sa.Column("params", sa.Text, nullable=False),  # JSON object, in space order
    sa.Column("origin", sa.String(32), nullable=False),
    sa.Column("parent", sa.String(32)),
    sa.Column("source", sa.Text, nullable=False),
    sa.Column("job", sa.String(200)),
    sa.Column("created", sa.Float, nullable=False),
)

compiles_table = sa.Table(
    "kf_compiles", metadata,
    sa.Column("candidate_id", sa.String(32), sa.ForeignKey("kf_candidates.id"), primary_key=True),
    sa.Column("target", sa.String(32), primary_key=True),
    sa.Column("dtype", sa.String(16), primary_key=True),
    sa.Column("status", sa.String(32), nullable=False),
    sa.Column("message", sa.Text, nullable=False, default=""),
    sa.Column("kernels", sa.Text, nullable=False, default="[]"),  # JSON list of per-kernel resources
    sa.Column("created", sa.Float, nullable=False),
)

results_table = sa.Table(
    "kf_results", metadata,
    sa.Column("id", sa.Integer, primary_key=True, autoincrement=True),
    sa.Column("candidate_id", sa.String(32), sa.ForeignKey("kf_candidates.id"), nullable=False, index=True),
    sa.Column("block", sa.String(200), nullable=False, index=True),
    sa.Column("shape", sa.String(200), nullable=False),
    sa.Column("dtype", sa.String(16), nullable=False),
    sa.Column("device", sa.String(200), nullable=False),  # e.g. "cuda NVIDIA H200" or "interpret"
    sa.Column("env_key", sa.String(32), nullable=False),  # hash of device name and versions
    sa.Column("status", sa.String(32), nullable=False),
    sa.Column("rel_error", sa.Float),
    sa.Column("excess", sa.Float),
    sa.Column("median_s", sa.Float),
    sa.Column("p20_s", sa.Float),
    sa.Column("p80_s", sa.Float),
    sa.Column("samples", sa.Integer),
    sa.Column("timing_method", sa.String(32)),
    sa.Column("timing_label", sa.Text),
    sa.Column("joules", sa.Float),
    sa.Column("flops", sa.Float),
    sa.Column("bytes", sa.Float),
    sa.Column("message", sa.Text, nullable=False, default=""),
    sa.Column("env", sa.Text, nullable=False),  # JSON: device, versions, clocks
    sa.Column("job", sa.String(200)),
    sa.Column("created", sa.Float, nullable=False),
    sa.UniqueConstraint("candidate_id", "shape", "dtype", "env_key", name="uq_result"),
)


confirmations_table = sa.Table(
    "kf_confirmations", metadata,
    sa.Column("id", sa.Integer, primary_key=True, autoincrement=True),
    sa.Column("job", sa.String(200), nullable=False, index=True),
    sa.Column("block", sa.String(200), nullable=False),
    sa.Column("shape", sa.String(200), nullable=False),
    sa.Column("dtype", sa.String(16), nullable=False),
    sa.Column("candidate_id", sa.String(32), sa.ForeignKey("kf_candidates.id"), nullable=False),
    sa.Column("baseline_id", sa.String(32), sa.ForeignKey("kf_candidates.id"), nullable=False),
    sa.Column("env_key", sa.String(32), nullable=False),
    sa.Column("speedups", sa.Text, nullable=False),  # JSON list: baseline/candidate per interleaved pair
    sa.Column("median", sa.Float, nullable=False),
    sa.Column("p20", sa.Float, nullable=False),
    sa.Column("p80", sa.Float, nullable=False),
    sa.Column("created", sa.Float, nullable=False),
)


# Templates written by the LLM generator: a resumed or replayed search rebuilds them from here (the
# candidates alone would not do: Optuna tunes the template, not one rendering of it).
templates_table = sa.Table(
    "kf_templates", metadata,
    sa.Column("id", sa.String(300), primary_key=True),  # <block>/llm_<hash of text>
    sa.Column("block", sa.String(200), nullable=False, index=True),
    sa.Column("text", sa.Text, nullable=False),
    sa.Column("origin", sa.String(32), nullable=False),
    sa.Column("parent", sa.String(32)),  # the candidate the model was asked to improve on
    sa.Column("call_seq", sa.Integer),  # kf_llm_calls.seq of the response that wrote it
    sa.Column("job", sa.String(200)),
    sa.Column("created", sa.Float, nullable=False),
)

# Every HTTP attempt of the LLM generator: the request (messages and parameters, never the API
# key), the response, token counts and latency. Attempts of one request share ``seq`` (the order in
# which the search took in responses); the last attempt of a request carries ``kind``: what became
# of it (ok / wrong / compile_error ... after evaluation, or no_code, truncated, policy,
# request_timeout ...). ``tick`` is the search's evaluation count when the response was taken in,
# so a replay hands it over at the same moment.
llm_calls_table = sa.Table(
    "kf_llm_calls", metadata,
    sa.Column("id", sa.Integer, primary_key=True, autoincrement=True),
    sa.Column("job", sa.String(200), nullable=False, index=True),
    sa.Column("run", sa.Integer, nullable=False),
    sa.Column("seq", sa.Integer, nullable=False),
    sa.Column("attempt", sa.Integer, nullable=False),
    sa.Column("final", sa.Boolean, nullable=False),
    sa.Column("block", sa.String(200), nullable=False),
    sa.Column("purpose", sa.String(32), nullable=False),  # new | repair
    sa.Column("parent", sa.String(32)),
    sa.Column("depth", sa.Integer, nullable=False, default=0),
    sa.Column("model", sa.String(200), nullable=False),
    sa.Column("base_url", sa.Text, nullable=False),
    sa.Column("request", sa.Text, nullable=False),  # JSON: messages and sampling parameters
    sa.Column("request_hash", sa.String(32), nullable=False, index=True),
    sa.Column("response", sa.Text),
    sa.Column("finish_reason", sa.String(32)),
    sa.Column("status", sa.String(32), nullable=False),  # of this attempt: ok, rate_limited, ...
    sa.Column("http_status", sa.Integer),
    sa.Column("error", sa.Text),
    sa.Column("prompt_tokens", sa.Integer),
    sa.Column("completion_tokens", sa.Integer),
    sa.Column("latency_s", sa.Float),
    sa.Column("tick", sa.Integer, nullable=False, default=0),
    sa.Column("kind", sa.String(32)),
    sa.Column("message", sa.Text),  # what was wrong with the response, for the record
    sa.Column("template_id", sa.String(300)),
    sa.Column("candidate_id", sa.String(32)),
    sa.Column("replayed_from", sa.Text),
    sa.Column("created", sa.Float, nullable=False),
)

#: Tables added after schema version 1 without changing it: created on open when missing.
_ADDED_TABLES = (templates_table, llm_calls_table)


# One row per job while a search runs it: who holds it (host, pid and the process's start time, so
# a reused pid is not mistaken for the holder) and when it last said it was alive. A second search of
# the same job refuses while the holder lives, and takes over (compare-and-swap on ``holder``) when
# it is dead: a SIGKILLed search leaves its row behind, and that must not block the rerun.
locks_table = sa.Table(
    "kf_locks", metadata,
    sa.Column("job", sa.String(200), primary_key=True),
    sa.Column("holder", sa.String(300), nullable=False),  # host:pid:process start time
    sa.Column("host", sa.String(200), nullable=False),
    sa.Column("pid", sa.Integer, nullable=False),
    sa.Column("started", sa.Float, nullable=False),
    sa.Column("heartbeat", sa.Float, nullable=False),
)

#: A lock whose holder runs on another host is taken over when its heartbeat is older than this
#: (the holder refreshes it every LOCK_HEARTBEAT_S seconds; on the same host the pid is checked).
LOCK_STALE_S = 300.0
LOCK_HEARTBEAT_S = 30.0

#: SQLite error texts that mean "nothing can be written here", turned into one clear UserError.
_WRITE_FAILURES = ("database or disk is full", "readonly database", "read-only", "disk i/o error",
                   "unable to open database file", "no space left")


def env_key(env: dict[str, Any]) -> str:
    """What makes two measurements comparable: device and library versions (not clocks)."""
    keep = {k: env.get(k) for k in ("device", "device_name", "capability", "torch", "triton", "cuda", "driver")}
    return hashlib.sha256(json.dumps(keep, sort_keys=True).encode()).hexdigest()[:16]


@dataclass(frozen=True)
class StoredResult:
    """One row of kf_results, as the search and the reports read it."""

    candidate_id: str
    block: str
    shape: str
    dtype: str
    device: str
    env_key: str
    status: Status
    rel_error: float | None
    median_s: float | None
    p20_s: float | None
    p80_s: float | None
    samples: int | None
    timing_method: str | None
    timing_label: str | None
    joules: float | None
    flops: float | None
    bytes: float | None
    message: str
    env: dict[str, Any]
    job: str | None
    created: float
    excess: float | None = None

    @property
    def ok(self) -> bool:
        return self.status is Status.OK


@dataclass(frozen=True)
class StoredCandidate:
    id: str
    block: str
    template: str
    params: dict[str, Any]
    origin: str
    parent: str | None
    source: str
    job: str | None
    created: float


def _sqlite_pragmas(dbapi_connection, _record) -> None:
    cursor = dbapi_connection.cursor()
    # WAL lets a report read while a search writes; busy_timeout makes a second writer wait
    # rather than fail at once; synchronous=NORMAL in WAL mode is still crash-safe for the DB.
    cursor.execute("PRAGMA journal_mode=WAL")
    cursor.execute("PRAGMA busy_timeout=30000")
    cursor.execute("PRAGMA synchronous=NORMAL")
    cursor.execute("PRAGMA foreign_keys=ON")
    cursor.close()


class Store:
    """A results database at a SQLAlchemy URL (created on first use)."""

    def __init__(self, url: str, *, create: bool = True):
        self.url = url
        self._prepare_sqlite_path(url, create)
        try:
            self.engine = sa.create_engine(url, future=True)
        except Exception as exc:  # bad URL, missing driver
            raise UserError(f"storage {url!r}: {exc}; use a SQLAlchemy URL such as sqlite:///reports/job/kernelforge.db") from None
        sa.event.listen(self.engine, "handle_error", self._write_failure)
        self._open(create)

    def _enable_sqlite_pragmas(self) -> None:
        # Only once the file is known to be ours: WAL mode rewrites the file header, and a
        # foreign or damaged file must be left byte-for-byte untouched.
        if self.engine.dialect.name == "sqlite":
            self.engine.dispose()
            sa.event.listen(self.engine, "connect", _sqlite_pragmas)

    @staticmethod
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

    def _open(self, create: bool) -> None:
        try:
            inspector = sa.inspect(self.engine)
            tables = set(inspector.get_table_names())
        except (DatabaseError, OperationalError) as exc:
            raise UserError(f"storage {self.url}: not a readable database ({exc.orig}); it was left untouched") from None
        ours = {t.name for t in metadata.sorted_tables}
        if tables and "kf_meta" not in tables:
            foreign = sorted(t for t in tables if not (t in ours or _is_optuna_table(t)))
            if foreign:
                raise UserError(
                    f"storage {self.url} holds tables that are not kernelforge's ({', '.join(foreign[:5])}); "
                    "refusing to write into a foreign database; choose another --storage"
                )
        if "kf_meta" in tables:
            with self.engine.connect() as conn:
                rows = dict(conn.execute(sa.select(meta_table.c.key, meta_table.c.value)).all())
            if rows.get("application") != APPLICATION:
                raise UserError(f"storage {self.url} is not a kernelforge database; refusing to modify it")
            version = int(rows.get("schema_version", "0"))
            if version > SCHEMA_VERSION:
                raise UserError(
                    f"storage {self.url} has schema version {version}, newer than this kernelforge "
                    f"({SCHEMA_VERSION}); upgrade kernelforge to read it"
                )
            self._enable_sqlite_pragmas()
            missing = [t for t in _ADDED_TABLES if t.name not in tables]
            if missing:
                try:
                    metadata.create_all(self.engine, tables=missing)
                except (IntegrityError, OperationalError):
                    pass  # created concurrently by another worker, or a read-only file: readers cope
            return
        if not create:
            raise UserError(f"storage {self.url} has no kernelforge results")
        self._enable_sqlite_pragmas()
        try:
            metadata.create_all(self.engine)
            with self.engine.begin() as conn:
                conn.execute(meta_table.insert(), [
                    {"key": "application", "value": APPLICATION},
                    {"key": "schema_version", "value": str(SCHEMA_VERSION)},
                ])
        except IntegrityError:
            pass  # another worker created it at the same moment
        except OperationalError as exc:
            raise UserError(f"storage {self.url}: cannot create tables ({exc.orig}); is the folder writable?") from None

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
                    conn.execute(candidates_table.insert(), row)
                except IntegrityError:
                    pass  # inserted concurrently by another worker

    def candidate(self, candidate_id: str) -> StoredCandidate | None:
        with self.engine.connect() as conn:
            row = conn.execute(sa.select(candidates_table).where(candidates_table.c.id == candidate_id)).mappings().first()
        return _candidate(row) if row else None

    def candidates(self, block: str | None = None) -> list[StoredCandidate]:
        query = sa.select(candidates_table).order_by(candidates_table.c.created)
        if block:
            query = query.where(candidates_table.c.block == block)
        with self.engine.connect() as conn:
            return [_candidate(r) for r in conn.execute(query).mappings()]

    # -- compiles ------------------------------------------------------------------------------

    def add_compile(self, candidate_id: str, target: str, dtype: str, status: str, message: str,
                    kernels: list[dict[str, Any]]) -> None:
        row = {"candidate_id": candidate_id, "target": target, "dtype": dtype, "status": status,
               "message": message, "kernels": json.dumps(kernels), "created": time.time()}
        with self.engine.begin() as conn:
            conn.execute(compiles_table.delete().where(
                (compiles_table.c.candidate_id == candidate_id) & (compiles_table.c.target == target)
                & (compiles_table.c.dtype == dtype)))
            conn.execute(compiles_table.insert(), row)

    def compile(self, candidate_id: str, target: str, dtype: str) -> dict[str, Any] | None:
        with self.engine.connect() as conn:
            row = conn.execute(sa.select(compiles_table).where(
                (compiles_table.c.candidate_id == candidate_id) & (compiles_table.c.target == target)
                & (compiles_table.c.dtype == dtype))).mappings().first()
        if row is None:
            return None
        return {**row, "kernels": json.loads(row["kernels"])}

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
        }
        try:
            with self.engine.begin() as conn:
                conn.execute(results_table.insert(), row)
        except IntegrityError:
            return False
        return True

    def find_result(self, candidate_id: str, shape: str, dtype: str, env_key_: str) -> StoredResult | None:
        query = sa.select(results_table).where(
            (results_table.c.candidate_id == candidate_id) & (results_table.c.shape == shape)
            & (results_table.c.dtype == dtype) & (results_table.c.env_key == env_key_))
        with self.engine.connect() as conn:
            row = conn.execute(query).mappings().first()
        return _result(row) if row else None

    def results(self, block: str | None = None, candidate_id: str | None = None,
                dtype: str | None = None) -> list[StoredResult]:
        query = sa.select(results_table).order_by(results_table.c.id)
        if block:
            query = query.where(results_table.c.block == block)
        if candidate_id:
            query = query.where(results_table.c.candidate_id == candidate_id)
        if dtype:
            query = query.where(results_table.c.dtype == dtype)
        with self.engine.connect() as conn:
            return [_result(r) for r in conn.execute(query).mappings()]

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

    def add_confirmation(self, row: dict[str, Any]) -> None:
        """Store one interleaved re-timing of a candidate against the baseline on one shape."""
        row = {**row, "speedups": json.dumps(row["speedups"]), "created": time.time()}
        with self.engine.begin() as conn:
            conn.execute(confirmations_table.insert(), row)

    def confirmations(self, job: str | None = None) -> list[dict[str, Any]]:
        query = sa.select(confirmations_table).order_by(confirmations_table.c.id)
        if job:
            query = query.where(confirmations_table.c.job == job)
        with self.engine.connect() as conn:
            return [{**r, "speedups": json.loads(r["speedups"])} for r in conn.execute(query).mappings()]

    # -- LLM templates and transcripts ---------------------------------------------------------

    def add_template(self, template_id: str, block: str, text: str, *, origin: str = "llm",
                     parent: str | None = None, call_seq: int | None = None, job: str | None = None) -> None:
        """Store a generated template's full text; a no-op when it is already stored."""
        row = {"id": template_id, "block": block, "text": text, "origin": origin, "parent": parent,
               "call_seq": call_seq, "job": job, "created": time.time()}
        with self.engine.begin() as conn:
            exists = conn.execute(sa.select(templates_table.c.id).where(templates_table.c.id == template_id)).first()
            if exists is None:
                try:
                    conn.execute(templates_table.insert(), row)
                except IntegrityError:
                    pass

    def templates(self, block: str | None = None, job: str | None = None) -> list[dict[str, Any]]:
        """Stored generated templates, oldest first."""
        query = sa.select(templates_table).order_by(templates_table.c.created, templates_table.c.id)
        if block:
            query = query.where(templates_table.c.block == block)
        if job:
            query = query.where(templates_table.c.job == job)
        with self.engine.connect() as conn:
            return [dict(r) for r in conn.execute(query).mappings()]

    def add_llm_calls(self, rows: list[dict[str, Any]]) -> list[int]:
        """Store the attempts of one request (one transaction); returns their row ids."""
        ids = []
        with self.engine.begin() as conn:
            for row in rows:
                row = {"created": time.time(), **row}
                ids.append(conn.execute(llm_calls_table.insert(), row).inserted_primary_key[0])
        return ids

    def set_llm_outcome(self, row_id: int, kind: str, message: str | None = None, *,
                        template_id: str | None = None, candidate_id: str | None = None) -> None:
        """Record what became of a response (its final attempt's row)."""
        values: dict[str, Any] = {"kind": kind}
        if message is not None:
            values["message"] = message
        if template_id is not None:
            values["template_id"] = template_id
        if candidate_id is not None:
            values["candidate_id"] = candidate_id
        with self.engine.begin() as conn:
            conn.execute(llm_calls_table.update().where(llm_calls_table.c.id == row_id).values(**values))

    def llm_calls(self, job: str | None = None, *, final_only: bool = False) -> list[dict[str, Any]]:
        """Stored LLM attempts in the order they were taken in (run, seq, attempt)."""
        query = sa.select(llm_calls_table).order_by(llm_calls_table.c.run, llm_calls_table.c.seq,
                                                    llm_calls_table.c.attempt)
        if job:
            query = query.where(llm_calls_table.c.job == job)
        if final_only:
            query = query.where(llm_calls_table.c.final == sa.true())
        with self.engine.connect() as conn:
            return [dict(r) for r in conn.execute(query).mappings()]

    def llm_usage(self, job: str) -> dict[str, int]:
        """Requests, attempts, tokens and the last run number the generator used for ``job``
        (live calls only: replayed ones cost nothing)."""
        c = llm_calls_table.c
        live = (c.job == job) & c.replayed_from.is_(None)
        with self.engine.connect() as conn:
            requests = conn.execute(sa.select(sa.func.count()).where(live & (c.final == sa.true()))).scalar_one()
            attempts, prompt, completion = conn.execute(sa.select(
                sa.func.count(), sa.func.coalesce(sa.func.sum(c.prompt_tokens), 0),
                sa.func.coalesce(sa.func.sum(c.completion_tokens), 0)).where(live)).one()
            last_run = conn.execute(sa.select(sa.func.coalesce(sa.func.max(c.run), 0)).where(c.job == job)).scalar_one()
            last_seq = conn.execute(sa.select(sa.func.coalesce(sa.func.max(c.seq), 0)).where(c.job == job)).scalar_one()
        return {"requests": requests, "attempts": attempts, "tokens": int(prompt) + int(completion),
                "last_run": int(last_run), "last_seq": int(last_seq)}

    def counts(self) -> dict[str, int]:
        with self.engine.connect() as conn:
            return {
                "candidates": conn.execute(sa.select(sa.func.count()).select_from(candidates_table)).scalar_one(),
                "results": conn.execute(sa.select(sa.func.count()).select_from(results_table)).scalar_one(),
            }

    # -- write failures and job locks ------------------------------------------------------------

    def _write_failure(self, context: Any) -> None:
        """SQLAlchemy ``handle_error`` hook: a full disk or a read-only file or folder becomes one
        UserError naming the database (each write is its own transaction, so everything stored
        before it stays stored)."""
        text = str(getattr(context, "original_exception", "") or "").lower()
        locked = "database is locked" in text
        if not locked and not any(marker in text for marker in _WRITE_FAILURES):
            return
        where = self.url
        if self.url.startswith("sqlite:///"):
            path = Path(self.url[len("sqlite:///"):])
            where = f"{path} (folder {path.parent.resolve()})"
        if locked:
            raise UserError(
                f"the results database {where} stayed locked by another process for 30 s; wait for it (another "
                "job's search or report writing to the same file) and rerun: everything stored so far is kept"
            ) from None
        raise UserError(
            f"cannot write the results database {where}: {context.original_exception}; free disk space or make "
            "the file and its folder writable, then rerun: everything stored so far is kept"
        ) from None

    def acquire_job_lock(self, job: str) -> "JobLock":
        """Take the lock of ``job`` for this process, or raise UserError naming the live holder.

        A dead holder's lock (same host: its pid is gone or was reused; another host: no heartbeat
        for LOCK_STALE_S seconds) is taken over. Re-entrant for the holding process.
        """
        metadata.create_all(self.engine, tables=[locks_table])
        me = _holder_identity()
        now = time.time()
        row = {"job": job, "holder": me[0], "host": me[1], "pid": me[2], "started": now, "heartbeat": now}
        for _ in range(3):
            try:
                with self.engine.begin() as conn:
                    conn.execute(locks_table.insert(), row)
                return JobLock(self, job, me[0], taken_over=None)
            except IntegrityError:
                pass
            with self.engine.connect() as conn:
                held = conn.execute(sa.select(locks_table).where(locks_table.c.job == job)).mappings().first()
            if held is None:
                continue  # released in between: try again
            if held["holder"] == me[0]:
                return JobLock(self, job, me[0], taken_over=None)
            if _holder_alive(dict(held)):
                since = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(held["started"]))
                raise UserError(
                    f"job {job!r} is being searched by process {held['pid']} on host {held['host']} (since {since}) "
                    f"in {self.url}; wait for it to finish or stop it (a killed search's lock is taken over "
                    "automatically), or give this run another job name or --storage"
                )
            with self.engine.begin() as conn:
                taken = conn.execute(locks_table.update().where(
                    (locks_table.c.job == job) & (locks_table.c.holder == held["holder"])).values(**row))
            if taken.rowcount == 1:
                return JobLock(self, job, me[0], taken_over=f"process {held['pid']} on {held['host']}")
        raise UserError(f"job {job!r}: could not take its lock in {self.url} (another search is starting); retry")

    def job_lock(self, job: str) -> dict[str, Any] | None:
        """The lock row of ``job`` (holder, host, pid, started, heartbeat), or None."""
        metadata.create_all(self.engine, tables=[locks_table])
        with self.engine.connect() as conn:
            row = conn.execute(sa.select(locks_table).where(locks_table.c.job == job)).mappings().first()
        return dict(row) if row else None

    def close(self) -> None:
        self.engine.dispose()


class JobLock:
    """A held job lock: :meth:`refresh` it while running (a background heartbeat does), then
    :meth:`release`. ``taken_over`` names the dead holder it replaced, if any."""

    def __init__(self, store: Store, job: str, holder: str, taken_over: str | None):
        self.store = store
        self.job = job
        self.holder = holder
        self.taken_over = taken_over
        self._stop: Any = None

    def refresh(self) -> None:
        with self.store.engine.begin() as conn:
            conn.execute(locks_table.update().where(
                (locks_table.c.job == self.job) & (locks_table.c.holder == self.holder)).values(heartbeat=time.time()))

    def start_heartbeat(self, interval: float = LOCK_HEARTBEAT_S) -> None:
        """Refresh the heartbeat every ``interval`` seconds from a daemon thread (for holders on
        other hosts, whose pid cannot be checked)."""
        import threading

        stop = threading.Event()
        self._stop = stop

        def beat() -> None:
            while not stop.wait(interval):
                try:
                    self.refresh()
                except Exception:  # a full disk or a locked file: the search itself will say so
                    pass

        threading.Thread(target=beat, name="kernelforge-lock-heartbeat", daemon=True).start()

    def release(self) -> None:
        if self._stop is not None:
            self._stop.set()
        try:
            with self.store.engine.begin() as conn:
                conn.execute(locks_table.delete().where(
                    (locks_table.c.job == self.job) & (locks_table.c.holder == self.holder)))
        except (UserError, OperationalError):
            pass  # unwritable now: the next search sees a dead holder and takes over


def _process_start(pid: int) -> str:
    """The start time of process ``pid`` in clock ticks since boot (Linux), '' elsewhere: with the
    pid, it identifies a process even after its pid is reused."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            fields = f.read().rsplit(b")", 1)[1].split()
        return fields[19].decode()
    except (OSError, IndexError):
        return ""


def _holder_identity() -> tuple[str, str, int]:
    import os
    import socket

    host, pid = socket.gethostname(), os.getpid()
    return f"{host}:{pid}:{_process_start(pid)}", host, pid


def _holder_alive(row: dict[str, Any]) -> bool:
    import os
    import socket

    if row["host"] != socket.gethostname():
        return time.time() - float(row["heartbeat"]) < LOCK_STALE_S
    pid = int(row["pid"])
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        pass  # alive, another user's
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            if f.read().rsplit(b")", 1)[1].split()[0] == b"Z":
                return False  # killed, not yet reaped by its parent
    except (OSError, IndexError):
        pass
    started = str(row["holder"]).rsplit(":", 1)[-1]
    return not started or _process_start(pid) in ("", started)


def _is_optuna_table(name: str) -> bool:
    return name in {
        "studies", "version_info", "study_directions", "study_user_attributes", "study_system_attributes",
        "trials", "trial_user_attributes", "trial_system_attributes", "trial_params", "trial_values",
        "trial_intermediate_values", "trial_heartbeats", "alembic_version",
    }


def _finite(value: float | None) -> float | None:
    if value is None or value != value or value in (float("inf"), float("-inf")):
        return None
    return value


def _candidate(row) -> StoredCandidate:
    return StoredCandidate(row["id"], row["block"], row["template"], json.loads(row["params"]), row["origin"],
                           row["parent"], row["source"], row["job"], row["created"])


def _result(row) -> StoredResult:
    return StoredResult(
        candidate_id=row["candidate_id"], block=row["block"], shape=row["shape"], dtype=row["dtype"],
        device=row["device"], env_key=row["env_key"], status=Status(row["status"]), rel_error=row["rel_error"],
        median_s=row["median_s"], p20_s=row["p20_s"], p80_s=row["p80_s"], samples=row["samples"],
        timing_method=row["timing_method"], timing_label=row["timing_label"], joules=row["joules"],
        flops=row["flops"], bytes=row["bytes"], message=row["message"], env=json.loads(row["env"]),
        job=row["job"], created=row["created"], excess=row["excess"],
    )


def iter_ok(results: Iterable[StoredResult]) -> Iterable[StoredResult]:
    return (r for r in results if r.ok and r.median_s is not None)
