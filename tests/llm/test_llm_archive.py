"""The archive of elites and the lineage (kernelforge.llm.archive, kernelforge.llm.lineage): built
from a real SQLite store filled through its public methods; cells by family and descriptor with the
fastest candidate each; parents beyond the fastest four, deterministic for a seed and the same
after a resume; and end to end against the loopback server, a second request written from the
first one's template, stored with depth 2."""

from __future__ import annotations

import time

import pytest

from kernelforge.candidate import Candidate
from kernelforge.llm.archive import (Archive, Cell, ParentMode, ParentPicker, bucket, descriptor)
from kernelforge.llm.context import PARENT_POOL
from kernelforge.llm.lineage import HUMAN, Ancestry, lineage
from kernelforge.llm.parse import template_id_for
from kernelforge.result import Status, StoredResult, env_key
from kernelforge.store.store import Store

BLOCK = "toy/axpy"
BASE_TPL = "toy/axpy/baseline"
ROWS_TPL = "toy/axpy/rows"  # a second human template: its own family
LLM1 = "toy/axpy/llm_1111111111"
LLM2 = "toy/axpy/llm_2222222222"  # written from a candidate of LLM1
SHAPES = ["n7", "n63"]
ENV = {"device": "interpret", "device_name": "cpu", "torch": "x", "triton": "y"}
KEY = env_key(ENV)
BASE_S = 1e-3


def cand(template: str, block_size: int, origin: str = "optuna", parent: str | None = None) -> Candidate:
    source = f"# {template}\ndef run(out):\n    BLOCK = {block_size}\n"
    return Candidate(BLOCK, template, (("BLOCK", block_size), ("num_warps", 4)), source, origin=origin, parent=parent)


def add(store: Store, c: Candidate, seconds: float | None, *, shapes=SHAPES, status=Status.OK) -> str:
    store.add_candidate(c, "j")
    for shape in shapes:
        store.add_result(StoredResult(c.id, BLOCK, shape, "float16", "cpu", KEY, status, 1e-4, seconds, seconds,
                                      seconds, 3, "interpreter-wall", "interpreter", None, 2.0, 6.0, "", ENV, "j",
                                      time.time()))
    return c.id


def call_row(seq: int, parent: str | None, *, purpose: str = "new", model: str = "m", template_id=None) -> dict:
    return {"job": "j", "run": 1, "seq": seq, "attempt": 0, "final": True, "block": BLOCK, "purpose": purpose,
            "parent": parent, "depth": 0, "model": model, "base_url": "http://127.0.0.1/v1", "request": "{}",
            "request_hash": f"h{seq}", "response": "...", "finish_reason": "stop", "status": "ok",
            "http_status": 200, "error": None, "prompt_tokens": 10, "completion_tokens": 10, "latency_s": 0.1,
            "tick": seq, "template_id": template_id}


@pytest.fixture
def filled(tmp_path):
    """A store with two human families, an LLM template and one written from it (ids by name)."""
    url = f"sqlite:///{tmp_path / 'kf.db'}"
    store = Store(url)
    ids = {}
    ids["base"] = add(store, cand(BASE_TPL, 256, origin="baseline"), BASE_S)  # x1.00
    ids["base64"] = add(store, cand(BASE_TPL, 64, parent=ids["base"]), 0.9e-3)  # x1.11
    ids["base1024"] = add(store, cand(BASE_TPL, 1024, parent=ids["base"]), 0.8e-3)  # x1.25
    ids["rows128"] = add(store, cand(ROWS_TPL, 128, origin="manual"), 0.7e-3)  # x1.43
    ids["rows512"] = add(store, cand(ROWS_TPL, 512, parent=ids["rows128"]), 1.1e-3)  # x0.91
    store.add_template(LLM1, BLOCK, "text one", parent=ids["base"], call_seq=1, job="j")
    ids["llm1_1024"] = add(store, cand(LLM1, 1024, origin="llm", parent=ids["base"]), 0.5e-3)  # x2.00
    ids["llm1_2048"] = add(store, cand(LLM1, 2048, parent=ids["llm1_1024"]), 0.4e-3)  # x2.50
    ids["llm1_4096"] = add(store, cand(LLM1, 4096, parent=ids["llm1_1024"]), 0.45e-3)  # x2.22
    store.add_template(LLM2, BLOCK, "text two", parent=ids["llm1_2048"], call_seq=2, job="j")
    ids["llm2_4096"] = add(store, cand(LLM2, 4096, origin="llm", parent=ids["llm1_2048"]), 0.3e-3)  # x3.33
    # Not verified: wrong on every shape, or measured on one shape only.
    ids["wrong"] = add(store, cand(LLM2, 8192, parent=ids["llm2_4096"]), None, status=Status.WRONG)
    ids["partial"] = add(store, cand(BASE_TPL, 16, parent=ids["base"]), 0.1e-3, shapes=["n7"])
    store.add_llm_calls([call_row(1, ids["base"], model="model-a", template_id=LLM1)])
    store.add_llm_calls([call_row(2, ids["llm1_2048"], model="model-b", template_id=LLM2)])
    for row in store.llm_calls("j", final_only=True):
        store.set_llm_outcome(row.id, "ok")
    yield store, ids, url
    store.close()


