"""The ``auto`` strategy beyond the shared contract: the surrogate, the chance to run, enqueue,
spaces too large to list, non-numeric parameters. Every run is seeded, so each assertion is
deterministic (no timing, no luck)."""

from __future__ import annotations

import dataclasses
import statistics

import numpy as np

from kernelforge.space import Space
from kernelforge.strategies.auto import AutoStrategy
from kernelforge.strategies.names import make_strategy
from kernelforge.strategies.surrogate import Encoder, GaussianProcess, expected_improvement


def grid_space() -> Space:
    return Space.build({"a": list(range(12)), "b": list(range(12)), "c": [1, 2, 4, 8]}, [], where="test")


def bowl(point) -> float:
    """A smooth landscape with one optimum at a=7, b=3, c=4 (value 1.0)."""
    return 1.0 + 0.3 * (point["a"] - 7) ** 2 + 0.2 * (point["b"] - 3) ** 2 + abs(point["c"] - 4)


def evaluations_to_optimum(strategy, objective, budget: int) -> int:
    for n in range(1, budget + 1):
        point = strategy.ask()
        assert point is not None
        value = objective(point)
        strategy.tell(point, value)
        if value <= 1.0:
            return n
    return budget + 1


def test_auto_finds_the_optimum_of_a_smooth_space_far_sooner_than_random():
    space = grid_space()  # 576 points
    auto = [evaluations_to_optimum(make_strategy("auto", space, seed=s), bowl, 300) for s in range(4)]
    rand = [evaluations_to_optimum(make_strategy("random", space, seed=s), bowl, 300) for s in range(4)]
    assert statistics.median(auto) * 3 < statistics.median(rand), (auto, rand)
    assert max(auto) <= 100, auto


def test_auto_exhausts_a_small_space_then_returns_none():
    space = Space.build({"x": [1, 2, 3], "y": ["p", "q"]}, [], where="test")
    strategy = AutoStrategy(space, seed=0)
    seen = []
    while (point := strategy.ask()) is not None:
        seen.append((point["x"], point["y"]))
        strategy.tell(point, float(point["x"]) if point["y"] == "p" else None)
    assert sorted(seen) == sorted((x, y) for x in (1, 2, 3) for y in ("p", "q"))
    assert strategy.evaluations == 6


def test_infeasible_points_are_free_and_steer_the_search_away():
    space = grid_space()
    strategy = AutoStrategy(space, seed=5)
    infeasible = lambda p: p["a"] >= 6  # noqa: E731  the half of the space that "cannot run"
    asked = []
    for _ in range(60):
        point = strategy.ask()
        asked.append(point)
        if infeasible(point):
            strategy.infeasible(point, "shared memory over the limit")
        else:
            strategy.tell(point, bowl(point))
    told_infeasible = sum(infeasible(p) for p in asked)
    assert strategy.free_tells == told_infeasible
    assert strategy.evaluations == 60 - told_infeasible
    keys = [tuple(p.values()) for p in asked]
    assert len(set(keys)) == len(keys)
    late = asked[30:]
    # Half of the space cannot run; after learning it, most asks stay in the half that can.
    assert sum(infeasible(p) for p in late) <= len(late) // 4, [p["a"] for p in late]


def test_enqueued_point_is_asked_next_and_not_twice():
    space = grid_space()
    strategy = AutoStrategy(space, seed=0)
    wanted = {"a": 1, "b": 2, "c": 8}
    assert strategy.enqueue(wanted)
    assert not strategy.enqueue(wanted)  # already queued
    assert not strategy.enqueue({"a": 99, "b": 2, "c": 8})  # not in the space
    assert strategy.ask() == wanted
    strategy.tell(wanted, 3.0)
    assert not strategy.enqueue(wanted)  # known


def test_many_asks_outstanding_spread_out():
    space = grid_space()
    strategy = AutoStrategy(space, seed=2)
    for _ in range(20):
        point = strategy.ask()
        strategy.tell(point, bowl(point))
    batch = [strategy.ask() for _ in range(8)]
    keys = {tuple(p.values()) for p in batch}
    assert len(keys) == 8
    assert strategy.pending == keys


def test_a_space_too_large_to_list_is_sampled_within_its_constraints():
    space = Space.build({"a": list(range(64)), "b": list(range(64)), "c": list(range(64))}, ["a + b <= c"],
                        where="test")

    class Small(AutoStrategy):
        enumerate_limit = 1000  # 262,144 grid points: sampled, never listed

    strategy = Small(space, seed=1)
    for _ in range(30):
        point = strategy.ask()
        assert space.contains(point)
        strategy.tell(point, 1.0 + (point["c"] - point["a"] - point["b"]))
    assert strategy.evaluations == 30


def test_feasible_set_of_a_recorded_space_is_honoured():
    space = grid_space()
    allowed = frozenset(k for k in (tuple(p.values()) for p in space.points()) if k[0] % 3 == 0)
    strategy = AutoStrategy(dataclasses.replace(space, feasible=allowed), seed=0)
    for _ in range(40):
        point = strategy.ask()
        assert tuple(point.values()) in allowed
        strategy.tell(point, bowl(point))


def test_surrogate_learns_which_parameter_matters():
    space = Space.build({"a": list(range(16)), "noise": list(range(16)), "mode": ["x", "y"]}, [], where="test")
    encoder = Encoder(space)
    rng = np.random.default_rng(0)
    keys = [(int(rng.integers(16)), int(rng.integers(16)), "xy"[int(rng.integers(2))]) for _ in range(60)]
    y = np.array([(k[0] - 8) ** 2 / 10.0 for k in keys])  # only ``a`` matters
    gp = GaussianProcess(encoder)
    gp.fit(encoder.encode(keys), y, refit=True, steps=60)
    lengths = np.exp(gp.hyper.log_lengths)
    assert lengths[0] < lengths[1] and lengths[0] < lengths[2], lengths
    mu, sd = gp.predict(encoder.encode([(8, 0, "x"), (0, 0, "x")]))
    assert mu[0] < mu[1] and (sd > 0).all()
    ei = expected_improvement(np.array([0.0, 1.0]), np.array([0.5, 0.5]), best=0.5)
    assert ei[0] > ei[1] > 0
