"""The real servers the multi-worker tests run against (tests/services.py, scripts/ensure_services.sh):
a fresh database per test, a Ray cluster with two (fake) GPUs, and the skip-or-fail rule."""

from __future__ import annotations

import subprocess
import sys

import pytest
import sqlalchemy as sa

import services


def test_a_missing_server_skips_unless_required(monkeypatch):
    monkeypatch.delenv(services.REQUIRE_ENV, raising=False)
    with pytest.raises(pytest.skip.Exception, match="no server here"):
        services.unavailable("no server here")
    monkeypatch.setenv(services.REQUIRE_ENV, "1")
    with pytest.raises(pytest.fail.Exception, match="no server here .*required here"):
        services.unavailable("no server here")


def test_the_stop_command_deletes_only_a_folder_it_started(tmp_path):
    (tmp_path / "keep.txt").write_text("mine")
    done = subprocess.run(["bash", str(services.SCRIPT), "stop", str(tmp_path)], capture_output=True, text=True)
    assert done.returncode == 0 and "not a folder started by ensure_services.sh" in done.stderr
    assert (tmp_path / "keep.txt").read_text() == "mine"


def test_each_test_database_is_new_empty_and_dropped_after(postgres_url):
    admin = sa.create_engine(postgres_url, isolation_level="AUTOCOMMIT", poolclass=sa.pool.NullPool)

    def databases() -> set[str]:
        with admin.connect() as conn:
            query = sa.text("select datname from pg_database where datname like :pattern")
            return {r[0] for r in conn.execute(query, {"pattern": "kf_test_%"})}

    with services.fresh_database(postgres_url) as first, services.fresh_database(postgres_url) as second:
        assert first != second and first.startswith("postgresql+psycopg://")
        names = {sa.engine.make_url(first).database, sa.engine.make_url(second).database}
        assert names <= databases()
        engine = sa.create_engine(first)
        with engine.connect() as conn:  # its pool keeps the connection open: the drop must not wait on it
            assert sa.inspect(conn).get_table_names() == []
            conn.exec_driver_sql("create table t (x int)")
            conn.commit()
    assert not names & databases()
    engine.dispose()
    admin.dispose()


RAY_PROBE = """
import sys
import ray
ray.init(address=sys.argv[1], logging_level="ERROR", log_to_driver=False)

@ray.remote(num_gpus=1)
def gpu():
    return ray.get_gpu_ids()

print(ray.cluster_resources().get("GPU"), sorted(ray.get([gpu.remote(), gpu.remote()])))
"""


def test_the_ray_cluster_offers_two_fake_gpus_one_per_task(ray_address):
    done = subprocess.run([sys.executable, "-c", RAY_PROBE, ray_address], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.split("\n")[0] == "2.0 [[0], [1]]"
