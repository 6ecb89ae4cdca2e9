"""The fair replay: unrecorded configurations are infeasible (never asked, never counted), recorded
failures are evaluations told None, and the random baseline samples the feasible set."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pytest

from kernelforge.space import Space
from kernelforge.strategies.bench.run import CHECKPOINTS, bench, checkpoints, run_one
from kernelforge.strategies.names import STRATEGY_NAMES, make_strategy, strategy_available
from kernelforge.strategies.bench.recorded import load_kernel_tuner_cache
from kernelforge.strategies.simple import RandomStrategy

AVAILABLE = [name for name in STRATEGY_NAMES if strategy_available(name)]


def write_cache(path: Path, params: dict, records: dict) -> Path:
    path.write_text(json.dumps({"device_name": "Test GPU", "tune_params": params, "cache": records}))
    return path


@pytest.fixture
def sparse(tmp_path):
    """A 4x3 grid with 5 recorded configurations, one of them a compile failure."""
    records = {
        "1,10": {"time": 5.0},
        "2,20": {"time": 3.0},
        "3,30": {"time": "CompilationFailedConfig"},
        "4,10": {"time": 2.0},
        "4,30": {"time": 4.0},
    }
    return load_kernel_tuner_cache(write_cache(tmp_path / "sparse.json", {"a": [1, 2, 3, 4], "b": [10, 20, 30]}, records))


@pytest.mark.parametrize("name", AVAILABLE)
def test_every_strategy_asks_only_recorded_points_and_counts_failures(sparse, name):
    strategy = make_strategy(name, sparse.space, seed=3)
    asked = []
    for _ in range(20):
        point = strategy.ask()
        if point is None:
            break
        asked.append(sparse.key(point))
        strategy.tell(point, sparse.lookup(point))
    # Exactly the recorded configurations, each once: the failure included, no unrecorded one.
    assert sorted(asked) == sorted(sparse.records)
    assert strategy.evaluations == len(sparse.records) == 5
    assert strategy.known[(3, 30)] is None  # the recorded failure was told as failed
    assert all(key in sparse.records for key in strategy.known)


def test_run_one_counts_the_failure_and_never_the_unrecorded(sparse):
    run = run_one(sparse, "grid", seed=0, budget=50)
    assert run.evaluations == 5  # 5 recorded of 12 grid points: the other 7 cost nothing
    assert run.best_time == 2.0
    # Grid order: (1,10)=5.0, (2,20)=3.0, (3,30) failed, (4,10)=2.0 is the optimum at evaluation 4.
    assert run.reached == {0.01: 4, 0.05: 4, 0.10: 4}
    assert run.best_at == {10: 2.0, 25: 2.0, 50: 2.0}  # space exhausted before the checkpoints: best stands
    assert run.trace == (5.0, 3.0, 3.0, 2.0, 2.0)  # the best after each evaluation
    assert len(run.ask_ms) == 6  # five points, then the ask that says nothing is left


def test_a_strategy_asking_an_unrecorded_point_is_caught(sparse):
    open_space = replace(sparse, space=replace(sparse.space, feasible=None))
    with pytest.raises(RuntimeError, match="not a recorded"):
        run_one(open_space, "grid", seed=0, budget=50)


def test_checkpoints_within_the_budget():
    assert checkpoints(9) == ()
    assert checkpoints(100) == (10, 25, 50, 100)
    assert checkpoints(10_000) == CHECKPOINTS


def test_random_samples_only_the_feasible_set_of_a_huge_grid():
    # 10^8 grid points, 5 feasible: rejection sampling over the grid would hardly ever hit one.
    params = {f"p{i}": list(range(10)) for i in range(8)}
    feasible = frozenset(tuple((i * k) % 10 for k in range(8)) for i in range(5))
    space = replace(Space.build(params, [], where="test"), feasible=feasible)
    firsts = set()
    for seed in range(60):
        strategy = RandomStrategy(space, seed=seed)
        asked = []
        while (point := strategy.ask()) is not None:
            asked.append(strategy.key(point))
            strategy.tell(point, 1.0)
        assert sorted(asked) == sorted(feasible)
        firsts.add(asked[0])
    assert firsts == feasible  # the first draw lands on every feasible point over the seeds


def test_bench_rows_carry_checkpoints_and_ask_times(sparse):
    rows = bench(sparse, ["grid"], seeds=2, budget=30)
    grid = rows[0]
    assert list(grid.median_best_ratio_at) == [10, 25]
    assert grid.median_best_ratio_at[25] == 1.0
    assert grid.ask_ms_p95 >= grid.ask_ms_median >= 0
    assert all(len(run.ask_ms) == 6 for run in grid.runs)
