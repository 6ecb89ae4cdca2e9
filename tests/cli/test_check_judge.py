"""One judge: ``kernelforge check`` judges as a search does (the static policy, the sandboxed
worker, the same time limits); ``--trusted`` runs in-process and says its verdicts are not
trustworthy."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from click.testing import CliRunner

from kernelforge.cli.check import TRUSTED_WARNING
from kernelforge.cli.main import main

ROOT = Path(__file__).resolve().parents[2]
FIXTURES = ROOT / "tests" / "fixtures" / "kernels"

pytestmark = pytest.mark.interpreter


def check(kernels: Path, *args: str):
    return CliRunner().invoke(main, ["--kernels", str(kernels), "check", *args, "--device", "interpret",
                                     "--dtype", "float16", "--shapes", "smoke"], catch_exceptions=False)


def with_variant(tmp_path: Path, name: str, old: str, new: str) -> Path:
    """A copy of the toy kernels with template ``toy/axpy/<name>``: the baseline with ``old``
    replaced by ``new``."""
    kernels = tmp_path / "kernels"
    shutil.copytree(FIXTURES / "toy", kernels / "toy")
    text = (kernels / "toy/axpy/baseline.py.j2").read_text()
    assert old in text
    (kernels / f"toy/axpy/{name}.py.j2").write_text(text.replace('role = "baseline"', 'role = "variant"')
                                                    .replace(old, new))
    return kernels


def test_a_policy_violation_is_rejected_through_check(tmp_path):
    kernels = with_variant(tmp_path, "snoops", "import triton\n", "import os\nimport triton\n")
    result = check(kernels, "toy/axpy/snoops")
    assert result.exit_code == 1, result.output
    assert "rejected" in result.output and "shape(s) failed" in result.output


def test_a_hanging_template_times_out_through_check(tmp_path, monkeypatch):
    monkeypatch.setenv("KERNELFORGE_RUN_TIMEOUT", "2")
    kernels = with_variant(tmp_path, "hangs", "    n = x.numel()\n", "    n = x.numel()\n    while n > 0:\n        n = n + 1\n")
    result = check(kernels, "toy/axpy/hangs")
    assert result.exit_code == 1, result.output
    assert "timeout" in result.output and "did not finish within 2 s" in result.output


def test_check_runs_in_the_sandboxed_worker_and_records_its_sandbox(tmp_path):
    out = tmp_path / "results.json"
    result = check(FIXTURES, "toy/axpy", "--json", str(out))
    assert result.exit_code == 0, result.output
    environment = json.loads(out.read_text())["environment"]
    assert f"sandbox: {environment['sandbox']}" in result.output
    assert not environment["sandbox"].startswith("none: in-process") and TRUSTED_WARNING not in result.output


def test_trusted_runs_in_process_and_says_so(tmp_path):
    out = tmp_path / "results.json"
    result = check(FIXTURES, "toy/axpy", "--trusted", "--json", str(out))
    assert result.exit_code == 0, result.output
    assert TRUSTED_WARNING in " ".join(result.output.split())  # however the console wrapped it
    assert json.loads(out.read_text())["environment"]["sandbox"].startswith("none: in-process")
