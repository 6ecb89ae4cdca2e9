"""The results database's tables and schema version, and the check that opens a database only when
it is kernelforge's (or empty): a foreign, damaged or newer database is refused and left untouched.

Optuna's studies live in the same database through Optuna's own tables; those are recognised and
left alone.
"""

from __future__ import annotations

import time

import sqlalchemy as sa
from sqlalchemy.engine import Engine
from sqlalchemy.exc import DatabaseError, IntegrityError, OperationalError, ProgrammingError

from kernelforge.errors import StorageError, UserError
from kernelforge.redact import redact, redact_url
from kernelforge.storage_url import sqlite_file
from kernelforge.textsafe import DETAIL, cut

SCHEMA_VERSION = 1
APPLICATION = "kernelforge"

metadata = sa.MetaData()


class SafeText(sa.types.TypeDecorator):
    """Text that every database stores: PostgreSQL refuses NUL characters in text, which SQLite
    keeps, and a compiler message or a model's answer may hold one; it is stored as U+FFFD."""

    impl = sa.Text
    cache_ok = True

    def process_bind_param(self, value, dialect):
        return value.replace("\x00", "\ufffd") if isinstance(value, str) else value


meta_table = sa.Table(
    "kf_meta", metadata,
    sa.Column("key", sa.String(64), primary_key=True),
    sa.Column("value", SafeText, nullable=False),
)

candidates_table = sa.Table(
    "kf_candidates", metadata,
    sa.Column("id", sa.String(32), primary_key=True),
    sa.Column("block", sa.String(200), nullable=False, index=True),
    sa.Column("template", sa.String(300), nullable=False),
    sa.Column("params", SafeText, nullable=False),  # JSON object, in space order
    sa.Column("origin", sa.String(32), nullable=False),
    sa.Column("parent", sa.String(32)),
    sa.Column("source", SafeText, nullable=False),
    sa.Column("job", sa.String(200)),
    sa.Column("created", sa.Float, nullable=False),
)

compiles_table = sa.Table(
    "kf_compiles", metadata,
    sa.Column("candidate_id", sa.String(32), sa.ForeignKey("kf_candidates.id"), primary_key=True),
    sa.Column("target", sa.String(32), primary_key=True),
    sa.Column("dtype", sa.String(16), primary_key=True),
    sa.Column("status", sa.String(32), nullable=False),
    sa.Column("message", SafeText, nullable=False, default=""),
    sa.Column("kernels", SafeText, nullable=False, default="[]"),  # JSON list of per-kernel resources
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
    sa.Column("timing_label", SafeText),
    sa.Column("joules", sa.Float),
    sa.Column("flops", sa.Float),
    sa.Column("bytes", sa.Float),
    sa.Column("message", SafeText, nullable=False, default=""),
    sa.Column("env", SafeText, nullable=False),  # JSON: device, versions, clocks
    sa.Column("job", sa.String(200)),
    sa.Column("created", sa.Float, nullable=False),
    sa.Column("host_launch_s", sa.Float),  # added after schema version 1 (ADDED_COLUMNS)
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
    sa.Column("speedups", SafeText, nullable=False),  # JSON list: baseline/candidate per interleaved pair
    sa.Column("median", sa.Float, nullable=False),
    sa.Column("p20", sa.Float, nullable=False),
    sa.Column("p80", sa.Float, nullable=False),
    sa.Column("created", sa.Float, nullable=False),
    sa.Column("pair_times", SafeText),  # JSON [[baseline_s, candidate_s], ...] per pair (ADDED_COLUMNS)
)


