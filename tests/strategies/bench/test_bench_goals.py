"""The goals a strategy is held to on a space: each verdict follows the figures, and each can fail."""

from __future__ import annotations

import json
import math
import statistics
from dataclasses import replace
from pathlib import Path

import pytest
from click.testing import CliRunner

from kernelforge.cli.main import main
from kernelforge.strategies.bench.goals import EARLY, QUICK, Verdict, goals, tally, transfer_goals, transfer_pairs
from kernelforge.strategies.bench.report import format_goals
from kernelforge.strategies.bench.run import BenchRow, BenchRun, SpaceBench, evaluations_text, median_is_bound
from markdown_tables import markdown_tables

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
    assert tally(found) == {Verdict.MET: 6, Verdict.MISSED: 0, Verdict.UNDECIDED: 0, Verdict.NOT_APPLICABLE: 0}


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
    # Both missed in most seeds: neither median says how long a longer run would take, so neither
    # goal is met, nor shown missed.
    assert both[0] is Verdict.UNDECIDED and both[2] is Verdict.UNDECIDED


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


def seeds_row(strategy: str, reached: list[int | None], budget: int = 100) -> BenchRow:
    """A row whose seeds reached 1% after ``reached`` evaluations (None: missed in the budget)."""
    runs = tuple(BenchRun(strategy=strategy, seed=i, evaluations=budget, free_tells=0, best_time=1.0,
                          reached={0.01: n}, best_at={}, ask_ms=(), seconds=0.0) for i, n in enumerate(reached))
    counted = [n if n is not None else budget + 1 for n in reached]
    return replace(row(strategy, statistics.median(counted), sum(n is not None for n in reached) / len(reached), {}),
                   budget=budget, seeds=len(reached), runs=runs)


@pytest.mark.parametrize("reached, text", [
    ([25, 27], "26"), ([25, None], "≥63"), ([None, None, 10], ">100"), ([10, None, 12], "12"), ([10, None, 99], "99"), ([None, None, 99, 10], "≥100"),
])
def test_a_median_with_a_missed_seed_among_its_middle_values_is_printed_as_a_bound(reached, text):
    assert evaluations_text(seeds_row("tpe", reached), 0.01) == text
    assert median_is_bound(seeds_row("tpe", reached), 0.01) is (text[0] in "≥>")


@pytest.mark.parametrize("auto, tpe, verdict", [
    ([20, 27], [None, 60], Verdict.MET),         # 23.5 within 2/3 of a median of at least 80.5
    ([60, 61], [None, 60], Verdict.UNDECIDED),   # 60.5 against at least 80.5: tpe's longer runs decide
    ([None, 15], [85, 95], Verdict.UNDECIDED),   # at least 58 against 60: auto's longer runs decide
    ([None, 20], [85, 95], Verdict.MISSED),      # at least 60.5 is past 2/3 of 90 however long it runs
    ([20, 27], [None, 25], Verdict.MET),         # tpe needs at least 63: more than 30, and 23.5 is within 2/3
])
def test_a_goal_against_a_median_that_is_a_bound_is_met_or_missed_only_where_the_bound_decides(auto, tpe, verdict):
    found = goals(replace(space(seeds_row("auto", auto), seeds_row("tpe", tpe), seeds_row("random", [None, None])),
                          budget=100))
    assert found[0].verdict is verdict
    assert found[2].verdict is (Verdict.UNDECIDED if None in auto else Verdict.MET)  # random: more than 100
    if verdict is Verdict.UNDECIDED:
        assert format_goals([replace(space(seeds_row("auto", auto), seeds_row("tpe", tpe),
                                           seeds_row("random", [None, None])), budget=100)]).count("undecided") >= 2


# -- transfer: a space benched cold and warm ---------------------------------------------------------

def warm_of(bench: SpaceBench, source: str = "other") -> SpaceBench:
    return replace(bench, warm_from=source, warm_points=4)


@pytest.mark.parametrize("warm_median, verdicts", [
    (22, [Verdict.MET, Verdict.MET]),        # halves 45
    (30, [Verdict.MISSED, Verdict.MET]),     # better, not halved
    (50, [Verdict.MISSED, Verdict.MISSED]),  # worse than cold
    (BUDGET + 1, [Verdict.MISSED, Verdict.MISSED]),  # missed 1% in most seeds
])
def test_a_warm_start_halves_or_is_never_worse_per_strategy(warm_median, verdicts):
    at = {25: 1.2, 50: 1.0, 100: 1.0}
    cold = space(row("auto", 45, 1.0, at), TPE, RANDOM)
    warm = warm_of(space(row("auto", warm_median, 1.0, at), row("tpe", 90, 0.9, at), RANDOM))
    found = transfer_goals(cold, warm)
    assert [g.strategy for g in found] == ["auto", "auto", "tpe", "tpe"]  # random is the floor, not judged
    assert [g.verdict for g in found[:2]] == verdicts
    assert all("warm from other" in g.goal for g in found) and found[0].against == "45"
    assert [g.verdict for g in found[2:]] == [Verdict.MISSED, Verdict.MET]  # tpe: 90 against 90


