"""Optuna's samplers as strategies (TPE, GP, CMA-ES, NSGA-II, random, grid), through ask/tell.

- :mod:`.strategy`: :class:`~kernelforge.strategies.optuna.strategy.OptunaStrategy`.
- :mod:`.samplers`: Optuna's samplers by name.
- :mod:`.storage`: a shared study's storage and its trials' heartbeats, for a job's workers.
"""

__all__ = ["strategy", "samplers", "storage"]
