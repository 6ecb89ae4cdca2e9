"""The results database on a real PostgreSQL server stores exactly what SQLite stores, and the job
lock works there across processes (issue 13: several workers share one job through PostgreSQL).

Needs the ``pg_url`` fixture (tests/services.py): skipped without a server, failed in CI
(KERNELFORGE_REQUIRE_SERVICES=1).
"""

from __future__ import annotations

import os
import subprocess
import sys
from typing import Any

import pytest
from sqlalchemy.engine import make_url

from kernelforge.candidate import Candidate
from kernelforge.errors import UserError
from kernelforge.result import Status, StoredResult, env_key
from kernelforge.store import llm_log as llm_log_module
from kernelforge.store import store as store_module
from kernelforge.store.records import Confirmation
from kernelforge.store.store import Store

# Values a float column must keep to the last bit (a REAL/float4 column would round them).
EXACT = (1.2345678901234567e-05, 0.1 + 0.2, 3.0000000000000004, 1.7976931348623157e308, 5e-324)


class Clock:
    """A deterministic stand-in for the store's ``time`` module: both databases get the same
    ``created`` stamps (with microseconds, like time.time()), so their records compare equal."""

    def __init__(self) -> None:
        self.now = 1767312345.123456

    def time(self) -> float:
        self.now += 0.001001
        return self.now


def baseline() -> Candidate:
    return Candidate("toy/axpy", "toy/axpy/baseline", (("BLOCK", 64), ("WARPS", 4)),
                     "def run(out):\n    out[0] = 'é ✓'\n", origin="baseline")


def child(parent: Candidate) -> Candidate:
    return Candidate("toy/axpy", "toy/axpy/llm_0123456789abcdef", (("BLOCK", 128), ("SCALE", 0.5), ("SPLIT", True)),
                     "def run(out):\n    out[0] = 2\n", origin="llm", parent=parent.id)


ENV = {"device": "interpret", "device_name": "cpu", "torch": "2.13.0", "triton": "3.9.0", "clocks": [1410, 1980]}


def result(cid: str, shape: str, status: Status, median: float | None, created: float) -> StoredResult:
    """An OK result (every float column set, to the last bit) or, without ``median``, a WRONG one
    (NaN and inf, which the store keeps as NULL)."""
    timed = median is not None
    return StoredResult(
        candidate_id=cid, block="toy/axpy", shape=shape, dtype="bfloat16", device="cuda NVIDIA H200",
        env_key=env_key(ENV), status=status, rel_error=EXACT[0] if timed else float("nan"), median_s=median,
        p20_s=EXACT[1] if timed else None, p80_s=EXACT[2] if timed else None, samples=25 if timed else None,
        timing_method="cuda-events", timing_label="CUDA events, L2 flushed", joules=EXACT[3] if timed else None,
        flops=2.0e15, bytes=6.5e9, message="" if timed else "max rel error 0.5 > 0.01 at (3, 7)", env=ENV,
        job="j", created=created, excess=EXACT[4] if timed else float("inf"))


def write_sequence(store: Store) -> dict[str, Any]:
    """The writes a search makes, in its order; returns the ids the reads need."""
    base, new = baseline(), child(baseline())
    store.add_candidate(base, "j")
    store.add_candidate(new, "j")
    store.add_candidate(new, "j")  # already stored: a no-op
    kernels = [{"name": "axpy_kernel", "registers": 128, "spill_stores": 0, "shared_bytes": 49152,
                "uses_wgmma": True}]
    store.add_compile(base.id, "cuda:90a", "bfloat16", "ok", "", kernels)
    store.add_compile(new.id, "cuda:90a", "bfloat16", "compile_error", "ptxas: too many resources", [])
    store.add_compile(new.id, "cuda:90a", "bfloat16", "ok", "", kernels)  # replaces the failed one
    assert store.add_result(result(base.id, "n7", Status.OK, 1.0e-3, 1767312000.5)) is True
    assert store.add_result(result(new.id, "n7", Status.OK, 7.123456789012345e-4, 1767312001.25)) is True
    assert store.add_result(result(new.id, "n63", Status.WRONG, None, 1767312002.0)) is True
    assert store.add_result(result(new.id, "n7", Status.OK, 9.9e-4, 1767312003.0)) is False  # same conditions
    store.add_confirmation(Confirmation("j", "toy/axpy", "n7", "bfloat16", new.id, base.id, env_key(ENV),
                                        (1.41, 1.39, EXACT[1], 1.4), 1.40, 1.39, 1.41))
    store.add_template(new.template_id, "toy/axpy", "@triton.jit\ndef k(): ...\n", parent=base.id, call_seq=1,
                       job="j")
    calls = [{"job": "j", "run": 1, "seq": 1, "attempt": attempt, "final": attempt == 2, "block": "toy/axpy",
              "purpose": "new", "parent": base.id, "depth": 0, "model": "gpt-oss-120b", "base_url": "http://127.0.0.1:1/v1",
              "request": '{"messages": [{"role": "user", "content": "faster ✓"}]}', "request_hash": "ab" * 16,
              "response": None if attempt == 1 else "```python\n...\n```", "finish_reason": None if attempt == 1 else "stop",
              "status": "rate_limited" if attempt == 1 else "ok", "http_status": 429 if attempt == 1 else 200,
              "error": "slow down" if attempt == 1 else None, "prompt_tokens": None if attempt == 1 else 1200,
              "completion_tokens": None if attempt == 1 else 800, "latency_s": 0.25 * attempt, "tick": 3,
              "replayed_from": None} for attempt in (1, 2)]
    row_ids = store.add_llm_calls(calls)
    store.set_llm_outcome(row_ids[-1], "ok", template_id=new.template_id, candidate_id=new.id)
    return {"base": base.id, "new": new.id, "row_ids": row_ids}