def test_a_reference_whose_median_is_a_bound_under_quick_leaves_the_fraction_goal_undecided():
    # A budget of 20: tpe's median is at least 13, so it may need more than 30 evaluations, or fewer.
    found = goals(replace(space(seeds_row("auto", [5, 6], 20), seeds_row("tpe", [None, 5], 20),
                                seeds_row("random", [None, None], 20)), budget=20))
    assert (found[0].verdict, found[0].against) == (Verdict.UNDECIDED, "≥13")


def test_a_transfer_goal_against_a_cold_median_that_is_a_bound_is_undecided_unless_the_bound_decides():
    cold = replace(space(seeds_row("auto", [None, 40]), RANDOM), budget=100)
    for warm_median, verdicts in (([40, 50], [Verdict.UNDECIDED, Verdict.MET]),    # 45 against at least 70.5
                                  ([30, 34], [Verdict.MET, Verdict.MET]),          # 32 within half of 70.5
                                  ([None, 90], [Verdict.UNDECIDED, Verdict.UNDECIDED])):
        warm = warm_of(replace(space(seeds_row("auto", warm_median), RANDOM), budget=100))
        assert [g.verdict for g in transfer_goals(cold, warm)] == verdicts, warm_median


def test_only_a_space_benched_both_ways_with_the_same_seeds_and_budget_is_paired():
    cold = space(row("auto", 45, 1.0, {}), RANDOM)
    warm = warm_of(space(row("auto", 20, 1.0, {}), RANDOM))
    assert transfer_pairs([cold, warm]) == [(cold, warm)]
    assert transfer_pairs([warm]) == [] and transfer_pairs([cold]) == []
    assert transfer_pairs([replace(cold, seeds=10), warm]) == []
    assert "transfer goals" in format_goals([cold, warm]) and "transfer goals" not in format_goals([cold])


PARAMS = {"bx": [16, 32, 48, 64, 96, 128], "tile": [1, 2, 3, 4]}


def _cache(path: Path, best_bx: int, device: str) -> Path:
    cache = {f"{bx},{tile}": {"time": 1.0 + abs(bx - best_bx) / 16 + abs(tile - 2) * 0.7}
             for bx in PARAMS["bx"] for tile in PARAMS["tile"]}
    path.write_text(json.dumps({"device_name": device, "tune_params": PARAMS, "cache": cache}))
    return path


def test_the_bench_runs_cold_then_warm_and_reads_the_transfer_goals_from_the_same_runs(tmp_path):
    target, source = _cache(tmp_path / "k_a.json", 64, "GPU A"), _cache(tmp_path / "k_b.json", 48, "GPU B")
    result = CliRunner().invoke(main, ["strategy-bench", str(target), "--warm-from", str(source), "--with-cold",
                                       "--strategy", "auto", "--seeds", "3", "--budget", "20", "--jobs", "1",
                                       "--json", str(tmp_path / "b.json"), "--markdown", str(tmp_path / "b.md")])
    assert result.exit_code == 0, result.output
    cold, warm = json.loads((tmp_path / "b.json").read_text())["spaces"]
    assert (cold["warm_from"], warm["warm_from"]) == (None, "k_b") and cold["space"] == warm["space"] == "k_a"
    medians = [next(s for s in x["strategies"] if s["strategy"] == "auto")["median_evaluations"]["0.01"]
               for x in (warm, cold)]
    shown = [">20" if m > 20 else f"{m:g}" for m in medians]
    assert f"k_a auto: {'met' if medians[0] <= medians[1] else 'missed'}, warm from k_b: evaluations to 1% at most " \
           f"cold's ({shown[0]} against {shown[1]})" in result.output
    assert "k_a (warm from k_b) auto: @10" in result.output
    tables = markdown_tables((tmp_path / "b.md").read_text())
    assert [row[0] for row in tables[0][2:]] == ["k_a (GPU A)", "k_a (GPU A; warm from k_b)"]
    assert tables[-1][0] == ["space", "strategy", "goal", "value", "cold", "verdict"]
    assert [row[3:5] for row in tables[-1][2:]] == [shown, shown]


def test_with_cold_needs_a_warm_start():
    result = CliRunner().invoke(main, ["strategy-bench", "anything.json", "--with-cold"])
    assert result.exit_code != 0 and "--with-cold compares a warm start with a cold one: add --warm-from SPACE" \
        in result.output


def test_a_spaces_goals_cold_and_warm_are_told_apart():
    at = {25: 1.2, 50: 1.0, 100: 1.0}
    cold = space(row("auto", 45, 1.0, at), TPE, RANDOM)
    warm = warm_of(space(row("auto", 20, 1.0, at), TPE, RANDOM))
    assert {g.where for g in goals(cold)} == {"conv"} and {g.where for g in goals(warm)} == {"conv (warm from other)"}
    text = format_goals([cold, warm])
    assert "\nconv auto: met, hit rate" in text and "\nconv (warm from other) auto: met, hit rate" in text
    assert all(g.warm_from is None for g in transfer_goals(cold, warm))  # their goal names the warm start
