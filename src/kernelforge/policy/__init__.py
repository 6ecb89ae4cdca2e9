"""The static policy of candidate sources: what a candidate's text may name, checked before any of
it is compiled or run.

- :mod:`.checker`: :func:`~kernelforge.policy.checker.check_source`, the allowlist walk over a
  source's syntax tree.
- :mod:`.allowlist`: the allowlist itself, as data (modules, names, attributes, calls).
- :mod:`.violation`: the records a check returns (where a source breaks a rule, and the report).

The search decides in one place whether proposed code may run (:mod:`kernelforge.search.gate`); the
executors and the compile pool call the same check as their own first wall.
"""

__all__ = ["checker", "allowlist", "violation"]
