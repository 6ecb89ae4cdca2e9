"""Strategies propose points of a template's space from the history; they never touch a device. The
contract is :mod:`.base`; every strategy is one row of :mod:`.names`; :mod:`.ahead` and
:mod:`.guided` wrap any strategy; :mod:`.optuna` runs Optuna's samplers; :mod:`.bench`,
:mod:`.bench_report` and :mod:`.recorded` replay recorded GPU spaces to compare them."""

__all__ = ["base", "names", "ahead", "guided", "optuna", "bench", "bench_report", "recorded"]
