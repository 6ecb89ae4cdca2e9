"""GuidedStrategy: the shared Strategy contract on it (over the model-free strategies and TPE, bare
and asked ahead), and its own promise: the adviser's valid new points right after the baselines,
once, then the inner strategy, which is told everything; a failing adviser is no advice."""

from __future__ import annotations

import pytest

from kernelforge.strategies.ahead import AskAhead
from kernelforge.strategies.guided import GuidedStrategy
from kernelforge.strategies.names import STRATEGY_NAMES, make_strategy, strategy_available
from test_strategy import BASELINE, SPACE, VALID, drive, objective

#: The model-free strategies, TPE (enqueues through Optuna) and the default (when in the table).
INNERS = ["grid", "random"] + [n for n in ("tpe", "auto") if n in STRATEGY_NAMES and strategy_available(n)]

#: Three valid points, one outside the constraint (BLOCK_N <= BLOCK_M), one duplicate, one junk.
ADVICE = [{"BLOCK_M": 128, "BLOCK_N": 64, "num_warps": 8}, {"BLOCK_M": 16, "BLOCK_N": 16, "num_warps": 2},
          {"BLOCK_M": 32, "BLOCK_N": 128, "num_warps": 4}, {"BLOCK_M": 128, "BLOCK_N": 128, "num_warps": 2},
          {"BLOCK_M": 16, "BLOCK_N": 16, "num_warps": 2}, "fast please"]
GOOD = [ADVICE[0], ADVICE[1], ADVICE[3]]


def keys(points):
    return [tuple(p[n] for n in SPACE.names) for p in points]


class Adviser:
    """A scripted adviser that records the standings it was given."""

    def __init__(self, answer=ADVICE, error: Exception | None = None):
        self.answer, self.error, self.calls = answer, error, []

    def __call__(self, standings):
        self.calls.append(list(standings))
        if self.error is not None:
            raise self.error
        return self.answer


def guided(inner: str, *, seed=0, baseline=None, adviser=None, ahead=False):
    strategy = GuidedStrategy(make_strategy(inner, SPACE, seed=seed, baseline=baseline), adviser or Adviser())
    return AskAhead(strategy) if ahead else strategy


# -- the shared contract ---------------------------------------------------------------------------

@pytest.mark.parametrize("ahead", [False, True])
@pytest.mark.parametrize("inner", INNERS)
def test_contract_only_valid_points_never_twice(inner, ahead):
    strategy = guided(inner, seed=3, ahead=ahead)
    asked = drive(strategy, 25, batch=3)
    assert len(asked) == len(set(asked)) == 25
    assert set(asked) <= set(VALID)
    assert strategy.evaluations == 25


@pytest.mark.parametrize("inner", INNERS)
def test_contract_baseline_first_reproducible_failures_and_history(inner):
    assert guided(inner, baseline=BASELINE).ask() == BASELINE
    assert drive(guided(inner, seed=7), 15) == drive(guided(inner, seed=7), 15)
    asked = drive(guided(inner, seed=2), 25, fail=lambda p: p["num_warps"] == 8, batch=2)
    assert len(asked) == len(set(asked)) == 25 and set(asked) <= set(VALID)
    strategy = guided(inner)
    history = [dict(zip(SPACE.names, key)) for key in VALID[:20]]
    for point in history:
        strategy.tell(point, objective(point))
    asked = drive(strategy, 10)
    assert len(asked) == 10 and not set(asked) & set(VALID[:20]) and strategy.evaluations == 10


@pytest.mark.parametrize("inner", ["grid", "random"])
def test_contract_exhausts_the_space_then_none(inner):
    strategy = guided(inner, baseline=BASELINE)
    assert sorted(drive(strategy, 1000)) == sorted(VALID)
    assert strategy.ask() is None


@pytest.mark.parametrize("inner", INNERS)
def test_contract_infeasible_and_withdraw(inner):
    strategy = guided(inner, baseline=BASELINE)
    strategy.ask()  # the baseline
    point = strategy.ask()  # the first advised point
    strategy.infeasible(point, "shared memory over the limit")
    key = keys([point])[0]
    assert strategy.known[key] is None and key not in strategy.pending
    assert strategy.evaluations == 0 and strategy.free_tells >= 1
    other = strategy.ask()
    strategy.withdraw(other)
    assert keys([other])[0] not in strategy.pending and keys([other])[0] not in strategy.known


