"""``auto``, the default strategy, and its models.

- :mod:`.strategy`: :class:`~kernelforge.strategies.auto.strategy.AutoStrategy`, a portfolio over
  the feasible points of a space.
- :mod:`.surrogate`: its Gaussian process over a discrete space, in numpy.
- :mod:`.factor`: the GP's kernel factor, kept and extended across asks.
- :mod:`.parzen`: its second member, a per-parameter Parzen ratio.
- :mod:`.portfolio`: which member proposes an ask, and the order of the local member's moves.
"""

__all__ = ["strategy", "surrogate", "factor", "parzen", "portfolio"]
