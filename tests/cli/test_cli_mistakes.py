"""Issue 32's small command-line mistakes: each gets one line naming it, exit code 2, and nothing
is created (no folder, no database, no template)."""

from __future__ import annotations

import shutil
from pathlib import Path

from click.testing import CliRunner

from kernelforge.cli.main import main

ROOT = Path(__file__).resolve().parents[2]
FIXTURES = ROOT / "tests" / "fixtures" / "kernels"
TOY_JOB = """
[job]
name = "toymistake"
device = "interpret"
dtype = "float16"
storage = "sqlite:///{db}"

[strategy]
name = "random"
evaluations = 1

[[blocks]]
id = "toy/axpy"
shapes = "smoke"
"""


def invoke(*args: str, kernels: Path = FIXTURES):
    return CliRunner().invoke(main, ["--kernels", str(kernels), *args], catch_exceptions=False)


def _one_line(result) -> str:
    """The one message (the console may wrap it at the terminal's width)."""
    assert result.output.count("kernelforge:") == 1 and "Traceback" not in result.output, result.output
    return " ".join(line.strip() for line in result.output.splitlines() if line.strip())


def test_a_storage_folder_that_does_not_exist_is_refused_and_not_created(tmp_path):
    job = tmp_path / "toy.toml"
    job.write_text(TOY_JOB.format(db=tmp_path / "toy.db"))
    missing = tmp_path / "nonexistent" / "deeper"
    for command in ("search", "report"):
        result = invoke(command, str(job), "--storage", f"sqlite:///{missing}/kf.db")
        assert result.exit_code == 2
        assert str(missing) in _one_line(result) and "does not exist" in result.output
        assert not (tmp_path / "nonexistent").exists()
    assert not (tmp_path / "toy.db").exists()
    (tmp_path / "afile").write_text("not a folder")
    result = invoke("search", str(job), "--storage", f"sqlite:///{tmp_path / 'afile' / 'kf.db'}")
    assert result.exit_code == 2 and "afile is a file, not a folder" in _one_line(result)


def test_compare_with_itself_is_refused(tmp_path):
    job = tmp_path / "toy.toml"
    job.write_text(TOY_JOB.format(db=tmp_path / "toy.db"))
    result = invoke("report", str(job), "--compare", str(job))
    assert result.exit_code == 2 and "same storage" in _one_line(result)
    assert not (tmp_path / "toy.db").exists() and not list(ROOT.glob("reports/compare-toymistake*"))


def test_new_without_a_name_says_the_name_is_missing(tmp_path):
    kernels = tmp_path / "kernels"
    shutil.copytree(FIXTURES, kernels)
    before = sorted(p.name for p in (kernels / "toy" / "axpy").iterdir())
    result = invoke("new", "toy/axpy", kernels=kernels)
    assert result.exit_code == 2
    line = _one_line(result)
    assert "NAME is missing" in line and "toy/axpy/NAME" in line and "unknown" not in line
    assert sorted(p.name for p in (kernels / "toy" / "axpy").iterdir()) == before


