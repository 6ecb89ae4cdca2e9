"""The static policy of candidate sources: what a candidate's text may name, checked before any of
it is compiled or run.

- :mod:`.checker`: :func:`~kernelforge.policy.checker.check_source`, the allowlist walk over a
  source's syntax tree.
- :mod:`.allowlist`: the allowlist itself, as data (modules, names, attributes, calls).
- :mod:`.violation`: the records a check returns (where a source breaks a rule, and the report).
- :mod:`.wall`: :func:`~kernelforge.policy.wall.refusal`, what every wall calls before it compiles
  or runs a source.

The search decides in one place whether proposed code may run (:mod:`kernelforge.search.gate`); the
executors, the compile pools and the API's winner loader are walls of their own, and each calls
:func:`~kernelforge.policy.wall.refusal`, nothing else.
"""

__all__ = ["checker", "allowlist", "violation", "wall"]
