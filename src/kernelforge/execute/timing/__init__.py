"""Timing a verified candidate, and checking that the timing measured the candidate's work.

- :mod:`.rounds`: the trusted side's plan of one shape's timing: input sets, the round, the figures.
- :mod:`.calls`: the timed calls of one round, as the process that runs the candidate makes them.
- :mod:`.check`: the trusted side's checks of a round (every call's outputs, the round's figures).
- :mod:`.cputime`: CPU time and resident memory of the thread and process that call candidates.
- :mod:`.crosscheck`: every baseline timed three ways side by side (``kernelforge crosscheck``).
"""

__all__ = ["rounds", "calls", "check", "cputime", "crosscheck"]
