"""Warm start (kernelforge.search.warm): a search first asks the best stored configurations of
another job (another device's, or other shapes') right after its baseline points."""

from __future__ import annotations

import json
import math
import shutil
import time
from pathlib import Path

import pytest
from click.testing import CliRunner

from kernelforge.candidate import Candidate
from kernelforge.catalog import Catalog
from kernelforge.cli.main import main
from kernelforge.errors import UserError
from kernelforge.job import load_job
from kernelforge.result import Status, StoredResult
from kernelforge.search.search import Search
from kernelforge.search.warm import collect
from kernelforge.store.store import Store
from kf_progress import Recorder

pytestmark = pytest.mark.interpreter

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "kernels"
TEMPLATE = "toy/axpy/baseline"
BASELINE = {"BLOCK": 256, "num_warps": 4}
CHECK = ("n1", "n7", "n63")

JOB = """
[job]
name = "{name}"
device = "interpret"
dtype = "float16"
seed = 1
storage = "{storage}"

[strategy]
name = "{strategy}"
evaluations = {evaluations}
{extra}

[[blocks]]
id = "toy/axpy"
shapes = "{shapes}"
"""



def write_job(tmp_path: Path, db: Path, name: str, *, strategy="grid", evaluations=5, shapes="check", extra="") -> Path:
    path = tmp_path / f"{name}.toml"
    path.write_text(JOB.format(name=name, storage=f"sqlite:///{db}", strategy=strategy, evaluations=evaluations,
                               shapes=shapes, extra=extra))
    return path


def run_job(path: Path):
    catalog = Catalog.discover(FIXTURES)
    job = load_job(path, catalog)
    recorder = Recorder()
    store = Store(job.storage_url)
    outcome = Search(job, catalog, store, recorder, compile_enabled=False).run()
    return store, recorder, outcome


def evaluated_points(recorder: Recorder) -> list[dict]:
    return [dict(d["params"]) for d in recorder.of("evaluated")]


def expected_best(store: Store, job: str, limit: int = 4) -> list[dict]:
    """The test's own reading of the documented rule: per (env, dtype, shape) ratio to the fastest,
    geometric mean, failures out, the baseline point out, ties to more shapes then stored first;
    then spread out."""
    results = [r for r in store.results(block="toy/axpy") if r.job == job]
    best = {}
    for r in results:
        best[(r.env_key, r.dtype, r.shape)] = min(best.get((r.env_key, r.dtype, r.shape), r.median_s), r.median_s)
    params = {c.id: c.params for c in store.candidates("toy/axpy")}
    logs: dict[str, list[float]] = {}
    for r in results:
        assert r.ok
        logs.setdefault(r.candidate_id, []).append(math.log(r.median_s / best[(r.env_key, r.dtype, r.shape)]))
    order = list(logs)
    ranked = sorted(logs, key=lambda c: (math.exp(sum(logs[c]) / len(logs[c])), -len(logs[c]), order.index(c)))
    points = [params[c] for c in ranked if params[c] != BASELINE]
    # Spread: the best that differ pairwise in two parameters or more, then the next best fill up.
    apart: list[dict] = []
    for p in points:
        if len(apart) < limit and all(sum(p[k] != q[k] for k in p) >= 2 for q in apart):
            apart.append(p)
    return apart + [p for p in points if p not in apart][: limit - len(apart)]


@pytest.fixture(scope="module")
def first_job(tmp_path_factory):
    """A grid job over the whole toy space (9 points) on the check shapes: the source of the others."""
    tmp = tmp_path_factory.mktemp("first")
    db = tmp / "first.db"
    store, _, outcome = run_job(write_job(tmp, db, "first", evaluations=9))
    assert outcome.evaluations == 8  # the grid's 9 points less the baseline, answered from the store
    store.close()  # the last connection: SQLite folds its write-ahead log into the file copied below
    return db


@pytest.fixture
def shared_db(first_job, tmp_path):
    """A copy of the first job's database, for one test to add its own jobs to."""
    db = tmp_path / "shared.db"
    shutil.copy(first_job, db)
    assert Store(f"sqlite:///{db}").jobs() == ["first"]
    return db


# -- another device's job (synthetic results: an exact, known ranking) ------------------------------

#: point -> median seconds on each check shape of the "h100" job (another environment).
H100 = [
    ({"BLOCK": 256, "num_warps": 2}, 0.5, Status.WRONG),  # the fastest, but wrong on one shape: left out
    ({"BLOCK": 512, "num_warps": 4}, 0.6, Status.OK),     # not a point of the space any more: skipped
    ({"BLOCK": 64, "num_warps": 1}, 1.0, Status.OK),
    ({"BLOCK": 1024, "num_warps": 2}, 1.1, Status.OK),
    ({"BLOCK": 64, "num_warps": 2}, 1.2, Status.OK),
    ({"BLOCK": 1024, "num_warps": 1}, 1.3, Status.OK),
    ({"BLOCK": 256, "num_warps": 1}, 1.5, Status.OK),     # fifth: beyond the four warm points
    (BASELINE, 2.0, Status.OK),                           # the baseline point: asked first anyway
]


