"""The compile pools' policy wall (kernelforge.compile.pool.refused_compile): what it refuses, and
with which status, since a ``rejected`` compile reads as a configuration over the target's limits."""

from types import SimpleNamespace

from kernelforge.compile.pool import refused_compile
from kernelforge.result import Status, resource_rejected

VALID = "import triton\n\n\n@triton.jit\ndef k(x):\n    pass\n\n\ndef run(x, out):\n    k[(1,)](x)\n"


def _report(source: str):
    future = refused_compile(source, "sm_90")
    return None if future is None else future.result()


def test_a_source_the_policy_allows_goes_to_the_compiler():
    assert refused_compile(VALID, "sm_90") is None


def test_a_source_that_is_not_python_is_a_compile_error_with_its_line_not_a_resource_rejection():
    report = _report(VALID + "def broken(:\n    pass\n")
    assert report.status == Status.COMPILE_ERROR.value and not report.ok
    assert "syntax error at line 11" in report.message and report.target == "sm_90"
    executors_wall = [SimpleNamespace(status=Status.REJECTED)]  # the executor refuses it too, as rejected
    assert not resource_rejected(report.status, executors_wall), "a syntax error is charged, not infeasible"


def test_a_source_the_policy_refuses_is_rejected_with_the_policys_words():
    report = _report(VALID + "import os\nos.system('true')\n")
    assert report.status == Status.REJECTED.value and "policy" in report.message
