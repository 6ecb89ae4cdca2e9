"""The DeepSeek-R1, Kimi K2.5 and GPT-OSS MXFP4 blocks through a real search (search/
model-blocks-smoke.toml, in the interpreter): every block's baseline and a proposed candidate are
compiled for sm_90, verified, timed and stored, and the report shows each block with its baseline
source and compile resources. Interpreter times: the machinery, not GPU speed."""

from __future__ import annotations

from pathlib import Path

import pytest

from kernelforge.catalog import Catalog
from kernelforge.job import load_job
from kernelforge.report.collect import collect
from kernelforge.report.markdown import to_markdown
from kernelforge.search.search import Search
from kernelforge.search.progress import Progress
from kernelforge.store.store import Store

pytestmark = pytest.mark.interpreter

ROOT = Path(__file__).resolve().parents[2]
BLOCKS = ("moe/deepseek_r1_experts", "moe/kimi_k25_experts", "attention/mla_decode", "moe/gpt_oss_experts_mxfp4")


def test_the_new_model_blocks_run_in_a_search_and_their_report_shows_them(tmp_path):
    catalog = Catalog.discover(ROOT / "kernels")
    job = load_job(ROOT / "search" / "model-blocks-smoke.toml", catalog)
    assert {b.id for b in job.blocks} == set(BLOCKS)
    store = Store(f"sqlite:///{tmp_path / 'model-blocks.db'}")
    outcome = Search(job, catalog, store, Progress(), compile_enabled=True).run()
    assert outcome.evaluations >= len(BLOCKS)
    for block_id in BLOCKS:
        candidates = store.candidates(block_id)
        base = next(c for c in candidates if c.origin == "baseline")
        assert len(candidates) >= 2, block_id  # the baseline and what the strategy proposed
        results = [r for r in store.results(block=block_id) if r.candidate_id == base.id]
        assert results and all(r.ok and r.median_s for r in results), block_id
        compiled = store.compile(base.id, "sm_90", "bfloat16")
        assert compiled and compiled.status == "ok" and all(k["registers"] for k in compiled.kernels), block_id
    markdown = to_markdown(collect(job, catalog, store))
    for block_id in BLOCKS:
        assert f"## {block_id}" in markdown
        assert f"### Baselines of {block_id}" in markdown
    assert "#### deepseek-r1" in markdown and "#### kimi-k2.5" in markdown and "#### gpt-oss-120b" in markdown
