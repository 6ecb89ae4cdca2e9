"""Contract tests every Strategy runs, and resuming an Optuna study from a SQLite file."""

from __future__ import annotations

import importlib.util

import pytest

from kernelforge.errors import UserError
from kernelforge.space import Space
from kernelforge.strategies.names import STRATEGY_NAMES, make_strategy, strategy_available
from kernelforge.strategies.optuna.strategy import OptunaStrategy
from kernelforge.strategies.simple import RandomStrategy

AVAILABLE = [name for name in STRATEGY_NAMES if strategy_available(name)]
OPTUNA = [name for name in AVAILABLE if name not in ("grid", "random")]
HAS_OPTUNA = importlib.util.find_spec("optuna") is not None


def small_space() -> Space:
    # 4 * 4 * 3 = 48 points before the constraint, 30 after it.
    return Space.build(
        {"BLOCK_M": [16, 32, 64, 128], "BLOCK_N": [16, 32, 64, 128], "num_warps": [2, 4, 8]},
        ["BLOCK_N <= BLOCK_M"],
        where="test",
    )


SPACE = small_space()
VALID = [tuple(p.values()) for p in SPACE.points()]
BASELINE = {"BLOCK_M": 64, "BLOCK_N": 32, "num_warps": 4}


def objective(point) -> float:
    """A smooth-ish fake timing with its optimum at BLOCK_M=64, BLOCK_N=64, num_warps=4."""
    return 1.0 + abs(point["BLOCK_M"] - 64) / 64 + abs(point["BLOCK_N"] - 64) / 64 + abs(point["num_warps"] - 4) / 4


def drive(strategy, n: int, fail=lambda p: False, batch: int = 1) -> list[tuple]:
    """Ask/tell up to n points, ``batch`` asks outstanding at a time; returns the keys asked."""
    asked = []
    while len(asked) < n:
        points = []
        for _ in range(min(batch, n - len(asked))):
            point = strategy.ask()
            if point is None:
                break
            points.append(point)
            asked.append(tuple(point[k] for k in SPACE.names))
        if not points:
            break
        for point in points:
            strategy.tell(point, None if fail(point) else objective(point))
    return asked


@pytest.mark.parametrize("name", AVAILABLE)
def test_only_valid_points_never_twice(name):
    strategy = make_strategy(name, SPACE, seed=3, baseline=None)
    asked = drive(strategy, 25, batch=3)
    assert len(asked) == 25
    assert len(set(asked)) == len(asked)
    assert set(asked) <= set(VALID)
    assert strategy.evaluations == 25


@pytest.mark.parametrize("name", AVAILABLE)
def test_baseline_is_asked_first(name):
    strategy = make_strategy(name, SPACE, seed=1, baseline=BASELINE)
    assert strategy.ask() == BASELINE


@pytest.mark.parametrize("name", AVAILABLE)
def test_seeded_strategy_is_reproducible(name):
    first = drive(make_strategy(name, SPACE, seed=7, baseline=None), 15)
    second = drive(make_strategy(name, SPACE, seed=7, baseline=None), 15)
    assert first == second


@pytest.mark.parametrize("name", AVAILABLE)
def test_failed_points_do_not_crash_and_are_not_asked_again(name):
    strategy = make_strategy(name, SPACE, seed=2, baseline=None)
    # Every point with 8 warps fails (a third of the space): the search goes on past them.
    asked = drive(strategy, 25, fail=lambda p: p["num_warps"] == 8, batch=2)
    assert len(asked) == len(set(asked)) == 25
    assert set(asked) <= set(VALID)


@pytest.mark.parametrize("name", ["grid", "random"])
def test_ask_returns_none_when_exhausted(name):
    strategy = make_strategy(name, SPACE, seed=0, baseline=BASELINE)
    asked = drive(strategy, 1000)
    assert sorted(asked) == sorted(VALID)
    assert strategy.ask() is None


@pytest.mark.skipif(not HAS_OPTUNA, reason="needs optuna")
def test_optuna_strategy_exhausts_a_small_space():
    # The sampler converges and keeps proposing told points; the fallback still covers the space.
    strategy = make_strategy("tpe", SPACE, seed=0, baseline=None)
    asked = drive(strategy, 1000)
    assert sorted(asked) == sorted(VALID)
    assert strategy.ask() is None
    assert strategy.free_tells > 0


def test_random_strategy_is_uniform_without_replacement_on_large_spaces():
    # Past the enumeration limit it samples by rejection; still no repeats and valid points only.
    big = Space.build({f"p{i}": list(range(8)) for i in range(7)}, ["p0 <= p1"], where="test")
    strategy = RandomStrategy(big, seed=0)
    keys = set()
    for _ in range(500):
        point = strategy.ask()
        assert big.contains(point)
        keys.add(tuple(point.values()))
        strategy.tell(point, 1.0)
    assert len(keys) == 500


