"""Test set-up: tests run with Triton's interpreter on (CPU tensors), with the bf16 fix, except
when KERNELFORGE_TEST_DEVICE=cuda (scripts/gpu_check.py runs the GPU tests that way)."""

from __future__ import annotations

import os
from pathlib import Path

# The interpreter runs kernels' dots as numpy matmuls: on the shared 2-core machine OpenBLAS's own
# threads made a 64x128x64 product take 22 ms instead of 0.26 ms under load. Read when numpy loads,
# so before torch (which loads it).
os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")

import pytest  # noqa: E402
import torch  # noqa: E402

from kernelforge.devices import interpreter  # noqa: E402

if os.environ.get("KERNELFORGE_TEST_DEVICE", "interpret") != "cuda":
    interpreter.enable()

# The suite runs as 2 xdist workers on 2 cores: torch's own intra-op threads on top of that made
# small reference ops hundreds of times slower under load (measured 737 ms instead of 0.95 ms).
torch.set_num_threads(1)

REPO = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="session")
def catalog():
    from kernelforge.catalog import Catalog

    return Catalog.discover(REPO / "kernels")


# -- real servers (tests/services.py): PostgreSQL and Ray, from the environment or started here ----
# Each skips with its reason when the server cannot be had, or fails when
# KERNELFORGE_REQUIRE_SERVICES=1 (.ci/run). Session fixtures: started once per xdist worker, lazily
# (only a worker that runs a test needing one starts it).


@pytest.fixture(scope="session")
def postgres_url():
    """SQLAlchemy URL (postgresql+psycopg://...@127.0.0.1:PORT/DB) of a PostgreSQL server the test
    may create databases on: $KERNELFORGE_TEST_POSTGRES_URL, or a private server for the session."""
    import services

    try:
        with services.postgres_server() as url:
            yield url
    except services.ServiceUnavailable as exc:
        services.unavailable(str(exc))


@pytest.fixture
def pg_url(postgres_url):
    """URL of a fresh, empty PostgreSQL database for this test only (dropped after it)."""
    import services

    with services.fresh_database(postgres_url) as url:
        yield url


@pytest.fixture(scope="session")
def ray_address():
    """Address (127.0.0.1:PORT) of a Ray cluster with 2 CPUs and 2 (fake) GPUs:
    $KERNELFORGE_TEST_RAY_ADDRESS, or a local cluster started for the session."""
    import services

    try:
        with services.ray_cluster() as address:
            yield address
    except services.ServiceUnavailable as exc:
        services.unavailable(str(exc))