# Every re-timing of a shape's baseline through a search (its first timing is its row in
# kf_results): a candidate is compared with the baseline as timed most recently before it
# (kernelforge.baseline_timing), and the report shows their spread.
baseline_timings_table = sa.Table(
    "kf_baseline_timings", metadata,
    sa.Column("id", sa.Integer, primary_key=True, autoincrement=True),
    sa.Column("job", sa.String(200), nullable=False),
    sa.Column("block", sa.String(200), nullable=False, index=True),
    sa.Column("shape", sa.String(200), nullable=False),
    sa.Column("dtype", sa.String(16), nullable=False),
    sa.Column("env_key", sa.String(32), nullable=False),
    sa.Column("baseline_id", sa.String(32), sa.ForeignKey("kf_candidates.id"), nullable=False),
    sa.Column("median_s", sa.Float, nullable=False),
    sa.Column("p20_s", sa.Float),
    sa.Column("p80_s", sa.Float),
    sa.Column("timing_method", sa.String(32)),
    sa.Column("created", sa.Float, nullable=False),
)

# Templates written by the LLM generator: a resumed or replayed search rebuilds them from here (the
# candidates alone would not do: Optuna tunes the template, not one rendering of it).
templates_table = sa.Table(
    "kf_templates", metadata,
    sa.Column("id", sa.String(300), primary_key=True),  # <block>/llm_<hash of text>
    sa.Column("block", sa.String(200), nullable=False, index=True),
    sa.Column("text", SafeText, nullable=False),
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
    sa.Column("base_url", SafeText, nullable=False),
    sa.Column("request", SafeText, nullable=False),  # JSON: messages and sampling parameters
    sa.Column("request_hash", sa.String(32), nullable=False, index=True),
    sa.Column("response", SafeText),
    sa.Column("finish_reason", SafeText),  # the server's word: any length
    sa.Column("status", sa.String(32), nullable=False),  # of this attempt: ok, rate_limited, ...
    sa.Column("http_status", sa.Integer),
    sa.Column("error", SafeText),
    sa.Column("prompt_tokens", sa.Integer),
    sa.Column("completion_tokens", sa.Integer),
    sa.Column("latency_s", sa.Float),
    sa.Column("tick", sa.Integer, nullable=False, default=0),
    sa.Column("kind", sa.String(32)),
    sa.Column("message", SafeText),  # what was wrong with the response, for the record
    sa.Column("template_id", sa.String(300)),
    sa.Column("candidate_id", sa.String(32)),
    sa.Column("replayed_from", SafeText),
    sa.Column("created", sa.Float, nullable=False),
)

# The shared ledger of the workers of one job (kernelforge.store.ledger). kf_workers: one row per
# running worker (its identity, as the lock's, and its heartbeat). kf_budgets: per study, the
# evaluations it may spend and how many have been granted to claims (a conditional update grants
# one atomically). kf_claims: who evaluates which candidate on which shape group under which
# environment; unique, so nothing is evaluated twice; ``state`` is claimed until its results are
# stored, then done. kf_finished: a job confirmed under an environment, so a rerun knows it is complete.
workers_table = sa.Table(
    "kf_workers", metadata,
    sa.Column("job", sa.String(200), primary_key=True),
    sa.Column("worker", sa.String(300), primary_key=True),  # host:pid:process start time
    sa.Column("host", sa.String(200), nullable=False),
    sa.Column("pid", sa.Integer, nullable=False),
    sa.Column("started", sa.Float, nullable=False),
    sa.Column("heartbeat", sa.Float, nullable=False),
)

budgets_table = sa.Table(
    "kf_budgets", metadata,
    sa.Column("job", sa.String(200), primary_key=True),
    sa.Column("study", sa.String(400), primary_key=True),
    sa.Column("budget", sa.Integer, nullable=False),
    sa.Column("granted", sa.Integer, nullable=False),
)

claims_table = sa.Table(
    "kf_claims", metadata,
    sa.Column("job", sa.String(200), primary_key=True),
    sa.Column("env_key", sa.String(32), primary_key=True),
    sa.Column("candidate_id", sa.String(32), primary_key=True),
    sa.Column("shapes", SafeText, primary_key=True),  # the shape group's names, comma-joined
    sa.Column("study", sa.String(400), nullable=False),
    sa.Column("point", SafeText, nullable=False),  # JSON object: the study's point of the candidate
    sa.Column("worker", sa.String(300), nullable=False),
    sa.Column("state", sa.String(16), nullable=False),  # claimed | done
    sa.Column("claimed", sa.Float, nullable=False),
)