# -- the adviser's points ----------------------------------------------------------------------------

@pytest.mark.parametrize("ahead", [False, True])
@pytest.mark.parametrize("inner", INNERS)
def test_advised_points_come_right_after_the_baseline_and_the_inner_strategy_learns_them(inner, ahead):
    adviser = Adviser()
    strategy = guided(inner, baseline=BASELINE, adviser=adviser, ahead=ahead)
    first = strategy.ask()
    assert first == BASELINE
    strategy.tell(first, objective(first))
    asked = [strategy.ask() for _ in range(3)]
    assert keys(asked) == keys(GOOD)
    for point in asked:
        strategy.tell(point, objective(point))
    rest = drive(strategy, 10)
    assert len(adviser.calls) == 1, "one consultation"
    assert not set(rest) & set(keys(GOOD) + keys([BASELINE]))
    core = strategy.inner if ahead else strategy
    core = core.inner  # the guided strategy's inner one
    assert all(core.known[k] == objective(dict(zip(SPACE.names, k))) for k in keys(GOOD))
    assert core.evaluations == strategy.evaluations == 14
    if inner == "tpe":  # Optuna learnt them as completed trials of its study
        told = {tuple(t.params[n] for n in SPACE.names) for t in core.study.trials if t.state.name == "COMPLETE"}
        assert set(keys(GOOD)) <= told


def test_what_was_refused_is_kept_with_why():
    strategy = guided("random", baseline=BASELINE)
    strategy.ask()
    strategy.ask()
    reasons = dict((repr(p), why) for p, why in strategy.rejected)
    assert "violates constraint 'BLOCK_N <= BLOCK_M'" in reasons[repr(ADVICE[2])]
    assert reasons[repr(ADVICE[4])] == "already evaluated or proposed"
    assert "not a mapping" in reasons[repr(ADVICE[5])]
    assert keys(strategy.advised) == keys(GOOD)


def test_the_adviser_sees_the_standings_best_first():
    adviser = Adviser()
    strategy = guided("grid", baseline=BASELINE, adviser=adviser)
    strategy.tell({"BLOCK_M": 128, "BLOCK_N": 16, "num_warps": 2}, None)  # history: failed
    strategy.tell({"BLOCK_M": 64, "BLOCK_N": 64, "num_warps": 4}, 0.5)  # history
    strategy.tell(strategy.ask(), 1.0)  # the baseline
    strategy.ask()
    assert [v for _, v in adviser.calls[0]] == [0.5, 1.0, None]


@pytest.mark.parametrize("inner", INNERS)
def test_a_failing_or_empty_adviser_is_no_advice(inner):
    for adviser in (Adviser(error=RuntimeError("endpoint down")), Adviser(answer=[])):
        strategy = guided(inner, baseline=BASELINE, adviser=adviser, seed=4)
        plain = make_strategy(inner, SPACE, seed=4, baseline=BASELINE)
        assert drive(strategy, 8) == drive(plain, 8), "the inner strategy's own sequence"
        assert len(adviser.calls) == 1


def test_an_adviser_error_is_kept():
    strategy = GuidedStrategy(make_strategy("grid", SPACE), Adviser(error=RuntimeError("endpoint down")))
    assert strategy.ask() is not None
    assert strategy.advice_error == "RuntimeError: endpoint down"


def test_enqueue_without_an_inner_enqueue_goes_after_the_advice():
    strategy = guided("grid", baseline=BASELINE)
    extra = {"BLOCK_M": 32, "BLOCK_N": 32, "num_warps": 8}
    assert strategy.enqueue(extra)
    assert not strategy.enqueue(extra), "already queued"
    assert not strategy.enqueue({"BLOCK_M": 16, "BLOCK_N": 32, "num_warps": 8}), "outside the space"
    asked = drive(strategy, 5)
    assert asked == keys([BASELINE] + GOOD + [extra])
