"""Rendering is data, not code (issue 29): a template body cannot reach a Python object of the
process that renders it, every render and every header expression is bounded by the limits of
kernelforge.limits (deterministic counters, not the clock), and no other module compiles Jinja
text."""

from __future__ import annotations

import ast
from pathlib import Path

import jinja2.sandbox
import pytest

from kernelforge import render
from kernelforge.baselines import flash_attn_num_splits
from kernelforge.errors import TemplateError, UserError
from kernelforge.policy.checker import check_source
from kernelforge.limits import MAX_SOURCE_CHARS, LimitExceeded
from kernelforge.space import Space
from kernelforge.template import Template

HEADER = '{#-\n[template]\nconstraints = CONSTRAINTS\n[space]\nA = [1, 2]\n[baseline]\nA = 1\n-#}\n'
PACKAGE = Path(__file__).resolve().parents[1] / "src" / "kernelforge"


def make(body: str, constraints: str = "[]") -> Template:
    return Template.from_text(HEADER.replace("CONSTRAINTS", constraints) + body, template_id="toy/axpy/t",
                              block_id="toy/axpy", where="t.py.j2")


@pytest.mark.parametrize("body, fragment", [
    ("{{ ().__class__.__base__.__subclasses__() }}{{ A }}", "the only call allowed is range"),
    ("{{ A.__class__.__mro__ }}", "Getattr (attribute access) is not allowed"),
    ("{{ A['__class__'] }}", "Getitem (item access) is not allowed"),
    ("{{ A|attr('__class__') }}", "the filter 'attr' is not allowed"),
    ("{% set x = A %}{{ x }}", "Assign (set) is not allowed"),
    ("{% macro m() %}{% endmacro %}{{ A }}", "Macro (macro) is not allowed"),
    ("{% for x in [A] %}{{ x }}{% endfor %}", "a loop must be {% for NAME in range(...) %}"),
    ("{{ self }}{{ A }}", "the name 'self' is not allowed"),
    ("{% include 'x' %}{{ A }}", "Include (include) is not allowed"),
])
def test_a_body_that_reaches_for_python_objects_is_refused_when_loaded(body, fragment):
    with pytest.raises(TemplateError, match="t.py.j2:9: ") as err:
        make(body)
    assert fragment in str(err.value)


def test_the_sandbox_is_a_second_lock_behind_the_language_check():
    """Even a body that skipped the load-time check (compiled directly in the render environment)
    cannot read an attribute or call anything but range."""
    with pytest.raises(jinja2.sandbox.SecurityError):
        render._ENV.from_string("{{ x.__class__.__mro__ }}").render(x=1)
    with pytest.raises(jinja2.sandbox.SecurityError):
        render._ENV.from_string("{{ f() }}").render(f=lambda: pytest.fail("called a function of the trusted process"))
    assert set(render._ENV.globals) == {"range"}
    assert set(render._ENV.filters) == set(render.FILTERS)


def test_the_small_language_renders_what_honest_templates_write():
    body = ("{% for i in range(A + 1) %}x{{ i * 2 }} {% endfor %}{% if A is even %}even{% elif A == 1 %}one"
            "{% endif %} {{ (A ** 3) // 2 }} {{ A | string | upper }} {{ 'w' ~ A }}\n")
    assert make(body).render({"A": 2}).endswith("x0 x2 x4 even 4 2 w2\n")
    assert make(body).render({"A": 1}).endswith("x0 x2 one 0 1 w1\n")


@pytest.mark.parametrize("body, fragment", [
    ("{{ 7 ** (7 ** 9) }}{{ A }}", "over the limit of 64"),
    ("{{ 'x' * 10 ** 9 }}{{ A }}", "times is over the limit"),
    ("{% for i in range(100000) %}{% for j in range(100000) %}{% endfor %}{% endfor %}{{ A }}",
     "MAX_RENDER_ITERATIONS"),
    ("{% for i in range(9000) %}{{ 'y' * 100 }}{% endfor %}{{ A }}", "MAX_RENDER_CHARS"),
    ("{{ 'a' % A }}", "% is not allowed on str"),
])
def test_a_render_that_would_take_long_or_grow_large_is_cut_by_a_counter(body, fragment):
    template = make(body)  # loads: the limits are on what a render does
    with pytest.raises(TemplateError, match="rendering failed") as err:
        template.render({"A": 1})
    assert fragment in str(err.value)


