"""Faults of the results database itself (issue 33): a database deleted or replaced under a running
search, a full disk for real, a damaged file, SIGHUP, the write-ahead log, backups. Each ends in one
line and a non-zero exit status, never a traceback, and nothing stored is lost unannounced."""

from __future__ import annotations

import hashlib
import json
import os
import resource
import shutil
import signal
import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest

from kernelforge.candidate import Candidate
from kernelforge.catalog import Catalog
from kernelforge.errors import StorageError
from kernelforge.job import load_job
from kernelforge.search.search import Search
from kernelforge.search.progress import Progress
from kernelforge.store.failures import clean_up
from kernelforge.store.store import Store
from toy_job import CLI, FIXTURES, toy_job

pytestmark = pytest.mark.interpreter

DB = Path("reports") / "toy" / "kernelforge.db"


class Recorder(Progress):
    def __init__(self):
        self.events = []

    def event(self, kind, **data):
        self.events.append((kind, data))


def rows(db: Path, query: str) -> list:
    with sqlite3.connect(db) as conn:
        return conn.execute(query).fetchall()


def _candidate(i: int) -> Candidate:
    return Candidate("toy/axpy", "toy/axpy/filler", (("i", i),), f"# {i}\n")


def _search(folder: Path, job: Path, *extra: str, preexec_fn=None, progress: str = "quiet") -> subprocess.Popen:
    return subprocess.Popen([*CLI, "search", str(job), "--progress", progress, "--no-compile", *extra], cwd=folder,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, preexec_fn=preexec_fn)


def _one_line(stderr: str) -> str:
    assert "Traceback" not in stderr, stderr
    assert stderr.lstrip().startswith("kernelforge:") and stderr.count("kernelforge:") == 1, stderr  # one message
    return " ".join(stderr.split())


# -- the store knows where it writes -----------------------------------------------------------


def test_a_database_deleted_under_the_store_stops_it_and_what_it_held_is_rescued(tmp_path):
    db = tmp_path / "kf.db"
    store = Store(f"sqlite:///{db}")
    for i in range(3):
        store.add_candidate(_candidate(i))
    for path in tmp_path.glob("kf.db*"):
        path.unlink()  # rm reports/<job>/kernelforge.db*: the store's connections still have it open
    with pytest.raises(StorageError, match="was deleted while the search ran") as failure:
        store.add_candidate(_candidate(3))
    message = str(failure.value)
    rescued = [p for p in tmp_path.iterdir() if p.name.startswith("kf.db.rescued-")]
    assert len(rescued) == 1 and str(rescued[0]) in message
    assert rows(rescued[0], "select count(*) from kf_candidates") == [(3,)]  # nothing lost
    with pytest.raises(StorageError):  # and it stays stopped
        store.verify()
    store.close()


def test_a_database_replaced_under_the_store_is_never_written(tmp_path):
    db = tmp_path / "kf.db"
    store = Store(f"sqlite:///{db}")
    store.add_candidate(_candidate(0))
    db.rename(tmp_path / "moved.db")
    sqlite3.connect(db).close()  # another (empty) file at the path
    with pytest.raises(StorageError, match="was replaced by another file"):
        store.add_candidate(_candidate(1))
    assert rows(db, "select count(*) from sqlite_master") == [(0,)]  # the new file untouched


def test_a_search_whose_database_is_deleted_mid_run_exits_1_and_never_says_it_is_stored(tmp_path):
    job = toy_job(tmp_path, "toy", evaluations=6)
    proc = _search(tmp_path, job, "--in-process", "--no-report", progress="jsonl")
    for line in proc.stdout:
        if json.loads(line).get("event") == "start":
            shutil.rmtree(tmp_path / "reports")  # the whole job folder, database, -wal and -shm
            break
    out, err = proc.communicate(timeout=300)
    assert proc.returncode == 1, err
    flat = _one_line(err)
    assert "was deleted while the search ran" in flat and "stored in" not in flat
    rescued = list((tmp_path / "reports" / "toy").glob("kernelforge.db.rescued-*"))
    assert len(rescued) == 1 and str(rescued[0].name) in flat
    # A whole kernelforge database: its application, schema version and the block's judge.
    assert rows(rescued[0], "select count(*) from kf_meta where key not like 'judge:%'") == [(2,)]