finished_table = sa.Table(
    "kf_finished", metadata,
    sa.Column("job", sa.String(200), primary_key=True),
    sa.Column("env_key", sa.String(32), primary_key=True),
    sa.Column("finished", sa.Float, nullable=False),
)

#: Tables added after schema version 1 without changing it: created on open when missing.
ADDED_TABLES = (templates_table, llm_calls_table, workers_table, budgets_table, claims_table, finished_table,
                baseline_timings_table)
#: Columns added after schema version 1 (nullable, so older rows read None): added on open when missing.
ADDED_COLUMNS = ((results_table, "host_launch_s"), (confirmations_table, "pair_times"))


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

#: Optuna's own tables: allowed beside ours in a database without kf_meta (a half-created store).
OPTUNA_TABLES = frozenset({
    "studies", "version_info", "study_directions", "study_user_attributes", "study_system_attributes",
    "trials", "trial_user_attributes", "trial_system_attributes", "trial_params", "trial_values",
    "trial_intermediate_values", "trial_heartbeats", "alembic_version",
})


def open_schema(engine: Engine, url: str, create: bool) -> bool:
    """Check that the database at ``engine`` is kernelforge's (or empty) and create what is missing.

    Raises UserError, touching nothing, for a file that is not a readable database, a database with
    foreign tables, another application's kf_meta, or a schema newer than :data:`SCHEMA_VERSION`;
    and, when not ``create``, for a database without kernelforge results. Returns True once the
    database is known to be ours (the caller may then switch SQLite to WAL mode: before that, a
    foreign or damaged file must be left byte-for-byte untouched).
    """
    try:
        tables = set(sa.inspect(engine).get_table_names())
    except (DatabaseError, OperationalError) as exc:
        detail = _one_line([redact(str(exc.orig))])
        if engine.dialect.name != "sqlite":  # a server that refused the connection, not a file
            raise UserError(f"storage {redact_url(url)}: cannot connect ({detail}); check that the server runs and "
                            "the user, password and database name of the URL") from None
        raise UserError(f"storage {redact_url(url)}: not a readable database ({detail}); it was left untouched") from None
    except StorageError as exc:
        if getattr(exc, "kind", None) != "damaged":
            raise
        raise StorageError(f"storage {redact_url(url)}: not a readable database; it was left untouched ({exc})") from None
    check_integrity(engine, url)
    ours = {t.name for t in metadata.sorted_tables}
    if tables and "kf_meta" not in tables:
        foreign = sorted(t for t in tables if not (t in ours or t in OPTUNA_TABLES))
        if foreign:
            raise UserError(
                f"storage {redact_url(url)} holds tables that are not kernelforge's ({', '.join(foreign[:5])}); "
                "refusing to write into a foreign database; choose another --storage"
            )
    if "kf_meta" in tables:
        rows = _meta(engine)
        if not rows and not (tables - ours - OPTUNA_TABLES):
            # Our tables, not stamped yet: another worker is creating this database right now (or
            # one was killed while it did). Its stamp follows at once; without one, finish the job.
            for attempt in range(10):
                time.sleep(0.1 * (attempt + 1))
                rows = _meta(engine)
                if rows:
                    break
            else:
                if not create:
                    raise UserError(f"storage {redact_url(url)} has no kernelforge results")
                return False
        if rows.get("application") != APPLICATION:
            raise UserError(f"storage {redact_url(url)} is not a kernelforge database; refusing to modify it")
        version = int(rows.get("schema_version", "0"))
        if version > SCHEMA_VERSION:
            raise UserError(
                f"storage {redact_url(url)} has schema version {version}, newer than this kernelforge "
                f"({SCHEMA_VERSION}); upgrade kernelforge to read it"
            )
        return True
    if not create:
        raise UserError(f"storage {redact_url(url)} has no kernelforge results")
    return False


