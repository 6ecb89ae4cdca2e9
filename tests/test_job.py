"""Job files: a valid job parses; every malformed one names the file, the field and the fix."""

from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from kernelforge.catalog import Catalog
from kernelforge.errors import UserError
from kernelforge.job import load_job, parse_job

ROOT = Path(__file__).resolve().parents[1]
FIXTURES = ROOT / "tests" / "fixtures" / "kernels"

GOOD = """
[job]
name = "t1"
device = "interpret"
dtype = "float16"
tune = "per-shape"

[strategy]
name = "random"
evaluations = 3

[[blocks]]
id = "toy/axpy"
shapes = "check"
templates = ["baseline"]
"""


def write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "job.toml"
    path.write_text(text)
    return path


def test_a_good_job_parses(tmp_path):
    job = load_job(write(tmp_path, GOOD), Catalog.discover(FIXTURES))
    assert job.name == "t1" and job.dtype == "float16" and job.tune == "per-shape"
    assert job.strategy.name == "random" and job.strategy.evaluations == 3
    assert job.blocks[0].id == "toy/axpy" and job.blocks[0].templates == ("baseline",)
    assert job.storage_url == "sqlite:///reports/t1/kernelforge.db"


def test_shipped_jobs_parse():
    catalog = Catalog.discover(ROOT / "kernels")
    jobs = sorted((ROOT / "search").glob("*.toml"))
    assert any(p.name == "demo.toml" for p in jobs)
    for path in jobs:
        load_job(path, catalog)


@pytest.mark.parametrize(
    "change, fragment",
    [
        (("evaluations = 3", "evaluations = 0"), "[strategy] evaluations: must be at least 1"),
        (("evaluations = 3", 'evaluations = "many"'), "[strategy] evaluations: expected a positive integer"),
        (('name = "random"', 'name = "tpee"'), "did you mean tpe?"),
        (('dtype = "float16"', 'dtype = "fp8"'), "[job] dtype: 'fp8' is not one of"),
        (('tune = "per-shape"', 'tune = "each"'), "[job] tune"),
        (('device = "interpret"', 'device = "tpu"'), "[job] device"),
        (('device = "interpret"', 'devise = "cuda"'), "unknown field 'devise' (did you mean device?)"),
        (('id = "toy/axpy"', 'id = "toy/axpi"'), "did you mean toy/axpy?"),
        (('shapes = "check"', 'shapes = "huge"'), "no shape set or shape named 'huge'"),
        (('templates = ["baseline"]', 'templates = ["fast"]'), "toy/axpy has no template 'fast'"),
        (('templates = ["baseline"]', 'templates = []'), "templates: [] names no template"),
        (('name = "t1"', 'name = "../evil"'), "[job] name"),
        (("[job]", "[jobs]"), "unknown field 'jobs'"),
        (('id = "toy/axpy"', 'ID = "toy/axpy"'), "unknown field 'ID'"),
        (("evaluations = 3", "evaluations = 3\nmax_minutes = -1"), "max_minutes: must be positive"),
        # Issue 33: every number finite, every name known, as the command line checks the same value.
        (("evaluations = 3", "evaluations = 3\nmax_minutes = nan"), "max_minutes: expected a number of minutes, got nan"),
        (("evaluations = 3", "evaluations = 3\nmax_minutes = inf"), "not a finite number"),
        (("evaluations = 3", "evaluations = true"), "[strategy] evaluations: expected a positive integer"),
        (('dtype = "float16"', 'dtype = "float16"\ntarget = "sm_999"'), "[job] target: unknown compile target 'sm_999'"),
        (("[[blocks]]", "[blocks]"), "expected an array of tables"),
        (("evaluations = 3", "evaluations = 99999999999999999999"), "past the 64-bit integers a database stores"),
        (("evaluations = 3", 'evaluations = 3\nwarm_start = "shapes"'), 'expected a list, got \'shapes\'; write ["shapes"]'),
        (('dtype = "float16"', 'dtype = "float16"\nseed = -1'), "[job] seed: must be at least 0"),
        (('dtype = "float16"', 'dtype = "float16"\nseed = 4294967296'), "[job] seed: must be at most 4294967295"),
        (('device = "interpret"', 'device = "cuda:x"'), "[job] device: 'cuda:x': cuda:N takes a GPU index"),
        (('device = "interpret"', 'device = "cuda:-1"'), "cuda:N takes a GPU index"),
        # Issue 32: how often the baseline is re-timed beside the candidates.
        (("evaluations = 3", "evaluations = 3\nbaseline_every = 0"), "[strategy] baseline_every: must be at least 1"),
        (("evaluations = 3", 'evaluations = 3\nbaseline_every = "often"'),
         "[strategy] baseline_every: expected a number of evaluations"),
    ],
)
def test_malformed_jobs_name_file_and_field(tmp_path, change, fragment):
    path = write(tmp_path, GOOD.replace(*change))
    with pytest.raises(UserError) as info:
        load_job(path, Catalog.discover(FIXTURES))
    assert str(info.value).startswith(str(path)) and fragment in str(info.value)


