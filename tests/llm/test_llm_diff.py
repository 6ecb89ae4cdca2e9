"""Diff edits: search/replace blocks are parsed and applied to the parent's template (fenced or
bare, CRLF, trailing whitespace), every failure says what to change; and in the search, end to end
against the loopback server, a diff answer makes a template that is stored with its parent,
verified and tuned, a diff that does not apply earns a repair turn and costs no evaluation, a
repair edits the model's own failed attempt, and a replay applies the same diffs again."""

from __future__ import annotations

from pathlib import Path

import pytest

from kernelforge.llm.diff import (AppliedEdit, EditBlock, EditError, EditFailure, apply_blocks, apply_edit,
                                  has_edit_blocks, parse_blocks, unified_diff)
from kernelforge.llm.parse import template_id_for
from kernelforge.store.store import Store
from llm_server import Reply, ScriptedServer
from llm_toy import BLOCK, FIXTURES, run_llm_search, write_llm_job

BASELINE = (FIXTURES / "toy" / "axpy" / "baseline.py.j2").read_text()

PARENT = "a = 1\nb = 2\nc = 3\nb = 2\nd = 4\n"


def block(search: str, replace_with: str) -> str:
    return f"<<<<<<< SEARCH\n{search}=======\n{replace_with}>>>>>>> REPLACE\n"


# -- the parser and applier ---------------------------------------------------------------------------

def test_one_block_applies_and_the_diff_is_unified():
    edit = apply_edit(PARENT, "Change a:\n" + block("a = 1\n", "a = 10\n") + "That is all.")
    assert isinstance(edit, AppliedEdit) and edit.ok and edit.blocks == 1
    assert edit.text == PARENT.replace("a = 1", "a = 10")
    assert edit.diff == unified_diff(PARENT, edit.text) and "-a = 1\n+a = 10\n" in edit.diff
    assert edit.diff.startswith("--- parent\n+++ new\n")


def test_several_blocks_apply_in_order_each_to_what_the_earlier_left():
    answer = "```diff\n" + block("a = 1\n", "a = 10\nz = 0\n") + "```\nand\n```\n" + block("z = 0\nb = 2\n", "") + "```"
    edit = apply_edit(PARENT, answer)
    assert edit.ok and edit.blocks == 2 and edit.text == "a = 10\nc = 3\nb = 2\nd = 4\n"


def test_crlf_answers_and_trailing_whitespace_match():
    answer = block("c = 3   \nb = 2\n", "c = 30\nb = 2\n").replace("\n", "\r\n")
    edit = apply_edit(PARENT.replace("\n", "\r\n"), answer)
    assert edit.ok and edit.text == "a = 1\nb = 2\nc = 30\nb = 2\nd = 4\n"


def test_parse_blocks_reads_sections_and_ignores_fences_and_prose():
    blocks = parse_blocks("Intro\n```python\n" + block("x\n\ny\n", "") + "```\n" + block("p\n", "q\n"))
    assert blocks == (EditBlock(("x", "", "y"), (), 3), EditBlock(("p",), ("q",), 10))
    assert has_edit_blocks(block("p\n", "q\n")) and not has_edit_blocks("a\n=======\nb\n")


def test_a_search_text_not_found_names_the_block_its_first_line_and_the_closest_lines():
    answer = block("a = 1\n", "a = 10\n") + block("    d = 5\n", "d = 6\n")
    failure = apply_edit(PARENT, answer)
    assert isinstance(failure, EditFailure) and not failure.ok
    assert failure.error is EditError.NOT_FOUND and failure.block == 2
    assert "block 2 of 2" in failure.message and "'d = 5'" in failure.message
    assert "   5| d = 4" in failure.message, "the closest parent line, with its number"


def test_a_search_text_found_twice_asks_for_more_context():
    failure = apply_edit(PARENT, block("b = 2\n", "b = 20\n"))
    assert failure.error is EditError.AMBIGUOUS and "2 times" in failure.message
    assert "lines 2, 4" in failure.message and "matches exactly once" in failure.message
    assert apply_edit(PARENT, block("c = 3\nb = 2\n", "c = 3\nb = 20\n")).ok, "one more line of context is unique"


