"""Resource-aware pruning (issue 14): a candidate the ahead-of-time compile rejects for the
target's resource limits never reaches the device, so it costs no evaluation. Its results are
stored (failures are data), its strategy is told ``infeasible`` (free), the budget unit its claim
was granted goes back to the shared ledger, and a peer or a rerun reading those stored results
treats them the same way. A compile error is the kernel's fault: still an evaluation.

Most tests run the toy block in the interpreter with a stand-in compile pool (a real compile of
the toy block never exceeds a limit, and ptxas would cost seconds per candidate): it rejects
every ``num_warps=1`` point for resources, as ``limit_problems`` does, and fails ``BLOCK=1024,
num_warps=2`` with a compile error. One test (marked ``aot``) runs the real route: a matmul space
whose large tiles are over sm_90's shared memory, compiled by the real sandboxed pool.
"""

from __future__ import annotations

import shutil
from concurrent.futures import Future
from pathlib import Path

import pytest

from kernelforge.catalog import Catalog
from kernelforge.compile.resources import CompileReport
from kernelforge.targets import parse_target
from kernelforge.job import load_job
from kernelforge.result import Status, resource_rejected
from kernelforge.search.search import Search
from kernelforge.store.ledger import ClaimState
from kernelforge.store.store import Store
from kernelforge.strategies.base import Strategy
from kf_progress import Recorder

pytestmark = pytest.mark.interpreter

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "kernels"
LIMIT = "kernel _axpy needs 300000 bytes of shared memory; sm_90 allows 232448 per block"

JOB = """
[job]
name = "{name}"
device = "interpret"
dtype = "float16"
seed = 3
target = "sm_90"

[strategy]
name = "{strategy}"
evaluations = {evaluations}

[[blocks]]
id = "{block}"
shapes = "check"
"""



class StandInPool:
    """A compile pool that answers at once: ``num_warps=1`` is over the target's resources
    (rejected), ``BLOCK=1024, num_warps=2`` does not compile, everything else is ok."""

    def __init__(self):
        self.submitted = 0

    def submit(self, source, block_id, kernels_root, dtype, target=None):
        self.submitted += 1
        name = parse_target(target).name
        if "num_warps=1)" in source:
            report = CompileReport.failed(name, Status.REJECTED, LIMIT)
        elif "BLOCK=1024, num_warps=2)" in source:
            report = CompileReport.failed(name, Status.COMPILE_ERROR, "kernel _axpy failed to compile: on purpose")
        else:
            report = CompileReport(name, (), True, Status.OK, "", 0.0)
        future = Future()
        future.set_result(report)
        return future

    def shutdown(self, wait=True, cancel_futures=False):
        pass


@pytest.fixture
def told(monkeypatch):
    """Every ``infeasible`` and every failed ``tell`` (value None) the search's strategies get:
    (kind, (BLOCK, num_warps), reason) triples."""
    from kernelforge.strategies.optuna.strategy import OptunaStrategy
    from kernelforge.strategies.simple import GridStrategy, RandomStrategy

    calls = []
    infeasible = Strategy.infeasible

    def spy_infeasible(self, point, reason=""):
        calls.append(("infeasible", _key(point), reason))
        return infeasible(self, point, reason)

    monkeypatch.setattr(Strategy, "infeasible", spy_infeasible)
    for cls in (GridStrategy, RandomStrategy, OptunaStrategy):
        def spy_tell(self, point, value, _tell=cls.tell):
            if value is None:
                calls.append(("failed", _key(point), ""))
            return _tell(self, point, value)

        monkeypatch.setattr(cls, "tell", spy_tell)
    return calls


def _key(point):
    return point["BLOCK"], point["num_warps"]


def write_job(tmp_path: Path, name: str, evaluations: int, strategy: str = "grid", block: str = "toy/axpy") -> Path:
    path = tmp_path / f"{name}.toml"
    path.write_text(JOB.format(name=name, strategy=strategy, evaluations=evaluations, block=block))
    return path


def search(tmp_path: Path, path: Path, catalog_root: Path = FIXTURES, pool=None, store: Store | None = None):
    catalog = Catalog.discover(catalog_root)
    job = load_job(path, catalog)
    store = store or Store(f"sqlite:///{tmp_path / 'kf.db'}")
    recorder = Recorder()
    searcher = Search(job, catalog, store, recorder, pool=pool if pool is not None else StandInPool())
    outcome = searcher.run()
    return job, store, recorder, outcome, searcher.run_context


def granted(run) -> int:
    """Units granted by the ledger over every study of the run's job."""
    from kernelforge.search.plan import plan_studies

    return sum(run.ledger.budget(p.name).granted for p in plan_studies(run.job, run.catalog))


def by_candidate(store: Store, block: str) -> dict[str, set[Status]]:
    statuses: dict[str, set[Status]] = {}
    for r in store.results(block=block):
        statuses.setdefault(r.candidate_id, set()).add(r.status)
    return statuses


