"""Two objectives (time, energy) through an Optuna study: told pairs, the study's Pareto set,
failures, resuming from SQLite, and the name table's refusal of single-objective strategies."""

from __future__ import annotations

import importlib.util

import pytest

from kernelforge.errors import UserError
from kernelforge.report.pareto import pareto_front
from kernelforge.space import Space
from kernelforge.strategies.base import clean_value
from kernelforge.strategies.names import STRATEGIES, make_strategy

pytestmark = pytest.mark.skipif(importlib.util.find_spec("optuna") is None, reason="needs optuna")

SPACE = Space.build({"BLOCK": [16, 32, 64, 128], "num_warps": [2, 4, 8]}, [], where="test")


def time_energy(point) -> tuple[float, float]:
    """A trade-off: bigger blocks run faster but draw more energy per call."""
    t = 1.0 / point["BLOCK"] + 0.01 * point["num_warps"]
    e = point["BLOCK"] * 0.01 + 0.001 * point["num_warps"]
    return t, e


def run(strategy, n: int, fail=lambda p: False) -> dict[tuple, tuple[float, float]]:
    told = {}
    for _ in range(n):
        point = strategy.ask()
        if point is None:
            break
        if fail(point):
            strategy.tell(point, None)
            continue
        told[tuple(point.values())] = time_energy(point)
        strategy.tell(point, told[tuple(point.values())])
    return told


def test_best_trials_are_the_pareto_set_of_the_told_pairs():
    strategy = make_strategy("tpe", SPACE, seed=1, objectives=2)
    assert strategy.objectives == 2
    told = run(strategy, 10)
    assert len(told) == 10 and strategy.evaluations == 10
    front = pareto_front("all", [(str(k), t, e) for k, (t, e) in told.items()])
    expected = {p.candidate for p in front.front}
    # A sampler re-proposing a told point is told its pair again (a "duplicate" trial): same point.
    best = {str((t.params["BLOCK"], t.params["num_warps"])) for t in strategy.study.best_trials}
    assert best == expected and len(front.front) > 1  # a real trade-off, not one winner


def test_failures_get_a_penalty_per_objective_and_a_one_number_tell_is_refused():
    strategy = make_strategy("nsga2", SPACE, seed=0, objectives=2)
    told = run(strategy, 6, fail=lambda p: p["BLOCK"] == 16)
    worst = tuple(max(v[i] for v in told.values()) for i in range(2))
    assert strategy.penalty() == pytest.approx(tuple(10 * w for w in worst))
    failed = [t for t in strategy.study.trials if t.user_attrs.get("kernelforge") == "failed"]
    assert all(len(t.values) == 2 for t in failed)
    point = strategy.ask()
    with pytest.raises(ValueError, match="2 objective"):
        strategy.tell(point, 0.5)


def test_a_resumed_two_objective_study_knows_its_pairs(tmp_path):
    url = f"sqlite:///{tmp_path / 'o.db'}"
    first = make_strategy("optuna-random", SPACE, seed=0, storage=url, study_name="s-te", objectives=2)
    told = run(first, 5)
    again = make_strategy("optuna-random", SPACE, seed=0, storage=url, study_name="s-te", objectives=2)
    assert {k: v for k, v in again.known.items() if v is not None} == told  # JSON floats round-trip exactly
    assert all(isinstance(v, tuple) for v in again.known.values())


def test_single_objective_strategies_refuse_two_objectives():
    assert {n for n, s in STRATEGIES.items() if s.objectives == 2} == {"tpe", "nsga2", "optuna-random"}
    for name in ("auto", "random", "grid"):
        with pytest.raises(UserError, match="tpe, nsga2, optuna-random"):
            make_strategy(name, SPACE, objectives=2)


def test_clean_value_takes_pairs():
    assert clean_value((1, 2.5)) == (1.0, 2.5)
    assert clean_value((1.0, float("nan"))) is None and clean_value((1.0, None)) is None
    assert clean_value(float("inf")) is None and clean_value(3) == 3.0