@pytest.mark.parametrize("name", AVAILABLE)
def test_history_told_without_asking_is_not_asked(name):
    strategy = make_strategy(name, SPACE, seed=0, baseline=None)
    history = [dict(zip(SPACE.names, key)) for key in VALID[:20]]
    for point in history:
        strategy.tell(point, objective(point))
    asked = drive(strategy, 10)
    assert len(asked) == 10
    assert not set(asked) & set(VALID[:20])
    assert strategy.evaluations == 10


@pytest.mark.skipif(not HAS_OPTUNA, reason="needs optuna")
def test_optuna_free_tells_for_duplicates_and_violations():
    strategy = make_strategy("tpe", SPACE, seed=0, baseline=None)
    drive(strategy, 30)  # all valid points: later proposals are duplicates or violations
    assert strategy.evaluations == 30
    assert strategy.free_tells > 0
    worst_real = max(objective(dict(zip(SPACE.names, k))) for k in VALID)
    violations = [t for t in strategy.study.trials if not SPACE.contains(t.params)]
    duplicates = [t for t in strategy.study.trials if t.user_attrs.get("kernelforge") == "duplicate"]
    assert violations and duplicates
    # A violation is told the penalty, worse than every real value; a duplicate its old value.
    assert all(t.value > worst_real for t in violations)
    assert all(t.value == objective(t.params) for t in duplicates)
    assert strategy.penalty() == 10 * worst_real


def test_unknown_strategy_lists_the_names():
    with pytest.raises(UserError) as info:
        make_strategy("annealing", SPACE, seed=0, baseline=None)
    for name in STRATEGY_NAMES:
        assert name in str(info.value)


def test_baseline_outside_the_space_is_a_user_error():
    with pytest.raises(UserError, match="baseline"):
        make_strategy("grid", SPACE, seed=0, baseline={"BLOCK_M": 16, "BLOCK_N": 128, "num_warps": 4})


@pytest.mark.skipif(importlib.util.find_spec("cmaes") is not None, reason="cmaes is installed")
def test_missing_cmaes_names_the_package():
    with pytest.raises(UserError, match="'cmaes'"):
        make_strategy("cmaes", SPACE, seed=0, baseline=None)


@pytest.mark.skipif(not HAS_OPTUNA, reason="needs optuna")
def test_the_stored_study_holds_one_finished_trial_per_told_point_and_nothing_else(tmp_path):
    import optuna

    url = f"sqlite:///{tmp_path / 'study.db'}"
    first = make_strategy("tpe", SPACE, seed=0, baseline=BASELINE, storage=url, study_name="s")
    told = drive(first, 40)  # every valid point: the sampler re-proposed many (duplicates, violations)
    assert sorted(told) == sorted(VALID) and told[0] == tuple(BASELINE.values())
    assert first.free_tells > 0  # ... which the sampler's own study holds
    assert len(first.study.trials) == len(told) + first.free_tells

    def stored():
        return optuna.load_study(study_name="s", storage=url).trials

    trials = stored()
    assert {t.state for t in trials} == {optuna.trial.TrialState.COMPLETE}
    assert sorted(tuple(t.params[n] for n in SPACE.names) for t in trials) == sorted(told)  # each once
    assert all(t.value == objective(t.params) and t.user_attrs["kernelforge"] == "ok" for t in trials)

    # A rerun (a resumed search, or a peer) knows every point; its sampler re-proposes them all,
    # and the stored study gets nothing more.
    again = make_strategy("tpe", SPACE, seed=0, baseline=BASELINE, storage=url, study_name="s")
    assert set(again.known) == set(told)
    assert again.ask() is None and again.free_tells > 0
    assert len(stored()) == len(trials)


@pytest.mark.skipif(not HAS_OPTUNA, reason="needs optuna")
def test_a_point_being_evaluated_is_not_in_the_stored_study_and_a_peer_learns_it_once_told(tmp_path):
    import optuna

    url = f"sqlite:///{tmp_path / 'study.db'}"
    first = make_strategy("tpe", SPACE, seed=0, baseline=BASELINE, storage=url, study_name="s")
    told = drive(first, 8)
    running = first.ask()  # being evaluated: a kill now leaves nothing running in the stored study
    states = [t.state for t in optuna.load_study(study_name="s", storage=url).trials]
    assert states == [optuna.trial.TrialState.COMPLETE] * 8
    second = make_strategy("tpe", SPACE, seed=1, baseline=BASELINE, storage=url, study_name="s")
    assert set(second.known) == set(told)
    assert len(second.study.trials) == 8  # its sampler learns the stored observations
    first.tell(running, None)  # failed: told the penalty, status "failed"
    more = drive(second, 10)
    assert tuple(running.values()) in second.known and second.known[tuple(running.values())] is None
    assert not set(more) & (set(told) | {tuple(running.values())})
    trials = optuna.load_study(study_name="s", storage=url).trials
    assert len(trials) == 8 + 1 + 10 and first.retire_orphans() == 0
    assert [t.user_attrs["kernelforge"] for t in trials].count("failed") == 1


