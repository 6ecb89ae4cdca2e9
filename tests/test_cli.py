"""The command line: listings, render, check, new, and one-line errors for user mistakes."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner

from kernelforge.cli import main

ROOT = Path(__file__).resolve().parents[1]
FIXTURES = ROOT / "tests" / "fixtures" / "kernels"


def invoke(*args: str, kernels: Path = FIXTURES):
    return CliRunner().invoke(main, ["--kernels", str(kernels), *args], catch_exceptions=False)


def test_blocks_and_templates_list_what_discovery_finds():
    result = invoke("blocks")
    assert result.exit_code == 0 and "toy/axpy" in result.output
    result = invoke("templates", "toy/axpy")
    assert result.exit_code == 0 and "toy/axpy/baseline" in result.output and "BLOCK=256" in result.output


def test_render_applies_overrides():
    result = invoke("render", "toy/axpy/baseline", "BLOCK=1024")
    assert result.exit_code == 0 and "BLOCK=1024" in result.output and "def run(" in result.output


@pytest.mark.parametrize(
    "args, fragment",
    [
        (("render", "toy/axpy/baseline", "BLOCK=7"), "BLOCK=7 is not one of"),
        (("render", "toy/axpy/baseline", "BLOCK"), "must be written NAME=VALUE"),
        (("render", "toy/axpy/nope"), "unknown template"),
        (("check", "toy/axpi", "--device", "interpret"), "did you mean toy/axpy"),
        (("check", "toy/axpy", "--device", "interpret", "--shapes", "huge"), "no shape set or shape named 'huge'"),
        (("check", "toy/axpy", "--device", "interpret", "--dtype", "float64"), "--dtype 'float64'"),
        (("check", "toy/axpy", "--device", "tpu"), "unknown device 'tpu'"),
        (("new", "toy/axpy/baseline"), "already exists"),
        (("new", "toy/axpy/bad-name"), "must be a Python identifier"),
    ],
)
def test_user_mistakes_give_one_clear_line(args, fragment):
    result = invoke(*args)
    assert result.exit_code == 2
    assert fragment in result.output
    assert "Traceback" not in result.output


@pytest.mark.interpreter
def test_check_passes_and_labels_interpreter_timings():
    result = invoke("check", "toy/axpy", "--device", "interpret", "--shapes", "check", "--dtype", "bfloat16")
    assert result.exit_code == 0, result.output
    assert "n63" in result.output and "interpreter wall time" in result.output and "all shapes passed" in result.output


@pytest.mark.interpreter
def test_check_of_a_wrong_template_exits_nonzero(tmp_path):
    kernels = tmp_path / "kernels"
    shutil.copytree(FIXTURES / "toy", kernels / "toy")
    baseline = (kernels / "toy/axpy/baseline.py.j2").read_text()
    wrong = baseline.replace('role = "baseline"', 'role = "variant"').replace("alpha * x + y", "alpha * x - y")
    (kernels / "toy/axpy/wrong.py.j2").write_text(wrong)
    result = invoke("check", "toy/axpy/wrong", "--device", "interpret", "--dtype", "float16", kernels=kernels)
    assert result.exit_code == 1
    assert "wrong" in result.output and "shape(s) failed" in result.output


def test_new_scaffolds_a_valid_variant(tmp_path):
    kernels = tmp_path / "kernels"
    shutil.copytree(FIXTURES / "toy", kernels / "toy")
    result = invoke("new", "toy/axpy/wide", kernels=kernels)
    assert result.exit_code == 0, result.output
    text = (kernels / "toy/axpy/wide.py.j2").read_text()
    assert 'role = "variant"' in text and "Variant of toy/axpy/baseline" in text
    listing = invoke("templates", "toy/axpy", kernels=kernels)
    assert "toy/axpy/wide" in listing.output and "variant" in listing.output


def test_console_script_reports_user_errors_without_traceback():
    exe = Path(sys.executable).with_name("kernelforge")
    proc = subprocess.run([str(exe), "--kernels", str(FIXTURES), "render", "toy/nothing/x"],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2
    assert "unknown block or template" in proc.stderr and "Traceback" not in proc.stderr
