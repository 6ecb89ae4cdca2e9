"""Framework overhead on the CPU (not kernel speed): how fast kernelforge itself renders, compiles
ahead of time, verifies and stores candidates. Run with `make bench` (pytest-benchmark); the
numbers say how many candidates per minute the machinery can feed a GPU.
"""

from __future__ import annotations

import time
from pathlib import Path

import pytest
import torch

from kernelforge.devices import interpreter
from kernelforge.compile.pool import CompilePool
from kernelforge.candidate import Candidate
from kernelforge.catalog import Catalog
from kernelforge.execute.runner import load_candidate
from kernelforge.result import StoredResult, env_key
from kernelforge.store.store import Store
from kernelforge.result import Status
from kernelforge.execute.judge.verify import verify_shape

interpreter.enable()
ROOT = Path(__file__).resolve().parents[1]
CATALOG = Catalog.discover(ROOT / "kernels")
TOY = Catalog.discover(ROOT / "tests" / "fixtures" / "kernels")


@pytest.mark.parametrize("block_id", sorted(CATALOG.blocks))
def test_render(benchmark, block_id):
    template = CATALOG.baseline(block_id)
    points = list(template.space.points())[:50]
    benchmark(lambda: [template.render(p) for p in points])


def test_aot_compiles_per_minute(benchmark):
    """Distinct decode configs compiled for sm_90 through the pool (cold Triton cache entries)."""
    template = CATALOG.baseline("attention/gpt_oss_decode")
    points = iter(template.space.points())
    pool = CompilePool(max_workers=1)
    pool.submit(Candidate.from_template(template).source, template.block_id, CATALOG.root, "bfloat16", "sm_90").result()

    def compile_four():
        futures = [pool.submit(Candidate.from_template(template, next(points)).source, template.block_id,
                               CATALOG.root, "bfloat16", "sm_90") for _ in range(4)]
        return [f.result() for f in futures]

    start = time.perf_counter()
    reports = benchmark.pedantic(compile_four, rounds=2, iterations=1)
    elapsed = time.perf_counter() - start
    pool.shutdown()
    assert all(r.status in ("ok", "rejected") for r in reports)
    benchmark.extra_info["candidates_per_minute"] = round(8 / elapsed * 60, 1)


@pytest.mark.parametrize("block_id", sorted(CATALOG.blocks))
def test_verify_one_smoke_shape(benchmark, block_id):
    """Verification of a baseline on one smoke shape in the interpreter (3 calls + 2 references)."""
    block = CATALOG.block(block_id)
    module, _ = load_candidate(Candidate.from_template(CATALOG.baseline(block_id)).source, block_id)
    shape = block.shapes("smoke")[0]
    verdict = benchmark.pedantic(lambda: verify_shape(block, module.run, shape, torch.bfloat16, "cpu"),
                                 rounds=2, iterations=1)
    assert verdict.ok


def test_store_writes(benchmark, tmp_path):
    store = Store(f"sqlite:///{tmp_path / 'kf.db'}")
    candidate = Candidate.from_template(TOY.baseline("toy/axpy"))
    store.add_candidate(candidate)
    env = {"device": "interpret"}
    counter = iter(range(10**9))

    def write():
        store.add_result(StoredResult(candidate.id, "toy/axpy", f"s{next(counter)}", "float16", "cpu", env_key(env),
                                      Status.OK, 0.0, 1.0, 1.0, 1.0, 1, "m", "l", None, 1.0, 1.0, "", env, "b", 0.0))

    benchmark(write)
