"""The policy as a wall: the one function every place that is about to compile or run a source
calls, and the one-line reason it gives when the source may not pass.

The search decides once whether proposed code may run at all (:mod:`kernelforge.search.gate`). The
executors and the compile pools check again, as walls of their own (a source can reach them from a
stored database, the Python API or ``kernelforge check``); each calls :func:`refusal` and nothing
else, so every wall refuses the same sources with the same words.
"""

from __future__ import annotations

from kernelforge.policy.checker import check_source


def refusal(source: str) -> str | None:
    """Why ``source`` may not be compiled or run (the policy's message), or None when it may."""
    report = check_source(source)
    return None if report.ok else report.message()


__all__ = ["refusal"]
