"""The search end to end on the toy block: store, resume after SIGKILL and Ctrl-C, replay, report."""

from __future__ import annotations

import json
import os
import signal
import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest

from kernelforge.baseline_timing import BaselineSeries, baseline_at
from kernelforge.catalog import Catalog
from kernelforge.errors import UserError
from kernelforge.job import load_job
from kernelforge.search.search import Search
from kernelforge.store.records import StoreCounts
from kernelforge.store.store import Store
from kf_progress import Recorder
from toy_job import write_job

pytestmark = pytest.mark.interpreter

ROOT = Path(__file__).resolve().parents[2]
FIXTURES = ROOT / "tests" / "fixtures" / "kernels"
CLI = [sys.executable, "-m", "kernelforge", "--kernels", str(FIXTURES)]




def job_file(tmp_path: Path, name="toy", device="interpret", tune="all-shapes", strategy="tpe", evaluations=5) -> Path:
    return write_job(tmp_path, name, device=device, tune=tune, strategy=strategy, evaluations=evaluations, seed=3)


def rows(db: Path, query: str):
    with sqlite3.connect(db) as conn:
        return conn.execute(query).fetchall()


def run_search(tmp_path, path, compile_enabled=False, device_name=None):
    catalog = Catalog.discover(FIXTURES)
    job = load_job(path, catalog)
    store = Store(f"sqlite:///{tmp_path / (job.name + '.db')}")
    recorder = Recorder()
    outcome = Search(job, catalog, store, recorder, compile_enabled=compile_enabled, device_name=device_name).run()
    return job, store, recorder, outcome


def test_search_stores_every_candidate_and_result(tmp_path):
    job, store, recorder, outcome = run_search(tmp_path, job_file(tmp_path), compile_enabled=True)
    assert outcome.evaluations == 5
    kinds = [k for k, _ in recorder.events]
    assert kinds[0] == "start" and kinds[1] == "baseline" and kinds[-1] == "end"
    # The baseline point is enqueued first and answered from the store, not re-measured.
    assert kinds[2] == "duplicate"
    candidates = store.candidates("toy/axpy")
    assert len(candidates) == 6 and {c.origin for c in candidates} == {"baseline", "optuna"}
    assert all(c.source.startswith("{#-") is False and "def run(" in c.source for c in candidates)
    results = store.results(block="toy/axpy")
    assert len(results) == 6 * 3 and all(r.ok and r.median_s for r in results)
    compiles = [store.compile(c.id, "sm_90", "float16") for c in candidates]
    assert all(c and c.status == "ok" and c.kernels[0]["registers"] for c in compiles)


def test_rerun_continues_without_measuring_anything_twice(tmp_path):
    path = job_file(tmp_path, evaluations=3)
    run_search(tmp_path, path)
    path.write_text(path.read_text().replace("evaluations = 3", "evaluations = 5"))
    _, store, _, outcome = run_search(tmp_path, path)
    assert outcome.evaluations == 2  # only the extra budget
    assert store.counts() == StoreCounts(candidates=6, results=18)


def test_per_shape_tuning_has_a_budget_per_shape(tmp_path):
    _, store, recorder, outcome = run_search(tmp_path, job_file(tmp_path, tune="per-shape", evaluations=2))
    assert outcome.evaluations == 2 * 3
    assert {d["budgets"]["toy/axpy"] for k, d in recorder.events if k == "start"} == {6}


def test_replay_answers_from_a_recording(tmp_path):
    job, store, _, _ = run_search(tmp_path, job_file(tmp_path, name="rec", strategy="grid", evaluations=9))
    recording = tmp_path / "rec.db"
    path = job_file(tmp_path, name="rep", device=f"replay:{recording}", strategy="grid", evaluations=9)
    _, replayed, _, outcome = run_search(tmp_path, path)
    assert outcome.evaluations == 8  # the grid's 9 points, less the baseline answered from the store
    original = {(r.candidate_id, r.shape): r.median_s for r in store.results()}
    again = {(r.candidate_id, r.shape): r.median_s for r in replayed.results()}
    assert again == original
    assert all("replay" in r.env["device"] for r in replayed.results())


def _as_from_a_terminal() -> None:
    # A search typed at a terminal gets Ctrl-C. One started by a job launched in the background
    # of a non-interactive shell (`make test &`, nohup) inherits SIGINT ignored and rightly keeps
    # ignoring it: the test models the terminal whatever launched the suite.
    signal.signal(signal.SIGINT, signal.SIG_DFL)
    signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT})


def _spawn(path: Path, cwd: Path) -> subprocess.Popen:
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    return subprocess.Popen([*CLI, "search", str(path), "--progress", "jsonl", "--no-compile", "--no-report"],
                            cwd=cwd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env,
                            preexec_fn=_as_from_a_terminal)


