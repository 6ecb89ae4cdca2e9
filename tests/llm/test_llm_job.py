"""The [llm] table of a job and the search command's --llm options: defaults, overrides, and one
clear message per mistake, naming the field (and never repeating what may be a key)."""

from __future__ import annotations

from pathlib import Path

import pytest
from click.testing import CliRunner

from kernelforge.catalog import Catalog
from kernelforge.cli.main import main
from kernelforge.cli.search import with_llm as _with_llm
from kernelforge.errors import UserError
from kernelforge.job import load_job, require_llm_endpoint

ROOT = Path(__file__).resolve().parents[2]
FIXTURES = ROOT / "tests" / "fixtures" / "kernels"

JOB = """
[job]
name = "t"
device = "interpret"
dtype = "float16"

[strategy]
evaluations = 4

[[blocks]]
id = "toy/axpy"
shapes = "smoke"

[llm]
base_url = "http://127.0.0.1:8000/v1"
model = "m"
api_key_env = "MY_KEY"
max_calls = 5
temperature = 0.2
"""


def load(tmp_path: Path, text: str):
    path = tmp_path / "job.toml"
    path.write_text(text)
    return load_job(path, Catalog.discover(FIXTURES))


def test_llm_table_parses_with_defaults(tmp_path):
    spec = load(tmp_path, JOB).llm
    assert (spec.base_url, spec.model, spec.api_key_env, spec.max_calls, spec.temperature) == (
        "http://127.0.0.1:8000/v1", "m", "MY_KEY", 5, 0.2)
    assert spec.concurrency >= 1 and spec.max_retries >= 0 and 0 < spec.tune_share <= 1 and spec.replay is None
    assert load(tmp_path, JOB.split("[llm]")[0]).llm is None


@pytest.mark.parametrize("change, fragment", [
    (("max_calls = 5", "max_calls = 0"), "[llm] max_calls: must be at least 1"),
    (("max_calls = 5", "max_call = 5"), "unknown field 'max_call' (did you mean max_calls?)"),
    (("temperature = 0.2", "temperature = 3"), "[llm] temperature: must be between 0.0 and 2.0"),
    (("temperature = 0.2", 'temperature = "hot"'), "[llm] temperature: expected a number"),
    (("max_calls = 5", "tune_share = 1.5"), "[llm] tune_share: must be between 0.0 and 1.0"),
    (("max_calls = 5", "timeout_s = 0"), "[llm] timeout_s: must be above 0.0"),
    (("max_calls = 5", "concurrency = 0"), "[llm] concurrency: must be at least 1"),
    (('base_url = "http://127.0.0.1:8000/v1"', 'base_url = "127.0.0.1:8000"'), "[llm] base_url"),
])
def test_malformed_llm_tables_name_the_field(tmp_path, change, fragment):
    with pytest.raises(UserError) as info:
        load(tmp_path, JOB.replace(*change))
    assert fragment in str(info.value) and str(info.value).startswith(str(tmp_path / "job.toml"))


def test_a_key_pasted_into_api_key_env_is_refused_without_being_repeated(tmp_path):
    with pytest.raises(UserError) as info:
        load(tmp_path, JOB.replace('api_key_env = "MY_KEY"', 'api_key_env = "sk-live-Abc123/xyz"'))
    assert "NAME of an environment variable" in str(info.value) and "sk-live" not in str(info.value)


def test_endpoint_may_come_from_the_command_line(tmp_path):
    job = load(tmp_path, JOB.replace('base_url = "http://127.0.0.1:8000/v1"\n', "").replace('model = "m"\n', ""))
    with pytest.raises(UserError, match=r"\[llm\]: missing base_url"):
        require_llm_endpoint(job)
    job = _with_llm(job, "http://127.0.0.1:9/v1", "other", None)
    require_llm_endpoint(job)
    assert (job.llm.base_url, job.llm.model, job.llm.max_calls) == ("http://127.0.0.1:9/v1", "other", 5)


def test_llm_options_enable_override_replay_and_switch_off(tmp_path):
    plain = load(tmp_path, JOB.split("[llm]")[0])
    enabled = _with_llm(plain, "http://localhost:1234/v1", "local", "KEY_VAR")
    assert (enabled.llm.base_url, enabled.llm.model, enabled.llm.api_key_env) == (
        "http://localhost:1234/v1", "local", "KEY_VAR")
    assert _with_llm(plain, "replay", None, None).llm.replay == plain.storage_url
    db = tmp_path / "other.db"
    db.write_bytes(b"")
    assert _with_llm(plain, f"replay:{db}", None, None).llm.replay == f"sqlite:///{db}"
    assert _with_llm(load(tmp_path, JOB), "off", None, None).llm is None
    with pytest.raises(UserError, match="--llm-model"):
        _with_llm(plain, "http://localhost:1234/v1", None, None)
    with pytest.raises(UserError, match="no such job database"):
        _with_llm(plain, f"replay:{tmp_path / 'missing.db'}", None, None)
    with pytest.raises(UserError, match="--llm replay:sqlite:///.*typo.db: no such job database"):
        _with_llm(plain, f"replay:sqlite:///{tmp_path / 'typo.db'}", None, None)


def test_cli_mistakes_are_one_line_with_the_table_name_visible(tmp_path):
    path = tmp_path / "job.toml"
    path.write_text(JOB.replace("max_calls = 5", "max_calls = -1"))
    result = CliRunner().invoke(main, ["--kernels", str(FIXTURES), "search", str(path), "--progress", "quiet"])
    assert result.exit_code == 2 and "[llm] max_calls" in result.output
    path.write_text(JOB)
    result = CliRunner().invoke(main, ["--kernels", str(FIXTURES), "search", str(path), "--llm", "ftp://x"])
    assert result.exit_code == 2 and "not an http(s) URL" in result.output


def test_the_jobs_key_and_headers_never_go_to_another_host_unasked(tmp_path, capsys):
    job = load(tmp_path, JOB + '[llm.headers]\nX-Secret = "${HDR}"\n')
    assert job.llm.api_key_env == "MY_KEY" and job.llm.headers
    same_host = _with_llm(job, "http://127.0.0.1:8000/other/v1", None, None)  # the same endpoint's host
    assert same_host.llm.api_key_env == "MY_KEY" and same_host.llm.headers == job.llm.headers
    elsewhere = _with_llm(job, "http://127.0.0.1:8780/v1", "local", None)
    assert elsewhere.llm.api_key_env == "" and elsewhere.llm.headers == ()
    assert "is another host than the job's [llm] endpoint" in capsys.readouterr().err
    asked = _with_llm(job, "http://127.0.0.1:8780/v1", "local", "OTHER_KEY")
    assert asked.llm.api_key_env == "OTHER_KEY"