def read_everything(store: Store, ids: dict[str, Any]) -> dict[str, Any]:
    """What every read method returns after the sequence."""
    return {
        "row_ids": ids["row_ids"],
        "candidates": store.candidates(),
        "candidates_of_block": store.candidates("toy/axpy"),
        "candidate": store.candidate(ids["new"]),
        "compile": store.compile(ids["new"], "cuda:90a", "bfloat16"),
        "compiles": sorted(store.compiles([ids["base"], ids["new"]], "bfloat16"), key=lambda c: c.candidate_id),
        "results": store.results(),
        "results_of_candidate": store.results(block="toy/axpy", candidate_id=ids["new"], dtype="bfloat16"),
        "found": store.find_result(ids["new"], "n7", "bfloat16", env_key(ENV)),
        "missing": store.find_result(ids["new"], "n7", "float16", env_key(ENV)),
        "evaluated": store.evaluated("j", "toy/axpy"),
        "evaluated_shape": store.evaluated("j", "toy/axpy", template="toy/axpy/baseline", shape="n7", dtype="bfloat16"),
        "counts": store.counts(),
        "confirmations": store.confirmations("j"),
        "templates": store.templates("toy/axpy", "j"),
        "llm_calls": store.llm_calls("j"),
        "llm_final": store.llm_calls("j", final_only=True),
        "llm_usage": store.llm_usage("j"),
    }


def stored_by(url: str, monkeypatch) -> dict[str, Any]:
    clock = Clock()
    monkeypatch.setattr(store_module, "time", clock)
    monkeypatch.setattr(llm_log_module, "time", clock)
    store = Store(url)
    try:
        return read_everything(store, write_sequence(store))
    finally:
        store.close()


def test_postgresql_stores_exactly_what_sqlite_stores(tmp_path, pg_url, monkeypatch):
    on_sqlite = stored_by(f"sqlite:///{tmp_path / 'kf.db'}", monkeypatch)
    on_postgres = stored_by(pg_url, monkeypatch)
    probe = Store(pg_url)
    assert probe.engine.dialect.name == "postgresql"  # not silently another database
    probe.close()
    for key in on_sqlite:
        assert on_postgres[key] == on_sqlite[key], key
    # What was compared is what was written (not two equally wrong stores).
    found = on_postgres["found"]
    assert found.median_s == 7.123456789012345e-4 and found.rel_error == EXACT[0] and found.joules == EXACT[3]
    assert found.excess == EXACT[4] and found.env == ENV and found.created == 1767312001.25
    wrong = on_postgres["results"][-1]
    assert wrong.status is Status.WRONG and wrong.rel_error is None and wrong.excess is None and wrong.median_s is None
    assert on_postgres["candidate"].params == {"BLOCK": 128, "SCALE": 0.5, "SPLIT": True}
    assert on_postgres["candidates"][0].source.endswith("'é ✓'\n")
    assert on_postgres["compile"].status == "ok" and on_postgres["compile"].kernels[0]["uses_wgmma"] is True
    assert on_postgres["confirmations"][0].speedups == (1.41, 1.39, EXACT[1], 1.4)
    assert [c.final for c in on_postgres["llm_calls"]] == [False, True] and on_postgres["llm_final"][0].kind == "ok"
    assert on_postgres["llm_usage"].tokens == 2000 and on_postgres["counts"].results == 3