def test_a_report_of_a_storage_that_holds_other_jobs_or_of_jobs_with_no_block_in_common_is_refused(
        tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # the search's report goes to ./reports/
    job = tmp_path / "toy.toml"
    job.write_text(TOY_JOB.format(db=tmp_path / "toy.db"))
    assert invoke("search", str(job), "--progress", "quiet", "--no-compile").exit_code == 0
    report = tmp_path / "reports" / "toymistake" / "REPORT.md"
    before = report.read_text()
    other = tmp_path / "other.toml"
    other.write_text(TOY_JOB.format(db=tmp_path / "other.db").replace('"toymistake"', '"toyother"'))
    result = invoke("report", str(other), "--storage", f"sqlite:///{tmp_path / 'toy.db'}")
    assert result.exit_code == 2
    assert "holds no results of job toyother, only of toymistake" in _one_line(result)
    result = invoke("report", str(job), "--compare", str(other), "--compare-storage",
                    f"sqlite:///{tmp_path / 'missing' / 'x.db'}")
    assert result.exit_code == 2 and _one_line(result).startswith(f"kernelforge: --compare-storage sqlite:///{tmp_path}")
    rules = tmp_path / "rules.toml"
    rules.write_text(TOY_JOB.format(db=tmp_path / "rules.db").replace('"toymistake"', '"toyrules"')
                     .replace('"toy/axpy"', '"toy/axpy_rules"'))
    result = invoke("report", str(job), "--compare", str(rules))
    assert result.exit_code == 2 and "share no block" in _one_line(result)
    assert report.read_text() == before  # no report was rewritten


def test_every_command_reads_the_database_set_in_the_environment(tmp_path, monkeypatch):
    """KERNELFORGE_STORAGE set once in the shell: the search writes that database, and the
    report, show and backup read it (the report used to look for the job's default file)."""
    monkeypatch.chdir(tmp_path)
    job = tmp_path / "toy.toml"
    job.write_text(TOY_JOB.format(db=tmp_path / "unused.db"))
    elsewhere = tmp_path / "elsewhere.db"
    monkeypatch.setenv("KERNELFORGE_STORAGE", f"sqlite:///{elsewhere}")
    assert invoke("search", str(job), "--progress", "quiet", "--no-compile", "--no-report").exit_code == 0
    assert elsewhere.exists() and not (tmp_path / "unused.db").exists()
    report = invoke("report", str(job))
    assert report.exit_code == 0, report.output
    assert (tmp_path / "reports" / "toymistake" / "REPORT.md").exists()
    backup = invoke("backup", str(job), str(tmp_path / "copy.db"))
    assert backup.exit_code == 0 and (tmp_path / "copy.db").exists(), backup.output
    assert not (tmp_path / "unused.db").exists()


def test_a_baseline_rule_outside_the_space_is_refused_by_the_dry_run_and_before_the_database(tmp_path):
    kernels = tmp_path / "kernels"
    shutil.copytree(FIXTURES, kernels)
    template = kernels / "toy" / "axpy_rules" / "baseline.py.j2"
    template.write_text(template.read_text().replace('"min(4, cdiv(N, 512))"', '"8"'))
    job = tmp_path / "rules.toml"
    db = tmp_path / "rules.db"
    job.write_text(TOY_JOB.format(db=db).replace('"toy/axpy"', '"toy/axpy_rules"').replace('"smoke"', '"rules"'))
    for extra in (["--dry-run"], ["--progress", "quiet"]):
        result = invoke("search", str(job), *extra, kernels=kernels)
        assert result.exit_code == 2, result.output
        assert "[[baselines]]" in _one_line(result) and "num_warps=8 is not one of [1, 2, 4]" in result.output
    assert not db.exists(), "refused before the database was created"


def test_a_dry_run_refuses_what_the_search_would_refuse(tmp_path):
    import torch

    job = tmp_path / "toy.toml"
    job.write_text(TOY_JOB.format(db=tmp_path / "toy.db"))
    assert invoke("search", str(job), "--dry-run").exit_code == 0
    cases = [(["--warm-start", "nosuchjob"], "warm start 'nosuchjob': no job of that name stored results"),
             (["--device", f"replay:{tmp_path / 'none.db'}"], "no such recording")]
    if not torch.cuda.is_available():
        cases.append((["--device", "cuda"], "device 'cuda': no CUDA GPU is visible to torch"))
    for options, message in cases:
        result = invoke("search", str(job), "--dry-run", *options)
        assert result.exit_code == 2 and message in _one_line(result), options
    (tmp_path / "toy.db").write_bytes(b"not a database at all, but a file where the database goes" * 100)
    result = invoke("search", str(job), "--dry-run")
    assert result.exit_code == 0 and "cannot be opened" in result.output  # named on the storage line
    assert (tmp_path / "toy.db").read_bytes().startswith(b"not a database")  # left as it was
