"""AskAhead: a strategy's next proposal computed in a background thread while the device measures.

Ordering is tested with events, never with wall time."""

from __future__ import annotations

import importlib.util
import inspect
import threading

import pytest
import test_strategy as contract  # the shared contract tests (tests/strategies/test_strategy.py)

from kernelforge.space import Space
from kernelforge.strategies.ahead import AskAhead, asks_ahead
from kernelforge.strategies.base import Strategy
from kernelforge.strategies.names import make_strategy

HAS_OPTUNA = importlib.util.find_spec("optuna") is not None
SPACE = contract.SPACE

# Every contract test that takes only a strategy name, run on the wrapped strategy.
CONTRACT = [f for n, f in sorted(vars(contract).items())
            if n.startswith("test_") and callable(f) and list(inspect.signature(f).parameters) == ["name"]]


@pytest.mark.parametrize("name", ["random"] + (["tpe"] if HAS_OPTUNA else []))
@pytest.mark.parametrize("test", CONTRACT, ids=lambda f: f.__name__)
def test_the_strategy_contract_holds_through_ask_ahead(test, name, monkeypatch):
    wrapped = []

    def make(*args, **kwargs):
        wrapped.append(AskAhead(make_strategy(*args, **kwargs)))
        return wrapped[-1]

    monkeypatch.setattr(contract, "make_strategy", make)
    test(name)
    assert wrapped, "the contract test built no strategy"
    for strategy in wrapped:
        strategy.close()


def test_the_contract_tests_were_found():
    assert {"test_only_valid_points_never_twice", "test_seeded_strategy_is_reproducible"} <= {
        f.__name__ for f in CONTRACT}


class Scripted(Strategy):
    """Proposes ``points`` in order, recording the thread of each ask; an ask may be held at a gate
    (``gates[i]``: the i-th ask waits for it) or raise (``errors[i]``)."""

    def __init__(self, space: Space, points: list[dict], name: str = "scripted"):
        super().__init__(space)
        self.name = name
        self.points = list(points)
        self.threads: list[int] = []
        self.gates: dict[int, threading.Event] = {}
        self.started: dict[int, threading.Event] = {}
        self.errors: dict[int, Exception] = {}
        self.in_ask = False
        self.overlaps = 0  # calls made while an ask was running (must stay 0)
        self.log: list[str] = []

    def ask(self) -> dict | None:
        i = len(self.threads)
        self.threads.append(threading.get_ident())
        self.in_ask = True
        try:
            self.started.setdefault(i, threading.Event()).set()
            if i in self.gates:
                self.gates[i].wait()
            if i in self.errors:
                raise self.errors[i]
            while self.points:
                point = self.points.pop(0)
                if self.key(point) not in self.known and self.key(point) not in self.pending:
                    self.pending.add(self.key(point))
                    self.log.append(f"ask {point['BLOCK_M']}")
                    return point
            return None
        finally:
            self.in_ask = False

    def tell(self, point, value) -> None:
        self.overlaps += self.in_ask
        self.log.append(f"tell {point['BLOCK_M']}")
        self._record(point, value)


def pts(*blocks: int) -> list[dict]:
    return [{"BLOCK_M": b, "BLOCK_N": 16, "num_warps": 4} for b in blocks]


def test_the_proposal_computed_ahead_is_the_next_ask_and_was_computed_off_the_callers_thread():
    inner = Scripted(SPACE, pts(16, 32, 64, 128))
    strategy = AskAhead(inner)
    assert strategy.ask() == pts(16)[0]  # asked on this thread: nothing was computed ahead yet
    inner.started.setdefault(1, threading.Event()).wait()  # the second proposal is being computed
    assert strategy.ask() == pts(32)[0]
    assert inner.threads[0] == threading.get_ident() and inner.threads[1] != threading.get_ident()
    strategy.close()


def test_a_tell_waits_for_the_ask_running_ahead():
    inner = Scripted(SPACE, pts(16, 32, 64))
    inner.gates[1] = gate = threading.Event()
    strategy = AskAhead(inner)
    first = strategy.ask()
    inner.started.setdefault(1, threading.Event()).wait()  # the ask ahead is held at its gate
    teller = threading.Thread(target=strategy.tell, args=(first, 1.0))
    teller.start()
    teller.join(timeout=0.2)  # give it the chance to overtake the ask (it must not)
    gate.set()
    teller.join()
    assert inner.overlaps == 0
    assert inner.log == ["ask 16", "ask 32", "tell 16"]
    assert strategy.ask() == pts(32)[0]
    strategy.close()


def test_an_exception_of_the_ask_ahead_is_raised_by_the_next_ask():
    inner = Scripted(SPACE, pts(16, 32, 64))
    inner.errors[1] = RuntimeError("the sampler broke")
    strategy = AskAhead(inner)
    assert strategy.ask() == pts(16)[0]
    with pytest.raises(RuntimeError, match="the sampler broke"):
        strategy.ask()
    assert strategy.ask() == pts(32)[0]  # raised once; the next ask asks again
    strategy.close()


