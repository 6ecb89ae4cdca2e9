"""``auto``, the default strategy: a portfolio over the feasible points of a space.

Kernel-tuning spaces are discrete, mostly small, and full of configurations that cannot run. TPE
models each parameter's good and bad values and proposes infeasible points it must then be told
about; this strategy proposes only feasible points and spends each evaluation where one of three
members expects the most:

1. the baseline (and warm-start) points, then random feasible points until ``start`` are told,
   the given ones among them (a warm start never delays the models), every other random one
   *aligned*: every size with both powers of two and other values takes a power of two (a size:
   an integer parameter with all values at least 1, such as a block width 16..256 in steps of 16;
   not a selector 0..3). GPU kernels are fast at powers of two far more often than between them
   (warps, vector widths, aligned tiles), so a fast region that needs several sizes aligned is
   found there several times as often (:attr:`AutoStrategy.aligned_start`). A given point takes
   the place of an unaligned one: the first random points, one per given point, are aligned, and
   every other one counted from the first, so a start holds as many aligned points with given
   ones as without (a useless warm start costs its evaluations, not the start's aligned half);
2. then each ask goes to a member, drawn with odds that follow the members' recent rates of gain
   (how much their points improved the best, per point told, over the last ``window`` tells: a
   member is not favoured for having been asked often; at least ``floor`` each):

   - ``gp``: a Gaussian process (:mod:`kernelforge.strategies.auto.surrogate`) over the log-objective
     scores a pool of unseen feasible points (every one while the listed feasible set times the
     history is at most ``score_all``, else a random sample plus every one-parameter move from the
     best points) by expected improvement times the estimated chance to run;
   - ``parzen``: the same pool scored by a per-parameter ratio of the best to the rest
     (:mod:`kernelforge.strategies.auto.parzen`), robust where the GP smooths a needle away;
   - ``local``: the unseen one-parameter moves of the best point (then of the next best), each
     parameter once before any twice, the most promising by the GP's expected improvement times
     the chance to run (3): the move next to the optimum is never left untried because a model
     wrote it off, nor queued behind every value of a wide parameter (:attr:`AutoStrategy.spread_moves`);
     after ``stall`` results without a new best, the other basins' best points come first
     (:func:`~kernelforge.strategies.auto.portfolio.basin_leaders`, :attr:`AutoStrategy.stall`);

3. failures (told ``None``) and points found infeasible before the device ran them
   (:meth:`~kernelforge.strategies.base.Strategy.infeasible`) train a second GP on "it failed";
   a point with little chance to run is asked only when nothing else is left;
4. points asked and not yet told are believed at the GP's mean (the "kriging believer"), so
   several outstanding asks spread out instead of piling onto one point;
5. results worse than the median are told as the median, so a few very slow configurations do
   not shape the model around the fast ones;
6. with ``transfer`` (how the same kernel ranked on another GPU:
   :func:`kernelforge.strategies.transfer.rank_scores`), both GPs read that rank as one more
   input (:class:`~kernelforge.strategies.auto.surrogate.Encoder`): ranks carry over between GPUs,
   times do not, and the fit decides how much the rank says on this one.

Measured with ``kernelforge strategy-bench`` on recorded GPU spaces (docs/strategies.md). The
strategy keeps no state of its own between runs: a resumed search tells it the history.
"""

from __future__ import annotations

import math
import random
from collections import deque
from typing import Any, Mapping

import numpy as np

from kernelforge.space import Space
from kernelforge.strategies.base import Key, Strategy
from kernelforge.strategies.auto.parzen import ParzenRatio
from kernelforge.strategies.auto.portfolio import MEMBERS, basin_leaders, member_odds, untried_directions
from kernelforge.strategies.auto.surrogate import Encoder, GaussianProcess, expected_improvement, hashable, is_power_of_two


