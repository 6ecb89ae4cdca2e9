"""What the model is told: the block's math and interface, the baseline, the standings with
timings and speedups, compile resources, earlier failures, the device's ceilings and the rules;
and how parents are chosen (best first, spread over the best few)."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest

from kernelforge.catalog import Catalog
from kernelforge.job import LLMSpec, load_job
from kernelforge.llm.context import PromptContext
from kernelforge.llm.generator import LLMGenerator
from kernelforge.llm.prompts import device_facts, repair_prompt, system_prompt
from kernelforge.search.gate import PolicyGate
from kernelforge.search.pipeline import Pipeline
from kernelforge.search.progress import Progress
from kernelforge.search.proposals import View
from kernelforge.search.reserve import Reserve
from kernelforge.search.loop import Search
from kernelforge.store.store import Store

pytestmark = pytest.mark.interpreter

ROOT = Path(__file__).resolve().parents[2]
FIXTURES = ROOT / "tests" / "fixtures" / "kernels"
BLOCK = "toy/axpy"

JOB = """
[job]
name = "prompts"
device = "interpret"
dtype = "float16"

[strategy]
name = "grid"
evaluations = 4

[[blocks]]
id = "toy/axpy"
shapes = "smoke"
"""


@pytest.fixture(scope="module")
def searched(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("prompts")
    (tmp / "job.toml").write_text(JOB)
    catalog = Catalog.discover(FIXTURES)
    job = load_job(tmp / "job.toml", catalog)
    search = Search(job, catalog, Store(f"sqlite:///{tmp / 'p.db'}"), Progress(), compile_enabled=False,
                    in_process=True)
    search.run()
    return search.run_context  # what the search ran with: store, catalog, baselines, environment


def view(run):
    """The finished search as a proposer sees it (its baseline results from the store)."""
    block = run.catalog.block(BLOCK)
    baselines = {BLOCK: Pipeline(run, PolicyGate()).stored(run.first_baseline(BLOCK), block.shapes("smoke"))}
    return View(run, Reserve(), {}, baselines, lambda: 0)


def test_the_prompt_carries_what_the_model_needs(searched):
    store = searched.store
    baseline_id = searched.first_baseline(BLOCK).id
    others = [c for c in store.candidates(BLOCK) if c.id != baseline_id]
    store.add_compile(others[0].id, "sm_90", "float16", "ok", "", [
        {"name": "_axpy", "registers": 42, "spill_stores": 8, "spill_loads": 4, "shared_bytes": 1024,
         "num_warps": 4, "num_stages": 3}])
    store.add_llm_calls([{
        "job": "prompts", "run": 1, "seq": 1, "attempt": 0, "final": True, "block": BLOCK, "purpose": "new",
        "parent": baseline_id, "depth": 0, "model": "m", "base_url": "http://x/v1", "request": "{}",
        "request_hash": "0" * 16, "status": "ok", "tick": 0, "kind": "wrong", "template_id": "toy/axpy/llm_feed",
        "message": "n1000: relative error 1.07 exceeds 0.002"}])
    searched = replace(searched, target="sm_90")
    text = PromptContext(view(searched)).prompt(BLOCK, others[0].id)
    # the math, the inputs and the interface
    assert "return alpha * x.float() + y.float()" in text and "out = alpha * x + y" in text
    assert "x: tensor (1000,) float16" in text and "alpha: float = 1.5" in text and "n1000 {'N': 1000}" in text
    assert "run(**inputs, out=out)" in text and "[space]" in text and "[baseline]" in text
    # the baseline, the parent and the standings with timings and speedups
    assert "_axpy[(triton.cdiv(n, {{ BLOCK }}),)]" in text
    assert f"| {baseline_id} | toy/axpy/baseline | baseline |" in text and "(x1.00)" in text
    assert f"| {others[0].id} |" in text and others[0].template in text
    # resources, failures, the device, the answer formats
    assert f"{others[0].id} _axpy: registers 42, spill stores/loads 8/4 B, shared memory 1024 B" in text
    assert "toy/axpy/llm_feed: wrong: n1000: relative error 1.07 exceeds 0.002" in text
    assert "interpreter" in text and "not GPU speed" in text
    assert 'template = "toy/axpy/baseline"' in text and "points = [{ BLOCK = 256, num_warps = 4 }]" in text
    assert "{{" not in text.replace("{{ BLOCK }}", "").replace("{{ num_warps }}", "").replace("{{ NAME }}", "")


def test_rules_and_repair_turns():
    rules = system_prompt()
    for rule in ("Triton kernels only", "no torch math", "try/except", "Triton 3.6", "make_block_ptr", "libdevice"):
        assert rule in rules
    turn = repair_prompt(kind="evaluated", status="wrong", message="n7: relative error 0.3", template_id="t/x/llm_1",
                         point="BLOCK=64")
    assert "t/x/llm_1" in turn and "BLOCK=64" in turn and "relative error 0.3" in turn and "wrong" in turn
    assert "no code block" in repair_prompt(kind="answer", status="no_code", message="no code block here")


def test_device_facts_place_the_baseline_under_the_roofline(searched):
    block = searched.catalog.block(BLOCK)
    shapes = block.shapes("smoke")
    facts = device_facts({"device": "cuda", "device_name": "NVIDIA H200", "timing": "cuda events"}, block, shapes,
                         searched.dtype, {"n1000": 2e-6})
    assert "NVIDIA H200" in facts["description"] and "TB/s" in facts["description"]
    [line] = facts["roofline"]
    assert line.startswith("n1000: baseline 2.00 us") and "memory-bound" in line and "% of the roofline" in line
    assert device_facts({"device": "cuda", "device_name": "Unknown GPU"}, block, shapes, searched.dtype, {})[
        "roofline"] == []


def test_parents_are_the_best_first_then_the_next_best(searched):
    context = PromptContext(view(searched))
    ranked = [row["id"] for row in context.standings(BLOCK)]
    generator = LLMGenerator(LLMSpec(base_url="http://127.0.0.1:9/v1", model="m"), job_name="prompts",
                             store=searched.store, progress=Progress(), context=context)
    parents = [generator._new_request(BLOCK).parent for _ in range(len(ranked) + 1)]
    assert parents[0] == ranked[0]
    assert set(parents[: len(ranked)]) == set(ranked), "each of the best gets a child before any gets two"
    assert parents[len(ranked)] == ranked[0]
    request = generator._new_request(BLOCK)
    assert [m["role"] for m in request.messages] == ["system", "user"] and request.purpose == "new"