# -- the decision ----------------------------------------------------------------------------------


def test_only_a_compile_rejection_with_rejected_results_is_infeasible(tmp_path):
    job, store, recorder, outcome, run = search(tmp_path, write_job(tmp_path, "decide", 9))
    results = store.results(block="toy/axpy")
    rejected = [r for r in results if r.status is Status.REJECTED]
    errors = [r for r in results if r.status is Status.COMPILE_ERROR]
    assert rejected and errors
    compile_of = {c.candidate_id: c.status for c in store.compiles({r.candidate_id for r in results}, "float16")}
    assert all(resource_rejected(compile_of[r.candidate_id], [r]) for r in rejected)
    assert not any(resource_rejected(compile_of[r.candidate_id], [r]) for r in errors)
    assert not resource_rejected(Status.REJECTED.value, [])  # nothing stored: nothing decided
    assert not resource_rejected(None, rejected)  # rejected without a compile (the policy gate, the executor)
    ok = next(r for r in results if r.ok)
    assert not resource_rejected(Status.REJECTED.value, [rejected[0], ok])


# -- one worker ------------------------------------------------------------------------------------


def test_resource_rejections_cost_no_evaluation_and_are_stored(tmp_path, told):
    # Grid order: (256, 4) the baseline, then (64, 1) R, (64, 2), (64, 4), (256, 1) R, (256, 2),
    # (1024, 1) R, (1024, 2) compile error, (1024, 4): a budget of 4 ends at the compile error.
    job, store, recorder, outcome, run = search(tmp_path, write_job(tmp_path, "prune", 4))
    assert outcome.evaluations == 4 and outcome.infeasible == 3
    evaluated = recorder.of("evaluated")
    assert [e["params"]["num_warps"] for e in evaluated] == [2, 4, 2, 2]
    assert [e["status"] for e in evaluated] == ["ok", "ok", "ok", "compile_error"]
    infeasible = recorder.of("infeasible")
    assert sorted(e["params"]["BLOCK"] for e in infeasible) == [64, 256, 1024]
    assert all(e["status"] == "rejected" and e["message"] == f"sm_90: {LIMIT}" for e in infeasible)
    # The strategy: three free tells, the compile error a failed evaluation.
    assert sorted(c[1] for c in told if c[0] == "infeasible") == [(64, 1), (256, 1), (1024, 1)]
    assert all(c[2] == f"sm_90: {LIMIT}" for c in told if c[0] == "infeasible")
    assert [c[1] for c in told if c[0] == "failed"] == [(1024, 2)]
    # Stored as now: every shape of a rejected candidate, with the compile's verdict.
    statuses = by_candidate(store, "toy/axpy")
    assert sum(s == {Status.REJECTED} for s in statuses.values()) == 3
    assert sum(s == {Status.COMPILE_ERROR} for s in statuses.values()) == 1
    shapes = len(run.catalog.block("toy/axpy").shapes("check"))
    assert sum(r.status is Status.REJECTED for r in store.results(block="toy/axpy")) == 3 * shapes
    # The ledger granted exactly the device evaluations; every claim is closed.
    assert granted(run) == 4
    claims = [c for c in run.ledger.claims() if c.study != "baselines"]
    assert {c.state for c in claims} == {"done"} and len(claims) == 7  # 4 evaluated, 3 infeasible


def test_the_space_exhausted_counts_only_what_ran(tmp_path):
    job, store, recorder, outcome, run = search(tmp_path, write_job(tmp_path, "whole", 20))
    # 9 points: the baseline (free), 3 rejected for resources, 5 run (one a compile error).
    assert outcome.evaluations == 5 and outcome.infeasible == 3
    assert granted(run) == 5


def test_optuna_learns_infeasible_trials_that_cost_no_evaluation(tmp_path, told):
    import optuna

    job, store, recorder, outcome, run = search(tmp_path, write_job(tmp_path, "tpe", 4, strategy="tpe"))
    assert outcome.evaluations == 4
    assert outcome.infeasible == len(recorder.of("infeasible")) == sum(c[0] == "infeasible" for c in told)
    assert all(e["params"]["num_warps"] != 1 for e in recorder.of("evaluated"))
    assert granted(run) == 4
    (summary,) = optuna.get_all_study_summaries(store.url)
    trials = optuna.load_study(study_name=summary.study_name, storage=store.url).trials
    marked = [t for t in trials if t.user_attrs.get("kernelforge") == "infeasible"]
    assert len(marked) == outcome.infeasible
    assert all(t.params["num_warps"] == 1 for t in marked)


# -- the store: peers and reruns -------------------------------------------------------------------


