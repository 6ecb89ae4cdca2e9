"""Per-shape baselines through the search, on the interpreter: the fixture block
tests/fixtures/kernels/toy/axpy_rules gives its three "rules" shapes three baseline points (a
nearest-key table, the [baseline] fallback, a computed value). Each shape's speedup is over its own
baseline; studies start at the baseline points; a rerun reuses the stored baselines; confirmation
pairs each shape with its own baseline."""

from __future__ import annotations

import math
import time
from pathlib import Path

import pytest

from kernelforge.baseline_timing import BaselineSeries, baseline_at
from kernelforge.candidate import Candidate, source_id
from kernelforge.catalog import Catalog
from kernelforge.job import load_job
from kernelforge.objective import by_candidate
from kernelforge.result import Status, StoredResult
from kernelforge.search.confirm import confirm
from kernelforge.search.context import RunContext
from kernelforge.search.search import Search
from kernelforge.search.plan import baseline_candidate, baseline_candidates
from kernelforge.search.progress import Progress
from kernelforge.store.store import Store
from kf_progress import Recorder

ROOT = Path(__file__).resolve().parents[2]
FIXTURES = ROOT / "tests" / "fixtures" / "kernels"
BLOCK = "toy/axpy_rules"
CATALOG = Catalog.discover(FIXTURES)
SHAPES = CATALOG.block(BLOCK).shapes("rules")
POINTS = {"n8": {"BLOCK": 64, "num_warps": 1}, "n200": {"BLOCK": 256, "num_warps": 4},
          "n600": {"BLOCK": 256, "num_warps": 2}}
SOURCES = {"n8": "toy tuned table by N", "n200": "toy default point", "n600": "toy computed warps"}

JOB = """
[job]
name = "{name}"
device = "interpret"
dtype = "float16"
tune = "{tune}"
seed = 3

[strategy]
name = "grid"
evaluations = {evaluations}

[[blocks]]
id = "toy/axpy_rules"
shapes = "rules"
"""



def search(tmp_path: Path, *, tune="all-shapes", evaluations=4, name="rules"):
    path = tmp_path / f"{name}.toml"
    path.write_text(JOB.format(name=name, tune=tune, evaluations=evaluations))
    job = load_job(path, CATALOG)
    store = Store(f"sqlite:///{tmp_path / (name + '.db')}")
    recorder = Recorder()
    run = Search(job, CATALOG, store, recorder, compile_enabled=False, in_process=True)
    outcome = run.run()
    return run.run_context, store, recorder, outcome


def test_baseline_candidates_follow_the_rules():
    candidates = baseline_candidates(CATALOG, BLOCK, SHAPES)
    assert {name: c.point for name, c in candidates.items()} == POINTS
    assert all(c.origin == "baseline" for c in candidates.values())
    assert len({c.id for c in candidates.values()}) == 3
    # The single-point baseline stays the [baseline] point (n200's here).
    assert baseline_candidate(CATALOG, BLOCK).id == candidates["n200"].id


def test_each_shape_is_compared_with_its_own_baseline(tmp_path):
    run, store, recorder, outcome = search(tmp_path)
    ids = {name: c.id for name, c in run.baselines[BLOCK].items()}
    assert {name: c.point for name, c in run.baselines[BLOCK].items()} == POINTS
    # One baseline event per distinct baseline, naming its shape and source.
    events = recorder.of("baseline")
    assert sorted((e["shapes"], e["source"], e["candidate"]) for e in events) == sorted(
        ([name], SOURCES[name], ids[name]) for name in POINTS)
    # The study asks the three baseline points first (each needs the two shapes it is not the
    # baseline of: real evaluations), then the grid.
    evaluated = recorder.of("evaluated")
    assert outcome.evaluations == 4 and [e["candidate"] for e in evaluated[:3]] == [ids[s.name] for s in SHAPES]
    stored = {c.id: c for c in store.candidates(BLOCK)}
    assert all(stored[i].origin == "baseline" for i in ids.values())
    table = by_candidate(store.results(block=BLOCK))
    assert all(set(table[i]) == set(POINTS) for i in ids.values())
    # Each result against its shape's own baseline as timed most recently before it (re-timed
    # beside the candidates: kernelforge.baseline_timing).
    series = BaselineSeries({s: table[ids[s]][s] for s in POINTS}, store.baseline_timings(BLOCK))
    for event in evaluated:
        rows = table[event["candidate"]]
        own = math.exp(sum(math.log(baseline_at(series, rows[s]).median_s / rows[s].median_s) for s in POINTS) / 3)
        single = math.exp(sum(math.log(table[ids["n200"]][s].median_s / rows[s].median_s) for s in POINTS) / 3)
        assert event["speedup"] == pytest.approx(own, rel=1e-12)
        assert event["speedup"] != pytest.approx(single, rel=1e-12)  # not against one [baseline] point
    # A rerun reuses every stored result (same source, same candidate id) and spends nothing more;
    # a larger budget buys exactly the difference.
    counts = store.counts()
    _, store, recorder, outcome = search(tmp_path)
    assert outcome.evaluations == 0 and store.counts() == counts
    assert outcome.complete and not recorder.of("baseline")  # finished and confirmed: nothing runs
    _, store, recorder, outcome = search(tmp_path, evaluations=5)
    assert outcome.evaluations == 1 and store.counts().results == counts.results + 3
    # The baselines answer from the store, each once.
    assert sorted(e["candidate"] for e in recorder.of("baseline")) == sorted(ids.values())


