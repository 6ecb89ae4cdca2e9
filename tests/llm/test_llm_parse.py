"""Parsing model answers: the template is found in prose and fences, points are read, and every
unusable answer gets a kind and a message the model can act on."""

from __future__ import annotations

import pytest

from kernelforge.llm.parse import fenced_blocks, parse_answer, template_id_for
from llm_server import FAST, SLOW, fenced, points_answer

BLOCK = "toy/axpy"


def test_a_template_is_taken_from_prose_and_fences_as_a_variant_of_origin_llm():
    parsed = parse_answer(fenced(FAST), BLOCK)
    assert parsed.kind == "template" and parsed.ok
    template = parsed.template
    assert template.origin == "llm" and template.role == "variant" and template.block_id == BLOCK
    assert template.id == template_id_for(BLOCK, FAST) and template.id.startswith("toy/axpy/llm_")
    assert dict(template.baseline) == {"BLOCK": 1024, "num_warps": 4}
    assert "def run(x, y, alpha, out)" in template.render(template.baseline)


def test_the_header_claims_nothing_about_origin_and_role():
    text = FAST.replace('[template]\n', '[template]\nrole = "baseline"\norigin = "human"\n')
    template = parse_answer(fenced(text), BLOCK).template
    assert template.role == "variant" and template.origin == "llm"


def test_the_last_template_block_wins_and_other_fences_are_ignored():
    answer = "Sketch:\n```python\nprint('draft')\n```\n" + fenced(SLOW) + "\n" + fenced(FAST)
    assert parse_answer(answer, BLOCK).template.id == template_id_for(BLOCK, FAST)


def test_an_unfenced_template_is_accepted():
    assert parse_answer("Here it is:\n" + FAST, BLOCK).kind == "template"


def test_four_backtick_fences_and_tildes_are_fences():
    blocks, open_fence = fenced_blocks("````jinja\n" + FAST + "````\n~~~\ncode\n~~~\n")
    assert [tag for tag, _ in blocks] == ["jinja", ""] and not open_fence


@pytest.mark.parametrize("answer, finish, kind", [
    ("Use bigger blocks.", "stop", "no_code"),
    ("```python\n" + FAST[:200], "length", "truncated"),
    ("```python\n" + FAST[:200], "stop", "truncated"),
    ("Too long, so I stopped.", "length", "truncated"),
    ("```python\nimport triton\n```", "stop", "invalid_template"),
    (fenced(FAST.replace("BLOCK = 1024\nnum_warps = 4", "BLOCK = 1024")), "stop", "invalid_template"),
    (fenced(FAST.replace("{{ num_warps }}", "4")), "stop", "invalid_template"),
    ("```toml\ntemplate = \"baseline\"\npoints = 3\n```", "stop", "invalid_points"),
])
def test_unusable_answers_have_a_kind_and_a_message(answer, finish, kind):
    parsed = parse_answer(answer, BLOCK, finish_reason=finish)
    assert parsed.kind == kind and not parsed.ok and parsed.message


def test_a_missing_baseline_point_is_explained():
    parsed = parse_answer(fenced(FAST.replace("BLOCK = 1024\nnum_warps = 4", "BLOCK = 1024")), BLOCK)
    assert "num_warps" in parsed.message


@pytest.mark.parametrize("answer", [
    points_answer("toy/axpy/baseline", [{"BLOCK": 1024, "num_warps": 2}, {"BLOCK": 64, "num_warps": 1}]),
    '```toml\ntemplate = "baseline"\npoints = [{BLOCK = 1024, num_warps = 2}, {BLOCK = 64, num_warps = 1}]\n```',
])
def test_points_for_an_existing_template(answer):
    parsed = parse_answer(answer, BLOCK)
    assert parsed.kind == "points" and parsed.target == "toy/axpy/baseline"
    assert parsed.points == [{"BLOCK": 1024, "num_warps": 2}, {"BLOCK": 64, "num_warps": 1}]


# -- diff edits (kernelforge.llm.diff) --------------------------------------------------------------

_WIDEN = ("I widen the tile.\n\n```\n<<<<<<< SEARCH\nBLOCK = [1024, 2048, 4096]\n=======\nBLOCK = [2048, 4096]\n"
          ">>>>>>> REPLACE\n<<<<<<< SEARCH\n[baseline]\nBLOCK = 1024\n=======\n[baseline]\nBLOCK = 2048\n"
          ">>>>>>> REPLACE\n```\n")


def test_a_diff_edit_is_applied_to_the_parent_and_parsed_like_the_whole_template():
    parsed = parse_answer(_WIDEN, BLOCK, parent_text=FAST)
    whole = FAST.replace("BLOCK = [1024, 2048, 4096]", "BLOCK = [2048, 4096]").replace(
        "[baseline]\nBLOCK = 1024", "[baseline]\nBLOCK = 2048")
    assert parsed.kind == "template" and parsed.template.origin == "llm" and parsed.template.role == "variant"
    assert parsed.template.id == parse_answer(fenced(whole), BLOCK).template.id == template_id_for(BLOCK, whole)
    assert dict(parsed.template.baseline) == {"BLOCK": 2048, "num_warps": 4}
    assert "-BLOCK = [1024, 2048, 4096]\n+BLOCK = [2048, 4096]\n" in parsed.edit
    assert parse_answer(fenced(whole), BLOCK).edit == "", "a whole template is no edit"


@pytest.mark.parametrize("answer, parent, fragment", [
    (_WIDEN, None, "answer with the complete template"),
    (_WIDEN, SLOW, "was not found"),
    (_WIDEN.replace(">>>>>>> REPLACE\n```", "```"), FAST, "no >>>>>>> REPLACE line"),
])
def test_a_diff_edit_that_does_not_apply_is_an_invalid_diff(answer, parent, fragment):
    parsed = parse_answer(answer, BLOCK, parent_text=parent)
    assert parsed.kind == "invalid_diff" and not parsed.ok and fragment in parsed.message and not parsed.edit


def test_a_diff_edit_cut_off_inside_a_block_is_truncated():
    parsed = parse_answer(_WIDEN[:120], BLOCK, finish_reason="length", parent_text=FAST)
    assert parsed.kind == "truncated"


def test_a_diff_edit_that_breaks_the_template_is_an_invalid_template_with_its_edit():
    answer = "<<<<<<< SEARCH\n[baseline]\nBLOCK = 1024\n=======\n[baseline]\nBLOCK = 7\n>>>>>>> REPLACE\n"
    parsed = parse_answer(answer, BLOCK, parent_text=FAST)
    assert parsed.kind == "invalid_template" and "the edit applied" in parsed.message
    assert "+BLOCK = 7" in parsed.edit