def test_close_withdraws_the_unused_proposal_and_leaves_no_thread():
    inner = Scripted(SPACE, pts(16, 32, 64), name="closing")
    strategy = AskAhead(inner)
    first = strategy.ask()
    strategy.tell(first, 1.0)
    assert strategy.pending == {strategy.key(pts(32)[0])}  # computed ahead: pending in the inner strategy
    strategy.close()
    assert inner.pending == set() and strategy.pending == set()
    assert strategy.evaluations == 1
    assert not [t for t in threading.enumerate() if t.name == "ask-ahead-closing"]
    strategy.close()  # idempotent
    # Withdrawn, so it may be asked again; after close, asks run on the caller's thread.
    assert strategy.ask() == pts(64)[0] and inner.threads[-1] == threading.get_ident()


def test_withdrawing_every_pending_point_withdraws_the_one_computed_ahead():
    # What a search does when it stops (Shares.withdraw_all): the proposal held ahead goes back too.
    inner = Scripted(SPACE, pts(16, 32, 64))
    strategy = AskAhead(inner)
    strategy.ask()
    for key in list(strategy.pending):
        strategy.withdraw(strategy.point(key))
    assert inner.pending == set()
    assert strategy.ask() == pts(64)[0]  # 16 and 32 were popped from the script: the next one
    strategy.close()


def test_a_point_told_before_it_was_handed_out_is_history_and_never_handed_out():
    inner = Scripted(SPACE, pts(16, 32, 64))
    strategy = AskAhead(inner)
    strategy.ask()
    strategy.tell(pts(32)[0], 2.0)  # the proposal computed ahead, told by someone else (a peer)
    assert strategy.evaluations == 0  # history, not an evaluation
    assert strategy.ask() == pts(64)[0]
    strategy.close()


def test_a_model_free_strategy_has_no_enqueue_and_is_not_asked_ahead():
    assert getattr(AskAhead(make_strategy("random", SPACE)), "enqueue", None) is None
    assert not asks_ahead("grid") and not asks_ahead("random")
    assert asks_ahead("tpe")


@pytest.mark.skipif(not HAS_OPTUNA, reason="needs optuna")
def test_an_enqueued_point_comes_before_the_proposal_computed_ahead():
    strategy = AskAhead(make_strategy("tpe", SPACE, seed=0))
    first = strategy.ask()
    (ahead,) = strategy.pending - {strategy.key(first)}
    chosen = next(k for k in contract.VALID if k not in strategy.pending)
    assert strategy.enqueue(strategy.point(chosen))
    assert strategy.ask() == strategy.point(chosen)
    assert strategy.ask() == strategy.point(ahead)
    strategy.close()  # the proposal computed after those is withdrawn: the three handed out stay
    assert strategy.inner.pending == {strategy.key(first), chosen, ahead}


@pytest.mark.skipif(not HAS_OPTUNA, reason="needs optuna")
def test_close_fails_the_optuna_trial_of_the_unused_proposal(tmp_path):
    import optuna

    url = f"sqlite:///{tmp_path / 'study.db'}"
    strategy = AskAhead(make_strategy("tpe", SPACE, seed=0, storage=url, study_name="s"))
    for _ in range(3):
        point = strategy.ask()
        strategy.tell(point, contract.objective(point))
    strategy.close()
    # The proposal computed ahead, withdrawn, is closed FAIL in the sampler's study; the stored
    # study holds only the three observations.
    assert strategy.inner.study.trials[-1].state == optuna.trial.TrialState.FAIL
    trials = optuna.load_study(study_name="s", storage=url).trials
    assert [(t.state, t.user_attrs.get("kernelforge")) for t in trials] == [(optuna.trial.TrialState.COMPLETE, "ok")] * 3


@pytest.mark.interpreter
@pytest.mark.skipif(not HAS_OPTUNA, reason="needs optuna")
def test_a_search_with_a_strategy_asked_ahead_spends_its_budget_and_leaves_nothing_running(tmp_path, monkeypatch):
    import optuna
    from toy_job import FIXTURES, toy_job

    from kernelforge.catalog import Catalog
    from kernelforge.job import load_job
    from kernelforge.search.search import Search
    from kernelforge.search.progress import Progress
    from kernelforge.store.store import Store

    made = []
    original = AskAhead.__init__

    def spy(self, inner):
        original(self, inner)
        made.append(self)

    monkeypatch.setattr(AskAhead, "__init__", spy)

    class Quiet(Progress):
        def event(self, kind, **data):
            pass

    path = toy_job(tmp_path, "ahead", evaluations=6)
    path.write_text(path.read_text().replace('name = "grid"', 'name = "tpe"'))
    catalog = Catalog.discover(FIXTURES)
    job = load_job(path, catalog)
    url = f"sqlite:///{tmp_path / 'ahead.db'}"
    outcome = Search(job, catalog, Store(url), Quiet()).run()
    assert outcome.evaluations == 6
    assert made and all(s.pending == set() for s in made)
    for summary in optuna.get_all_study_summaries(storage=url):
        trials = optuna.load_study(study_name=summary.study_name, storage=url).trials
        assert optuna.trial.TrialState.RUNNING not in [t.state for t in trials]
