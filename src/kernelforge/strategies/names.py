"""The one table of strategy names: what a job's ``[strategy] name``, ``strategy-bench --strategy``
and :func:`make_strategy` accept, what each one needs, and how its candidates are labelled.

Adding a strategy is one row here (and its class); job validation, the search, the strategy bench
and the command line's help all read this table.
"""

from __future__ import annotations

import importlib.util
from dataclasses import dataclass
from typing import Any, Callable, Mapping

from kernelforge.errors import UserError
from kernelforge.space import Space
from kernelforge.strategies.auto.strategy import AutoStrategy
from kernelforge.strategies.base import Strategy
from kernelforge.strategies.optuna.strategy import OptunaStrategy
from kernelforge.strategies.simple import GridStrategy, RandomStrategy


@dataclass(frozen=True)
class StrategyName:
    """One strategy name.

    ``factory`` builds it: ``factory(space, seed=, baseline=)`` for a strategy of its own (grid,
    random); Optuna strategies are built by :class:`OptunaStrategy` with ``sampler``, the Optuna
    sampler they drive (None for the others). ``stateful``: it keeps a study in the job's storage
    (resumed from there; a strategy without one is told a resumed search's history); ``origin``:
    the origin its candidates are stored with; ``packages``: optional Python packages it needs;
    ``objectives``: how many objectives it minimises at once (2: time and energy per call);
    ``transfers``: its factory takes ``transfer=`` (rank scores of the same kernel on another GPU,
    :func:`kernelforge.strategies.transfer.rank_scores`) and models them.
    """

    name: str
    description: str
    factory: Callable[..., Strategy] = OptunaStrategy
    sampler: str | None = None
    stateful: bool = True
    origin: str = "optuna"
    packages: tuple[str, ...] = ("optuna",)
    objectives: int = 1
    transfers: bool = False


#: Every strategy, the default (``auto``) first.
STRATEGIES: dict[str, StrategyName] = {s.name: s for s in (
    StrategyName("auto", "Bayesian optimisation over the feasible points with local moves (the default)",
                 AutoStrategy, stateful=False, origin="auto", packages=("numpy",), transfers=True),
    StrategyName("tpe", "Optuna's multivariate TPE", sampler="tpe", objectives=2),
    # Random's candidates have always been stored with origin "optuna": kept for stored data.
    StrategyName("random", "uniform sampling without replacement, seeded", RandomStrategy, stateful=False,
                 packages=()),
    StrategyName("grid", "every valid point in the space's declaration order", GridStrategy, stateful=False,
                 origin="grid", packages=()),
    StrategyName("gp", "Optuna's Gaussian-process sampler", sampler="gp", packages=("optuna", "scipy", "torch")),
    StrategyName("cmaes", "Optuna's CMA-ES sampler (ordinal encoding)", sampler="cmaes",
                 packages=("optuna", "cmaes")),
    StrategyName("nsga2", "Optuna's NSGA-II sampler", sampler="nsga2", objectives=2),
    StrategyName("optuna-random", "Optuna's random sampler (through a stored study)", sampler="random",
                 objectives=2),
)}

#: Names accepted by :func:`make_strategy`, in table order.
STRATEGY_NAMES = tuple(STRATEGIES)


def strategy_help() -> str:
    """One line per strategy for help texts: ``name: description``."""
    return "; ".join(f"{s.name}: {s.description}" for s in STRATEGIES.values())


def strategy_available(name: str) -> bool:
    """Whether :func:`make_strategy` can build ``name`` here (its optional packages are installed)."""
    entry = STRATEGIES.get(name)
    return entry is not None and all(importlib.util.find_spec(m) is not None for m in entry.packages)


def make_strategy(
    name: str,
    space: Space,
    *,
    seed: int = 0,
    baseline: Mapping | None = None,
    storage: Any = None,
    study_name: str | None = None,
    objectives: int = 1,
    transfer: Mapping | None = None,
) -> Strategy:
    """Build the strategy called ``name`` (one of :data:`STRATEGY_NAMES`).

    ``storage`` and ``study_name`` apply to the stateful (Optuna) strategies (a study to create or
    resume); grid and random keep no state of their own: a resumed search tells them its history.
    ``objectives``: 2 for a (time, energy) search, refused by a strategy of one objective.
    ``transfer``: rank scores from another GPU, given to a strategy that models them
    (``transfers``); the others start from the warm points in ``baseline`` alone.
    """
    entry = STRATEGIES.get(name)
    if entry is None:
        raise UserError(f"unknown strategy {name!r}; choose one of {', '.join(STRATEGY_NAMES)}")
    if objectives > entry.objectives:
        two = ", ".join(s.name for s in STRATEGIES.values() if s.objectives >= objectives)
        raise UserError(f"the {name!r} strategy minimises one objective; {objectives} objectives need one of: {two}")
    if entry.sampler is None:
        if transfer and entry.transfers:
            return entry.factory(space, seed=seed, baseline=baseline, transfer=transfer)
        return entry.factory(space, seed=seed, baseline=baseline)
    if importlib.util.find_spec("optuna") is None:
        raise UserError(f"the {name!r} strategy needs the Python package 'optuna', which is not installed; pip install optuna")
    return entry.factory(space, seed=seed, baseline=baseline, sampler=entry.sampler, storage=storage,
                         study_name=study_name, objectives=objectives)
