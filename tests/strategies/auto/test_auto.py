"""The ``auto`` strategy beyond the shared contract: the surrogate, the chance to run, enqueue,
spaces too large to list, non-numeric parameters. Every run is seeded, so each assertion is
deterministic (no timing, no luck)."""

from __future__ import annotations

import dataclasses
import math
import statistics

import numpy as np

from kernelforge.space import Space
from kernelforge.strategies.auto.portfolio import MEMBERS, basin_leaders, member_odds
from kernelforge.strategies.auto.strategy import AutoStrategy
from kernelforge.strategies.names import make_strategy
from kernelforge.strategies.auto.parzen import ParzenRatio
from kernelforge.strategies.auto.surrogate import (Encoder, GaussianProcess, expected_improvement, is_power_of_two,
                                              splits_by_power_of_two)


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
    infeasible = lambda p: p["a"] >= 6  # noqa: E731  the half of the space that "cannot run"
    late_infeasible = []
    for seed in range(10):  # ten: a median of five seeds moved by one ask when the draws changed (issue 34)
        strategy = AutoStrategy(space, seed=seed)
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
        late_infeasible.append(sum(infeasible(p) for p in asked[30:]))
    # Half of the space cannot run; after learning it, most asks stay in the half that can (at
    # random, half of the last 30 would not run).
    assert statistics.median(late_infeasible) <= 30 // 4, late_infeasible


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