def test_missing_and_unparsable_files(tmp_path):
    with pytest.raises(UserError, match="no such job file"):
        load_job(tmp_path / "nope.toml")
    with pytest.raises(UserError, match="not valid TOML"):
        load_job(write(tmp_path, "[job\nname="))
    with pytest.raises(UserError, match=r"no \[\[blocks\]\]"):
        load_job(write(tmp_path, "[job]\nname='x'\n"))


_toml_scalars = st.one_of(st.integers(-5, 5), st.text(max_size=8), st.booleans(), st.floats(allow_nan=False, width=32))
_tables = st.dictionaries(st.sampled_from(["name", "device", "dtype", "tune", "seed", "evaluations", "id", "shapes",
                                           "templates", "storage", "max_minutes", "junk"]),
                          st.one_of(_toml_scalars, st.lists(_toml_scalars, max_size=3)), max_size=6)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(doc=st.dictionaries(st.sampled_from(["job", "strategy", "blocks", "other"]),
                           st.one_of(_tables, st.lists(_tables, max_size=3), _toml_scalars), max_size=3))
def test_fuzzed_documents_give_a_job_or_a_user_error(doc):
    catalog = Catalog.discover(FIXTURES)
    try:
        job = parse_job(doc, Path("fuzz.toml"), catalog)
    except UserError as exc:
        assert str(exc).startswith("fuzz.toml")
    else:
        assert job.blocks and job.strategy.evaluations >= 1


# -- [llm]: request shape, several models, the replay's report folder ------------------------------

LLM = GOOD + """
[llm]
base_url = "http://127.0.0.1:8000/v1"
model = "local"
"""


def test_llm_request_fields_default_to_what_every_server_accepts(tmp_path):
    from kernelforge.llm_spec import ModelSpec

    spec = load_job(write(tmp_path, LLM)).llm
    assert spec.temperature is None and spec.token_limit_field == "max_tokens"
    assert spec.extra_body == () and spec.headers == () and spec.models == ()
    assert spec.endpoints() == (ModelSpec("local", "http://127.0.0.1:8000/v1"),)


def test_extra_body_headers_and_several_models_parse_with_the_top_level_as_defaults(tmp_path, monkeypatch):
    from kernelforge.llm_spec import ModelSpec
    from kernelforge.redact import redact

    monkeypatch.setenv("KF_JOB_TEST_KEY_B", "sk-jobtest-KEYB-0011223344")
    spec = load_job(write(tmp_path, LLM + """temperature = 0.4
api_key_env = "KF_JOB_TEST_KEY_A"
token_limit_field = "max_completion_tokens"
response_tokens = 2000

[llm.extra_body]
reasoning_effort = "high"
options = { num_ctx = 16384 }

[llm.headers]
"X-Team" = "kernels"
"X-Token" = "${KF_JOB_TEST_TOKEN}"

[[llm.models]]
model = "big"
weight = 3

[[llm.models]]
model = "other"
base_url = "https://example.invalid/v1"
api_key_env = "KF_JOB_TEST_KEY_B"
temperature = 1.0
extra_body = { top_k = 20 }
""")).llm
    assert spec.token_limit_field == "max_completion_tokens" and spec.response_tokens == 2000
    assert dict(spec.headers) == {"X-Team": "kernels", "X-Token": "${KF_JOB_TEST_TOKEN}"}  # the reference, never a value
    body = (("reasoning_effort", "high"), ("options", {"num_ctx": 16384}))
    assert spec.models == (
        ModelSpec("big", "http://127.0.0.1:8000/v1", "KF_JOB_TEST_KEY_A", 3.0, 0.4, body),
        ModelSpec("other", "https://example.invalid/v1", "KF_JOB_TEST_KEY_B", 1.0, 1.0, (("top_k", 20),)),
    )
    assert spec.endpoints() == spec.models
    assert "sk-jobtest-KEYB-0011223344" not in redact("sk-jobtest-KEYB-0011223344")  # registered on parse


