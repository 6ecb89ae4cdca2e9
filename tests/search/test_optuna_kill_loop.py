"""Optuna's stored studies after a kill loop (issue 33): ten SIGKILLs at random moments and a final
run leave exactly the trials an uninterrupted run leaves, a faithful view of the store.

"The same trials" means: for each stored study (by name), the finished trials, as the multiset of
(state, point, kernelforge status), are equal between the interrupted job and the uninterrupted one;
no trial is left RUNNING or WAITING; and every trial's value is the objective of its point computed
from that job's own stored results (the time ratio to the baseline: interpreter timings differ
between the two jobs, so the values are compared with each job's store, not with each other). TPE
over the toy block's 9 points with a budget of 12 evaluates every point, so both jobs observe the
same points.
"""

from __future__ import annotations

import random
import signal
import sqlite3
import subprocess
from collections import Counter
from pathlib import Path

import pytest

from kernelforge.baseline_timing import BaselineSeries
from kernelforge.objective import by_candidate, time_ratio
from kernelforge.store.store import Store
from kills import kill_at_a_random_moment
from toy_job import CLI, toy_job

pytestmark = [pytest.mark.interpreter, pytest.mark.skipif(__import__("importlib").util.find_spec("optuna") is None,
                                                          reason="needs optuna")]

DB = Path("reports") / "toy" / "kernelforge.db"


def _search(folder: Path, job: Path, progress: str = "quiet") -> subprocess.Popen:
    return subprocess.Popen([*CLI, "search", str(job), "--progress", progress, "--no-compile", "--no-report",
                             "--in-process"], cwd=folder, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def _tpe_job(folder: Path) -> Path:
    folder.mkdir()
    job = toy_job(folder, "toy", evaluations=12)  # more than the space's 9 points: every point is evaluated
    job.write_text(job.read_text().replace('name = "grid"', 'name = "tpe"'))
    return job


def _finish(folder: Path, job: Path) -> None:
    proc = _search(folder, job)
    out, err = proc.communicate(timeout=600)
    assert proc.returncode == 0, err


def _objectives(db: Path) -> dict[tuple, float | None]:
    """point (sorted params) -> its time ratio to the baseline, from the store's results."""
    store = Store(f"sqlite:///{db}")
    try:
        candidates = store.candidates()
        table = by_candidate(store.results())
        timings = store.baseline_timings("toy/axpy")
    finally:
        store.close()
    (baseline,) = [c.id for c in candidates if c.origin == "baseline"]
    # Each result against the baseline as re-timed most recently before it, as the search tells it.
    series = BaselineSeries(table[baseline], timings)
    return {tuple(sorted(c.params.items())): time_ratio(table[c.id].values(), series) for c in candidates}


def _studies(db: Path) -> dict[str, Counter]:
    """study name -> Counter of (state, point, status) of its trials; checks each value against the store."""
    import optuna

    url = f"sqlite:///{db}"
    objectives = _objectives(db)
    out = {}
    for summary in optuna.get_all_study_summaries(storage=url):
        counts: Counter = Counter()
        for trial in optuna.load_study(study_name=summary.study_name, storage=url).get_trials():
            point = tuple(sorted(trial.params.items()))
            status = trial.user_attrs.get("kernelforge")
            counts[(trial.state.name, point, status)] += 1
            if status == "ok":
                assert trial.user_attrs["value"] == pytest.approx(objectives[point]), (summary.study_name, point)
        out[summary.study_name] = counts
    return out


def test_ten_random_sigkills_and_a_final_run_leave_the_trials_of_an_uninterrupted_run(tmp_path):
    reference = tmp_path / "reference"
    _finish(reference, _tpe_job(reference))
    expected = _studies(reference / DB)
    assert expected and all(sum(c.values()) == 9 for c in expected.values())  # one trial per point of the space

    folder = tmp_path / "interrupted"
    job = _tpe_job(folder)
    rng = random.Random(20261206)
    killed = 0
    for attempt in range(10):
        proc = _search(folder, job, progress="jsonl")
        killed += kill_at_a_random_moment(proc, rng, attempt, first=0.5, events=8, settle=0.2)
        proc.communicate(timeout=120)
    assert killed >= 8  # really interrupted, not left to finish
    _finish(folder, job)
    assert _studies(folder / DB) == expected
    with sqlite3.connect(folder / DB) as conn:
        assert conn.execute("select count(*) from trials where state in ('RUNNING', 'WAITING')").fetchone() == (0,)
        assert conn.execute("select count(*) from kf_workers").fetchone() == (0,)


DIE_AT_THE_NTH_WRITE = """
import os, signal, sys
from kernelforge.strategies.optuna.strategy import OptunaStrategy
keep, calls = OptunaStrategy._keep, []
def dying(self, *args):
    calls.append(args)
    if len(calls) == {n}:  # its results are stored; the trial is not yet written
        os.kill(os.getpid(), signal.SIGKILL)
    return keep(self, *args)
OptunaStrategy._keep = dying
sys.argv = ["kernelforge", *{argv!r}]
from kernelforge.cli.entry import main
main()
"""


def test_a_kill_between_storing_a_result_and_writing_its_trial_is_made_good_by_the_next_run(tmp_path):
    """SIGKILLed in the one moment when the last budgeted point's results are stored and its trial
    is not yet written: the next run has no budget left to ask it again, and still its stored study
    ends with one trial per point the store holds for it."""
    folder = tmp_path / "job"
    folder.mkdir()
    job = toy_job(folder, "toy", evaluations=3)
    job.write_text(job.read_text().replace('name = "grid"', 'name = "tpe"'))
    argv = [*CLI[3:], "search", str(job), "--progress", "quiet", "--no-compile", "--no-report", "--in-process"]
    # Writes: the baseline's trial, then the three evaluations': die at the last one's.
    code = DIE_AT_THE_NTH_WRITE.format(n=4, argv=argv)
    killed = subprocess.run([CLI[0], "-c", code], cwd=folder, capture_output=True, text=True, timeout=600)
    assert killed.returncode == -signal.SIGKILL, killed.stderr
    _finish(folder, job)
    (counts,) = _studies(folder / DB).values()
    stored = {point for point, value in _objectives(folder / DB).items()}
    assert sorted(point for (state, point, status) in counts.elements()) == sorted(stored)  # each once
    assert len(stored) == 4  # the baseline and 3 evaluations
