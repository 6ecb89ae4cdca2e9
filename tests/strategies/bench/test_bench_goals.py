"""The goals a strategy is held to on a space: each verdict follows the figures, and each can fail."""

from __future__ import annotations

import math

import pytest

from kernelforge.strategies.bench.goals import EARLY, QUICK, Verdict, goals, tally
from kernelforge.strategies.bench.report import format_goals
from kernelforge.strategies.bench.run import BenchRow, SpaceBench

BUDGET = 300


def row(strategy: str, median: float, hit: float, at: dict[int, float]) -> BenchRow:
    return BenchRow(strategy=strategy, seeds=20, budget=BUDGET, optimum=1.0, median_evaluations={0.01: median},
                    hit_rate={0.01: hit}, median_best_ratio=1.0, median_best_ratio_at=at, ask_ms_median=1.0,
                    ask_ms_p95=2.0, median_free_tells=0.0, seconds=1.0, runs=())


def space(*rows: BenchRow) -> SpaceBench:
    return SpaceBench(name="conv", device="GPU", feasible=100, grid_size=200, optimum=1.0, optimum_point={},
                      budget=BUDGET, seeds=20, rows=rows)


TPE = row("tpe", 90, 0.9, {10: 1.5, 25: 1.3, 50: 1.2, 100: 1.1, 200: 1.0})
RANDOM = row("random", BUDGET + 1, 0.1, {10: 1.6, 25: 1.5, 50: 1.4, 100: 1.3, 200: 1.2})


def verdicts(auto: BenchRow, tpe: BenchRow = TPE, random: BenchRow = RANDOM) -> list[Verdict]:
    found = goals(space(auto, tpe, random))
    assert {g.strategy for g in found} == {"auto"} and {g.space for g in found} == {"conv"}
    return [g.verdict for g in found]


def test_a_strategy_ahead_on_every_figure_meets_every_goal():
    found = goals(space(row("auto", 45, 1.0, {10: 1.6, 25: 1.2, 50: 1.0, 100: 1.0, 200: 1.0}), TPE, RANDOM))
    assert [g.verdict for g in found] == [Verdict.MET] * (3 + len(EARLY))
    assert [(g.value, g.against) for g in found][:3] == [("45", "90"), ("100%", "90%"), ("45", ">300")]
    assert tally(found) == {Verdict.MET: 6, Verdict.MISSED: 0, Verdict.NOT_APPLICABLE: 0}


@pytest.mark.parametrize("auto, missed", [
    (row("auto", 61, 1.0, {25: 1.2, 50: 1.0, 100: 1.0}), 0),   # 61 > 2/3 of 90
    (row("auto", 45, 0.8, {25: 1.2, 50: 1.0, 100: 1.0}), 1),   # a lower hit rate
    (row("auto", 45, 1.0, {25: 1.31, 50: 1.0, 100: 1.0}), 3),  # behind tpe at 25
    (row("auto", 45, 1.0, {25: 1.2, 50: 1.0, 100: math.inf}), 5),  # nothing found by 100
])
def test_each_goal_misses_on_its_own_figure(auto, missed):
    found = verdicts(auto)
    assert [i for i, v in enumerate(found) if v is Verdict.MISSED] == [missed]


def test_a_quick_reference_makes_the_fraction_goal_not_apply_and_a_miss_never_meets_it():
    quick = row("tpe", QUICK, 1.0, {25: 1.0, 50: 1.0, 100: 1.0})
    assert verdicts(row("auto", 29, 1.0, {25: 1.0, 50: 1.0, 100: 1.0}), quick)[0] is Verdict.NOT_APPLICABLE
    missed = row("tpe", BUDGET + 1, 0.1, {25: 1.5, 50: 1.5, 100: 1.5})
    both = verdicts(row("auto", BUDGET + 1, 0.2, {25: 1.2, 50: 1.1, 100: 1.05}), missed, RANDOM)
    assert both[0] is Verdict.MISSED and both[2] is Verdict.MISSED  # a miss is never "at most random's"


def test_worse_than_random_is_a_miss():
    random = row("random", 40, 0.9, {25: 1.5, 50: 1.4, 100: 1.3})
    assert verdicts(row("auto", 45, 1.0, {25: 1.2, 50: 1.0, 100: 1.0}), TPE, random)[2] is Verdict.MISSED


def test_no_goal_without_the_reference_or_the_floor_and_the_summary_says_each_verdict():
    auto = row("auto", 45, 1.0, {25: 1.2, 50: 1.0, 100: 1.0})
    assert goals(space(auto, RANDOM)) == () and goals(space(auto, TPE)) == ()
    assert format_goals([space(auto, RANDOM)]) == ""
    text = format_goals([space(row("auto", 61, 1.0, {25: 1.2, 50: 1.0, 100: 1.0}), TPE, RANDOM)])
    assert text.splitlines()[0].endswith("met 5, missed 1, not applicable 0")
    assert "conv auto: missed, evaluations to 1% at most 0.67 of tpe's where tpe needs more than 30 (61 against 90)" \
        in text