@pytest.mark.parametrize("answer, fragment", [
    ("<<<<<<< SEARCH\na = 1\n", "no ======= line"),
    ("<<<<<<< SEARCH\na = 1\n=======\na = 2\n", "no >>>>>>> REPLACE line"),
    ("<<<<<<< SEARCH\na = 1\n=======\na = 2\n" + block("b = 2\n", "b = 3\n"), "no >>>>>>> REPLACE line"),
    ("a = 1\n=======\na = 2\n>>>>>>> REPLACE\n", "no <<<<<<< SEARCH line before it"),
])
def test_malformed_blocks_are_named(answer, fragment):
    failure = apply_edit(PARENT, answer)
    assert failure.error is EditError.MALFORMED and fragment in failure.message and failure.block == 1


def test_an_edit_that_changes_nothing_is_refused():
    failure = apply_edit(PARENT, block("a = 1\n", "a = 1\n"))
    assert failure.error is EditError.NO_CHANGE and "changes nothing" in failure.message


def test_an_empty_search_is_refused_unless_the_parent_is_empty():
    failure = apply_edit(PARENT, block("", "e = 5\n"))
    assert failure.error is EditError.EMPTY_SEARCH and "empty SEARCH" in failure.message
    assert apply_edit("", block("", "e = 5\n")).text == "e = 5\n"
    assert apply_blocks("", (EditBlock((), ("e = 5",), 1),)).ok


# -- in the search, against the loopback server ------------------------------------------------------


#: One program over the whole smoke vector: the baseline's tile made larger, in three blocks.
WIDEN = ("I widen the tile so that one program covers the vector.\n\n```\n"
         + block('description = "One program per BLOCK elements"\n', 'description = "one wide program"\n')
         + block("[space]\nBLOCK = [64, 256, 1024]\n", "[space]\nBLOCK = [1024, 2048, 4096]\n")
         + block("[baseline]\nBLOCK = 256\n", "[baseline]\nBLOCK = 1024\n") + "```\n")
#: Computes alpha * x - y: verified wrong.
_STORE = "    tl.store(out_ptr + offs, ({}).to(out_ptr.dtype.element_ty), mask=mask)\n"
SUBTRACT = block(_STORE.format("alpha * x + y"), _STORE.format("alpha * x - y"))
#: Fixes SUBTRACT's template (its SEARCH text is only in that attempt, not in the baseline).
ADD_BACK = "Fixed:\n" + block(_STORE.format("alpha * x - y"), _STORE.format("y + alpha * x"))


def run_search(tmp_path: Path, name: str, url: str, *, db: str, max_calls: int = 1, evaluations: int = 6,
               tune: int = 2, **llm_changes):
    path = write_llm_job(tmp_path, name, evaluations=evaluations, base_url=url, model="scripted",
                         max_calls=max_calls, tune_evaluations=tune)
    return run_llm_search(path, tmp_path / db, **llm_changes)


def applied(parent: str, answer: str) -> str:
    """The template id a diff answer makes of ``parent`` (as a whole-template answer of that text)."""
    edit = apply_edit(parent, answer)
    assert edit.ok, edit
    return template_id_for(BLOCK, edit.text.strip() + "\n")


def lineage(store: Store) -> set[tuple]:
    return {(c.id, c.template, c.origin, c.parent) for c in store.candidates(BLOCK)}


