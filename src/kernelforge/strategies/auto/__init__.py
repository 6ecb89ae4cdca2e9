"""``auto``, the default strategy, and its models.

- :mod:`.strategy`: :class:`~kernelforge.strategies.auto.strategy.AutoStrategy`, a portfolio over
  the feasible points of a space.
- :mod:`.surrogate`: its Gaussian process over a discrete space, in numpy.
- :mod:`.parzen`: its second member, a per-parameter Parzen ratio.
"""

__all__ = ["strategy", "surrogate", "parzen"]