def _wait_for_evaluations(proc: subprocess.Popen, count: int) -> None:
    seen = 0
    for line in proc.stdout:
        if json.loads(line)["event"] == "evaluated":
            seen += 1
            if seen >= count:
                return
    raise AssertionError(f"search ended before {count} evaluations: {proc.stderr.read()}")


@pytest.mark.parametrize("sig", [signal.SIGKILL, signal.SIGINT], ids=["sigkill", "ctrl-c"])
def test_killed_search_resumes_to_the_full_budget(tmp_path, sig):
    # One study per shape, 3 x 8 evaluations of one shape each (every point of the toy space on
    # every shape): many evaluations are left when the signal lands.
    path = job_file(tmp_path, name="kill", tune="per-shape", evaluations=8)
    proc = _spawn(path, tmp_path)
    _wait_for_evaluations(proc, 3)
    proc.send_signal(sig)
    code = proc.wait(timeout=120)
    proc.stdout.close()
    proc.stderr.close()
    assert code == (-signal.SIGKILL if sig == signal.SIGKILL else 130)
    db = tmp_path / "reports" / "kill" / "kernelforge.db"
    stored_before = set(rows(db, "select candidate_id, shape from kf_results"))
    assert len(stored_before) >= 3 + 3  # the baseline on every shape, and three evaluations
    finish = subprocess.run([*CLI, "search", str(path), "--progress", "quiet", "--no-compile"], cwd=tmp_path,
                            capture_output=True, text=True, timeout=300)
    assert finish.returncode == 0, finish.stderr
    after = rows(db, "select candidate_id, shape from kf_results")
    assert stored_before <= set(after), "a stored result was lost"
    assert len(after) == len(set(after)), "a result was stored twice"
    evaluated = {c for c, _ in after}
    assert len(evaluated) == 8 + 1  # each study's budget plus the baseline: every point, on every shape
    assert len(after) == 9 * 3
    assert (tmp_path / "reports" / "kill" / "REPORT.md").exists()


def test_a_candidate_stored_on_some_shapes_of_its_group_is_not_spent(tmp_path):
    """A run stopped between two shapes of an all-shapes group (a kill, a full disk) leaves a
    candidate stored on some of them: that is no evaluation yet. Counting it as spent, beside the
    killed worker's open claim on it (or the unit a released claim gives back), left the rerun one
    evaluation short of the job's budget."""
    from kernelforge.search.plan import already_spent, plan_studies

    path = job_file(tmp_path, strategy="grid", evaluations=4)
    job, store, _, _ = run_search(tmp_path, path)
    catalog = Catalog.discover(FIXTURES)
    [planned] = plan_studies(job, catalog)
    assert already_spent(store, job, catalog, planned) == 4
    db = tmp_path / f"{job.name}.db"
    baseline = next(c.id for c in store.candidates() if c.origin == "baseline")
    [victim, *_] = sorted({c for (c,) in rows(db, "select candidate_id from kf_results")} - {baseline})
    with sqlite3.connect(db) as conn:
        conn.execute("delete from kf_results where candidate_id = ? and shape = 'n63'", (victim,))
    assert already_spent(store, job, catalog, planned) == 3
    run_search(tmp_path, path)
    results = rows(db, "select candidate_id, shape from kf_results")
    assert len(results) == len(set(results)), "a result stored twice"
    complete = [c for c in {c for c, _ in results} if sum(1 for r, _ in results if r == c) == 3]
    assert len(complete) == 1 + 4, "the baseline and the job's 4 evaluations, each on every shape"


