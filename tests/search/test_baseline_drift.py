"""Baseline drift cannot decide a ranking (issue 32): the search re-times the baseline beside the
candidates, stores every timing, and compares each candidate with the baseline as timed most
recently before it; the report shows the baseline's spread.

The device here really drifts: the interpreter, with a sleep inside every timed call that is long
for the first timing it takes (the baseline's first) and short afterwards, as a machine that was
busy or throttled when the search started. On the shape n63 every point of the toy axpy space
launches one program (BLOCK >= 64), so every candidate does the baseline's work.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Sequence

from kernelforge.baseline_timing import BaselineSeries, BaselineTiming, baseline_at
from kernelforge.catalog import Catalog
from kernelforge.devices.base import Before, Call
from kernelforge.devices.interpret import InterpretDevice
from kernelforge.execute.inprocess import InProcessExecutor
from kernelforge.job import load_job
from kernelforge.objective import baseline_results, by_candidate, rank, speedup, time_ratio
from kernelforge.report.collect import collect
from kernelforge.result import Status, StoredResult
from kernelforge.search.search import Search
from kernelforge.store.store import Store
from kf_progress import Recorder

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "kernels"
CATALOG = Catalog.discover(FIXTURES)
#: Seconds each timed call sleeps: the first timing taken, then every later one (10x apart; the
#: interpreter's own work on the shape, one program, is a small fraction of FAST_S).
SLOW_S, FAST_S = 2.0, 0.2

JOB = """
[job]
name = "drift"
device = "interpret"
dtype = "float16"

[strategy]
name = "grid"
evaluations = 4
baseline_every = 1

[[blocks]]
id = "toy/axpy"
shapes = "n63"
"""


class DriftingDevice(InterpretDevice):
    """The interpreter on a machine whose speed drifts: every timed call also sleeps, SLOW_S while
    the device takes its first timing and FAST_S afterwards. One timed call per timing."""

    def __init__(self) -> None:
        super().__init__(warmup=0, repeats=1)
        self.timings = 0

    def time(self, calls: Sequence[Call], *, working_set_bytes: int = 0, before: Before | None = None,
             method: str | None = None):
        pause = SLOW_S if self.timings == 0 else FAST_S
        self.timings += 1

        def slowed(call: Call) -> Call:
            def run():
                out = call()
                time.sleep(pause)
                return out
            return run

        return super().time([slowed(c) for c in calls], working_set_bytes=working_set_bytes, before=before,
                            method=method)


def test_a_drifting_device_does_not_rank_a_candidate_as_faster(tmp_path):
    path = tmp_path / "drift.toml"
    path.write_text(JOB)
    job = load_job(path, CATALOG)
    store = Store(f"sqlite:///{tmp_path / 'drift.db'}")
    recorder = Recorder()
    search = Search(job, CATALOG, store, recorder, compile_enabled=False, in_process=True)
    search.executor = InProcessExecutor(DriftingDevice())
    outcome = search.run()
    assert outcome.evaluations >= 3

    run = search.run_context
    baseline = run.baselines["toy/axpy"]["n63"]
    first = store.find_result(baseline.id, "n63", run.dtype_name, run.env_key)
    assert first is not None and first.ok
    retimed = store.baseline_timings("toy/axpy", run.dtype_name, run.env_key)
    # Re-timed beside every candidate (baseline_every = 1), after the drift: the stored timings
    # show it (the first timing is the slow one).
    assert len(retimed) >= outcome.evaluations
    assert all(t.baseline_id == baseline.id and t.shape == "n63" for t in retimed)
    # The progress events say so, with the baseline's id as every measuring event's candidate.
    measuring = [data for kind, data in recorder.events if kind == "measuring"]
    assert {d["candidate"] for d in measuring if d.get("retimed")} == {baseline.id}
    assert all(store.candidate(d["candidate"]) is not None for d in measuring)
    assert first.median_s > 5 * max(t.median_s for t in retimed)

    table = by_candidate(r for r in store.results(block="toy/axpy") if r.env_key == run.env_key)
    plain = baseline_results(table, {"n63": baseline.id})
    series = BaselineSeries(plain, retimed)
    candidates = [cid for cid in table if cid != baseline.id]
    assert len(candidates) >= 3
    # Against the first baseline timing alone (one timing deciding every ranking), the drift makes
    # each candidate several times "faster" ...
    assert all(s > 5 for cid, s in rank(table, plain, ["n63"]) if cid != baseline.id)
    # ... against the baseline timed beside it, none ranks as faster than the noise allows.
    ranked = rank(table, series, ["n63"])
    assert len(ranked) == len(candidates) + 1 and all(s < 1.5 for _, s in ranked)
    # What the strategy was told during the search is that comparison too.
    told = [e["speedup"] for e in recorder.of("evaluated") if e.get("speedup") is not None]
    assert len(told) == outcome.evaluations and all(s < 1.5 for s in told)

    # The report: each row's search figures come from one comparison, and the baseline's spread
    # (every stored timing of it) shows the drift.
    report = collect(job, CATALOG, store)
    (row,) = report.blocks[0].shapes
    assert row.search_speedup is not None and row.search_speedup < 1.5
    assert row.baseline_timings[:len(retimed) + 1] == (first.median_s, *(t.median_s for t in retimed))
    assert row.baseline_spread is not None and row.baseline_spread > 5
    if not row.winner_is_baseline and row.measured_by == "search":
        assert abs(row.search_baseline_s / row.search_best_s - row.search_speedup) < 1e-9
    store.close()


def _result(created: float, median: float, candidate: str = "base") -> StoredResult:
    return StoredResult(candidate_id=candidate, block="b", shape="s", dtype="float16", device="interpret",
                        env_key="e", status=Status.OK, rel_error=0.0, median_s=median, p20_s=median, p80_s=median,
                        samples=3, timing_method="interpreter-wall", timing_label="", joules=None, flops=None,
                        bytes=None, message="", env={}, job="j", created=created)


def _timing(created: float, median: float, **other) -> BaselineTiming:
    fields = dict(job="j", block="b", shape="s", dtype="float16", env_key="e", baseline_id="base",
                  median_s=median, p20_s=median, p80_s=median, timing_method="interpreter-wall", created=created)
    return BaselineTiming(**{**fields, **other})


def test_a_result_is_compared_with_the_baseline_timed_most_recently_before_it():
    series = BaselineSeries({"s": _result(10.0, 8.0)},
                            [_timing(30.0, 2.0), _timing(20.0, 4.0),
                             # not the same conditions: ignored
                             _timing(25.0, 100.0, baseline_id="other"), _timing(25.0, 100.0, env_key="f"),
                             _timing(25.0, 100.0, timing_method="cuda-events"), _timing(25.0, 100.0, dtype="bfloat16")])
    assert series.at("s", 5.0).median_s == 8.0     # before any re-timing: the first timing
    assert series.at("s", 20.0).median_s == 4.0    # a re-timing taken at that moment
    assert series.at("s", 29.0).median_s == 4.0
    assert series.at("s", 99.0).median_s == 2.0
    assert series.at("x", 99.0) is None
    assert series.timings("s") == (8.0, 4.0, 2.0)
    assert dict(series) == {"s": series["s"]} and series["s"].median_s == 8.0
    candidate = _result(21.0, 4.0, candidate="c")
    assert baseline_at(series, candidate).median_s == 4.0
    assert speedup(baseline_at(series, candidate), candidate) == 1.0
    assert time_ratio([candidate], series) == 1.0
    assert time_ratio([candidate], {"s": series["s"]}) == 0.5  # a plain mapping: the first timing