def test_a_gp_refits_on_a_schedule_the_first_fit_longest():
    space = Space.build({"a": list(range(16)), "b": list(range(16))}, [], where="test")
    encoder = Encoder(space)
    keys = [(a, b) for a in range(16) for b in range(16)]
    x, y = encoder.encode(keys), np.array([(a - 8) ** 2 + b / 4 for a, b in keys], dtype=float)
    gp = GaussianProcess(encoder)
    refitted_at, work = [], []
    for n in range(4, 64):
        before = gp.refits
        work.append(gp.update(x[:n], y[:n], first_steps=8, steps=2, subsample=80, rng=np.random.default_rng(0),
                              work=None))
        if gp.refits > before:
            refitted_at.append(n)
    # A refit once the points have grown by an eighth (at least 2) since the last one.
    assert refitted_at[0] == 4
    assert all(b - a == max(2, a // 8) for a, b in zip(refitted_at, refitted_at[1:])), refitted_at
    # The first fit takes ``first_steps``, each later one ``steps`` (work: steps times (n / 80) ** 3);
    # an update without a refit fits nothing.
    steps = {n: round(w / (n / 80) ** 3, 6) for n, w in zip(range(4, 64), work)}
    assert [steps[n] for n in refitted_at] == [8.0] + [2.0] * (len(refitted_at) - 1)
    assert all(steps[n] == 0 for n in steps if n not in refitted_at)


def power_of_two_space() -> Space:
    return Space.build({"bx": list(range(16, 257, 16)), "t": [1, 2, 3, 4]}, [], where="test")


def power_of_two_time(point) -> float:
    """Fast at powers of two, eight times slower between them (as block sizes on some GPUs)."""
    fast = point["bx"] & (point["bx"] - 1) == 0
    return (1.0 if fast else 8.0) * (1.0 + 0.1 * point["t"])


def test_value_by_value_groups_fit_what_no_smooth_rank_function_can():
    space = Space.build({"bx": list(range(16, 257, 16)), "t": [1, 2, 3, 4], "u": [1, 2, 3, 4]}, [], where="test")
    encoder = Encoder(space)
    # bx, t and u by rank, then each value by value, then whether it is a power of two
    assert len(encoder.groups) == 9 and encoder.powers_of_two == [0, 1, 2]
    assert list(encoder.initial_log_lengths()) == [0.0] * 3 + [encoder.by_value_log_length] * 6

    class RankOnly(Encoder):
        by_value = power_of_two = 10 ** 9

    def time(bx, t, u):
        return power_of_two_time({"bx": bx, "t": t}) * (1.0 + 0.2 * abs(u - 2))

    keys = [(bx, t, u) for bx in range(16, 257, 16) for t in (1, 2, 3, 4) for u in (1, 2, 3, 4)]
    for seed in range(3):
        order = np.random.default_rng(seed).permutation(len(keys))
        told, held = [keys[i] for i in order[:60]], [keys[i] for i in order[60:]]
        y, truth = np.log([time(*k) for k in told]), np.log([time(*k) for k in held])
        errors = {}
        for name, enc in (("by value", encoder), ("rank only", RankOnly(space))):
            gp = GaussianProcess(enc)
            gp.fit(enc.encode(told), y, refit=True, steps=80)
            mu, _ = gp.predict(enc.encode(held))
            errors[name] = float(np.abs(mu - truth).mean())
        assert errors["by value"] < 0.5 * errors["rank only"], (seed, errors)


def test_which_parameters_get_a_power_of_two_column():
    assert [v for v in (0, 1, 2, 3, 48, 64, -4, True, 2.0, "8") if is_power_of_two(v)] == [1, 2, 64]
    assert splits_by_power_of_two([16, 32, 48, 64])
    assert splits_by_power_of_two([1, 2, 3])  # a tile size of 3 is not one of its kind
    assert not splits_by_power_of_two([1, 2, 4, 8])  # nothing to tell apart
    assert not splits_by_power_of_two([0, 1])  # too few values: the one-hot reading says it all
    assert not splits_by_power_of_two([1.0, 2.0, 3.0])  # floats are not sizes
    assert not splits_by_power_of_two(["a", "b", "c"])
    encoder = Encoder(Space.build({"flag": [True, False], "bx": [16, 32, 48, 64], "w": [1, 2, 4]}, [], where="test"))
    assert encoder.powers_of_two == [1]
    assert list(encoder.encode([(True, 48, 2), (False, 64, 4)])[:, -1]) == [0.0, 1.0]


def test_the_power_of_two_column_carries_credit_to_an_untold_power_of_two():
    """Told every block size but 128, the GP expects 128 to be fast like 32 and 64, not slow like
    its rank neighbours 112 and 144; without the column it cannot tell 128 from them."""
    space = power_of_two_space()
    keys = [(bx, t) for bx in range(16, 257, 16) for t in (1, 2, 3, 4)]
    told = [k for k in keys if k[0] != 128]
    y = np.log([power_of_two_time({"bx": bx, "t": t}) for bx, t in told])
    query = [(112, 2), (128, 2), (144, 2)]

    class Without(Encoder):
        power_of_two = 10 ** 9

    means = {}
    for name, encoder in (("with", Encoder(space)), ("without", Without(space))):
        gp = GaussianProcess(encoder)
        gp.fit(encoder.encode(told), y, refit=True, steps=80)
        means[name] = gp.predict(encoder.encode(query))[0]
        assert np.allclose(gp.predict_mean(encoder.encode(query)), means[name])
    slow, fast = math.log(8.0), 0.0
    assert abs(means["with"][1] - fast) < abs(means["with"][1] - slow), means
    assert means["with"][1] < min(means["with"][0], means["with"][2]) - 1.0, means
    assert means["without"][1] > min(means["without"][0], means["without"][2]) - 1.0, means


def test_parzen_counts_a_rough_parameter_value_by_value():
    space = power_of_two_space()
    parzen = ParzenRatio(space)
    points = [{"bx": bx, "t": t} for bx in range(16, 257, 16) for t in (1, 2, 3, 4)]
    codes = np.array([[space.params[0][1].index(p["bx"]), space.params[1][1].index(p["t"])] for p in points])
    rough = np.log([power_of_two_time(p) for p in points])
    parzen.scores(codes, rough, np.zeros((0, 2), dtype=int), codes)
    assert parzen.rough_params == {0}  # bx alternates; t is a smooth trend
    smooth = np.log([1.0 + p["bx"] / 64 + 0.1 * p["t"] for p in points])
    parzen.scores(codes, smooth, np.zeros((0, 2), dtype=int), codes)
    assert parzen.rough_params == frozenset()
    # Counted value by value, the neighbours of the fast values get no share of their credit.
    parzen.scores(codes, rough, np.zeros((0, 2), dtype=int), codes)
    score = parzen.scores(codes, rough, np.zeros((0, 2), dtype=int), codes)
    fast = np.array([power_of_two_time(p) < 2 for p in points])
    assert score[fast].min() > score[~fast].max()


def test_member_odds_follow_the_rate_of_gain_not_the_number_of_tries():
    even = member_odds([], floor=0.15)
    assert set(even) == set(MEMBERS) and all(abs(v - 1 / len(MEMBERS)) < 1e-12 for v in even.values())
    # gp gained 0.3 in one point of three; local gained 0.3 too, over 20 points of nothing else.
    gains = [("gp", 0.3), ("gp", 0.0), ("gp", 0.0)] + [("local", 0.3)] + [("local", 0.0)] * 19
    odds = member_odds(gains, floor=0.15)
    assert abs(sum(odds.values()) - 1) < 1e-12
    assert odds["gp"] > odds["local"] > odds["parzen"] > 0
    assert odds["parzen"] == min(odds.values())  # the floor keeps a member that never gained alive


def local_asks(spread: bool, count: int) -> list[bool]:
    """For each of ``count`` asks of the ``local`` member on :func:`mixed_space`, where the best
    start point stays the best (every move is slower): whether it moved the best point along a
    parameter with the fewest points seen so far along it (told or asked, start points included),
    of those with a move left."""
    space = mixed_space()
    strategy = AutoStrategy(space, seed=1)
    strategy.spread_moves = spread
    strategy._choose_member = lambda: "local"  # noqa: SLF001 - the member under test, every ask
    seen = start_points(strategy, lambda p: 1.0 + p["bx"] / 256 + p["tile"] + p["flag"])
    best = min(seen, key=lambda p: p["bx"] / 256 + p["tile"] + p["flag"])

    def along(point: dict) -> str | None:
        changed = [name for name in point if point[name] != best[name]]
        return changed[0] if len(changed) == 1 else None

    fewest = []
    for _ in range(count):
        tried = {name: sum(along(p) == name for p in seen) for name in space.names}
        left = [name for name in space.names if tried[name] < len(space.values(name)) - 1]
        point = strategy.ask()
        assert along(point) is not None, (best, point)  # a move of the best point, as the local member asks
        fewest.append(tried[along(point)] == min(tried[name] for name in left))
        seen.append(point)
        strategy.tell(point, 10.0)
    return fewest


def test_the_local_member_moves_each_parameter_once_before_any_twice():
    assert all(local_asks(spread=True, count=12))
    # Without the spread, the moves go where the expected improvement is highest, along one
    # parameter again before another is tried.
    assert not all(local_asks(spread=False, count=12))


def test_basin_leaders_are_the_points_no_better_point_is_one_move_from():
    codes = np.array([[0, 0, 0],   # the best: always a leader
                      [0, 0, 1],   # one move from the best
                      [2, 2, 2],   # another basin's best
                      [2, 2, 0],   # one move from it
                      [1, 1, 1]])  # two moves from every better point: a basin of its own
    assert basin_leaders(codes) == [0, 2, 4]
    assert basin_leaders(codes[:1]) == [0]


def local_move_of(stall: int | None, told: list[tuple[dict, float]], parents: list[dict]) -> dict:
    """Which of ``parents`` the ``local`` member's next ask on :func:`mixed_space` is a
    one-parameter move of, after ``told``, with :attr:`AutoStrategy.stall` at ``stall``."""
    strategy = AutoStrategy(mixed_space(), seed=0)
    strategy.stall = stall
    strategy._choose_member = lambda: "local"  # noqa: SLF001 - the member under test, every ask
    for point, value in told:
        strategy.tell(point, value)
    point = strategy.ask()
    (parent,) = [p for p in parents if sum(p[k] != point[k] for k in p) == 1]
    return parent


def test_a_stalled_local_member_moves_another_basins_best_point_first():
    best, other = {"bx": 16, "tile": 1, "flag": 0}, {"bx": 256, "tile": 4, "flag": 1}
    slow = [{"bx": bx, "tile": tile, "flag": flag}
            for bx, tile, flag in ((128, 2, 0), (64, 3, 1), (96, 2, 1), (160, 3, 0), (192, 2, 0), (48, 3, 1))]
    told = [(best, 1.0), (other, 2.0)] + [(p, 10.0) for p in slow]  # 7 results since the best
    assert local_move_of(None, told, [best, other]) == best  # never stalls: the best point's moves
    assert local_move_of(20, told, [best, other]) == best  # not stalled yet
    assert local_move_of(5, told, [best, other]) == other  # stalled: the other basin's best first
    # A new best ends the stall: its own moves come first again.
    newer = {"bx": 16, "tile": 2, "flag": 0}
    assert local_move_of(5, told + [(newer, 0.5)], [newer, other]) == newer


def mixed_space() -> Space:
    """Block widths 16..256 in steps of 16 (5 of 16 powers of two), tile sizes 1..4, a flag."""
    return Space.build({"bx": list(range(16, 257, 16)), "tile": [1, 2, 3, 4], "flag": [0, 1]}, [], where="test")


def start_points(strategy: AutoStrategy, objective) -> list[dict]:
    points = []
    for _ in range(strategy.start):
        point = strategy.ask()
        points.append(point)
        strategy.tell(point, objective(point))
    return points


def test_every_other_start_point_is_aligned():
    space = mixed_space()  # 128 points, 30 of them aligned (bx 16..256 a power of two, tile 1, 2 or 4)
    for seed in range(3):
        strategy = AutoStrategy(space, seed=seed)
        points = start_points(strategy, lambda p: 1.0 + p["bx"] / 256)
        flags = [strategy.aligned(strategy.key(p)) for p in points]
        assert all(flags[0::2]), (seed, points)
        # The other half is drawn from every point: about three in four of them are not aligned.
        assert not all(flags[1::2]), (seed, points)


def test_a_given_point_takes_the_place_of_an_unaligned_start_point():
    space = mixed_space()
    given = [{"bx": 48, "tile": 3, "flag": 0}, {"bx": 80, "tile": 1, "flag": 1}, {"bx": 112, "tile": 3, "flag": 1},
             {"bx": 144, "tile": 2, "flag": 0}]
    for count in range(len(given) + 1):
        for seed in range(3):
            strategy = AutoStrategy(space, seed=seed, baseline=given[:count] or None)
            points = start_points(strategy, lambda p: 1.0 + p["bx"] / 256)
            assert [strategy.key(p) for p in points[:count]] == [strategy.key(p) for p in given[:count]]
            flags = [strategy.aligned(strategy.key(p)) for p in points[count:]]
            # The first random points, one per given point, are aligned, and every other one counted
            # from the first: the start holds as many aligned random points as one without given points.
            assert all(f for drawn, f in enumerate(flags) if drawn < count or drawn % 2 == 0), (count, seed, points)
            assert sum(flags) >= strategy.start // 2, (count, seed, points)


def test_unaligned_start_when_turned_off_and_the_same_start_where_nothing_mixes():
    class Plain(AutoStrategy):
        aligned_start = False

    space = mixed_space()
    flags = [Plain(space, seed=s) for s in range(3)]
    drawn = [[f.aligned(f.key(p)) for p in start_points(f, lambda p: 1.0)] for f in flags]
    assert not all(all(d[0::2]) for d in drawn)
    # Every value of every parameter a power of two (or not a number): nothing to align, the same draws.
    pure = Space.build({"bx": [16, 32, 64, 128], "vw": [1, 2, 4, 8], "flag": [0, 1]}, [], where="test")
    assert start_points(AutoStrategy(pure, seed=4), bowl_free) == start_points(Plain(pure, seed=4), bowl_free)


def bowl_free(point) -> float:
    return 1.0 + abs(point["bx"] - 64) / 64 + abs(point["vw"] - 2)


def test_a_space_too_large_to_list_draws_aligned_start_points_too():
    class Small(AutoStrategy):
        enumerate_limit = 10  # 128 grid points: sampled, never listed

    strategy = Small(mixed_space(), seed=2)
    points = start_points(strategy, lambda p: 1.0 + p["tile"])
    assert all(strategy.aligned(strategy.key(p)) for p in points[0::2])
    assert len({strategy.key(p) for p in points}) == len(points)


def test_a_selector_is_not_a_size():
    space = Space.build({"method": [0, 1, 2, 3], "bx": [32, 64, 96, 128], "tile": [1, 2, 3]}, [], where="test")
    strategy = AutoStrategy(space, seed=0)
    assert strategy.sizes == [1, 2]  # method 0..3 has a power-of-two column, but 0 is no size
    assert strategy.aligned((0, 64, 2)) and strategy.aligned((3, 128, 1))
    assert not strategy.aligned((1, 96, 1)) and not strategy.aligned((2, 64, 3))


def test_a_refit_starts_from_the_previous_fit():
    """``auto``'s later refits take fewer Adam steps (``refit_steps``) than its first fit
    (``fit_steps``) because each starts from the hyperparameters the previous fit left."""
    space = Space.build({"a": list(range(16)), "noise": list(range(16)), "mode": ["x", "y"]}, [], where="test")
    encoder = Encoder(space)
    rng = np.random.default_rng(0)
    keys = [(int(rng.integers(16)), int(rng.integers(16)), "xy"[int(rng.integers(2))]) for _ in range(60)]
    x, y = encoder.encode(keys), np.array([(k[0] - 8) ** 2 / 10.0 for k in keys])
    gp = GaussianProcess(encoder)
    start = gp.hyper.log_lengths.copy()
    gp.fit(x, y, refit=True, steps=40)
    fitted = gp.hyper.log_lengths.copy()
    assert not np.allclose(fitted, start)
    gp.fit(x, y, refit=True, steps=0)  # no step: where the last fit ended, not the initial lengths
    assert np.array_equal(gp.hyper.log_lengths, fitted)
    gp.fit(x, y, refit=True, steps=10)  # a short refit from there keeps what the long fit learned
    lengths = np.exp(gp.hyper.log_lengths)
    assert lengths[0] < lengths[1] and lengths[0] < lengths[2], lengths
    assert AutoStrategy.refit_steps <= AutoStrategy.fit_steps


def test_a_fit_taken_a_few_steps_at_a_time_ends_where_one_call_ends():
    """A hyperparameter fit bounded by ``work`` per call goes on at the next call from where it
    stopped; meanwhile the model keeps its last finished hyperparameters, and the fit it ends with
    is the one a single call computes."""
    space = Space.build({"a": list(range(16)), "noise": list(range(16)), "mode": ["x", "y"]}, [], where="test")
    encoder = Encoder(space)
    rng = np.random.default_rng(0)
    keys = [(int(rng.integers(16)), int(rng.integers(16)), "xy"[int(rng.integers(2))]) for _ in range(40)]
    x, y = encoder.encode(keys), np.array([(k[0] - 8) ** 2 / 10.0 for k in keys])
    whole = GaussianProcess(encoder)
    assert whole.fit(x, y, refit=True, steps=20, subsample=40) == 20.0  # 20 steps on 40 of 40 points
    split = GaussianProcess(encoder)
    start = split.hyper.log_lengths.copy()
    spent = [split.fit(x, y, refit=True, steps=20, subsample=40, work=6.0)]
    while split.under_way is not None:
        assert np.array_equal(split.hyper.log_lengths, start)  # the last finished fit meanwhile
        spent.append(split.fit(x, y, refit=False, work=6.0))
    assert spent == [6.0, 6.0, 6.0, 2.0]
    assert np.array_equal(split.hyper.log_lengths, whole.hyper.log_lengths)
    assert split.work_done == 20.0
    small = GaussianProcess(encoder)  # a step on 20 points costs (20 / 40) ** 3 of one on 40
    assert math.isclose(small.fit(x[:20], y[:20], refit=True, steps=8, subsample=40), 1.0)


class _SmallFits(AutoStrategy):
    fit_subsample = 20  # steps cost their full unit once 20 points are told
    ask_work = 5.0


def _ask_work(strategy_class, asks: int) -> list[float]:
    space = grid_space()
    strategy = strategy_class(space, seed=1)
    out = []
    for _ in range(asks):
        point = strategy.ask()
        strategy.tell(point, None if point["c"] == 8 and point["a"] > 8 else bowl(point))  # some failures
        out.append(strategy.last_ask_work)
    return out


def test_no_ask_does_more_fit_work_than_ask_work():
    """The slowest ask is bounded by work, not by the host's load: no ask takes more Adam steps
    (weighted by the points fitted) than ``ask_work``; a first fit of 40 steps or a refit of both
    models on one ask is spread over the next asks."""
    bounded = _ask_work(_SmallFits, 90)
    assert max(bounded) <= _SmallFits.ask_work
    full = [w == _SmallFits.ask_work for w in bounded]
    assert any(full[i] and full[i + 1] and full[i + 2] for i in range(len(full) - 2)), bounded  # a split fit
    unbounded = type("Unbounded", (_SmallFits,), {"ask_work": math.inf})
    assert max(_ask_work(unbounded, 90)) > _SmallFits.ask_work  # without the bound, some ask does more



def test_given_points_count_among_the_start():
    """Given start points (baselines, a warm start) replace random start points: with or without
    them, the models take over once ``start`` points are told, not ``start`` points after them."""
    space = grid_space()
    warm = [{"a": 0, "b": 0, "c": 1}, {"a": 11, "b": 11, "c": 8}, {"a": 5, "b": 5, "c": 2}]
    for given in (None, warm):
        strategy = AutoStrategy(space, seed=3, baseline=given)
        starting = []
        for _ in range(AutoStrategy.start + 3):
            starting.append(strategy.starting())
            point = strategy.ask()
            strategy.tell(point, bowl(point))
        assert starting == [True] * AutoStrategy.start + [False] * 3, (given, starting)
    many = [{"a": a, "b": 0, "c": 1} for a in range(AutoStrategy.start + 2)]  # more given than start
    strategy = AutoStrategy(space, seed=3, baseline=many)
    for _ in many:
        strategy.tell(strategy.ask(), 2.0)
    assert not strategy.starting()
