"""Optuna's samplers by name, as :class:`~kernelforge.strategies.optuna.strategy.OptunaStrategy` drives them
(the measurements behind each setting are noted where it is made).

Optuna is passed in (imported lazily by the strategy): this module imports nothing of it.
"""

from __future__ import annotations

import importlib.util
from typing import Any

from kernelforge.errors import UserError
from kernelforge.space import Space


def make_sampler(optuna: Any, sampler: str, seed: int, space: Space, choices: Any, options: dict) -> Any:
    samplers = optuna.samplers
    if sampler == "tpe":
        # Measured on the recorded pnpoly space (strategy_bench, budget 200, evaluations until
        # within 1% of the optimum; random search needs ~512 on average):
        # - multivariate=True: median 46.5, mean 51, worst 119 over 60 seeds; independent TPE:
        #   median 57.5, mean 70, worst 174, and 5x more proposals wasted on told points (338
        #   vs 67 per run, 5x the CPU time).
        # - constant_liar=True: with 16 asks outstanding, mean 61 / worst 110 vs 73 / 185
        #   without, and 67 vs 299 wasted proposals (without it, concurrent asks pile onto the
        #   same point); with 4 outstanding no difference.
        # - n_startup_trials: 5 was better on seeds 0-29 (median 46.5 vs 63) and worse on seeds
        #   30-89 (57 vs 46.5); 20 gave 59.5 on seeds 0-29: no consistent gain over the default 10.
        kwargs = dict(seed=seed, multivariate=True, constant_liar=True)
        kwargs.update(options)
        return samplers.TPESampler(**kwargs)
    if sampler == "random":
        return samplers.RandomSampler(seed=seed, **options)
    if sampler == "gp":
        _require("scipy", "the 'gp' strategy (Optuna's GPSampler)")
        _require("torch", "the 'gp' strategy (Optuna's GPSampler)")
        return samplers.GPSampler(seed=seed, **options)
    if sampler == "cmaes":
        _require("cmaes", "the 'cmaes' strategy (Optuna's CmaEsSampler)")
        return samplers.CmaEsSampler(seed=seed, **options)
    if sampler == "nsga2":
        return samplers.NSGAIISampler(seed=seed, **options)
    if sampler == "grid":
        grid = {name: choices[name][0] for name, _ in space.params}

        class AskTellGridSampler(samplers.GridSampler):
            def after_trial(self, study: Any, trial: Any, state: Any, values: Any) -> None:
                # GridSampler calls study.stop() once the grid is covered, which raises outside
                # study.optimize(); OptunaStrategy.ask() detects exhaustion itself.
                pass

        return AskTellGridSampler(grid, seed=seed, **options)
    raise AssertionError(sampler)


def _require(module: str, what: str) -> None:
    if importlib.util.find_spec(module) is None:
        extra = {"scipy": "gp", "cmaes": "cmaes"}.get(module)  # pyproject.toml's optional extras
        raise UserError(f"{what} needs the Python package '{module}', which is not installed; pip install "
                        + (f"'kernelforge[{extra}]'" if extra else module))