@pytest.mark.interpreter
def test_a_diff_answer_makes_a_template_that_is_stored_with_its_parent_verified_tuned_and_replayed(tmp_path):
    with ScriptedServer([Reply(WIDEN, label="diff")]) as server:
        url = server.base_url
        store, recorder, outcome = run_search(tmp_path, "diffed", url, db="live.db")
        # The replay (offline: the server stays up only to show that it is asked nothing).
        replayed, _, _ = run_search(tmp_path, "diffed", url, db="replayed.db", replay=store.url)
    template_id = applied(BASELINE, WIDEN)
    baseline = next(c for c in store.candidates(BLOCK) if c.origin == "baseline")
    [row] = store.llm_calls(final_only=True)
    assert row.kind == "ok" and row.template_id == template_id and row.parent == baseline.id
    assert "<<<<<<< SEARCH" in row.response, "the stored response holds the diff"
    [stored] = [t for t in store.templates(BLOCK) if t.id == template_id]
    assert stored.parent == baseline.id and stored.origin == "llm" and 'description = "one wide program"' in stored.text
    [event] = [d for k, d in recorder.events if k == "llm"]
    assert event["edit"] is True and event["template"] == template_id
    made = [c for c in store.candidates(BLOCK) if c.template == template_id]
    root = next(c for c in made if c.origin == "llm")
    assert root.parent == baseline.id and root.params == {"BLOCK": 1024, "num_warps": 4}
    tuned = [c for c in made if c.origin == "optuna"]
    assert tuned and all(c.parent == root.id for c in tuned), "its study got points"
    assert {r.status.value for c in made for r in store.results(BLOCK, c.id)} == {"ok"}, "verified"
    assert outcome.llm["kinds"] == {"ok": 1}

    assert len(server.requests) == 1, "a replay asks nothing"
    assert [(r.kind, r.template_id) for r in replayed.llm_calls(final_only=True)] == [("ok", template_id)]
    assert lineage(replayed) == lineage(store)


@pytest.mark.interpreter
def test_a_diff_that_does_not_apply_is_repaired_and_costs_no_evaluation(tmp_path):
    bad = block("    x = tl.load(x_ptr + offs)\n", "    x = tl.load(x_ptr + offs, other=0.0)\n")
    with ScriptedServer([Reply(bad, label="bad"), Reply(WIDEN, label="fixed")]) as server:
        store, _, outcome = run_search(tmp_path, "baddiff", server.base_url, db="live.db", max_calls=2)
    first, second = store.llm_calls(final_only=True)
    assert first.kind == "invalid_diff" and first.template_id is None and first.candidate_id is None
    assert "was not found" in first.message and "x = tl.load(x_ptr + offs, mask=mask)" in first.message
    follow_up = server.requests[1]["messages"][-1]["content"]
    assert "invalid_diff" in follow_up and "was not found" in follow_up
    assert second.purpose == "repair" and second.depth == 1 and second.kind == "ok"
    assert second.template_id == applied(BASELINE, WIDEN) and second.parent == first.parent
    # Nothing of the bad answer was evaluated: every candidate is the baseline's or the repair's.
    assert {c.template for c in store.candidates(BLOCK)} == {f"{BLOCK}/baseline", second.template_id}
    assert outcome.llm["kinds"] == {"invalid_diff": 1, "ok": 1}


@pytest.mark.interpreter
def test_a_repair_edits_the_failed_attempt_and_a_replay_applies_the_same_diffs(tmp_path):
    with ScriptedServer([Reply(SUBTRACT, label="wrong"), Reply(ADD_BACK, label="fixed")]) as server:
        url = server.base_url
        store, _, _ = run_search(tmp_path, "repaired", url, db="live.db", max_calls=2)
        replayed, _, _ = run_search(tmp_path, "repaired", url, db="replayed.db", max_calls=2, replay=store.url)
    wrong_id = applied(BASELINE, SUBTRACT)
    fixed_id = applied(apply_edit(BASELINE, SUBTRACT).text.strip() + "\n", ADD_BACK)
    first, second = store.llm_calls(final_only=True)
    assert (first.kind, first.template_id) == ("wrong", wrong_id)
    assert (second.purpose, second.kind, second.template_id) == ("repair", "ok", fixed_id)
    assert second.parent == first.candidate_id, "the repair's parent is the failed candidate"
    assert {t.id: t.parent for t in store.templates(BLOCK)}[fixed_id] == first.candidate_id

    assert len(server.requests) == 2
    assert [(r.kind, r.template_id) for r in replayed.llm_calls(final_only=True)] == [
        ("wrong", wrong_id), ("ok", fixed_id)]
    assert lineage(replayed) == lineage(store)
