"""The records of a policy check: where a source breaks a rule, and the report of all of them."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Violation:
    """One rule the source breaks: where, and what to do instead."""

    line: int
    message: str

    def __str__(self) -> str:
        return f"candidate line {self.line}: {self.message}"  # of the rendered source (kernelforge render, show)


@dataclass(frozen=True)
class PolicyReport:
    """The outcome of :func:`check_source`: ``ok`` when there are no violations."""

    violations: tuple[Violation, ...]

    @property
    def ok(self) -> bool:
        return not self.violations

    def __iter__(self):
        """The violations as lines (``line N: what``)."""
        return iter([str(v) for v in self.violations])

    def __len__(self) -> int:
        return len(self.violations)

    def message(self, limit: int = 5) -> str:
        """One line for a result row: the first ``limit`` violations."""
        if self.ok:
            return ""
        shown = "; ".join(str(v) for v in self.violations[:limit])
        more = f" (and {len(self.violations) - limit} more)" if len(self.violations) > limit else ""
        return f"policy: {shown}{more}"
