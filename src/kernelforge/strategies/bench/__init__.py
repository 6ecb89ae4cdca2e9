"""The strategy bench: strategies compared on recorded GPU spaces (``kernelforge strategy-bench``).

- :mod:`.recorded`: Kernel Tuner cache files as recorded spaces, replayed instead of a device.
- :mod:`.slices`: the parts of a recorded space where some parameters hold one value, benched as spaces.
- :mod:`.run`: the runs: evaluations needed to get within x% of the optimum, per strategy and seed.
- :mod:`.anytime`: how good the best found is after any number of evaluations.
- :mod:`.stats`: percentiles and bootstrap intervals.
- :mod:`.compare`: each strategy against TPE, in evaluations to 1% and at each checkpoint.
- :mod:`.goals`: the bar a strategy is held to on each space (against TPE and random), met or missed.
- :mod:`.report`: the bench's tables, the summary against TPE and the JSON file.
- :mod:`.markdown`: one Markdown table per metric over every space, for a write-up.
- :mod:`.outputs`: where a bench writes, checked before any run.
"""

__all__ = ["recorded", "slices", "run", "anytime", "stats", "compare", "goals", "report", "markdown", "outputs"]