@pytest.mark.skipif(not HAS_OPTUNA, reason="needs optuna")
def test_running_trials_of_an_earlier_version_are_closed_by_retire_orphans(tmp_path):
    import optuna

    url = f"sqlite:///{tmp_path / 'study.db'}"
    old = optuna.create_study(storage=url, study_name="s")
    old.ask()  # a killed run of an earlier version left its asked trial RUNNING
    strategy = make_strategy("tpe", SPACE, seed=0, baseline=None, storage=url, study_name="s")
    assert strategy.retire_orphans() == 1
    assert [t.state for t in optuna.load_study(study_name="s", storage=url).trials] == [optuna.trial.TrialState.FAIL]


@pytest.mark.skipif(not HAS_OPTUNA, reason="needs optuna")
def test_resume_keeps_failures_known(tmp_path):
    url = f"sqlite:///{tmp_path / 'study.db'}"
    first = make_strategy("tpe", SPACE, seed=0, baseline=None, storage=url, study_name="s")
    failed = first.ask()
    first.tell(failed, None)
    second = make_strategy("tpe", SPACE, seed=0, baseline=None, storage=url, study_name="s")
    key = tuple(failed.values())
    assert key in second.known and second.known[key] is None
    asked = drive(second, 12)
    assert len(asked) == 12 and key not in asked


@pytest.mark.skipif(not HAS_OPTUNA, reason="needs optuna")
def test_optuna_grid_sampler_covers_the_space():
    strategy = OptunaStrategy(SPACE, seed=0, sampler="grid")
    asked = drive(strategy, 1000)
    assert sorted(asked) == sorted(VALID)


@pytest.mark.skipif(not HAS_OPTUNA, reason="needs optuna")
def test_ordinal_encoding_keeps_the_contract():
    # cmaes uses ordinal encoding (suggest_int over value indices); check that path with TPE.
    strategy = OptunaStrategy(SPACE, seed=0, baseline=BASELINE, encoding="ordinal")
    asked = drive(strategy, 30)
    assert asked[0] == tuple(BASELINE.values())
    assert sorted(asked) == sorted(VALID)


@pytest.mark.skipif(not HAS_OPTUNA, reason="needs optuna")
def test_values_optuna_cannot_store_are_mapped():
    space = Space.build({"shape": [(1, 2), (2, 1), (4, 4)], "num_warps": [4, 8]}, [], where="test")
    strategy = make_strategy("tpe", space, seed=0, baseline={"shape": (2, 1), "num_warps": 8})
    asked = []
    while (point := strategy.ask()) is not None:
        assert space.contains(point)
        asked.append(point)
        strategy.tell(point, float(point["num_warps"]))
    assert asked[0] == {"shape": (2, 1), "num_warps": 8}
    assert len(asked) == 6


@pytest.mark.skipif(not HAS_OPTUNA, reason="needs optuna")
def test_resuming_a_study_of_another_space_is_a_user_error(tmp_path):
    url = f"sqlite:///{tmp_path / 'study.db'}"
    drive(make_strategy("tpe", SPACE, seed=0, baseline=None, storage=url, study_name="s"), 2)
    other = Space.build({"BLOCK_M": [16, 32], "BLOCK_N": [16], "num_warps": [4]}, [], where="test")
    with pytest.raises(UserError, match="another search space"):
        make_strategy("tpe", other, seed=0, baseline=None, storage=url, study_name="s")


@pytest.mark.skipif(not HAS_OPTUNA, reason="needs optuna")
def test_bad_storage_is_a_user_error(tmp_path):
    with pytest.raises(UserError, match="storage"):
        make_strategy("tpe", SPACE, seed=0, baseline=None, storage=f"sqlite:///{tmp_path}/no/such/dir/x.db", study_name="s")


@pytest.mark.skipif(not HAS_OPTUNA, reason="needs optuna")
def test_workers_sharing_a_study_see_each_others_results(tmp_path):
    url = f"sqlite:///{tmp_path / 'study.db'}"
    a = make_strategy("tpe", SPACE, seed=0, baseline=None, storage=url, study_name="s")
    b = make_strategy("tpe", SPACE, seed=1, baseline=None, storage=url, study_name="s")
    told_by_a = drive(a, 6)
    asked_by_b = drive(b, 6)
    assert not set(told_by_a) & set(asked_by_b)
    assert set(told_by_a) <= set(b.known)


def test_importing_strategy_does_not_import_optuna():
    import subprocess
    import sys

    code = (
        "import sys, kernelforge.strategies.names, kernelforge.strategies.optuna.strategy, kernelforge.strategies.bench.run, "
        "kernelforge.strategies.bench.recorded, kernelforge.job; "
        "assert 'optuna' not in sys.modules"
    )
    subprocess.run([sys.executable, "-c", code], check=True)