def test_per_shape_studies_start_at_their_shapes_baseline(tmp_path):
    run, store, recorder, outcome = search(tmp_path, tune="per-shape", evaluations=2, name="pershape")
    ids = {name: c.id for name, c in run.baselines[BLOCK].items()}
    # Each study's first point is its shape's baseline, already measured there: free.
    assert sorted(e["candidate"] for e in recorder.of("duplicate")) == sorted(ids.values())
    assert outcome.evaluations == 2 * 3
    # Each per-shape speedup is over that shape's own baseline.
    table = by_candidate(store.results(block=BLOCK))
    speedups = [e for e in recorder.of("evaluated") if e["speedup"] is not None]
    assert len(speedups) == 6
    series = BaselineSeries({s: table[ids[s]][s] for s in POINTS}, store.baseline_timings(BLOCK))
    for event in speedups:
        rows = table[event["candidate"]]
        own = [s for s in rows
               if event["speedup"] == pytest.approx(baseline_at(series, rows[s]).median_s / rows[s].median_s)]
        assert own, f"{event['candidate']}'s speedup is over no shape's own baseline"


class PairingExecutor:
    """Records which baseline each shape is paired with; nothing runs."""

    kind = "interpret"
    runs_code = True

    def __init__(self):
        self.pairs = []

    def pair_speedups(self, block, baseline_source, candidate_source, shape, dtype, pairs):
        self.pairs.append((shape.name, source_id(baseline_source), source_id(candidate_source)))  # source hashes
        return [1.5] * pairs


def _row(candidate_id: str, shape: str, seconds: float) -> StoredResult:
    return StoredResult(candidate_id=candidate_id, block=BLOCK, shape=shape, dtype="float16", device="interpret",
                        env_key="env", status=Status.OK, rel_error=0.0, median_s=seconds, p20_s=seconds,
                        p80_s=seconds, samples=3, timing_method="wall", timing_label="wall", joules=None,
                        flops=1.0, bytes=1.0, message="", env={}, job="confirm", created=time.time())


def test_confirmation_pairs_each_shape_with_its_own_baseline(tmp_path):
    path = tmp_path / "confirm.toml"
    path.write_text(JOB.format(name="confirm", tune="all-shapes", evaluations=2))
    job = load_job(path, CATALOG)
    store = Store(f"sqlite:///{tmp_path / 'c.db'}")
    baselines = baseline_candidates(CATALOG, BLOCK, SHAPES)
    fast = Candidate.from_template(CATALOG.baseline(BLOCK), {"BLOCK": 1024, "num_warps": 1}, origin="grid")
    for candidate in [*baselines.values(), fast]:
        store.add_candidate(candidate, job.name)
    for name in POINTS:
        store.add_result(_row(baselines[name].id, name, 2e-3))
        store.add_result(_row(fast.id, name, 1e-3))
    # The [baseline] point, slower elsewhere than the shapes' own baselines, must not be used there.
    for name in ("n8", "n600"):
        store.add_result(_row(baselines["n200"].id, name, 9e-3))
    executor = PairingExecutor()
    run = RunContext(job=job, catalog=CATALOG, store=store, executor=executor, progress=Progress(), env={},
                     env_key="env", baselines={BLOCK: baselines}, ledger=store.ledger(job.name, "env"))
    winners = confirm(run, top=1)
    assert sorted(executor.pairs) == sorted((name, source_id(baselines[name].source), source_id(fast.source))
                                            for name in POINTS)
    rows = store.confirmations(job.name)
    assert {(r.shape, r.baseline_id) for r in rows} == {(name, baselines[name].id) for name in POINTS}
    assert len(winners[BLOCK]) == 3 and all(w.winner for w in winners[BLOCK])