def test_reopening_a_postgresql_store_keeps_its_schema_and_rows(pg_url):
    first = Store(pg_url)
    first.add_candidate(baseline(), "j")
    first.close()
    again = Store(pg_url)  # kf_meta is found: the database is recognised as kernelforge's
    assert [c.id for c in again.candidates()] == [baseline().id]
    again.close()
    with pytest.raises(UserError, match="has no kernelforge results"):
        Store(pg_url.rsplit("/", 1)[0] + "/postgres", create=False)


HOLD = """
import os, sys
from kernelforge.errors import UserError
from kernelforge.store.store import Store
store = Store(os.environ["KF_TEST_STORE_URL"])
try:
    lock = store.acquire_job_lock("toy")
except UserError as exc:
    print("refused:", exc, flush=True)
    sys.exit(3)
print("held", lock.holder, flush=True)
if sys.argv[1] == "release":
    lock.release()
"""


def run_holder(url: str, then: str) -> subprocess.CompletedProcess:
    # Another process, so another lock identity. The URL (with its password) goes through the
    # environment, not the command line that `ps` shows.
    return subprocess.run([sys.executable, "-c", HOLD, then], capture_output=True, text=True, timeout=300,
                          env={**os.environ, "KF_TEST_STORE_URL": url})


def test_the_job_lock_on_postgresql_refuses_a_second_process_and_takes_over_a_dead_one(pg_url):
    store = Store(pg_url)
    lock = store.acquire_job_lock("toy")
    refused = run_holder(pg_url, "release")
    assert refused.returncode == 3, refused.stderr
    assert f"job 'toy' is being searched by process {os.getpid()} on host" in refused.stdout
    password = make_url(pg_url).password
    assert not password or (password not in refused.stdout and "://***@127.0.0.1:" in refused.stdout)  # named, redacted
    assert store.acquire_job_lock("toy").holder == lock.holder  # re-entrant for its holder
    lock.release()
    assert store.job_lock("toy") is None
    # A process that takes the lock and exits without releasing it (as if SIGKILLed) leaves its row;
    # the next search sees the holder is gone and takes the lock over.
    dead = run_holder(pg_url, "keep")
    assert dead.returncode == 0 and dead.stdout.startswith("held"), dead.stderr
    left = store.job_lock("toy")
    assert left is not None and left.holder == dead.stdout.split()[1]
    taken = store.acquire_job_lock("toy")
    assert taken.taken_over == f"process {left.pid} on {left.host}"
    taken.release()
    store.close()


def test_another_database_at_the_url_stops_the_store_without_writing_there(pg_url, postgres_url):
    """Issue 33: the database at the URL replaced under a running store (recreated empty, as by a
    server restored from nothing): one StorageError per write, never a write into the new one."""
    import sqlalchemy as sa

    import services
    from kernelforge.errors import StorageError

    store = Store(pg_url)
    store.add_candidate(baseline())
    name = make_url(pg_url).database
    admin = services._admin_engine(postgres_url)
    try:
        with admin.connect() as conn:
            conn.exec_driver_sql(f'DROP DATABASE "{name}" WITH (FORCE)')
            conn.exec_driver_sql(f'CREATE DATABASE "{name}"')
    finally:
        admin.dispose()
    with pytest.raises(StorageError):  # the dropped connection: the server closed it
        store.add_candidate(child(baseline()))
    with pytest.raises(StorageError, match="is no longer the one this search opened"):
        store.add_candidate(child(baseline()))
    with pytest.raises(StorageError, match="is no longer the one this search opened"):
        store.verify()
    store.engine.dispose()
    probe = sa.create_engine(pg_url)
    try:
        assert sa.inspect(probe).get_table_names() == []  # nothing written into the new database
    finally:
        probe.dispose()


def test_a_wrong_password_is_a_connection_refused_and_never_shown(pg_url):
    """A server that refuses the login: one message saying the connection was refused and what to
    check (not "not a readable database", which reads as a damaged file), the password masked."""
    from sqlalchemy.engine import make_url

    url = make_url(pg_url).set(password="wrong-password-xyz")
    rendered = url.render_as_string(hide_password=False)
    with pytest.raises(UserError) as refused:
        Store(rendered)
    message = str(refused.value)
    assert "cannot connect" in message and "user, password and database name" in message
    assert "wrong-password-xyz" not in message
