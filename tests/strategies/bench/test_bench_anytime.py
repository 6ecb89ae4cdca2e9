"""The bench's anytime figures (best/optimum at 10..200 evaluations, the area under that curve) and
its transfer (``--warm-from``: the best-ranked points of another GPU's recording asked first), on
tiny synthetic recorded spaces whose every figure can be worked out by hand."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner

from kernelforge.cli.main import main
from kernelforge.errors import UserError
from kernelforge.strategies.bench import anytime
from kernelforge.strategies.bench.run import bench, bench_spaces, run_one
from kernelforge.strategies.bench.report import format_space, format_summary, to_json
from kernelforge.strategies.bench.recorded import load_kernel_tuner_cache
from kernelforge.strategies.names import make_strategy
from kernelforge.strategies.transfer import WarmStart, other_recordings, rank_scores, same_kernel, warm_points, warm_start


def write_cache(path: Path, params: dict, records: dict, device: str = "GPU A") -> Path:
    path.write_text(json.dumps({"device_name": device, "tune_params": params, "cache": records}))
    return path


@pytest.fixture
def falling(tmp_path):
    """a = 1..12, time 13 - a: grid order improves by one at each evaluation, the optimum (1.0) last."""
    records = {f"{a}": {"time": float(13 - a)} for a in range(1, 13)}
    return load_kernel_tuner_cache(write_cache(tmp_path / "falling.json", {"a": list(range(1, 13))}, records))


def test_grid_on_a_falling_space_has_the_curve_worked_out_by_hand(falling):
    (row,) = [r for r in bench(falling, ["grid"], seeds=2, budget=25) if r.strategy == "grid"]
    # After n evaluations the best is 13 - n (the optimum 1.0 from the 12th on): 3.0 after 10.
    assert row.median_best_ratio_at == {10: 3.0, 25: 1.0}
    expected = (sum(1 / (13 - n) for n in range(1, 13)) + 13) / 25  # the space ran out: its best stands
    assert row.area == pytest.approx(expected)
    assert row.area_interval == (pytest.approx(expected), pytest.approx(expected))  # identical runs


def test_the_median_curve_counts_no_success_as_nothing_and_carries_a_stopped_run():
    traces = [(None, 4.0, 2.0), (None, None, None, None), (2.0,)]
    curve = anytime.median_curve(traces, optimum=2.0, budget=4)
    # Per evaluation: (inf, inf, 1) -> inf; (2, inf, 1) -> 2; (1, inf, 1) -> 1; (1, inf, 1) -> 1.
    assert list(curve) == [math.inf, 2.0, 1.0, 1.0]
    assert anytime.area(curve) == pytest.approx((0 + 0.5 + 1 + 1) / 4)
    assert anytime.at_checkpoints(anytime.median_curve(traces, 2.0, 12)) == {10: 1.0}


def test_the_area_interval_brackets_the_area_of_scattered_runs():
    traces = [(4.0,) * 5 + (1.0,) * 45, (1.0,) * 50, (2.0,) * 50, (1.0,) * 50, (8.0,) * 50]
    low, high = anytime.area_interval(traces, 1.0, 50)
    value = anytime.area(anytime.median_curve(traces, 1.0, 50))
    assert low <= value <= high and low < high
    assert (low, high) == anytime.area_interval(traces, 1.0, 50)  # fixed seed: the same interval


def test_the_checkpoint_intervals_bracket_the_median_curve_and_come_from_the_same_resamples():
    traces = [(3.0,) * 10 + (1.0,) * 40, (2.0,) * 25 + (1.0,) * 25, (2.5,) * 50, (1.5,) * 10 + (1.2,) * 40, (8.0,) * 50]
    found = anytime.intervals(traces, 1.0, 50)
    curve = anytime.median_curve(traces, 1.0, 50)
    assert set(found.at) == {10, 25, 50}
    for c, (low, high) in found.at.items():
        assert low <= curve[c - 1] <= high
    # Each checkpoint's interval is the 2.5th and 97.5th nearest-rank percentiles of the median of
    # that evaluation's column over the same 2,000 resamples of the five runs.
    picks = np.random.default_rng(0).integers(0, 5, size=(2000, 5))
    for c in (10, 25, 50):
        column = np.array([t[c - 1] for t in traces])
        medians = sorted(np.median(column[picks], axis=1).tolist())
        assert found.at[c] == (medians[49], medians[1949])
    assert found.at[10][0] > found.at[25][0]  # the runs improve after evaluation 10: so do the intervals
    assert found.area == anytime.area_interval(traces, 1.0, 50)  # one set of resamples for both


def test_the_resampled_curves_taken_a_block_at_a_time_give_the_same_intervals(monkeypatch):
    traces = [tuple(1.0 + ((seed * 7 + n) % 5) / 4 for n in range(30)) for seed in range(9)]
    whole = anytime.intervals(traces, 1.0, 30)
    monkeypatch.setattr(anytime, "_RESAMPLE_VALUES", 9 * 30 * 7)  # 7 resamples per block
    assert anytime.intervals(traces, 1.0, 30) == whole


def test_summary_and_json_carry_the_anytime_figures(falling):
    results = list(bench_spaces([falling], ["grid"], seeds=1, budget=25))
    text = format_summary(results)
    assert "falling grid: @10 3.000 (3.000-3.000) @25 1.000 (1.000-1.000); area 0.6" in text  # identical seeds
    grid = to_json(results)["spaces"][0]["strategies"][0]
    assert grid["median_best_ratio_at"] == {"10": 3.0, "25": 1.0}
    assert grid["area"] == pytest.approx(results[0].rows[0].area) and len(grid["area_interval"]) == 2
    assert grid["median_best_ratio_interval_at"] == {"10": [3.0, 3.0], "25": [1.0, 1.0]}
    # The trace is stored as its improvements: every evaluation of the 12 improved the best.
    assert grid["runs"][0]["trace"] == [[n, float(13 - n)] for n in range(1, 13)]


@pytest.fixture
def pair(tmp_path):
    """One kernel (a, b) on two GPUs whose times differ in scale and detail but agree on the best
    region; a third space of another kernel."""
    params = {"a": [1, 2, 3, 4], "b": [1, 2]}
    source = {f"{a},{b}": {"time": 100.0 * (5 - a) + b} for a in (1, 2, 3, 4) for b in (1, 2)}
    source["4,2"] = {"time": "CompilationFailedConfig"}
    target = {f"{a},{b}": {"time": 3.0 * (5 - a) + 2 - b} for a in (1, 2, 3, 4) for b in (1, 2) if (a, b) != (3, 2)}
    return (load_kernel_tuner_cache(write_cache(tmp_path / "k_A.json", params, source, "GPU A")),
            load_kernel_tuner_cache(write_cache(tmp_path / "k_B.json", params, target, "GPU B")),
            load_kernel_tuner_cache(write_cache(tmp_path / "other.json", {"c": [1, 2]},
                                                {"1": {"time": 1.0}, "2": {"time": 2.0}}, "GPU B")))


def test_warm_points_carry_the_source_ranks_feasible_in_the_target(pair):
    source, target, other = pair
    # Source ranks (failed 4,2 left out): 4,1 < 3,1 < 3,2 < 2,1 < 2,2 ...; 3,2 is not recorded on
    # the target. Spread: 2,2 is the best that differs from 4,1 in both parameters; 3,1 fills up.
    assert warm_points(source, target, limit=3) == [{"a": 4, "b": 1}, {"a": 2, "b": 2}, {"a": 3, "b": 1}]
    with pytest.raises(UserError, match="not another GPU's recording"):
        warm_points(source, other)
    with pytest.raises(UserError, match="not another GPU's recording"):
        warm_points(source, source)


def test_a_recording_of_the_same_device_is_not_another_gpus_even_under_another_name(pair, tmp_path):
    source, target, _ = pair
    data = json.loads((tmp_path / "k_A.json").read_text())
    copy = load_kernel_tuner_cache(write_cache(tmp_path / "copy_of_A.json", data["tune_params"], data["cache"], "GPU A"))
    assert same_kernel(source, target) and not same_kernel(source, copy) and not same_kernel(source, source)
    # Without device names: another name and other records make another recording; a copy does not.
    (tmp_path / "anon").mkdir()
    anon = {}
    for name, records in (("a", data["cache"]), ("a_copy", data["cache"]), ("b", {"1,1": {"time": 1.0}})):
        path = tmp_path / "anon" / f"{name}.json"
        path.write_text(json.dumps({"tune_params": data["tune_params"], "cache": records}))
        anon[name] = load_kernel_tuner_cache(path)
    assert anon["a"].device is None and not same_kernel(anon["a"], anon["a_copy"]) and same_kernel(anon["a"], anon["b"])
    with pytest.raises(UserError, match="no space to bench is another recording of its kernel on another device "
                                        "than GPU A"):
        other_recordings(source, [source, copy], "k_A.json")


def test_a_source_with_no_timed_point_in_the_target_asks_no_warm_point_and_the_bench_says_so(pair, tmp_path):
    _, target, _ = pair
    # Only 3,2 ran on this source, and the target never recorded 3,2.
    source = load_kernel_tuner_cache(write_cache(tmp_path / "k_C.json", {"a": [1, 2, 3, 4], "b": [1, 2]},
                                                 {"3,2": {"time": 1.0}, "1,1": {"time": "InvalidConfig"}}, "GPU C"))
    assert warm_points(source, target) == []
    (result,) = bench_spaces([target], ["grid"], seeds=1, budget=4, warm=source)
    assert result.warm_points == 0
    assert "warm start from k_C: none of its configurations with a recorded time is a point of this space" in \
        format_space(result)


def test_a_warm_start_is_the_points_and_the_scores_and_none_is_cold(pair):
    source, target, other = pair
    warm = warm_start(source, target)
    assert warm.first == tuple(warm_points(source, target)) and warm.transfer == rank_scores(source, target)
    assert warm_start(None, target) == WarmStart() and WarmStart().first == () and WarmStart().transfer is None
    with pytest.raises(UserError, match="not another GPU's recording"):
        warm_start(source, other)


def test_a_warm_run_asks_the_ranked_points_first_and_counts_them(pair):
    source, target, _ = pair
    first = warm_points(source, target)
    run = run_one(target, "grid", seed=0, budget=20, first=first)
    # Cold, grid order gets within 10% of the target's optimum (4,2: 3.0) only at its last point,
    # the 7th; warm, its first ask is the source's best, 4,1 (4.0 here), then 2,2 (spread), 3,1 2,1.
    cold = run_one(target, "grid", seed=0, budget=20)
    assert cold.trace[0] == 13.0 and cold.reached[0.10] == 7
    assert first == [{"a": 4, "b": 1}, {"a": 2, "b": 2}, {"a": 3, "b": 1}, {"a": 2, "b": 1}]
    assert run.trace[:4] == (4.0, 4.0, 4.0, 4.0)
    assert run.evaluations == cold.evaluations == len(target.records)  # the warm points are evaluations
    (warm,) = bench_spaces([target], ["grid"], seeds=1, budget=20, warm=source)
    assert (warm.warm_from, warm.warm_points) == ("k_A", 4)
    assert warm.rows[0].runs[0].trace[:4] == run.trace[:4]


def test_cli_warm_from_benches_only_the_other_recordings_of_the_kernel(pair, tmp_path):
    (tmp_path / "out").mkdir()
    out = tmp_path / "out" / "warm.json"
    result = CliRunner().invoke(main, ["strategy-bench", str(tmp_path), "--strategy", "grid", "--seeds", "1",
                                       "--budget", "12", "--jobs", "1", "--warm-from", str(tmp_path / "k_A.json"),
                                       "--json", str(out)])
    assert result.exit_code == 0, result.output
    assert "== k_B on GPU B" in result.output and "== k_A" not in result.output and "== other" not in result.output
    assert "asked 4 best-ranked points of k_A (spread over its regions) first" in result.output
    (space,) = json.loads(out.read_text())["spaces"]
    assert (space["warm_from"], space["warm_points"]) == ("k_A", 4)
    lone = CliRunner().invoke(main, ["strategy-bench", str(tmp_path / "other.json"), "--strategy", "grid",
                                     "--warm-from", str(tmp_path / "k_A.json")])
    assert lone.exit_code != 0 and "no space to bench is another recording of its kernel" in " ".join(lone.output.split())


def test_rank_scores_order_the_source_and_put_its_failures_last(pair):
    source, target, _ = pair
    scores = rank_scores(source, target)
    assert set(scores) == set(source.records)  # same parameter order here: the same keys
    ranked = sorted((k for k in scores if k != (4, 2)), key=scores.get)
    assert ranked == sorted((k for k in source.records if k != (4, 2)), key=source.records.get)
    assert scores[(4, 1)] == pytest.approx(0.0) and scores[(1, 2)] == pytest.approx(1.0)  # fastest, slowest
    assert scores[(4, 2)] == 1.0  # it failed there


def test_auto_reads_the_rank_scores_as_one_more_input(pair):
    source, target, _ = pair
    cold = make_strategy("auto", target.space, seed=0)
    warm = make_strategy("auto", target.space, seed=0, transfer=rank_scores(source, target))
    assert warm._encoder.width == cold._encoder.width + 1
    assert list(warm._encoder.encode([(4, 1), (1, 2)])[:, -1]) == pytest.approx([0.0, 1.0])
    # A strategy without a model of it is built as before.
    assert type(make_strategy("grid", target.space, transfer={(4, 1): 0.0})).__name__ == "GridStrategy"
