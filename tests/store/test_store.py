"""The results database: real SQLite files; nothing stored twice, foreign or damaged files refused."""

from __future__ import annotations

import sqlite3
import time

import pytest

from kernelforge.candidate import Candidate
from kernelforge.errors import UserError
from kernelforge.result import Status, StoredResult, env_key
from kernelforge.store.records import StoreCounts
from kernelforge.store.store import Store


def candidate(source: str = "def run(out):\n    pass\n") -> Candidate:
    return Candidate("toy/axpy", "toy/axpy/baseline", (("BLOCK", 64),), source, origin="optuna")


def result(cid: str, shape: str = "n7", status: Status = Status.OK, median: float | None = 1e-3) -> StoredResult:
    env = {"device": "interpret", "device_name": "cpu", "torch": "x", "triton": "y"}
    return StoredResult(cid, "toy/axpy", shape, "float16", "cpu", env_key(env), status, 1e-4, median, median,
                        median, 3, "interpreter-wall", "interpreter", None, 2.0, 6.0, "", env, "j", time.time())


def test_candidates_and_results_round_trip_and_never_duplicate(tmp_path):
    url = f"sqlite:///{tmp_path / 'kf.db'}"
    store = Store(url)
    c = candidate()
    store.add_candidate(c, "j")
    store.add_candidate(c, "j")
    assert store.add_result(result(c.id)) is True
    assert store.add_result(result(c.id)) is False  # same candidate, shape, dtype, versions
    assert store.add_result(result(c.id, shape="n63", status=Status.WRONG, median=None)) is True
    store.close()
    reopened = Store(url)
    assert reopened.counts() == StoreCounts(candidates=1, results=2)
    stored = reopened.candidate(c.id)
    assert stored.source == c.source and stored.params == {"BLOCK": 64} and stored.origin == "optuna"
    found = reopened.find_result(c.id, "n7", "float16", result(c.id).env_key)
    assert found.ok and found.median_s == 1e-3 and found.env["triton"] == "y"
    assert reopened.evaluated("j", "toy/axpy") == {c.id}
    assert [r.status for r in reopened.results(block="toy/axpy")] == [Status.OK, Status.WRONG]


def test_a_foreign_database_is_refused_and_left_untouched(tmp_path):
    path = tmp_path / "other.db"
    conn = sqlite3.connect(path)
    conn.execute("create table customers (id integer)")
    conn.commit()
    conn.close()
    before = path.read_bytes()
    with pytest.raises(UserError, match="not kernelforge's"):
        Store(f"sqlite:///{path}")
    assert path.read_bytes() == before


def test_a_corrupted_file_is_refused_not_overwritten(tmp_path):
    path = tmp_path / "broken.db"
    path.write_bytes(b"this is not a database" * 100)
    with pytest.raises(UserError, match="not a readable database"):
        Store(f"sqlite:///{path}")
    assert path.read_bytes() == b"this is not a database" * 100


def test_a_newer_schema_is_refused(tmp_path):
    url = f"sqlite:///{tmp_path / 'kf.db'}"
    Store(url).close()
    conn = sqlite3.connect(tmp_path / "kf.db")
    conn.execute("update kf_meta set value = '99' where key = 'schema_version'")
    conn.commit()
    conn.close()
    with pytest.raises(UserError, match="newer than this kernelforge"):
        Store(url)


def test_opening_a_missing_database_for_reading_says_run_the_search(tmp_path):
    with pytest.raises(UserError, match="run the search first"):
        Store(f"sqlite:///{tmp_path / 'none.db'}", create=False)


def test_the_hosts_launch_time_is_stored_and_an_older_database_gains_its_column(tmp_path):
    """A timing's host launch time travels to the stored row (issue 28); a database made before the
    column existed gets it on open, its old rows reading None."""
    from kernelforge.block import Counts, Shape
    from kernelforge.result import Evaluation, Timing, Verification

    url = f"sqlite:///{tmp_path / 'kf.db'}"
    store = Store(url)
    old, new = candidate(), candidate("def run(out):\n    return None\n")
    store.add_candidate(old, "j")
    store.add_candidate(new, "j")
    store.add_result(result(old.id))
    store.close()
    with sqlite3.connect(tmp_path / "kf.db") as conn:  # as a database of the earlier schema
        conn.execute("ALTER TABLE kf_results DROP COLUMN host_launch_s")
    reopened = Store(url)
    ev = Evaluation(Shape.of("n7", n=7), Verification(Status.OK, rel_error=1e-4), Counts(2.0, 6.0),
                    Timing(2e-5, 2e-5, 2e-5, 5, "cuda-graph", "graph", extra={"host_launch_s": 4.5e-5}))
    base = result(old.id)
    row = StoredResult.of(new.id, "toy/axpy", ev, dtype="float16", device="cpu", env=base.env, env_key=base.env_key,
                          job="j")
    assert reopened.add_result(row)
    assert reopened.find_result(new.id, "n7", "float16", base.env_key).host_launch_s == 4.5e-5
    assert reopened.find_result(old.id, "n7", "float16", base.env_key).host_launch_s is None


def test_a_url_of_a_missing_driver_or_a_bad_scheme_says_which(tmp_path):
    import importlib.util

    if importlib.util.find_spec("MySQLdb") is None:
        with pytest.raises(UserError, match=r"storage 'mysql://\*\*\*@host/db': its database driver is not installed "
                                            r"\(MySQLdb\); install it"):
            Store("mysql://user:pw@host/db")
    with pytest.raises(UserError, match="storage 'nope://x': .*use a SQLAlchemy URL such as"):
        Store("nope://x")