# -- one storage-failure path ---------------------------------------------------------------------


def _cap_files(size: int):
    def cap() -> None:
        # A full disk for real, as the process sees one: writes past ``size`` bytes fail (EFBIG;
        # Python ignores SIGXFSZ, so the write returns the error instead of killing the process).
        resource.setrlimit(resource.RLIMIT_FSIZE, (size, size))
    return cap


def test_a_disk_full_mid_run_is_one_line_status_1_and_loses_nothing(tmp_path):
    job = toy_job(tmp_path, "toy", evaluations=2)
    first = _search(tmp_path, job, "--in-process", "--no-report")
    assert first.wait(timeout=300) == 0, first.stderr.read()
    first.stdout.close(), first.stderr.close()
    before = rows(tmp_path / DB, "select candidate_id, shape, status from kf_results")
    job.write_text(job.read_text().replace("evaluations = 2", "evaluations = 12"))
    size = os.path.getsize(tmp_path / DB)
    proc = _search(tmp_path, job, "--in-process", "--no-report", preexec_fn=_cap_files(size + 48 * 1024))
    out, err = proc.communicate(timeout=300)
    assert proc.returncode == 1, err
    flat = _one_line(err)
    assert str(DB) in flat and ("free disk space" in flat or "check the disk" in flat)
    assert "everything stored so far is kept" in flat
    assert rows(tmp_path / DB, "PRAGMA quick_check") == [("ok",)]
    during = rows(tmp_path / DB, "select candidate_id, shape, status from kf_results")
    assert set(before) <= set(during)
    again = _search(tmp_path, job, "--in-process", "--no-report")
    assert again.wait(timeout=300) == 0, again.stderr.read()
    again.stdout.close(), again.stderr.close()
    after = rows(tmp_path / DB, "select candidate_id, shape, status from kf_results")
    assert set(during) < set(after) and len(after) == len(set(after))  # went on, nothing twice


def test_a_file_size_limit_below_the_worker_s_shared_memory_is_one_line(tmp_path):
    """The file-size limit that makes a full disk here applies to the evaluation worker's shared
    memory (a memfd) too: a search in worker mode under a limit below it says so in one line."""
    job = toy_job(tmp_path, "toy", evaluations=2)
    proc = _search(tmp_path, job, "--no-report", preexec_fn=_cap_files(8 * 2**20))
    out, err = proc.communicate(timeout=300)
    assert proc.returncode == 2, err
    flat = _one_line(err)
    assert "memory shared with the evaluation worker" in flat and "ulimit -f" in flat and "--in-process" in flat
    assert rows(tmp_path / DB, "PRAGMA quick_check") == [("ok",)]  # the database it had written is whole


def test_a_storage_failure_gives_the_database_s_words_not_the_wrapper_s_class(tmp_path):
    import sqlalchemy as sa

    from kernelforge.store.failures import storage_error

    db = tmp_path / "kf.db"
    sqlite3.connect(db).execute("create table t (x)").connection.close()
    engine = sa.create_engine(f"sqlite:///file:{db}?mode=ro&uri=true")
    with pytest.raises(sa.exc.OperationalError) as raised:
        with engine.begin() as conn:
            conn.exec_driver_sql("insert into t values (1)")
    engine.dispose()
    message = str(storage_error(raised.value, f"sqlite:///{db}"))
    assert "attempt to write a readonly database" in message and "sqlite3.OperationalError" not in message


def test_clean_up_never_replaces_the_first_error():
    ran = []

    def fails():
        ran.append("fails")
        raise sqlite3.OperationalError("database or disk is full")

    first = StorageError("the first")
    clean_up(first, [fails, lambda: ran.append("after")])  # dropped: the first error goes on
    assert ran == ["fails", "after"]
    with pytest.raises(StorageError, match="database or disk is full"):  # alone, it is the error
        clean_up(None, [fails, lambda: ran.append("after")])
    assert ran[-1] == "after"


# -- corruption detected up front -----------------------------------------------------------------


