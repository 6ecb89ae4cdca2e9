"""What a model's answer contains: a complete template, a diff edit of its parent's template, a set
of points for an existing template, or nothing usable (and then exactly why, in words the model
gets back in its repair turn).

Models wrap code in prose and fences of any language tag; an answer may hold several fences (an
explanation snippet, then the template). The template is the fenced block that starts with the
``{#-`` header; points are a TOML block with ``template`` and ``points``. An unterminated fence or
``finish_reason == "length"`` without a complete template is a truncated answer. An answer with
search/replace markers (:mod:`kernelforge.llm.diff`) is a diff edit: applied to the parent's
template text, then parsed like a whole template (the same template, the same id, the same checks).
"""

from __future__ import annotations

import re
import sys
from dataclasses import dataclass, field, replace
from typing import Any

from kernelforge.candidate import source_id
from kernelforge.errors import TemplateError
from kernelforge.llm.diff import EditFailure, apply_edit, has_edit_blocks
from kernelforge.search.proposer import Outcome
from kernelforge.template import Template

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib

_FENCE = re.compile(r"^[ \t]*(`{3,}|~{3,})[ \t]*([\w+.#-]*)[^\n]*\n", re.MULTILINE)


@dataclass(frozen=True)
class Parsed:
    """The outcome of parsing one answer.

    ``kind``: ``template`` (``template`` set), ``points`` (``points`` and ``target`` set), or a
    failure: ``no_code``, ``truncated``, ``invalid_template``, ``invalid_points``,
    ``invalid_diff``; ``message`` says what was wrong. ``edit`` is the unified diff of the parent's
    template to the new one when the answer was a diff edit that applied (else empty).
    """

    kind: Outcome
    message: str = ""
    template: Template | None = None
    target: str | None = None
    points: list[dict[str, Any]] = field(default_factory=list)
    edit: str = ""

    @property
    def ok(self) -> bool:
        return self.kind in (Outcome.TEMPLATE, Outcome.POINTS)


def fenced_blocks(text: str) -> tuple[list[tuple[str, str]], bool]:
    """The fenced code blocks of ``text`` as (language tag, body), and whether a fence was left open
    (the answer was cut off inside a block)."""
    blocks: list[tuple[str, str]] = []
    pos = 0
    while True:
        opening = _FENCE.search(text, pos)
        if opening is None:
            return blocks, False
        fence, tag = opening.group(1), opening.group(2).lower()
        closing = re.compile(rf"^[ \t]*{re.escape(fence[0])}{{{len(fence)},}}[ \t]*$", re.MULTILINE)
        end = closing.search(text, opening.end())
        if end is None:
            return blocks, True
        blocks.append((tag, text[opening.end():end.start()]))
        pos = end.end()


def template_id_for(block_id: str, text: str) -> str:
    """The id of a generated template: its block and the hash of its text (stable across replays)."""
    return f"{block_id}/llm_{source_id(text)[:10]}"


def llm_template(text: str, block_id: str, where: str) -> Template:
    """Build a generated template from its text: always a variant of origin ``llm`` without
    per-shape baselines, whatever its header says (:meth:`Template.as_proposed`); a header key that
    would set a rule of the judge (``deterministic``, ...) is refused like in any template."""
    return Template.from_text(text, template_id=template_id_for(block_id, text), block_id=block_id,
                              where=where).as_proposed()


def parse_answer(text: str, block_id: str, *, finish_reason: str | None = None, where: str = "answer",
                 parent_text: str | None = None) -> Parsed:
    """Parse one answer for ``block_id`` (see the module docstring); ``parent_text`` is the template
    text a diff edit applies to (None: the request had none, so a diff edit is refused)."""
    if has_edit_blocks(text):
        return _edit(text, block_id, finish_reason, where, parent_text)
    blocks, open_fence = fenced_blocks(text)
    if not blocks and not open_fence and "{#-" in text:
        # No fences at all, but a header: take the answer from the header on as the template.
        blocks = [("", text[text.index("{#-"):])]
    headed = [body for _, body in blocks if body.lstrip().startswith("{#")]
    if headed:
        body = headed[-1].strip() + "\n"  # the last one: models often show a draft, then the final
        try:
            return Parsed(Outcome.TEMPLATE, template=llm_template(body, block_id, where))
        except TemplateError as exc:
            return Parsed(Outcome.INVALID_TEMPLATE, message=str(exc))
    points = [body for tag, body in blocks if tag in ("toml", "") and re.search(r"^\s*(\[\[points\]\]|points\s*=)",
                                                                               body, re.MULTILINE)]
    if points:
        return _points(points[-1], block_id)
    if open_fence or finish_reason == "length":
        return Parsed(Outcome.TRUNCATED, message="the answer was cut off before its code block ended (finish_reason "
                                           f"{finish_reason or 'stop'}); answer with the complete template only, "
                                           "without explanations")
    if blocks:
        return Parsed(Outcome.INVALID_TEMPLATE, message="the code block has no header: a template starts with "
                                                  "{#- [template] ... [space] ... [baseline] ... -#}")
    return Parsed(Outcome.NO_CODE, message="the answer contains no code block; answer with one fenced code block "
                                           "holding the complete template")


def _edit(text: str, block_id: str, finish_reason: str | None, where: str, parent_text: str | None) -> Parsed:
    if parent_text is None:
        return Parsed(Outcome.INVALID_DIFF, message="this request named no parent template to edit, so "
                                                    "SEARCH/REPLACE blocks cannot apply: answer with the complete "
                                                    "template in one fenced code block")
    applied = apply_edit(parent_text, text)
    if isinstance(applied, EditFailure):
        parsed = Parsed(Outcome.INVALID_DIFF, message=f"the edit does not apply: {applied.message}")
    else:
        body = applied.text.strip() + "\n"  # as a whole-template answer's body: the same text, the same id
        try:
            return Parsed(Outcome.TEMPLATE, template=llm_template(body, block_id, where), edit=applied.diff)
        except TemplateError as exc:
            parsed = Parsed(Outcome.INVALID_TEMPLATE, edit=applied.diff,
                            message=f"the edit applied, but the template it makes is invalid: {exc}. Edit the "
                                    "same parent template again (the blocks apply to it, not to your answer), or "
                                    "answer with the complete template")
    if finish_reason == "length":  # cut off: its last block may be missing or half written
        return replace(parsed, kind=Outcome.TRUNCATED, message=f"the answer was cut off ({parsed.message}); "
                                                               "answer with shorter SEARCH/REPLACE blocks only, "
                                                               "without explanations")
    return parsed


def _points(body: str, block_id: str) -> Parsed:
    try:
        doc = tomllib.loads(body)
    except tomllib.TOMLDecodeError as exc:
        return Parsed(Outcome.INVALID_POINTS, message=f"the points block is not valid TOML ({exc})")
    target = doc.get("template")
    points = doc.get("points")
    if not isinstance(target, str) or not target:
        return Parsed(Outcome.INVALID_POINTS, message='the points block needs template = "<template id>"')
    if not isinstance(points, list) or not points or not all(isinstance(p, dict) for p in points):
        return Parsed(Outcome.INVALID_POINTS, message="the points block needs points = [{NAME = value, ...}, ...]")
    if "/" not in target:
        target = f"{block_id}/{target}"
    return Parsed(Outcome.POINTS, target=target, points=[dict(p) for p in points])
