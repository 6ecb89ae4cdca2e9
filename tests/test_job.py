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
        (('name = "t1"', 'name = "../evil"'), "[job] name"),
        (("[job]", "[jobs]"), "unknown field 'jobs'"),
        (('id = "toy/axpy"', 'ID = "toy/axpy"'), "unknown field 'ID'"),
        (("evaluations = 3", "evaluations = 3\nmax_minutes = -1"), "max_minutes: must be positive"),
        (("[[blocks]]", "[blocks]"), "expected an array of tables"),
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