def _one_line(problems: list[str]) -> str:
    """SQLite's integrity report (rows that may hold line breaks) as one line."""
    return "; ".join(" ".join(str(problem).split()) for problem in problems)


def check_integrity(engine: Engine, url: str) -> None:
    """SQLite's ``PRAGMA quick_check`` (every page read once, no index cross-check: milliseconds for
    a job's database) on opening: a damaged file is one StorageError and is never written."""
    if engine.dialect.name != "sqlite":
        return
    try:
        with engine.connect() as conn:
            problems = [row[0] for row in conn.exec_driver_sql("PRAGMA quick_check(3)")]
    except StorageError as exc:
        if getattr(exc, "kind", None) != "damaged":
            raise
        problems = ["database disk image is malformed"]
    except (DatabaseError, OperationalError) as exc:
        problems = [str(exc.orig)]
    if problems and problems != ["ok"]:
        path = sqlite_file(url) or redact_url(url)
        raise StorageError(
            f"the results database {path} is damaged ({cut(redact(_one_line(problems)), DETAIL)}); it was left untouched: "
            f"restore a backup (kernelforge backup JOB makes one) or recover what it holds with "
            f"`sqlite3 {path} .recover | sqlite3 NEW.db` and use NEW.db in its place (--storage sqlite:///NEW.db for "
            "a job's results, --device replay:NEW.db for a recording)"
        )


def _meta(engine: Engine) -> dict[str, str]:
    with engine.connect() as conn:
        return dict(conn.execute(sa.select(meta_table.c.key, meta_table.c.value)).all())


def create_schema(engine: Engine, url: str) -> None:
    """Create every table and stamp kf_meta. Workers starting together on a new database race to
    create it: a table created by another between the check and the CREATE is that one's, so the
    creation is retried (each retry skips what exists)."""
    for attempt in range(5):
        try:
            metadata.create_all(engine)
            break
        except (OperationalError, ProgrammingError, IntegrityError) as exc:
            if "already exists" not in str(exc.orig) and not isinstance(exc, IntegrityError):
                raise UserError(f"storage {redact_url(url)}: cannot create tables ({redact(str(exc.orig))}); "
                                "is the folder writable?") from None
            if attempt == 4:
                raise UserError(f"storage {redact_url(url)}: cannot create tables ({redact(str(exc.orig))}); "
                                "another process keeps changing them; retry") from None
            time.sleep(0.1 * (attempt + 1))
    try:
        with engine.begin() as conn:
            conn.execute(meta_table.insert(), [
                {"key": "application", "value": APPLICATION},
                {"key": "schema_version", "value": str(SCHEMA_VERSION)},
            ])
    except IntegrityError:
        pass  # another worker stamped it at the same moment


def add_missing_tables(engine: Engine) -> None:
    """Create the tables and columns added since schema version 1 (:data:`ADDED_TABLES`,
    :data:`ADDED_COLUMNS`) where missing."""
    inspector = sa.inspect(engine)
    tables = set(inspector.get_table_names())
    missing = [t for t in ADDED_TABLES if t.name not in tables]
    if missing:
        try:
            metadata.create_all(engine, tables=missing)
        except (IntegrityError, OperationalError):
            pass  # created concurrently by another worker, or a read-only file: readers cope
    for table, name in ADDED_COLUMNS:
        if table.name in tables and name not in {c["name"] for c in inspector.get_columns(table.name)}:
            column = table.c[name]
            try:
                with engine.begin() as conn:
                    conn.execute(sa.text(f'ALTER TABLE {table.name} ADD COLUMN {name} '
                                         f'{column.type.compile(dialect=engine.dialect)}'))
            except (IntegrityError, OperationalError, ProgrammingError):
                pass  # added concurrently by another worker, or a read-only file: readers cope