def build(store: Store, target: str | None = None) -> Archive:
    return Archive.build(store, BLOCK, shapes=SHAPES, dtype="float16", env_key=KEY, baseline_id=store_base(store),
                         target=target)


def store_base(store: Store) -> str:
    return next(c.id for c in store.candidates(BLOCK) if c.origin == "baseline")


def test_cells_are_families_and_tiles_each_with_its_fastest_candidate(filled):
    store, ids, _ = filled
    archive = build(store)
    ranked = [cid for cid, _ in archive.ranked]
    assert ids["wrong"] not in ranked and ids["partial"] not in ranked, "verified on every shape only"
    assert ranked[0] == ids["llm2_4096"] and archive.ranked[0][1] == pytest.approx(BASE_S / 0.3e-3)

    def cell(family: str, block_size: int) -> Cell:
        return Cell(family, descriptor({"BLOCK": block_size, "num_warps": 4}))

    by_cell = {e.cell: e for e in archive.elites}
    # The LLM templates belong to the baseline's family; the second human template is its own.
    assert set(by_cell) == {cell(BASE_TPL, 64), cell(BASE_TPL, 256), cell(BASE_TPL, 1024), cell(BASE_TPL, 2048),
                            cell(BASE_TPL, 4096), cell(ROWS_TPL, 128), cell(ROWS_TPL, 512)}
    # Shared cells keep the faster: LLM1 beats the baseline template at 1024, LLM2 beats LLM1 at 4096.
    assert by_cell[cell(BASE_TPL, 1024)].candidate_id == ids["llm1_1024"]
    assert by_cell[cell(BASE_TPL, 1024)].members == (ids["llm1_1024"], ids["base1024"])
    assert by_cell[cell(BASE_TPL, 4096)].candidate_id == ids["llm2_4096"]
    assert by_cell[cell(BASE_TPL, 4096)].template_id == LLM2
    assert [e.rank for e in archive.elites] == sorted(e.rank for e in archive.elites), "fastest first"
    assert archive.cell_of(ids["base1024"]) == cell(BASE_TPL, 1024) and archive.cell_of(ids["wrong"]) is None
    assert archive.best_by_template()[LLM1] == pytest.approx(2.5)


def test_descriptors_bucket_tiles_and_compile_resources_in_powers_of_two(filled):
    assert [bucket(v) for v in (0, 1, 2, 3, 4, 1023, 1024)] == [0, 1, 2, 2, 3, 10, 11]
    tiled = descriptor({"BLOCK_M": 64, "BLOCK_N": 128, "BLOCK_SIZE_K": 32, "GROUP_SIZE_M": 8, "num_warps": 4})
    assert tiled.tile == bucket(64 * 128 * 32) and descriptor({"num_warps": 4}).tile is None
    store, ids, _ = filled
    # Same tile, different shared memory: two cells once the run's target has compile facts.
    store.add_compile(ids["llm1_4096"], "sm90", "float16", "ok", "", [{"name": "k", "shared_bytes": 0, "registers": 32}])
    store.add_compile(ids["llm2_4096"], "sm90", "float16", "ok", "",
                      [{"name": "k", "shared_bytes": 49152, "registers": 128}])
    plain = {e.candidate_id for e in build(store).elites}
    compiled = build(store, target="sm90")
    assert ids["llm1_4096"] not in plain and ids["llm1_4096"] in {e.candidate_id for e in compiled.elites}
    cell = compiled.cell_of(ids["llm2_4096"])
    assert (cell.descriptor.shared, cell.descriptor.registers) == (bucket(49152), bucket(128))
    assert "smem >=32768 B" in cell.descriptor.label


def test_parents_reach_beyond_the_fastest_four_deterministically_for_a_seed(filled):
    store, ids, _ = filled
    archive = build(store)
    top = {cid for cid, _ in archive.ranked[:PARENT_POOL]}
    picker = ParentPicker(3)
    choices = [picker.choose(archive) for _ in range(12)]
    parents = [c.parent for c in choices]
    assert len(set(parents)) > PARENT_POOL and set(parents) - top, "parents are not only the fastest four"
    assert {c.mode for c in choices} == {ParentMode.EXPLOIT, ParentMode.EXPLORE}
    assert all(c.parent in top for c in choices if c.mode is ParentMode.EXPLOIT)
    elites = {e.candidate_id for e in archive.elites}
    assert all(c.parent in elites and c.cell == archive.cell_of(c.parent)
               for c in choices if c.mode is ParentMode.EXPLORE)
    explored = [c.cell for c in choices if c.mode is ParentMode.EXPLORE]
    assert len(set(explored[:3])) == len(explored[:3]), "the least-used cell first: no cell twice early on"
    again = ParentPicker(3)
    assert [again.choose(archive) for _ in range(12)] == choices, "the same seed, the same parents"
    other = ParentPicker(4)
    assert [other.choose(archive) for _ in range(12)] != choices, "the seed decides"
    assert picker.children[ids["llm2_4096"]] >= 1 and sum(picker.children.values()) == 12


