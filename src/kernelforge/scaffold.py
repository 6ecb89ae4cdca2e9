"""A new variant scaffolded from a block's baseline template (``kernelforge new``).

The scaffold edits the baseline's text rather than writing a header from its parsed tables, so the
header's comments (what each parameter means, where each constraint comes from) stay with it. The
edits take any way TOML allows of writing the keys they touch, and what they wrote is parsed again
and checked: a header written in a way they do not reach is one clear error, never a second
baseline or a template that names no body.
"""

from __future__ import annotations

import re

from kernelforge.errors import TemplateError, UserError
from kernelforge.template import Template, body_text, parse_header

__all__ = ["variant_text"]

#: A TOML string value on one line, or a multi-line one, with a comment after it: what the edits of
#: :func:`variant_text` take as a key's value.
_TOML_STRING = ('(?:"""[\\s\\S]*?"""' "|'''[\\s\\S]*?'''" r'|"(?:[^"\\\n]|\\.)*"' r"|'[^'\n]*')" r"[ \t]*(?:#[^\n]*)?")


def variant_text(baseline: Template, *, header_only: bool = False) -> str:
    """The text of a new variant scaffolded from the block's ``baseline`` (``kernelforge new``): its
    header with ``role = "variant"``, a description to replace, no per-shape baselines (they belong
    to the baseline: the variant starts at ``[baseline]``; the comment lines right above a rule go
    with it) and no ``baseline_source``; the header's other lines and comments as they are. A copy
    of the baseline's body follows it, or, with ``header_only``, none: the header then names the
    baseline's body (``[template] body``; the template that holds it, where the baseline is itself
    a header), so the variant searches another space, other ties or constraints of the same kernel
    without a second copy of it. Raises UserError naming the baseline's file when its header is
    written in a way these edits do not reach (the result is checked)."""
    body = body_text(baseline.text)
    header = baseline.text[: len(baseline.text) - len(body)]
    header = re.sub(r"(?m)^(role\s*=\s*)([\"'])baseline\2", r'\1"variant"', header, count=1)
    header = re.sub(r"(?ms)(?:^#[^\n]*\n)*^\[\[\s*baselines\s*\]\][^\n]*\n.*?(?=^\[|^-?#\})", "", header)
    header = re.sub(rf"(?m)^baseline_source\s*=\s*{_TOML_STRING}\n", "", header, count=1)
    header = re.sub(rf"(?m)^description\s*=\s*{_TOML_STRING}$",
                    f'description = "Variant of {baseline.id}: describe your change"', header, count=1)
    if not header_only:
        header = re.sub(rf"(?m)^body\s*=\s*{_TOML_STRING}\n", "", header, count=1)
    elif baseline.body_of is None:
        name = baseline.id.rpartition("/")[2]
        header = re.sub(r"(?m)^\[\s*template\s*\][^\n]*$", lambda m: f'{m.group(0)}\nbody = "{name}"', header, count=1)
    _check_scaffold(header, baseline, header_only)
    return header if header_only else header + body


def _check_scaffold(header: str, baseline: Template, header_only: bool) -> None:
    """That :func:`variant_text`'s edits took: a variant, no rules or source, the body named only
    with ``header_only``."""
    where = str(baseline.path or baseline.id)
    try:
        info = parse_header(header, where)
    except TemplateError as exc:
        info, problem = {}, str(exc)
    else:
        meta = info.get("template", {})
        body = baseline.body_of or baseline.id.rpartition("/")[2]
        problem = next((text for wrong, text in (
            (meta.get("role") != "variant", 'role is not "variant"'),
            ("baselines" in info, "[[baselines]] rules are left"),
            ("baseline_source" in meta, "baseline_source is left"),
            (meta.get("body") != (body if header_only else None), f"body is not {body if header_only else 'gone'}"),
        ) if wrong), "")
    if problem:
        raise UserError(f"{where}: `kernelforge new` could not scaffold a variant from this header ({problem}); "
                        'copy the file by hand, set role = "variant" and remove its [[baselines]] rules')
