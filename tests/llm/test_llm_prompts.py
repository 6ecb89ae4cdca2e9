"""What the model is told: the block's math and interface, the baseline, the standings with
timings and speedups, compile resources, earlier failures, the device's ceilings and the rules;
the production shapes and the target GPU even when the search verifies smoke shapes in the
interpreter, the tolerances; repair turns that name the failing shape's dimensions and the
failed template's diff, and resend a long answer cut (against the loopback server); and how
parents are chosen (best first, spread over the best few)."""

from __future__ import annotations

import json
import re
from dataclasses import replace
from pathlib import Path

import pytest

from kernelforge.catalog import Catalog
from kernelforge.job import load_job
from kernelforge.llm_spec import LLMSpec
from kernelforge.llm.context import PromptContext
from kernelforge.llm.generator import LLMGenerator
from kernelforge.llm.prompts import MAX_ANSWER, device_facts, estimate_tokens, repair_prompt, system_prompt
from kernelforge.llm.proposer import for_job
from kernelforge.search.gate import PolicyGate
from kernelforge.search.pipeline import Pipeline
from kernelforge.search.progress import Progress
from kernelforge.search.proposals import View
from kernelforge.search.reserve import Reserve
from kernelforge.search.search import Search
from kernelforge.store.store import Store
from llm_server import WRONG, Reply, ScriptedServer, fenced

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
    assert "x: tensor (1000,) float16" in text and "alpha: float = 1.5" in text and "- n1000 (N=1000)" in text
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


def test_parents_come_from_the_archive_best_included_and_the_same_for_a_seed(searched):
    context = PromptContext(view(searched))
    ranked = [row["id"] for row in context.standings(BLOCK)]

    def parents(seed: int) -> list[str | None]:
        generator = LLMGenerator(LLMSpec(base_url="http://127.0.0.1:9/v1", model="m"), job_name="prompts",
                                 store=searched.store, progress=Progress(), context=context, seed=seed)
        return [generator._new_request(BLOCK).parent for _ in range(2 * len(ranked) + 2)]

    chosen = parents(0)
    assert ranked[0] in chosen, "the fastest candidate is a parent early on"
    assert all(parent is not None for parent in chosen)
    assert len(set(chosen)) > 1, "parents are not one candidate over and over"
    assert parents(0) == chosen, "the same seed chooses the same parents"
    generator = LLMGenerator(LLMSpec(base_url="http://127.0.0.1:9/v1", model="m"), job_name="prompts",
                             store=searched.store, progress=Progress(), context=context)
    request = generator._new_request(BLOCK)
    assert [m["role"] for m in request.messages] == ["system", "user"] and request.purpose == "new"


SMOKE_JOB = """
[job]
name = "aimed"
device = "interpret"
dtype = "bfloat16"
{target}

[strategy]
name = "grid"
evaluations = 1

[[blocks]]
id = "norm/fused_add_rmsnorm"
shapes = "smoke"
"""


@pytest.mark.parametrize("target, bandwidth", [("", "HBM bandwidth 4.80 TB/s"), ('target = "sm_80"',
                                                                                   "HBM bandwidth 2.04 TB/s")])
def test_a_smoke_job_in_the_interpreter_is_asked_for_the_target_and_its_production_shapes(tmp_path, catalog,
                                                                                         target, bandwidth):
    (tmp_path / "job.toml").write_text(SMOKE_JOB.format(target=target))
    job = load_job(tmp_path / "job.toml", catalog)
    search = Search(job, catalog, Store(f"sqlite:///{tmp_path / 'a.db'}"), Progress(), compile_enabled=False,
                    in_process=True)
    run = search.prepare()  # nothing measured: the prompt needs only the run's context
    try:
        text = PromptContext(View(run, Reserve(), {}, {}, lambda: 0)).prompt("norm/fused_add_rmsnorm", None)
    finally:
        search.close()
    block = catalog.block("norm/fused_add_rmsnorm")
    production = [s for name, shapes in block.shape_sets().items() if name not in ("smoke", "check")
                  for s in shapes]
    # the production shapes with their dimensions and roofline, not only the smoke ones
    assert production and production[0].name in text and f"H={production[0]['H']}" in text
    assert "Production shapes (what the kernel will run on" in text and "-bound, at best" in text
    # the target's ceilings and resources
    assert bandwidth in text and "TFLOP/s" in text and "SMs" in text and "KiB per block" in text
    assert "registers 64K 32-bit per SM" in text
    # interpreter times are said to be no GPU speed, and not to be designed for
    assert "not GPU speed" in text and "Do not design for them" in text
    assert "fewer, larger programs are faster" not in text
    # the tolerances (bf16: 2e-2 of the norm, 4e-2 elementwise) and the held-out shapes' dimensions
    assert "||out - ref|| / ||ref|| <= 0.02" in text and "0.04 * rms(ref) + 0.04 * |ref|" in text
    assert "Held-out shapes" in text and "check/" in text


SEARCH_JOB = """
[job]
name = "repairs"
device = "interpret"
dtype = "float16"

[strategy]
name = "grid"
evaluations = 4

[[blocks]]
id = "toy/axpy"
shapes = "smoke"

[llm]
base_url = "{url}"
model = "m"
max_calls = 3
max_tokens = 10_000_000
concurrency = 1
timeout_s = 10.0
max_retries = 0
repair_turns = 1
tune_share = 0.5
tune_evaluations = 1
"""


def repair_search(tmp_path: Path, script: list[Reply]) -> ScriptedServer:
    with ScriptedServer(script) as server:
        (tmp_path / "job.toml").write_text(SEARCH_JOB.format(url=server.base_url))
        catalog = Catalog.discover(FIXTURES)
        job = load_job(tmp_path / "job.toml", catalog)
        store = Store(f"sqlite:///{tmp_path / 'r.db'}")
        Search(job, catalog, store, Progress(), compile_enabled=False, in_process=True,
               proposer=for_job(job, store, Progress())).run()
    return server


def test_a_repair_resends_the_first_prompt_once_and_a_long_failed_answer_cut(tmp_path):
    huge = "I considered many tilings. " * 80_000  # about 2 MB of prose, no code
    server = repair_search(tmp_path, [Reply(huge), Reply("Still no code.")])
    first, repair = server.requests[:2]

    assert len(json.dumps(repair)) < 64_000, "the 2 MB answer is not resent whole"
    roles = [m["role"] for m in repair["messages"]]
    assert roles == ["system", "user", "assistant", "user"]
    assert repair["messages"][:2] == first["messages"], "the first prompt, once"
    answer = repair["messages"][2]["content"]
    assert len(answer) < MAX_ANSWER + 300 and f"the answer was {len(huge)} characters" in answer
    assert estimate_tokens(repair["messages"]) < 16_000


def test_a_verification_failure_names_the_failing_shape_with_its_dimensions_and_the_diff(tmp_path):
    server = repair_search(tmp_path, [Reply(fenced(WRONG)), Reply("No more ideas.")])
    # The second request went out while the template was evaluated; the repair turn is the third.
    [turn] = [r["messages"][-1]["content"] for r in server.requests if len(r["messages"]) == 4]
    assert "failed: wrong" in turn
    assert re.search(r"The failing shape: n\d+ \(N=\d+\)", turn), turn
    assert "```diff" in turn and "+    tl.store(out_ptr + offs, (alpha * x - y)" in turn
