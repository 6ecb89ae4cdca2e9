"""Random input where users and models give it: template texts (headers and bodies), job files as
raw text, candidate sources for the policy. Only TemplateError/UserError may come out of the
parsers, and the policy always answers with a report."""

from __future__ import annotations

from pathlib import Path

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from kernelforge.catalog import Catalog
from kernelforge.errors import TemplateError, UserError
from kernelforge.job import load_job
from kernelforge.policy.checker import check_source
from kernelforge.template import Template

ROOT = Path(__file__).resolve().parents[1]
FIXTURES = ROOT / "tests" / "fixtures" / "kernels"

_HEADER_LINES = [
    "[template]", "[space]", "[baseline]", "[other]", 'role = "baseline"', 'role = "boss"', 'origin = "llm"',
    'origin = 3', 'description = "d"', "deterministic = false", 'constraints = ["BLOCK <= 128"]',
    'constraints = ["BLOCK <"]', 'constraints = ["X > 1"]', 'constraints = ["__import__(\'os\')"]',
    'constraints = ["BLOCK // 0 > 1"]', 'constraints = "BLOCK"', "BLOCK = [64, 128]", "BLOCK = []",
    "BLOCK = 64", "BLOCK = 128", "BLOCK = [64, 64]", 'BLOCK = ["a", 1]', "num_warps = [4, 8]", "num_warps = 4",
    "num_warps = 16", "1BAD = [1]", '"x y" = [1]', "= 3", "[[space]]", "BLOCK = [0, 1]", "BLOCK = 0",
]
_BODY_PIECES = [
    "{{ BLOCK }}", "{{ num_warps }}", "{{ OTHER }}", "{{ BLOCK // 0 }}", "{{ BLOCK // (BLOCK - 64) }}",
    "{{ BLOCK | int }}", "{{ BLOCK.x }}", "{{ BLOCK() }}", "{{ BLOCK[0] }}", "{% if BLOCK > 64 %}", "{% endif %}",
    "{% for i in range(BLOCK) %}", "{% endfor %}", "{{", "}}", "{%", "%}", "{#", "#}", "def run(x, out):\n",
    "    pass\n", "\n", "import triton\n", "x = 1", " ", "{{ 1 / 0 }}", "{{ 'a' * 10 }}", "{{ lipsum }}",
]


@st.composite
def template_texts(draw):
    header = "\n".join(draw(st.lists(st.sampled_from(_HEADER_LINES), max_size=10)))
    if draw(st.booleans()):
        header += "\n" + draw(st.text(max_size=30))
    body = "".join(draw(st.lists(st.sampled_from(_BODY_PIECES) | st.text(max_size=8), max_size=12)))
    opener, closer = draw(st.sampled_from([("{#-", "-#}"), ("{#", "#}"), ("", ""), ("{#-", "")]))
    return f"{opener}\n{header}\n{closer}\n{body}"


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(text=template_texts())
def test_fuzzed_templates_give_a_template_or_a_template_error(text):
    try:
        template = Template.from_text(text, template_id="toy/axpy/fuzz", block_id="toy/axpy", where="fuzz.py.j2")
    except UserError as exc:  # TemplateError is a UserError; the space's own errors are UserErrors
        assert str(exc).startswith(("fuzz.py.j2", "template toy/axpy/fuzz"))
        return
    for point in [dict(template.baseline), *list(template.space.points())[:3]]:
        try:
            source = template.render(point)
        except TemplateError as exc:
            assert str(exc).startswith("template toy/axpy/fuzz")
        else:
            assert isinstance(source, str)


_JOB_LINES = [
    "[job]", "[strategy]", "[[blocks]]", "[llm]", 'name = "fz"', 'name = "../x"', 'device = "interpret"',
    'device = "tpu"', 'dtype = "float16"', 'dtype = 3', 'tune = "per-shape"', "seed = -1", 'name = "grid"',
    "evaluations = 0", "evaluations = 2", "max_minutes = -1", 'id = "toy/axpy"', 'id = "toy/nope"',
    'shapes = "check"', 'shapes = "huge"', 'templates = ["baseline"]', 'templates = "baseline"', "x = ",
    '"""', "[job.sub]", "evaluations = 1e400", 'storage = "nosuch://x"',
]


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow,
                                                                  HealthCheck.function_scoped_fixture])
@given(lines=st.lists(st.sampled_from(_JOB_LINES) | st.text(max_size=12), max_size=12), raw=st.binary(max_size=20))
def test_fuzzed_job_files_give_a_job_or_a_user_error(tmp_path_factory, lines, raw):
    path = tmp_path_factory.mktemp("jobs") / "fz.toml"
    path.write_bytes("\n".join(lines).encode("utf-8", "surrogatepass") + (raw if len(lines) % 3 == 0 else b""))
    try:
        job = load_job(path, Catalog.discover(FIXTURES))
    except UserError as exc:
        assert str(path) in str(exc) or "fz.toml" in str(exc)
    else:
        assert job.blocks and job.strategy.evaluations >= 1


_SOURCE_LINES = [
    "import torch", "import triton", "import triton.language as tl", "import os", "from torch import *",
    "@triton.jit", "def k(x_ptr, N: tl.constexpr):", "def run(x, out):", "    pass", "    out.copy_(x @ x)",
    "    torch.matmul(x, x)", "    try:", "    except:", "    except ValueError:", "        pass",
    "    x.__class__ = 1", "class A(torch.Tensor):", "lambda: 0", "t = torch", "eval('1')", "    return",
    "async def f():", "    await x", "    yield 1", "global torch", "del x.y", "x[1:2] = 3", "    tl.load(x_ptr)",
    "((((((", ")", "'''", "if True:", "    with torch.no_grad():", "        x = tl.core.builtins",
]


@settings(max_examples=300, deadline=None)
@given(lines=st.lists(st.sampled_from(_SOURCE_LINES) | st.text(max_size=20), max_size=15))
def test_the_policy_always_answers_with_a_report(lines):
    report = check_source("\n".join(lines))
    assert report.ok is (len(report.violations) == 0)
    assert all(isinstance(v.line, int) for v in report.violations)
    assert report.ok or report.message().startswith("policy:")