def _damage_a_middle_page(db: Path) -> None:
    page = rows(db, "PRAGMA page_size")[0][0]
    pages = db.stat().st_size // page
    assert pages >= 4
    with open(db, "r+b") as f:
        f.seek(page * (pages // 2))
        f.write(b"\xff" * page)


def test_a_damaged_database_is_one_line_and_never_written(tmp_path):
    db = tmp_path / "kf.db"
    store = Store(f"sqlite:///{db}")
    for i in range(60):
        store.add_candidate(Candidate("toy/axpy", "toy/axpy/filler", (("i", i),), f"# {i}\n" + "#" * 2000))
    store.close()
    _damage_a_middle_page(db)
    digest = hashlib.sha256(db.read_bytes()).hexdigest()
    with pytest.raises(StorageError, match="is damaged") as failure:
        Store(f"sqlite:///{db}")
    assert "it was left untouched" in str(failure.value) and ".recover" in str(failure.value)
    assert hashlib.sha256(db.read_bytes()).hexdigest() == digest
    job = toy_job(tmp_path, "toy", evaluations=1)
    proc = _search(tmp_path, job, "--in-process", "--no-report", "--storage", f"sqlite:///{db}")
    out, err = proc.communicate(timeout=300)
    assert proc.returncode == 1 and "is damaged" in _one_line(err)
    assert hashlib.sha256(db.read_bytes()).hexdigest() == digest


def test_a_database_damaged_while_open_is_one_storage_error(tmp_path):
    db = tmp_path / "kf.db"
    store = Store(f"sqlite:///{db}")
    for i in range(60):
        store.add_candidate(Candidate("toy/axpy", "toy/axpy/filler", (("i", i),), f"# {i}\n" + "#" * 2000))
    store.checkpoint(truncate=True)
    store.engine.dispose()  # no page cached
    _damage_a_middle_page(db)
    with pytest.raises(StorageError, match="database disk image is malformed.*the file is damaged"):
        store.candidates()


# -- SIGHUP, the write-ahead log, backups ---------------------------------------------------------


def test_sighup_stops_a_search_like_sigterm(tmp_path):
    job = toy_job(tmp_path, "toy", evaluations=40)
    proc = _search(tmp_path, job, "--in-process", "--no-report", progress="jsonl")
    for line in proc.stdout:
        if json.loads(line).get("event") == "evaluated":
            proc.send_signal(signal.SIGHUP)
            break
    out, err = proc.communicate(timeout=300)
    assert proc.returncode == 129, err
    assert "Traceback" not in err
    assert rows(tmp_path / DB, "select count(*) from kf_locks") == [(0,)]  # cleaned up: the lock released
    assert rows(tmp_path / DB, "select count(*) from kf_workers") == [(0,)]


def test_the_db_file_alone_holds_a_finished_search_and_no_wal_stays(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    catalog = Catalog.discover(FIXTURES)
    db = tmp_path / "kf.db"
    store = Store(f"sqlite:///{db}")
    Search(load_job(toy_job(tmp_path, "toy", evaluations=3), catalog), catalog, store, Recorder(),
           compile_enabled=False, in_process=True).run()
    shutil.copy(db, tmp_path / "copy.db")  # the .db alone, as a plain copy of a running job takes it
    stored = rows(db, "select count(*) from kf_results")
    assert stored == [(12,)]  # the baseline and 3 candidates on 3 shapes
    assert rows(tmp_path / "copy.db", "select count(*) from kf_results") == stored  # finished and confirmed: checkpointed
    store.close()
    wal = tmp_path / "kf.db-wal"
    assert not wal.exists() or wal.stat().st_size == 0


def test_backup_copies_a_job_database_consistently(tmp_path):
    job = toy_job(tmp_path, "toy", evaluations=2)
    first = _search(tmp_path, job, "--in-process", "--no-report")
    assert first.wait(timeout=300) == 0
    first.stdout.close(), first.stderr.close()
    wal = tmp_path / f"{DB}-wal"
    assert not wal.exists() or wal.stat().st_size == 0  # checkpointed and truncated at exit
    holder = sqlite3.connect(tmp_path / DB)  # a reader that keeps the -wal alive, as a running search
    holder.execute("BEGIN")
    holder.execute("select count(*) from kf_results").fetchall()
    try:
        done = subprocess.run([*CLI, "backup", str(job), "copy.db"], cwd=tmp_path, capture_output=True, text=True,
                              timeout=300)
        assert done.returncode == 0, done.stderr
        assert "copy.db" in done.stderr
        assert rows(tmp_path / "copy.db", "select candidate_id, shape from kf_results") == \
            rows(tmp_path / DB, "select candidate_id, shape from kf_results")
        again = subprocess.run([*CLI, "backup", str(job), "copy.db"], cwd=tmp_path, capture_output=True, text=True,
                               timeout=300)
        assert again.returncode == 2 and "never overwrites" in " ".join(again.stderr.split())
        astray = subprocess.run([*CLI, "backup", str(job), "no/such/folder/copy.db"], cwd=tmp_path,
                                capture_output=True, text=True, timeout=300)
        assert astray.returncode == 2 and "folder no/such/folder does not exist" in " ".join(astray.stderr.split())
        assert not (tmp_path / "no").exists()
        slash = subprocess.run([*CLI, "backup", str(job), "bk/"], cwd=tmp_path, capture_output=True, text=True,
                               timeout=300)
        assert slash.returncode == 2 and "folder bk does not exist" in " ".join(slash.stderr.split())
        assert not (tmp_path / "bk").exists()  # not a file named bk
    finally:
        holder.rollback()
        holder.close()


# -- Optuna's view true to the store --------------------------------------------------------------


def test_after_kills_and_a_final_run_optuna_and_the_ledger_hold_no_dead_workers_leftovers(tmp_path):
    """SIGKILLed runs leave their worker row and a RUNNING trial behind; the next run (alone on the
    job) retires both with a warning, so a finished job has no RUNNING trial, no worker row, and one
    observed trial per evaluated point."""
    job = toy_job(tmp_path, "toy", evaluations=8)
    job.write_text(job.read_text().replace('name = "grid"', 'name = "tpe"'))
    for _ in range(2):
        proc = _search(tmp_path, job, "--in-process", "--no-report", progress="jsonl")
        for line in proc.stdout:
            if json.loads(line).get("event") == "evaluated":
                proc.send_signal(signal.SIGKILL)
                break
        proc.communicate(timeout=300)
    assert rows(tmp_path / DB, "select count(*) from kf_workers") != [(0,)]  # the killed runs' rows
    final = _search(tmp_path, job, "--in-process", "--no-report", progress="jsonl")
    out, err = final.communicate(timeout=300)
    assert final.returncode == 0, err
    warnings = [json.loads(line)["message"] for line in out.splitlines() if json.loads(line).get("event") == "warning"]
    assert any("is no longer running (killed?): its row is retired" in w for w in warnings), warnings
    assert rows(tmp_path / DB, "select count(*) from kf_workers") == [(0,)]
    assert rows(tmp_path / DB, "select count(*) from trials where state = 'RUNNING'") == [(0,)]
    observed = rows(tmp_path / DB, """
        select group_concat(p.param_name || '=' || p.param_value) from trials t
        join trial_params p on p.trial_id = t.trial_id
        join trial_user_attributes a on a.trial_id = t.trial_id and a.key = 'kernelforge'
        where t.state = 'COMPLETE' and a.value_json in ('"ok"', '"failed"') group by t.trial_id""")
    assert len(observed) == len(set(observed))  # each evaluated point told once
    (evaluated,), = rows(tmp_path / DB, "select count(distinct candidate_id) from kf_results")
    assert len(observed) == evaluated


def test_an_unknown_database_error_after_the_file_was_replaced_names_the_replacement(tmp_path):
    """Optuna's own engine, opening a new connection after the file was deleted, finds a new empty
    file and fails with "no such table": reported as what happened to the database."""
    import sqlalchemy as sa

    from kernelforge.store.failures import storage_error

    db = tmp_path / "kf.db"
    store = Store(f"sqlite:///{db}")
    for path in tmp_path.glob("kf.db*"):
        path.unlink()
    other = sa.create_engine(f"sqlite:///{db}")  # as Optuna's engine would, on a new connection
    with pytest.raises(sa.exc.OperationalError) as raised:
        with other.connect() as conn:
            conn.exec_driver_sql("select * from studies")
    other.dispose()
    error = storage_error(raised.value)
    assert isinstance(error, StorageError) and "was replaced by another file" in str(error)
    assert storage_error(ValueError("not a database error")) is None
    store.witness.close()