def test_a_render_past_its_wall_clock_backstop_is_cut(monkeypatch):
    template = make("{% for i in range(5) %}{{ i }}{% endfor %}{{ A }}")
    monkeypatch.setattr(render, "MAX_RENDER_SECONDS", -1.0)
    with pytest.raises(TemplateError, match="MAX_RENDER_SECONDS"):
        template.render({"A": 1})


def test_a_huge_source_is_refused_before_it_is_parsed_naming_the_limit():
    huge = HEADER.replace("CONSTRAINTS", "[]") + "{{ A }}\n" + "# padding\n" * 700_000  # about 7 MB
    with pytest.raises(TemplateError, match=f"over the limit of {MAX_SOURCE_CHARS} \\(MAX_SOURCE_CHARS\\)"):
        Template.from_text(huge, template_id="toy/axpy/t", block_id="toy/axpy", where="t.py.j2")
    report = check_source("x = 1\n" * 1_200_000)
    assert not report.ok and "MAX_SOURCE_CHARS" in report.message()


@pytest.mark.parametrize("constraint, fragment", [
    ("7 ** 7 ** 9 > A", "over the limit of 64"),
    ("2 ** 64 * 2 ** 64 * 2 ** 64 * 2 ** 64 > A", "over the limit of 256"),
    ("A * 'x' * 10 ** 9 == A", "over the limit"),
    ("-" * 250 + "A > 0", "syntax nodes"),
    ("A + " * 400 + "A > 0", "MAX_EXPRESSION_CHARS"),
])
def test_a_header_expression_is_bounded(constraint, fragment):
    with pytest.raises(UserError) as err:
        make("{{ A }}", constraints=f'["{constraint}"]')
    assert fragment in str(err.value), str(err.value)


def test_a_model_answer_with_an_unbounded_constraint_is_an_invalid_template_not_a_crash():
    from kernelforge.llm.parse import parse_answer

    text = HEADER.replace("CONSTRAINTS", '["7 ** 7 ** 9 > A"]') + "{{ A }}\n"
    parsed = parse_answer(f"```\n{text}```\n", "toy/axpy")
    assert parsed.kind.value == "invalid_template" and "over the limit of 64" in parsed.message
    assert "answer [template] constraints" in parsed.message


def test_space_constraints_use_the_same_bounded_evaluator():
    space = Space.build({"A": [1, 2]}, ["A ** 100 > 0"], where="job")
    with pytest.raises(UserError, match="exponent 100 is over the limit"):
        space.problems({"A": 2})


def test_the_flash_attention_heuristic_refuses_a_long_loop():
    assert flash_attn_num_splits(8, 132, 64, 128) >= 1
    with pytest.raises(LimitExceeded):
        flash_attn_num_splits(1, 10**9, 10**9, 10**9)


def test_no_other_module_compiles_jinja_text():
    """Every template body goes through kernelforge.render: elsewhere a Jinja environment may
    only load the package's own templates (prompts, reports), never compile a string."""
    offenders = []
    for path in PACKAGE.rglob("*.py"):
        if path.name == "render.py" and path.parent == PACKAGE:
            continue
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Attribute) and node.attr in ("from_string", "compile_expression"):
                offenders.append(f"{path.name}:{node.lineno} {node.attr}")
            if isinstance(node, ast.Call) and getattr(node.func, "attr", getattr(node.func, "id", "")) == "Environment" \
                    and not any(k.arg == "loader" for k in node.keywords):
                offenders.append(f"{path.name}:{node.lineno} Environment without a package loader")
    assert not offenders, offenders
