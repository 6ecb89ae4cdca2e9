"""Issue 32's bring-your-own-kernel path: `kernelforge tune FILE.py::KERNEL` on a plain
@triton.autotune'd @triton.jit kernel (tests/fixtures/tune/scale_add.py, which knows nothing of
kernelforge) verifies, times, stores and reports its configs; a file missing a piece gets one line."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from click.testing import CliRunner

from kernelforge.cli.main import main

FIXTURE = Path(__file__).resolve().parents[1] / "fixtures" / "tune" / "scale_add.py"
DECLARED = [{"BLOCK": 256, "num_warps": 4, "num_stages": 2}, {"BLOCK": 64, "num_warps": 2, "num_stages": 2},
            {"BLOCK": 1024, "num_warps": 8, "num_stages": 3}]


@pytest.mark.interpreter
def test_tune_a_plain_triton_kernel_produces_a_report(tmp_path, monkeypatch):
    before = FIXTURE.read_text()
    monkeypatch.chdir(tmp_path)
    out = tmp_path / "reports" / "tune-scale_add"
    result = CliRunner().invoke(main, ["tune", f"{FIXTURE}::scale_add", "--device", "interpret"],
                                catch_exceptions=False)
    assert result.exit_code == 0, result.output
    assert FIXTURE.read_text() == before  # the user's file is never changed
    assert (out / "REPORT.md").is_file() and (out / "index.html").is_file()
    data = json.loads((out / "results.json").read_text())
    block = data["blocks"][0]
    assert block["block"] == "tune/scale_add" and block["candidates"] == 3  # every declared config, no other point
    assert sorted((c["params"] for c in block["candidate_rows"]), key=str) == sorted(DECLARED, key=str)
    assert all(c["status"] == "ok" for c in block["candidate_rows"])
    assert [r["shape"] for r in block["shapes"]] == ["n1000", "n4096"]
    assert all(r["params"] in DECLARED and r["speedup"] for r in block["shapes"])
    assert "tune/scale_add" in result.output and "report:" in result.output


def test_a_file_without_a_reference_is_one_line(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    broken = tmp_path / "k.py"
    broken.write_text(FIXTURE.read_text().replace("def reference(", "def not_the_reference("))
    result = CliRunner().invoke(main, ["tune", f"{broken}::scale_add"], catch_exceptions=False)
    assert result.exit_code == 2 and "defines no reference" in result.output
    assert not (tmp_path / "reports").exists()
    result = CliRunner().invoke(main, ["tune", str(broken)], catch_exceptions=False)
    assert result.exit_code == 2 and "FILE.py::KERNEL" in result.output


@pytest.mark.interpreter
def test_a_fixed_reference_is_judged_afresh_and_the_old_verdicts_are_kept(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    wrong = tmp_path / "k.py"
    wrong.write_text(FIXTURE.read_text().replace("return alpha * x.float() + y.float()",
                                                 "return alpha * x.float() - y.float()"))
    result = CliRunner().invoke(main, ["tune", f"{wrong}::scale_add", "--device", "interpret", "--evaluations", "1"])
    assert result.exit_code == 2 and "the human baseline of tune/scale_add" in result.output
    assert "`kernelforge --kernels reports/tune-scale_add/kernels check tune/scale_add`" in " ".join(result.output.split())
    wrong.write_text(FIXTURE.read_text())  # the user fixes the reference; the kernel is the same
    result = CliRunner().invoke(main, ["tune", f"{wrong}::scale_add", "--device", "interpret", "--evaluations", "1"])
    assert result.exit_code == 0, result.output
    assert "were judged by another reference, inputs, output or shapes" in " ".join(result.output.split())
    kept = list((tmp_path / "reports" / "tune-scale_add").glob("kernelforge-judged-before-*.db"))
    assert len(kept) == 1 and kept[0].stat().st_size > 0
