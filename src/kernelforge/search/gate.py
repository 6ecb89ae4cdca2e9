"""The policy gate: the one place the search decides whether proposed code may run at all.

Human templates are trusted. Code a proposer wrote (an LLM's templates) passes the static policy
(:mod:`kernelforge.policy.checker`: Triton, torch allocation and views, math; no torch compute,
no os/sys/threads, ...) before anything of it is compiled or run; a candidate that breaks it is
stored as ``rejected`` on every shape. A point a proposer suggests for a human template renders
human code, so it is trusted like the template.

The executors check the policy again in the worker (defense in depth); that is their decision,
not the search's.
"""

from __future__ import annotations

import ast

from kernelforge.candidate import Candidate
from kernelforge.result import Status


class PolicyUnavailable(RuntimeError):
    """kernelforge.policy.checker cannot be imported: proposed code is never run without it."""


def require_policy():
    """The policy's ``check_source``; raises :class:`PolicyUnavailable` when it cannot be imported
    (the policy is its own stage of the flow, imported only when proposed code needs it)."""
    try:
        from kernelforge.policy.checker import check_source
    except ImportError as exc:
        raise PolicyUnavailable(f"kernelforge.policy.checker cannot be imported ({exc}); LLM-written code never runs "
                                "without the static policy check") from None
    return check_source


def policy_problems(source: str) -> list[str]:
    """The static policy's objections to ``source`` (empty: allowed). Raises
    :class:`PolicyUnavailable` without the policy module.

    A source that is not valid Python passes here: nothing of it can run, and the compile step
    reports it as the compile error it is (with the line), which is what the model needs to hear.
    """
    check = require_policy()
    try:
        ast.parse(source)
    except (SyntaxError, ValueError):
        return []
    return list(check(source))


class PolicyGate:
    """Which templates are untrusted, and the policy's verdict on their candidates (cached by
    candidate id: a source is checked once)."""

    def __init__(self) -> None:
        self._untrusted: set[str] = set()
        self._verdicts: dict[str, str | None] = {}

    def distrust(self, template_id: str) -> None:
        """Mark a template as proposed code: its candidates must pass the policy to run."""
        self._untrusted.add(template_id)

    def failure(self, candidate: Candidate) -> tuple[Status, str] | None:
        """(rejected, why) when the candidate's code is untrusted and breaks the policy; None
        otherwise (and always for human templates)."""
        if candidate.template_id not in self._untrusted:
            return None
        if candidate.id not in self._verdicts:
            problems = policy_problems(candidate.source)
            self._verdicts[candidate.id] = "; ".join(problems) if problems else None
        message = self._verdicts[candidate.id]
        return (Status.REJECTED, f"policy: {message}") if message else None