def test_confirmation_retimes_the_best_against_the_baseline_and_reports_it(tmp_path):
    from kernelforge.search.confirm import confirm
    from kernelforge.report.collect import collect
    from kernelforge.report.markdown import to_markdown

    job, store, _, _ = run_search(tmp_path, job_file(tmp_path, strategy="grid", evaluations=3))
    baseline_id = next(c.id for c in store.candidates() if c.origin == "baseline")
    other = next(c.id for c in store.candidates() if c.origin != "baseline")
    # Make one candidate look 10x faster in its single measurement: confirmation must re-time it.
    with sqlite3.connect(tmp_path / "toy.db") as conn:
        conn.execute("update kf_results set median_s = median_s / 10, p20_s = p20_s / 10, p80_s = p80_s / 10 "
                     "where candidate_id = ?", (other,))
    catalog = Catalog.discover(FIXTURES)
    search = Search(job, catalog, store, Recorder(), compile_enabled=False)
    run = search.prepare()  # the executor ready, the environment described, the baselines known
    try:
        winners = confirm(run, top=1)
    finally:
        search.close()
    rows_ = store.confirmations(job.name)
    assert {r.shape for r in rows_} == {"n1", "n7", "n63"}
    assert all(r.candidate_id == other and len(r.speedups) == 2 for r in rows_[-3:])
    assert all(r.baseline_id == baseline_id for r in rows_)
    assert len(winners["toy/axpy"]) == 3
    data = collect(job, catalog, store)
    [block] = data.blocks
    assert all(row.confirmed and row.winner == other for row in block.shapes)
    # The report shows the confirmed (re-timed) figures, not the doctored 10x single measurement:
    # the pairs' median times and their ratio, beside the median of the per-pair speedups.
    latest = {r.shape: r.median for r in rows_}  # a re-run's confirmation supersedes earlier ones
    assert all(row.measured_by == "pairs" and row.pair_speedup == latest[row.shape] for row in block.shapes)
    assert all(row.speedup == pytest.approx(row.baseline_s / row.best_s) for row in block.shapes)
    stored = {(r.candidate_id, r.shape): r for r in store.results(block="toy/axpy")}
    # The doctored single timings, kept apart and labelled: the candidate's against the baseline as
    # timed most recently before it (the search re-times it beside the candidates).
    series = BaselineSeries({s: r for (c, s), r in stored.items() if c == baseline_id},
                            store.baseline_timings("toy/axpy"))
    assert all(row.search_speedup == pytest.approx(baseline_at(series, stored[(other, row.shape)]).median_s
                                                   / stored[(other, row.shape)].median_s)
               for row in block.shapes)
    assert all(row.search_baseline_s == baseline_at(series, stored[(other, row.shape)]).median_s
               for row in block.shapes)
    markdown = to_markdown(data)
    assert "not GPU measurements" in markdown and "| n63 |" in markdown


def test_a_replay_never_reads_its_own_database_nor_another_blocks_recording(tmp_path):
    run_search(tmp_path, job_file(tmp_path, name="rec", strategy="grid", evaluations=3))
    recording = tmp_path / "rec.db"
    before = rows(recording, "SELECT count(*) FROM kf_results")
    with pytest.raises(UserError, match=f"device replay:{recording} is the database this search stores into"):
        run_search(tmp_path, job_file(tmp_path, name="rec", device=f"replay:{recording}", strategy="grid"))
    assert rows(recording, "SELECT count(*) FROM kf_results") == before
    # A recording of another shape set (or block) is refused before anything is stored, so the
    # right recording replays afterwards under the same job.
    with sqlite3.connect(recording) as conn:
        conn.execute("UPDATE kf_results SET shape = 'other/' || shape")
    path = job_file(tmp_path, name="rep", device=f"replay:{recording}", strategy="grid", evaluations=3)
    with pytest.raises(UserError, match=f"replay:{recording}: the recording holds no result of toy/axpy at shape "
                                        r"\S+; it holds other/"):
        run_search(tmp_path, path)
    assert rows(tmp_path / "rep.db", "SELECT count(*) FROM kf_results") == [(0,)]
    with sqlite3.connect(recording) as conn:
        conn.execute("UPDATE kf_results SET shape = substr(shape, 7)")
    assert run_search(tmp_path, path)[3].evaluations == 3  # the right recording replays under the same job


def test_a_changed_block_stops_the_search_before_its_stored_verdicts_answer(tmp_path):
    import shutil

    kernels = tmp_path / "kernels"
    shutil.copytree(FIXTURES, kernels)
    path = job_file(tmp_path, name="judged", strategy="grid", evaluations=3)
    catalog = Catalog.discover(kernels)
    job = load_job(path, catalog)
    store = Store(f"sqlite:///{tmp_path / 'judged.db'}")
    assert Search(job, catalog, store, Recorder(), compile_enabled=False).run().evaluations == 3
    block = kernels / "toy" / "axpy" / "block.py"
    text = block.read_text()
    block.write_text(text.replace('"""', '"""A reworded docstring. ', 1) + "\n# a comment\n")  # no verdict changes
    assert Search(job, Catalog.discover(kernels), store, Recorder(), compile_enabled=False).run().complete
    block.write_text(text.replace("def reference(", "def reference_(", 1).replace(
        "    def counts(", "    def reference(self, **inputs):\n        return 2 * self.reference_(**inputs)\n\n"
        "    def counts(", 1))
    with pytest.raises(UserError, match="block toy/axpy .* changed since job judged's results of it were stored"):
        Search(job, Catalog.discover(kernels), store, Recorder(), compile_enabled=False).run()
    accepted = Search(job, Catalog.discover(kernels), store, Recorder(), compile_enabled=False,
                      accept_block_change=True).run()
    assert accepted.complete  # recorded: the next run goes on without the flag
    assert Search(job, Catalog.discover(kernels), store, Recorder(), compile_enabled=False).run().complete
