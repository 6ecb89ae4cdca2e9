"""The static policy: it accepts every template shipped in kernels/ and tests/ (all roles), rejects
each banned construct with a line number and a reason, and never runs what it checks."""

from __future__ import annotations

from pathlib import Path

import pytest

from kernelforge.candidate import Candidate
from kernelforge.policy.checker import check_source
from kernelforge.template import Template

REPO = Path(__file__).resolve().parents[2]
SHIPPED = sorted(
    [*REPO.glob("kernels/*/*/*.py.j2"), *REPO.glob("tests/fixtures/**/*.py.j2"), *REPO.glob("tests/mutants/**/*.py.j2"),
     *REPO.glob("tests/adversarial/*/*/honest_*.py.j2")]
)

PRELUDE = "import torch\nimport triton\nimport triton.language as tl\nimport math\n\n"


def _points(template: Template) -> list[dict]:
    """The baseline and the first and last points of the grid: enough to exercise every branch
    the shipped templates have, without rendering hundreds of MoE points."""
    space = template.space
    return [dict(template.baseline), next(space.points()), next(space.points(reverse=True))]


@pytest.mark.parametrize("path", SHIPPED, ids=lambda p: str(p.relative_to(REPO)))
def test_every_shipped_template_passes(path):
    assert SHIPPED, "no templates found"
    template = Template.from_file(path, "x/y")
    for point in _points(template):
        report = check_source(Candidate.from_template(template, point).source)
        assert report.ok, f"{path} at {point}: {report.message()}"


def test_the_shipped_template_set_covers_every_role():
    roles = {Template.from_file(p, "x/y").role for p in SHIPPED}
    assert roles == {"baseline", "variant"} or roles >= {"baseline"}
    assert any("moe" in str(p) for p in SHIPPED) and any("mutants" in str(p) for p in SHIPPED)


BANNED = [
    ("import os", "import os"),
    ("import sys", "import sys"),
    ("import subprocess", "import subprocess"),
    ("import socket", "import socket"),
    ("import threading", "import threading"),
    ("import multiprocessing", "import multiprocessing"),
    ("import ctypes", "import ctypes"),
    ("import inspect", "import inspect"),
    ("import gc", "import gc"),
    ("import importlib", "import importlib"),
    ("import builtins", "import builtins"),
    ("import kernelforge.execute.judge.verify", "import kernelforge.execute.judge.verify"),
    ("import torch.nn.functional as F", "import torch.nn.functional"),
    ("from os import path", "from os import"),
    ("from torch import matmul", "not on the allowlist of torch"),
    ("from triton.language import core", "not on the allowlist of triton.language"),
    ("from triton.language import *", "import *"),
    ("from . import x", "from . import"),
    ("data = open('/etc/passwd').read()", "open is not allowed"),
    ("eval('1')", "the builtin eval is not allowed"),
    ("exec('x = 1')", "the builtin exec is not allowed"),
    ("compile('1', 'f', 'eval')", "the builtin compile is not allowed"),
    ("__import__('os')", "dunder names are not allowed"),
    ("f = getattr(torch, 'matmul')", "getattr is not allowed"),
    ("setattr(torch, 'equal', None)", "the builtin setattr is not allowed"),
    ("g = globals()", "globals is not allowed"),
    ("v = vars(torch)", "vars is not allowed"),
    ("def run(a, b, out):\n    torch.matmul(a, b, out=out)", "torch.matmul"),
    ("def run(a, b, out):\n    out.copy_(torch.bmm(a, b))", "torch.bmm"),
    ("def run(a, b, out):\n    out.copy_(torch.einsum('ij,jk->ik', a, b))", "torch.einsum"),
    ("def run(a, out):\n    out.copy_(torch.softmax(a, -1))", "torch.softmax"),
    ("def run(q, k, v, out):\n    out.copy_(torch.nn.functional.scaled_dot_product_attention(q, k, v))", "torch.nn"),
    ("def run(a, out):\n    out.copy_(torch.linalg.inv(a))", "torch.linalg"),
    ("def run(a, out):\n    torch.ops.aten.mm(a, a)", "torch.ops"),
    ("def run(a, out):\n    torch._C._set_grad_enabled(False)", "torch._C"),
    ("def run(a, out):\n    s = torch.cuda.Stream()", "torch.cuda"),
    ("def run(a, out):\n    torch.cuda.synchronize()", "torch.cuda"),
    ("def run(a, b, out):\n    out.copy_(torch.Tensor.matmul(a, b))", ".matmul is not on the allowlist"),
    ("def run(a, b, out):\n    out.copy_(a @ b)", "@ operator"),
    ("def run(a, b, out):\n    c = a\n    c @= b", "@= operator"),
    ("def run(a, b, out):\n    out.copy_(a.matmul(b))", ".matmul is not on the allowlist"),
    ("def run(a, out):\n    out.copy_(a.softmax(-1))", ".softmax is not on the allowlist"),
    ("def run(a, out):\n    n = a.numpy()", ".numpy is not on the allowlist"),
    ("def run(a, out):\n    a.record_stream(None)", ".record_stream is not on the allowlist"),
    ("def run(a, out):\n    out.set_(a)", ".set_ is not on the allowlist"),
    ("def run(a, out):\n    out.data = a", "assigning or deleting attributes"),
    ("torch.allclose = lambda *a, **k: True", "assigning or deleting attributes"),
    ("tl.load = None", "assigning or deleting attributes"),
    ("del torch.equal", "assigning or deleting attributes"),
    ("triton.knobs.runtime.interpret = False", "knobs"),
    ("run_later = triton.autotune", "autotune"),
    ("bench = triton.testing.do_bench", "testing"),
    ("driver = triton.runtime.driver", "runtime"),
    ("b = tl.core.builtins", "builtins"),
    ("t = torch", "may only be used as torch.name"),
    ("def run(out, torch=None):\n    pass\ntorch = None", "rebinding the module name"),
    ("def run(a, out):\n    c = out.__class__", "dunder"),
    ("def run(a, out):\n    g = run.__globals__", "dunder"),
    ("d = torch.__dict__", "dunder"),
    ("class Lazy(torch.Tensor):\n    pass", "classes are not allowed"),
    ("class Lazy:\n    def __torch_function__(self):\n        pass", "classes are not allowed"),
    ("def run(a, out):\n    try:\n        pass\n    except:\n        pass", "except must name specific exceptions"),
    ("def run(a, out):\n    try:\n        pass\n    except Exception:\n        pass", "except must name specific exceptions"),
    ("def run(a, out):\n    try:\n        pass\n    except (ValueError, BaseException):\n        pass", "except must name specific exceptions"),
    ("async def run(a, out):\n    pass", "async"),
    ("if __name__ == '__main__':\n    pass", "if statement at module level"),
]