@pytest.mark.parametrize(
    "extra, fragment",
    [
        ('token_limit_field = "max_len"', "[llm] token_limit_field: 'max_len' is not one of"),
        ('temperature = 2.5', "[llm] temperature: must be between 0.0 and 2.0"),
        ("[llm.extra_body]\nmessages = []", "[llm] extra_body: 'messages' is set by the generator"),
        ('[llm.extra_body]\nmodel = "x"', "'model' is set by the generator"),
        ("[llm.extra_body]\nstream = true", "'stream' is set by the generator"),
        ("[llm.extra_body]\nn = 2", "'n' is set by the generator"),
        ('extra_body = "num_ctx=8"', "[llm] extra_body: expected a table"),
        ("[llm.headers]\nX-Count = 3", "[llm] headers X-Count: expected a string"),
        ('[llm.headers]\n"X Bad:" = "v"', "[llm] headers: 'X Bad:' is not an HTTP header name"),
        ('[llm.headers]\nX-Bad = "a\\nb"', "[llm] headers X-Bad: a header value cannot hold a line break"),
        ('[llm.headers]\nX-Secret = "Bearer ${HDR}"', '[llm] headers X-Secret: "${NAME}" is read from $NAME only as'),
        ('[llm.headers]\nAuthorization = "Bearer x"', "'Authorization' is set by the client"),
        ("[[llm.models]]\nweight = 2", "[[llm.models]] #1: missing model"),
        ('[[llm.models]]\nmodel = "a"\nweight = 0', "[[llm.models]] #1 weight: must be above 0"),
        ('[[llm.models]]\nmodel = "a"\nwieght = 2', "did you mean weight?"),
        ('[[llm.models]]\nmodel = "a"\nbase_url = "ftp://x"', "[[llm.models]] #1 base_url"),
        ('[[llm.models]]\nmodel = "a"\nextra_body = { n = 3 }', "[[llm.models]] #1 extra_body: 'n' is set"),
        ('[[llm.models]]\nmodel = "a"\napi_key_env = "sk-abc def"', "must be the NAME of an environment variable"),
    ],
)
def test_malformed_llm_request_fields_name_the_field(tmp_path, extra, fragment):
    path = write(tmp_path, LLM + extra + "\n")
    with pytest.raises(UserError) as info:
        load_job(path)
    assert str(info.value).startswith(str(path)) and fragment in str(info.value)


def test_a_model_without_an_endpoint_is_refused_when_the_search_starts(tmp_path):
    from kernelforge.job import require_llm_endpoint

    job = load_job(write(tmp_path, GOOD + '[llm]\n[[llm.models]]\nmodel = "a"\n'))
    with pytest.raises(UserError, match=r"\[\[llm.models\]\] #1 \(a\): missing base_url"):
        require_llm_endpoint(job)


def test_a_replay_into_another_database_reports_next_to_it_never_over_the_original(tmp_path):
    from dataclasses import replace

    job = load_job(write(tmp_path, LLM))
    original = tmp_path / "orig" / "kernelforge.db"
    other = tmp_path / "elsewhere" / "replayed.db"
    assert job.report_dir == Path("reports/t1")
    replay = replace(job, llm=replace(job.llm, replay=f"sqlite:///{original}"))
    assert replay.report_dir == Path("reports/t1")  # into the job's own database: the job's own report
    moved = replace(replay, storage=f"sqlite:///{other}")
    assert moved.report_dir == other.parent / "replayed-report"
    assert replace(moved, storage="postgresql://u@db/kf").report_dir == Path("reports/t1-replay")
    same = replace(replay, storage=f"sqlite:///{original}")
    assert same.report_dir == Path("reports/t1")  # replaying a database into itself
    assert replace(job, storage=f"sqlite:///{other}").report_dir == Path("reports/t1")  # not a replay: unchanged


def test_a_job_field_and_its_command_line_option_are_checked_alike(tmp_path):
    """One check per value (kernelforge.fields): a target the job refuses, `compile --target`
    refuses with the same words."""
    from click.testing import CliRunner

    from kernelforge.cli.main import main

    path = write(tmp_path, GOOD.replace('dtype = "float16"', 'dtype = "float16"\ntarget = "sm_999"'))
    with pytest.raises(UserError) as job_error:
        load_job(path, Catalog.discover(FIXTURES))
    result = CliRunner().invoke(main, ["--kernels", str(FIXTURES), "compile", "toy/axpy/baseline", "--target", "sm_999"])
    assert result.exit_code == 2
    words = str(job_error.value).partition("target: ")[2]
    assert words and words in " ".join(result.output.split())


def test_a_job_name_two_files_give_or_a_folder_is_refused_naming_them(tmp_path, monkeypatch):
    from kernelforge.job import job_path

    monkeypatch.chdir(tmp_path)
    (tmp_path / "search").mkdir()
    (tmp_path / "search" / "one.toml").write_text(GOOD)
    (tmp_path / "search" / "two.toml").write_text(GOOD)
    assert job_path("one") == Path("search/one.toml")  # a file's stem is unambiguous
    with pytest.raises(UserError, match=r"t1: search/one.toml and search/two.toml both name their job 't1'"):
        job_path("t1")
    with pytest.raises(UserError, match="search: is a folder; give a job file"):
        job_path("search")
