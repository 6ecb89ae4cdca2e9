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