@pytest.mark.parametrize("snippet, fragment", BANNED, ids=[b[0].splitlines()[-1][:40] for b in BANNED])
def test_banned_constructs_are_rejected_with_a_reason(snippet, fragment):
    report = check_source(PRELUDE + snippet + "\n")
    assert not report.ok
    assert fragment in report.message(limit=20), report.message(limit=20)
    assert all(v.line > 0 for v in report.violations)
    assert report.message().startswith("policy: candidate line ")


ALLOWED = [
    "def run(x, out):\n    try:\n        n = int(x.numel())\n    except (TypeError, ValueError):\n        n = 0",
    "def run(x, out):\n    t = torch.empty((4, 4), dtype=torch.float32, device=x.device)\n    v = x.view(-1)[:4].reshape(2, 2).t()",
    "def run(ids, out):\n    order = torch.argsort(ids.reshape(-1), stable=True)\n    c = torch.cumsum(torch.bincount(ids), 0)",
    "def run(ids, out):\n    z = torch.zeros(8, dtype=torch.int64, device=ids.device)\n    z.scatter_add_(0, ids, torch.ones_like(ids))",
    "def run(x, out):\n    s = torch.searchsorted(x, x, right=True).clamp_(max=3)\n    g = torch.gather(x, 0, s)",
    "@triton.jit\ndef k(x_ptr, BLOCK: tl.constexpr):\n    x = tl.load(x_ptr + tl.arange(0, BLOCK))\n    y = x.exp() + tl.sum(x, 0)\n    z = tl.dot(x, x) @ x",
    "@triton.heuristics({'EVEN': lambda args: args['n'] % 2 == 0})\n@triton.jit\ndef k(n, EVEN: tl.constexpr):\n    pass",
    "from triton.language.extra import libdevice\nfrom triton.tools.tensor_descriptor import TensorDescriptor",
    "def run(x, out):\n    s = math.sqrt(x.shape[-1])\n    f = torch.finfo(torch.bfloat16).max\n    n = triton.next_power_of_2(triton.cdiv(7, 2))",
]


@pytest.mark.parametrize("snippet", ALLOWED, ids=range(len(ALLOWED)))
def test_ordinary_kernel_code_is_allowed(snippet):
    report = check_source(PRELUDE + snippet + "\n")
    assert report.ok, report.message()


def test_the_check_never_runs_the_source(tmp_path):
    marker = tmp_path / "ran"
    source = f"import os\nopen({str(marker)!r}, 'w').write('x')\nraise SystemExit(3)\n"
    report = check_source(source)
    assert not report.ok and not marker.exists()


@pytest.mark.parametrize("source", ["def run(:\n", "x = '\0'\n", "(" * 500 + ")" * 500, ""])
def test_unparsable_or_odd_sources_are_reports_not_exceptions(source):
    report = check_source(source)
    assert report.ok is (source == "")
    if not report.ok:
        assert report.message().startswith("policy:")


def test_report_is_a_list_of_problems():
    """The LLM generator reads ``list(check_source(src))``: problem lines, empty when allowed."""
    assert list(check_source(PRELUDE)) == []
    problems = list(check_source(PRELUDE + "import os\ndef f():\n    return eval('1')\n"))
    assert len(problems) == 2 and problems[0].startswith("candidate line 6:") and "eval" in problems[1]
