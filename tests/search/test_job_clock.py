"""The job's wall-clock cap counts from after its baselines and library references are measured
(issue 28): a slow start (JIT compiles, FlexAttention's first compile) must not eat the search."""

from __future__ import annotations

import pytest

from kernelforge.search import search as loop
from kernelforge.search.context import PROPOSALS_SHARE, JobClock
from test_search import job_file, run_search

pytestmark = pytest.mark.interpreter


def test_the_clock_splits_the_cap_between_proposals_and_confirmation():
    clock = JobClock.start(2.0, now=1000.0)
    assert clock.proposals_end == pytest.approx(1000.0 + PROPOSALS_SHARE * 120)
    assert clock.end == pytest.approx(1120.0)
    assert JobClock.start(None) == JobClock() and JobClock().end is None


def test_a_slow_start_does_not_eat_the_search(tmp_path, monkeypatch):
    """The library references take longer than the whole cap (a cold compile): the search still
    evaluates its budget, because its clock starts once they are measured."""
    now = [1000.0]
    monkeypatch.setattr(loop.time, "time", lambda: now[0])  # the search's clock, driven by the test
    measured = loop.measure_library_for_run

    def slow_library(run, plans):
        measured(run, plans)
        now[0] += 3600.0  # an hour of compiling, far past the job's 0.5-minute cap

    monkeypatch.setattr(loop, "measure_library_for_run", slow_library)
    path = job_file(tmp_path, strategy="grid", evaluations=3)
    path.write_text(path.read_text().replace("evaluations = 3", "evaluations = 3\nmax_minutes = 0.5"))
    _, _, recorder, outcome = run_search(tmp_path, path)
    assert outcome.evaluations == 3, recorder.events