class AutoStrategy(Strategy):
    """The default strategy (see the module docstring): given points, random ones until ``start``
    are told, then model-guided asks over unseen feasible points (all, or a pool of ``pool``)."""

    name = "auto"
    #: Random start points. 8, not 16: at 25-100 evaluations 16 lost to TPE on convolution A4000;
    #: chosen on one half of the shared spaces, checked on the other (issue 34, the bench README).
    start = 8
    pool = 1500
    #: Spaces up to this many grid points have their feasible points listed once.
    enumerate_limit = 250_000
    #: Every unseen feasible point is scored while (feasible points) x (told points) is at most
    #: this (the cost of a prediction); past it, a pool of at most ``pool`` points is.
    score_all = 1_000_000
    #: Single-parameter moves are taken from this many of the best points.
    parents = 5
    #: Results worse than the median are told as the median (see the module docstring, 5).
    clip = True
    #: The portfolio's memory: gains over this many tells of its points decide the odds.
    window = 40
    #: Neither member's odds fall below this share of the gains.
    floor = 0.15
    #: A numeric parameter with more values than this moves only to its nearest ones in rank.
    wide = 32
    #: Points whose estimated chance to run is below this are asked only when nothing else is left.
    min_chance = 0.2
    #: Every other start point is drawn from the aligned points (see the module docstring, 1).
    aligned_start = True
    #: Adam steps of a GP's first hyperparameter fit and of each later refit (from the previous
    #: fit), on at most ``fit_subsample`` told points: what bounds an ask's fit work (issue 34).
    fit_steps = 40
    refit_steps = 15
    fit_subsample = 80
    #: The most fit work one ask may do over both GPs, in Adam steps on ``fit_subsample`` points (one
    #: refit; ``surrogate.HyperFit``). A longer fit goes on at the next asks, the models using their
    #: last finished fit meanwhile: an ask is bounded by work, not load.
    ask_work = 15.0
    #: The local member tries each parameter of a parent once before any twice (module docstring, 2).
    spread_moves = True
    #: Results in a row without a new best (failures not counted) after which the local member moves
    #: the other basins' leaders first (module docstring, 2): 20 of 10, 20, 30 on both halves of the
    #: shared spaces and their slices, checked on other seeds (bench README); None: never.
    stall: int | None = 20

    def __init__(self, space: Space, *, seed: int = 0, baseline: Mapping | None = None,
                 transfer: Mapping[Key, float] | None = None):
        super().__init__(space, seed=seed, baseline=baseline)
        self._rng = random.Random(seed)
        self._np_rng = np.random.default_rng(seed)
        self._encoder = Encoder(space, transfer)
        #: The parameters an aligned point takes at a power of two: those with a power-of-two
        #: column whose values are all at least 1 (sizes; a 0 marks a selector or a flag).
        self.sizes = [p for p in self._encoder.powers_of_two if min(space.params[p][1]) >= 1]
        #: Each parameter's values an aligned point may take (sampled spaces draw from these).
        self._aligned_values = [[v for v in values if p not in self.sizes or is_power_of_two(v)]
                                for p, (_, values) in enumerate(space.params)]
        self._gp = GaussianProcess(self._encoder)
        self._failures = GaussianProcess(self._encoder)  # 1 where a told point failed, 0 where it ran
        self._features: dict[Key, np.ndarray] = {}
        self._positions = [{hashable(v): i for i, v in enumerate(values)} for _, values in space.params]
        #: The feasible points listed once (spaces up to ``enumerate_limit`` grid points), their
        #: index, their features (GP) and their value positions (Parzen): a pool of the whole
        #: feasible set is not encoded again at every ask.
        self._feasible: list[Key] | None = None
        if space.size <= self.enumerate_limit:
            self._feasible = [self.key(p) for p in space.points()]
            self._index = {key: i for i, key in enumerate(self._feasible)}
            self._matrix = self._encoder.encode(self._feasible)
            self._code_matrix = self._positions_of(self._feasible)
            self._aligned = (np.array([self.aligned(key) for key in self._feasible], dtype=bool) if self.sizes
                             else np.ones(len(self._feasible), dtype=bool))
        self._queue: deque[Key] = deque()
        self._parzen = ParzenRatio(space)
        self._owner: dict[Key, str] = {}  # pending point -> the member that proposed it
        self._gains: deque[tuple[str, float]] = deque(maxlen=self.window)
        self._best: float | None = None  # best told objective (log scale when positive)
        self._since_best = 0  # results told since the best last improved
        self.last_ask_work = 0.0  #: the fit work (:attr:`ask_work`) the last ask spent

    # -- helpers ----------------------------------------------------------------------------------

    def _feature(self, keys: list[Key]) -> np.ndarray:
        if not keys:
            return np.zeros((0, self._encoder.width))
        if self._feasible is not None and all(k in self._index for k in keys):
            return self._matrix[[self._index[k] for k in keys]]
        missing = [k for k in keys if k not in self._features]
        if missing:
            for k, row in zip(missing, self._encoder.encode(missing)):
                self._features[k] = row
        return np.array([self._features[k] for k in keys])

    def _free(self, key: Key) -> bool:
        return key not in self.known and key not in self.pending

    def _feasible_point(self, key: Key) -> bool:
        if self._feasible is not None:
            return key in self._index
        return self.space.contains(self.point(key))

    def aligned(self, key: Key) -> bool:
        """Whether every size (:attr:`sizes`) takes a power of two at ``key`` (True without sizes)."""
        return all(is_power_of_two(key[p]) for p in self.sizes)

    def _random_unseen(self, count: int, *, aligned: bool = False) -> list[Key]:
        """Up to ``count`` distinct unseen feasible points at random (``aligned``: :meth:`aligned` ones)."""
        if self._feasible is not None:
            taken = np.zeros(len(self._feasible), dtype=bool)  # from known and pending: a withdrawn point is free again
            taken[[self._index[k] for k in (*self.known, *self.pending) if k in self._index]] = True
            free = np.flatnonzero(~taken & self._aligned if aligned else ~taken)
            if len(free) > count:
                free = self._np_rng.choice(free, count, replace=False)
            return [self._feasible[i] for i in free]
        choices = self._aligned_values if aligned else [values for _, values in self.space.params]
        out: dict[Key, None] = {}
        for _ in range(count * 50):
            if len(out) >= count:
                break
            key = tuple(self._rng.choice(values) for values in choices)
            if self._free(key) and key not in out and self.space.contains(self.point(key)):
                out[key] = None
        return list(out)

    def _moves(self, key: Key) -> list[Key]:
        """The unseen feasible points one parameter away from ``key``: every other value of the
        parameter (a numeric one with more than ``wide`` values: the ``wide`` nearest in rank)."""
        out = []
        for i, (_, values) in enumerate(self.space.params):
            at = values.index(key[i])
            picks = [j for j in range(len(values)) if j != at]
            order = self._parzen.orders[i]  # rank order of a numeric parameter (None: categorical)
            if len(values) > self.wide and order is not None:
                rank = int(np.flatnonzero(order == at)[0])
                half = self.wide // 2
                picks = [int(order[r]) for r in range(max(0, rank - half), min(len(order), rank + half + 1)) if r != rank]
            for j in picks:
                moved = key[:i] + (values[j],) + key[i + 1:]
                if self._free(moved) and self._feasible_point(moved):
                    out.append(moved)
        return out

    # -- asking -----------------------------------------------------------------------------------

    def ask(self) -> dict | None:
        first = self._ask_baseline_once()
        if first is not None:
            return first
        while self._queue:
            key = self._queue.popleft()
            if self._free(key):
                return self._hand_out(key)
        if self.starting():
            drawn = len(self.known) + len(self.pending) - len(self.baselines)  # random start points so far
            aligned = self.aligned_start and (drawn < len(self.baselines) or drawn % 2 == 0)
            picks = (self._random_unseen(1, aligned=True) if aligned else []) or self._random_unseen(1)
            return self._hand_out(picks[0]) if picks else None
        self.last_ask_work = 0.0
        ok = [k for k, v in self.known.items() if v is not None]
        chosen = self._best_candidate(ok, self._choose_member())
        if chosen is None:
            return None
        key, member = chosen
        self._owner[key] = member  # credited with the gain, if any, when it is told
        return self._hand_out(key)

    def starting(self) -> bool:
        """Whether the next ask (after any baseline left) is a random start point: fewer than
        ``start`` told (given points among them) or fewer than two ran."""
        ran = sum(v is not None for v in self.known.values())
        return ran < 2 or len(self.known) < max(self.start, len(self.baselines))

    def _hand_out(self, key: Key) -> dict:
        self.pending.add(key)
        return self.point(key)

    def _choose_member(self) -> str:
        """The member that proposes this ask, drawn with :func:`member_odds`."""
        draw = self._rng.random()
        for member, odds in member_odds(self._gains, self.floor).items():
            if draw < odds:
                return member
            draw -= odds
        return MEMBERS[-1]

    def _codes(self, keys: list[Key]) -> np.ndarray:
        if self._feasible is not None and all(k in self._index for k in keys):
            return self._code_matrix[[self._index[k] for k in keys]]
        return self._positions_of(keys)

    def _positions_of(self, keys: list[Key]) -> np.ndarray:
        """Each key's value positions (the index of each value among its parameter's values)."""
        if not keys:
            return np.zeros((0, len(self._positions)), dtype=int)
        return np.array([[pos[hashable(v)] for pos, v in zip(self._positions, key)] for key in keys], dtype=int)

    def _best_candidate(self, ok: list[Key], member: str) -> tuple[Key, str] | None:
        """The point ``member`` proposes, and the member that did (``local`` hands over to ``gp``
        once the best points' neighbourhoods are exhausted)."""
        values = np.array([self.known[k] for k in ok], dtype=float)
        logged = bool((values > 0).all())
        y = np.log(values) if logged else values
        if self.clip and len(y) >= 8:
            # Every point worse than the median is told the median (module docstring, 5).
            y = np.minimum(y, np.median(y))
        order = np.argsort(y)
        best_keys = [ok[i] for i in order[: self.parents]]
        if member == "local" and self.stall is not None and self._since_best >= self.stall:
            leaders = [ok[order[i]] for i in basin_leaders(self._codes([ok[i] for i in order]))]
            best_keys = leaders[1: self.parents + 1] + leaders[:1]
        failed = [k for k, v in self.known.items() if v is None]
        believed = sorted(self.pending)
        if member == "local":
            # The first parent's unseen moves, the most promising first (module docstring, 2); as
            # for the other members, a move unlikely to run waits while a likely one is left.
            for parent in best_keys:
                moves = self._moves(parent)
                if not moves:
                    continue
                runs, likely = self._runnable(self._feature(moves), bool(failed))
                chance = {key: c for key, c, keep in zip(moves, runs, likely) if keep}
                moves = list(chance)
                if self.spread_moves:
                    moves = untried_directions(parent, moves, (*self.known, *self.pending))
                self._condition(ok, y, believed)
                mu, sd = self._gp.predict(self._feature(moves))
                score = expected_improvement(mu, sd, float(y.min())) * np.array([chance[key] for key in moves])
                return moves[int(np.argmax(score))], member
            member = "gp"
        pool = self._pool(best_keys, len(ok))
        if not pool:
            return None
        if member == "parzen":
            score = self._parzen.scores(self._codes(ok), y, self._codes(failed), self._codes(pool))
            return pool[int(np.argmax(score))], member
        self._condition(ok, y, believed)
        x_pool = self._feature(pool)
        mu, sd = self._gp.predict(x_pool)
        chance, likely = self._runnable(x_pool, bool(failed))
        score = np.where(likely, expected_improvement(mu, sd, float(y.min())) * chance, -1.0)
        return pool[int(np.argmax(score))], member

    def _runnable(self, x: np.ndarray, failed: bool) -> tuple[np.ndarray, np.ndarray]:
        """Each row's chance to run (all 1 while nothing failed) and whether it may be asked now: a
        point the failure model gives under ``min_chance`` waits while any other remains (the
        speed model only extrapolates there: it never saw such a point run)."""
        chance = self._chance_to_run(x) if failed else np.ones(len(x))
        likely = chance >= self.min_chance
        return chance, likely if likely.any() else np.ones(len(x), dtype=bool)

    def _pool(self, best_keys: list[Key], told: int) -> list[Key]:
        """The unseen feasible points the models score: all of them while that costs at most
        ``score_all`` (then the best expected improvement is never left unscored), else every
        one-parameter move of ``best_keys`` and a random sample of the rest."""
        if self._feasible is not None and len(self._feasible) * len(self.known) <= self.score_all:
            return self._random_unseen(len(self._feasible))
        candidates: dict[Key, None] = {}
        for parent in best_keys:
            candidates.update(dict.fromkeys(self._moves(parent)))
        size = max(300, min(self.pool, 240_000 // max(told, 1)))
        candidates.update(dict.fromkeys(self._random_unseen(max(size - len(candidates), size // 2))))
        return list(candidates)

    def _condition(self, ok: list[Key], y: np.ndarray, believed: list[Key]) -> None:
        """Fit the model on the told points (refitting the hyperparameters every so often) and
        believe the pending points at its mean."""
        x = self._feature(ok)
        self.last_ask_work += self._gp.update(x, y, first_steps=self.fit_steps, steps=self.refit_steps,
                                              subsample=self.fit_subsample, rng=self._np_rng,
                                              work=self.ask_work - self.last_ask_work)
        if believed:
            xb = self._feature(believed)
            mu, _ = self._gp.predict(xb)
            self._gp.fit(np.vstack([x, xb]), np.concatenate([y, mu]), refit=False, work=0.0)

    def _chance_to_run(self, x_pool: np.ndarray) -> np.ndarray:
        """One minus a GP regression of "it failed" (1) against "it ran" (0) over every told point,
        with lengthscales of its own (failures hang on other parameters); rows in told order, so they grow."""
        told = list(self.known)
        y = np.array([float(self.known[k] is None) for k in told])
        self.last_ask_work += self._failures.update(self._feature(told), y, first_steps=self.fit_steps,
                                                    steps=self.refit_steps, subsample=self.fit_subsample,
                                                    rng=self._np_rng, work=self.ask_work - self.last_ask_work)
        mean = self._failures.predict_mean(x_pool)
        return np.clip(1.0 - mean, 0.02, 1.0)

    # -- telling ----------------------------------------------------------------------------------

    def tell(self, point: Mapping, value: float | None) -> None:
        recorded = self._record(point, value)
        if recorded is None:
            return
        key, value, asked = recorded
        member = self._owner.pop(key, None)
        if value is None:
            return
        scored = math.log(value) if value > 0 else value
        if member is not None:
            gain = 0.0 if self._best is None else max(0.0, self._best - scored)
            self._gains.append((member, gain))
        self._since_best += 1
        if self._best is None or scored < self._best:
            self._best = scored
            self._since_best = 0

    def _learn_infeasible(self, key: Key, reason: str) -> None:
        member = self._owner.pop(key, None)
        if member is not None:
            self._gains.append((member, 0.0))

    def withdraw(self, point: Mapping[str, Any]) -> None:
        self._owner.pop(self.key(point), None)
        super().withdraw(point)

    def enqueue(self, point: Mapping[str, Any]) -> bool:
        """Have :meth:`ask` return ``point`` next (e.g. a point an LLM suggested); False when it is
        not a valid point of the space or is already known or pending."""
        if any(name not in point for name in self.space.names):
            return False
        point = {name: point[name] for name in self.space.names}
        key = self.key(point)
        if not self.space.contains(point) or not self._free(key) or key in self._queue:
            return False
        self._queue.append(key)
        return True

