"""Strategies propose points of a template's space from the history; they never touch a device.

- :mod:`.base`: the contract; :mod:`.names`: the one table of strategy names.
- :mod:`.simple`: grid and random; :mod:`.auto`: the default portfolio; :mod:`.optuna`: Optuna's
  samplers.
- :mod:`.ahead` and :mod:`.guided` wrap any strategy (asks computed ahead of the device; an
  adviser's points first); :mod:`.transfer` starts a space from another GPU's recorded ranks.
- :mod:`.bench`: strategies compared on recorded GPU spaces.
"""

__all__ = ["base", "names", "simple", "auto", "optuna", "ahead", "guided", "transfer", "bench"]