def test_a_resumed_job_sees_the_same_archive_and_goes_on_with_the_same_parents(filled):
    store, ids, url = filled
    archive = build(store)
    live = ParentPicker.from_store(store, "j", seed=7)
    assert live.children == {ids["base"]: 1, ids["llm1_2048"]: 1}, "earlier runs' requests count"
    first = [live.choose(archive) for _ in range(3)]
    # What the live run stored of those requests; then the job is resumed in a new process.
    for seq, choice in enumerate(first, start=3):
        store.add_llm_calls([{**call_row(seq, choice.parent), "run": 2}])
    store.add_llm_calls([{**call_row(6, ids["wrong"], purpose="repair"), "run": 2}])  # a repair is no child
    store.close()
    reopened = Store(url)
    assert build(reopened) == archive
    resumed = ParentPicker.from_store(reopened, "j", seed=7)
    assert (resumed.children, resumed.choices) == (live.children, live.choices)
    assert [resumed.choose(build(reopened)) for _ in range(3)] == [live.choose(archive) for _ in range(3)]
    reopened.close()


def test_lineage_names_parents_depths_models_and_outcomes(filled):
    store, ids, _ = filled
    ancestry = Ancestry.from_store(store, BLOCK)
    assert [ancestry.family(t) for t in (BASE_TPL, ROWS_TPL, LLM1, LLM2)] == [BASE_TPL, ROWS_TPL, BASE_TPL, BASE_TPL]
    assert [ancestry.depth(t) for t in (BASE_TPL, LLM1, LLM2)] == [0, 1, 2]
    nodes = {n.template_id: n for n in lineage(store, "j", BLOCK, speedups=build(store).best_by_template())}
    assert list(nodes) == [BASE_TPL, LLM1, LLM2], "the root first, then the templates as stored"
    root, one, two = nodes[BASE_TPL], nodes[LLM1], nodes[LLM2]
    assert (root.origin, root.depth, root.parent_template, root.call_seq) == (HUMAN, 0, None, None)
    assert (one.parent_template, one.parent_candidate, one.depth, one.model, one.call_seq) == (
        BASE_TPL, ids["base"], 1, "model-a", 1)
    assert (two.parent_template, two.parent_candidate, two.depth, two.family, two.model, two.outcome) == (
        LLM1, ids["llm1_2048"], 2, BASE_TPL, "model-b", "ok")
    assert two.best_speedup == pytest.approx(BASE_S / 0.3e-3) and lineage(store, "other", BLOCK) == []


def test_a_policy_refused_template_still_leads_its_repair_to_the_family(filled):
    store, ids, _ = filled
    # Refused templates are not in kf_templates; their one candidate (origin llm) names the parent.
    refused = add(store, cand("toy/axpy/llm_3333333333", 512, origin="llm", parent=ids["llm1_1024"]), None,
                  status=Status.REJECTED)
    store.add_template("toy/axpy/llm_4444444444", BLOCK, "text four", parent=refused, call_seq=3, job="j")
    ancestry = Ancestry.from_store(store, BLOCK)
    assert ancestry.family("toy/axpy/llm_4444444444") == BASE_TPL
    assert ancestry.depth("toy/axpy/llm_4444444444") == 3


# -- end to end: the live generator against the loopback server ------------------------------------

@pytest.mark.interpreter
def test_the_second_request_improves_on_the_first_ones_template_and_the_lineage_says_so(tmp_path):
    from llm_server import FAST, Reply, ScriptedServer, fenced
    from test_llm_search import run_search, write_job

    fast_id = template_id_for(BLOCK, FAST)
    # Written from the wide kernel: the same kernel with its mask computed once more plainly.
    wider = FAST.replace("    mask = offs < n\n", "    mask = offs < n  # one bounds check per element\n")
    wider_id = template_id_for(BLOCK, wider)
    with ScriptedServer([Reply(fenced(FAST), label="fast"), Reply(fenced(wider), label="wider")]) as server:
        path = write_job(tmp_path, "lineage", endpoint=f'base_url = "{server.base_url}"\nmodel = "m"', max_calls=2,
                         evaluations=8, tune=1)
        store, _, outcome = run_search(tmp_path, path, repair_turns=0)
    assert server.served == ["fast", "wider"] and outcome.llm["kinds"] == {"ok": 2}
    first, second = store.llm_calls("lineage", final_only=True)
    baseline = store_base(store)
    assert first.parent == baseline
    assert second.parent != first.parent and store.candidate(second.parent).template == fast_id
    nodes = {n.template_id: n for n in lineage(store, "lineage", BLOCK)}
    assert nodes[fast_id].depth == 1 and nodes[fast_id].parent_candidate == baseline
    node = nodes[wider_id]
    assert (node.depth, node.parent_template, node.parent_candidate, node.family) == (
        2, fast_id, second.parent, store.candidate(baseline).template)
    assert (node.model, node.call_seq, node.outcome) == ("m", second.seq, "ok")