def test_stored_rejections_read_back_are_infeasible_too(tmp_path, told):
    store = Store(f"sqlite:///{tmp_path / 'kf.db'}")
    search(tmp_path, write_job(tmp_path, "first", 4), store=store)
    told.clear()
    # Another job over the same template and shapes reads the first one's results from the store.
    job, store, recorder, outcome, run = search(tmp_path, write_job(tmp_path, "second", 4), store=store)
    assert sorted(c[1] for c in told if c[0] == "infeasible") == [(64, 1), (256, 1), (1024, 1)]
    assert (64, 1) not in [c[1] for c in told if c[0] == "failed"]
    # Its own budget went on what the first job had not run: (1024, 4) only; the 3 rejected
    # answered from the store were compiled by the first job, so none is this worker's.
    assert outcome.evaluations == 1 and outcome.infeasible == 0
    assert granted(run) == 1


def test_a_rerun_does_not_count_stored_rejections_as_spent(tmp_path):
    store = Store(f"sqlite:///{tmp_path / 'kf.db'}")
    search(tmp_path, write_job(tmp_path, "again", 3), store=store)
    # 3 evaluations spent (64/2, 64/4, 256/2), 2 rejections free; a budget of 4 leaves one more.
    job, store, recorder, outcome, run = search(tmp_path, write_job(tmp_path, "again", 4), store=store)
    assert list(recorder.of("start")[0]["resumed"].values()) == [3]
    assert outcome.evaluations == 1
    assert granted(run) == 4


# -- the ledger ------------------------------------------------------------------------------------


@pytest.fixture(params=["sqlite", "postgresql"])
def ledger_store(request, tmp_path):
    if request.param == "sqlite":
        return Store(f"sqlite:///{tmp_path / 'ledger.db'}")
    return Store(request.getfixturevalue("pg_url"))


def test_refund_gives_the_unit_back_and_keeps_the_claim_done(ledger_store):
    ledger = ledger_store.ledger("job", "env")
    ledger.join()
    try:
        ledger.open_budget("study", 2, 0, alone=True)
        assert ledger.claim("study", "c1", "s", {"x": 1}) is ClaimState.GRANTED
        assert ledger.budget("study").granted == 1
        ledger.finish("c1", "s")
        assert ledger.refund("study").granted == 0
        assert ledger.claim("study", "c1", "s", {"x": 1}) is ClaimState.DONE  # no one runs it again
        assert ledger.refund("study").granted == 0  # never below zero
        # The refunded unit is spendable: two more claims fit a budget of 2, a third does not.
        assert ledger.claim("study", "c2", "s", {"x": 2}) is ClaimState.GRANTED
        assert ledger.claim("study", "c3", "s", {"x": 3}) is ClaimState.GRANTED
        assert ledger.claim("study", "c4", "s", {"x": 4}) is ClaimState.NO_BUDGET
    finally:
        ledger.leave()


# -- the real route --------------------------------------------------------------------------------

MATMUL_SPACE = """[space]
BLOCK_M = [128]
BLOCK_N = [64, 256]
BLOCK_K = [128]
num_warps = [8]
num_stages = [2, 3, 4, 5]

[baseline]
BLOCK_M = 128
BLOCK_N = 64
BLOCK_K = 128
num_warps = 8
num_stages = 2
-#}"""


@pytest.mark.aot
@pytest.mark.filterwarnings("ignore:TRITON_DEFAULT_FP_FUSION")
def test_real_compile_rejections_for_shared_memory_cost_no_evaluation(tmp_path):
    # fp16 tiles (128x128 + 128xBLOCK_N) x num_stages: BLOCK_N 64 fits sm_90's 232448 bytes up to
    # 3 stages... 4 (196608), 256 only at 2 (196608). Grid order: (64, 2) the baseline, (64, 3),
    # (64, 4), (64, 5) over, (256, 2), then (256, 3..5) over.
    root = tmp_path / "kernels"
    shutil.copytree(FIXTURES / "demo" / "matmul", root / "demo" / "matmul")
    template = root / "demo" / "matmul" / "baseline.py.j2"
    text = template.read_text()
    start, end = text.index("[space]"), text.index("-#}") + 3
    template.write_text(text[:start] + MATMUL_SPACE + text[end:])
    path = write_job(tmp_path, "real", 3, block="demo/matmul")
    catalog = Catalog.discover(root)
    job = load_job(path, catalog)
    store = Store(f"sqlite:///{tmp_path / 'kf.db'}")
    recorder = Recorder()
    searcher = Search(job, catalog, store, recorder)  # the real sandboxed compile pool
    outcome = searcher.run()
    run = searcher.run_context
    assert outcome.evaluations == 3 and outcome.infeasible >= 1
    assert all(e["status"] == "ok" for e in recorder.of("evaluated"))
    (infeasible, *_) = recorder.of("infeasible")
    assert infeasible["params"]["BLOCK_N"] == 64 and infeasible["params"]["num_stages"] == 5
    assert "bytes of shared memory; sm_90 allows 232448 per block" in infeasible["message"]
    rejected = [c for c, s in by_candidate(store, "demo/matmul").items() if s == {Status.REJECTED}]
    assert len(rejected) == outcome.infeasible
    assert all(store.compile(c, "sm_90", "float16").status == "rejected" for c in rejected)
    assert granted(run) == 3