def store_h100(store: Store, job: str = "h100", all_failed: bool = False) -> None:
    template = Catalog.discover(FIXTURES).template(TEMPLATE)
    for point, seconds, status in H100:
        if template.space.contains(point):
            candidate = Candidate.from_template(template, point, origin="optuna")
        else:  # stored when the template's space was wider
            candidate = Candidate("toy/axpy", TEMPLATE, tuple(point.items()), f"# BLOCK={point['BLOCK']}\n", "optuna")
        store.add_candidate(candidate, job=job)
        for i, shape in enumerate(CHECK):
            bad = Status.WRONG if all_failed else status if i == len(CHECK) - 1 else Status.OK
            store.add_result(StoredResult(
                candidate_id=candidate.id, block="toy/axpy", shape=shape, dtype="float16", device="NVIDIA H100",
                env_key="h100-env", status=bad, rel_error=0.0, median_s=seconds * (i + 1) * 1e-6, p20_s=None,
                p80_s=None, samples=10, timing_method="cuda_events", timing_label="", joules=None, flops=None,
                bytes=None, message="", env={"device": "cuda"}, job=job, created=time.time()))


H100_BEST = [{"BLOCK": 64, "num_warps": 1}, {"BLOCK": 1024, "num_warps": 2}, {"BLOCK": 64, "num_warps": 2},
             {"BLOCK": 1024, "num_warps": 1}]


@pytest.mark.parametrize("strategy", ["grid", "tpe"])
def test_a_job_starts_from_another_devices_best_points_in_order(tmp_path, strategy):
    db = tmp_path / "kf.db"
    store_h100(Store(f"sqlite:///{db}"))
    path = write_job(tmp_path, db, "here", strategy=strategy, evaluations=6, extra='warm_start = ["h100"]')
    store, recorder, outcome = run_job(path)
    assert outcome.evaluations == 6
    # Measured here (another environment's results do not answer), right after the baseline.
    assert [d["candidate"] for d in recorder.of("duplicate")][:1] == [c.id for c in store.candidates("toy/axpy")
                                                                       if c.params == BASELINE]
    assert evaluated_points(recorder)[:4] == H100_BEST
    [warm] = recorder.of("warm_start")
    assert [p["params"] for p in warm["points"]] == H100_BEST and {p["source"] for p in warm["points"]} == {"h100"}
    scores = [p["score"] for p in warm["points"]]
    # Ratios to the fastest per shape (the wrong point's correct shapes count as measurements).
    assert scores == sorted(scores) and scores[1] / scores[0] == pytest.approx(1.1, rel=1e-3)


def test_collect_ranks_skips_and_excludes(tmp_path):
    store = Store(f"sqlite:///{tmp_path / 'kf.db'}")
    store_h100(store)
    template = Catalog.discover(FIXTURES).template(TEMPLATE)
    shapes = Catalog.discover(FIXTURES).block("toy/axpy").shapes("check")
    found = collect(store, job_name="here", dtype="float16", template=template, shapes=shapes, sources=["h100"],
                    exclude=[{"BLOCK": 64, "num_warps": 1}], limit=2)
    # Spread: 64,2 and 1024,1 are one parameter from 1024,2; 256,1 differs from it in both.
    assert [dict(p.point) for p in found.points] == [H100_BEST[1], {"BLOCK": 256, "num_warps": 1}]
    assert found.empty == ()
    assert all(p.groups == 3 for p in found.points)


def test_shapes_mode_starts_from_the_templates_other_shapes(shared_db, tmp_path):
    store = Store(f"sqlite:///{shared_db}")
    expected = expected_best(store, "first")
    path = write_job(tmp_path, shared_db, "smoke", shapes="smoke", extra='warm_start = ["shapes"]')
    _, recorder, outcome = run_job(path)
    assert outcome.evaluations == 5
    assert evaluated_points(recorder)[:4] == expected
    assert {p["source"] for p in recorder.of("warm_start")[0]["points"]} == {"shapes"}


def test_without_warm_start_the_strategy_starts_as_before(shared_db, tmp_path):
    _, recorder, _ = run_job(write_job(tmp_path, shared_db, "cold", shapes="smoke", evaluations=3))
    assert recorder.of("warm_start") == []
    # grid order: the space's declaration order, less the baseline point
    assert evaluated_points(recorder) == [{"BLOCK": 64, "num_warps": 1}, {"BLOCK": 64, "num_warps": 2},
                                          {"BLOCK": 64, "num_warps": 4}]


def test_a_source_without_results_of_the_template_warns_and_the_search_goes_on(tmp_path):
    db = tmp_path / "kf.db"
    store_h100(Store(f"sqlite:///{db}"), job="broken", all_failed=True)  # stored, but every result failed
    _, recorder, outcome = run_job(write_job(tmp_path, db, "here", evaluations=2, extra='warm_start = ["broken"]'))
    assert outcome.evaluations == 2 and recorder.of("warm_start") == []
    assert any("job 'broken' has no successful result of toy/axpy/baseline" in d["message"]
               for d in recorder.of("warning"))


