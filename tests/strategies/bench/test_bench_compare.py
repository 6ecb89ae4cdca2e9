"""A strategy against tpe (``strategies/bench/compare.py``): evaluations to 1% and the median
best/optimum at each checkpoint as fractions of tpe's, on runs whose figures are worked out by hand."""

from __future__ import annotations

import statistics

import pytest

from kernelforge.strategies.bench.compare import checkpoint_fractions, relative
from kernelforge.strategies.bench.report import format_summary, to_json
from kernelforge.strategies.bench.run import BenchRun, SpaceBench, summarise
from kernelforge.strategies.bench.stats import fraction_interval

BUDGET = 30


def run(name: str, seed: int, at10: float, at25: float, first: int = 1) -> BenchRun:
    """A run on a space whose optimum is 1.0: nothing before evaluation ``first``, ``at10`` from
    there to evaluation 10, halfway to ``at25`` from 11 to 24, ``at25`` from 25 on."""
    trace = tuple(None if n < first else at10 if n <= 10 else (at10 + at25) / 2 if n < 25 else at25
                  for n in range(1, BUDGET + 1))
    reached = {t: next((n for n, b in enumerate(trace, 1) if b is not None and b <= 1 + t), None)
               for t in (0.01, 0.05, 0.10)}
    return BenchRun(name, seed, BUDGET, 0, at25, reached, {}, (1.0,), 0.0, trace)


def space(*rows) -> SpaceBench:
    return SpaceBench("toy", None, 100, 100, 1.0, {}, BUDGET, len(rows[0].runs), rows)


def test_checkpoint_fractions_are_ratios_of_medians_with_their_intervals():
    auto = summarise("auto", tuple(run("auto", s, a, b) for s, (a, b) in
                                   enumerate([(1.2, 1.0), (1.1, 1.0), (1.5, 1.2), (1.3, 1.0), (1.2, 1.1)])), BUDGET, 1.0)
    tpe = summarise("tpe", tuple(run("tpe", s, a, b) for s, (a, b) in
                                 enumerate([(1.6, 1.2), (1.4, 1.3), (2.0, 1.2), (1.5, 1.5), (1.6, 1.1)])), BUDGET, 1.0)
    at10, at25 = checkpoint_fractions(auto, tpe)
    assert (at10.evaluations, at25.evaluations) == (10, 25)
    assert at10.fraction == pytest.approx(1.2 / 1.6) and at25.fraction == pytest.approx(1.0 / 1.2)
    assert (at10.low, at10.high) == fraction_interval([1.2, 1.1, 1.5, 1.3, 1.2], [1.6, 1.4, 2.0, 1.5, 1.6])
    assert at10.low <= at10.fraction <= at10.high < 1.0
    # The reference against itself is even, to the last digit.
    assert all(f.fraction == 1.0 for f in checkpoint_fractions(tpe, tpe))


def test_a_checkpoint_where_a_seed_found_nothing_is_not_compared():
    late = tuple(run("auto", s, 1.2, 1.0, first=12 if s == 0 else 1) for s in range(3))
    auto, tpe = (summarise(n, tuple(run(n, s, 1.3, 1.1) for s in range(3)), BUDGET, 1.0) for n in ("auto", "tpe"))
    assert [f.evaluations for f in checkpoint_fractions(summarise("auto", late, BUDGET, 1.0), tpe)] == [25]
    assert [f.evaluations for f in checkpoint_fractions(auto, tpe)] == [10, 25]


def test_summary_and_json_carry_the_checkpoint_fractions():
    rows = [summarise(n, tuple(run(n, s, a + s / 10, 1.0) for s in range(4)), BUDGET, 1.0)
            for n, a in (("auto", 1.2), ("tpe", 1.5))]
    bench = space(*rows)
    (rel,) = relative(bench)
    text = format_summary([bench])
    assert "median best/optimum after n evaluations as a fraction of tpe's" in text
    median = statistics.median([1.2 + s / 10 for s in range(4)]) / statistics.median([1.5 + s / 10 for s in range(4)])
    assert f"toy: auto @10 {median:.3f} ({rel.at[0].low:.3f}-{rel.at[0].high:.3f}) @25 1.000 (1.000-1.000)" in text
    auto = to_json([bench])["spaces"][0]["strategies"][0]
    assert auto["vs_tpe"]["at"]["10"] == {"fraction": pytest.approx(median), "interval": [rel.at[0].low, rel.at[0].high]}
    assert auto["vs_tpe"]["at"]["25"]["fraction"] == 1.0
    assert "past a stop" not in text
    stopped = SpaceBench("toy", None, 100, 100, 1.0, {}, BUDGET, 4, tuple(rows), stopped=True)
    assert "runs stopped within 1%: past a stop, the best at the stop" in format_summary([stopped])


def test_a_strategy_with_a_seed_that_never_found_a_point_says_no_checkpoint_compares():
    never = tuple(run("auto", s, 1.2, 1.0, first=BUDGET + 1 if s == 0 else 1) for s in range(3))
    rows = (summarise("auto", never, BUDGET, 1.0), summarise("tpe", tuple(run("tpe", s, 1.3, 1.1) for s in range(3)),
                                                              BUDGET, 1.0))
    (rel,) = relative(space(*rows))
    assert rel.at == ()
    assert "toy: auto no checkpoint where every seed of both found a point" in format_summary([space(*rows)])