# -- the command line -----------------------------------------------------------------------------

def invoke(*args: str):
    return CliRunner().invoke(main, ["--kernels", str(FIXTURES), "search", *args], catch_exceptions=False)


def events(output: str) -> list[dict]:
    return [json.loads(line) for line in output.splitlines() if line.startswith("{")]


def test_the_command_line_warm_starts_from_a_job_by_name(shared_db, tmp_path):
    expected = expected_best(Store(f"sqlite:///{shared_db}"), "first")
    path = write_job(tmp_path, shared_db, "cli", shapes="smoke")
    result = invoke(str(path), "--warm-start", "first", "--progress", "jsonl", "--no-compile", "--no-report")
    assert result.exit_code == 0, result.output
    lines = events(result.output)
    assert [e["params"] for e in lines if e["event"] == "evaluated"][:4] == expected
    assert [e for e in lines if e["event"] == "warm_start"][0]["points"][0]["source"] == "first"


def test_an_unknown_source_names_it_and_lists_the_stored_jobs(shared_db, tmp_path):
    path = write_job(tmp_path, shared_db, "cli", shapes="smoke")
    result = invoke(str(path), "--warm-start", "shapes,nosuch", "--progress", "quiet", "--no-compile", "--no-report")
    assert result.exit_code == 2
    assert "warm start 'nosuch'" in result.output and "its jobs: first" in result.output
    assert "Traceback" not in result.output
    again = invoke(str(path), "--warm-start", "cli", "--progress", "quiet", "--no-compile", "--no-report")
    assert again.exit_code == 2 and "this job itself" in again.output


def test_the_job_file_field_is_validated(tmp_path):
    db = tmp_path / "kf.db"
    catalog = Catalog.discover(FIXTURES)
    job = load_job(write_job(tmp_path, db, "ok", extra='warm_start = ["a-run", "shapes", "a-run"]'), catalog)
    assert job.strategy.warm_start == ("a-run", "shapes")
    assert load_job(write_job(tmp_path, db, "none"), catalog).strategy.warm_start == ()
    with pytest.raises(UserError, match=r"\[strategy\] warm_start: expected a list, got 'a-run'; write \[\"a-run\"\]"):
        load_job(write_job(tmp_path, db, "bad", extra='warm_start = "a-run"'), catalog)
    with pytest.raises(UserError, match=r"\[strategy\] warm_start: 3 is not a job name"):
        load_job(write_job(tmp_path, db, "bad", extra="warm_start = [3]"), catalog)


def test_every_worker_of_a_launch_gets_the_warm_start(tmp_path, monkeypatch):
    from kernelforge.cli.launch import local as launch_module

    seen = []
    monkeypatch.setattr(launch_module, "run_local", lambda specs, relay, stop: seen.extend(specs) or 0)
    monkeypatch.setattr(launch_module, "finish", lambda *a, **k: None)
    path = write_job(tmp_path, tmp_path / "kf.db", "many")
    result = invoke(str(path), "--workers", "2", "--warm-start", "a-run,shapes", "--warm-start", "b-run")
    assert result.exit_code == 0, result.output
    argv = list(seen[0].argv)
    assert [argv[i + 1] for i, arg in enumerate(argv) if arg == "--warm-start"] == ["a-run,shapes", "b-run"]


def test_a_search_with_an_unknown_source_in_its_job_file_stops_before_measuring(shared_db, tmp_path):
    with pytest.raises(UserError, match="warm start 'nosuch': no job of that name .* its jobs: first"):
        run_job(write_job(tmp_path, shared_db, "typo", extra='warm_start = ["nosuch"]'))
    assert Store(f"sqlite:///{shared_db}").jobs() == ["first"]  # nothing of "typo" was measured


def test_collect_gives_the_whole_ranking_as_rank_scores(tmp_path):
    """Every ranked point of the space scores by its rank (0 the fastest, 1 the slowest), a point
    that failed in a group scores 1, a stored point out of the space is left out: what auto reads."""
    store = Store(f"sqlite:///{tmp_path / 'kf.db'}")
    store_h100(store)
    template = Catalog.discover(FIXTURES).template(TEMPLATE)
    shapes = Catalog.discover(FIXTURES).block("toy/axpy").shapes("check")
    found = collect(store, job_name="here", dtype="float16", template=template, shapes=shapes, sources=["h100"])
    key = lambda point: tuple(point[name] for name in template.space.names)  # noqa: E731
    ranked = [key(p) for p in H100_BEST + [{"BLOCK": 256, "num_warps": 1}, BASELINE]]
    assert sorted(found.scores, key=found.scores.get)[:len(ranked)] == ranked
    assert found.scores[ranked[0]] == pytest.approx(0.0) and found.scores[ranked[-1]] == pytest.approx(1.0)
    assert found.scores[key({"BLOCK": 256, "num_warps": 2})] == 1.0  # wrong on one shape
    assert len(found.scores) == len(ranked) + 1  # BLOCK 512 is not a point of the space
