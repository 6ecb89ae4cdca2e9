"""Per-model statistics of the LLM generator's calls (kf_llm_calls): what each model of a job cost
and what became of its answers. A function of an engine; :class:`kernelforge.store.store.Store`
exposes it as :meth:`~kernelforge.store.store.Store.llm_model_stats`.
"""

from __future__ import annotations

import statistics
from collections import Counter
from dataclasses import dataclass

import sqlalchemy as sa
from sqlalchemy.engine import Engine

from kernelforge.redact import redact_url
from kernelforge.store.schema import llm_calls_table


@dataclass(frozen=True)
class ModelStats:
    """One model (at one endpoint) of a job's live calls: requests (final attempts), HTTP attempts,
    prompt and completion tokens, the median latency of an attempt in seconds (None without one),
    and the outcome of each request (``outcomes``: ``(kind, count)`` pairs, most frequent first;
    an answer the search has not judged yet counts as ``pending``)."""

    model: str
    base_url: str
    requests: int
    attempts: int
    prompt_tokens: int
    completion_tokens: int
    median_latency_s: float | None
    outcomes: tuple[tuple[str, int], ...]

    @property
    def tokens(self) -> int:
        return self.prompt_tokens + self.completion_tokens


def llm_model_stats(engine: Engine, job: str) -> list[ModelStats]:
    """The statistics of every (model, base URL) that served ``job``'s live calls (replayed calls
    cost nothing and are left out), in the order each was first used. The URL is shown redacted."""
    c = llm_calls_table.c
    query = (sa.select(c.model, c.base_url, c.final, c.prompt_tokens, c.completion_tokens, c.latency_s, c.kind)
             .where((c.job == job) & c.replayed_from.is_(None)).order_by(c.run, c.seq, c.attempt))
    groups: dict[tuple[str, str], list] = {}
    with engine.connect() as conn:
        for row in conn.execute(query):
            groups.setdefault((row.model, row.base_url), []).append(row)
    out = []
    for (model, base_url), rows in groups.items():
        latencies = [r.latency_s for r in rows if r.latency_s is not None]
        outcomes = Counter(r.kind or "pending" for r in rows if r.final)
        out.append(ModelStats(
            model=model, base_url=redact_url(base_url), requests=sum(1 for r in rows if r.final), attempts=len(rows),
            prompt_tokens=sum(r.prompt_tokens or 0 for r in rows),
            completion_tokens=sum(r.completion_tokens or 0 for r in rows),
            median_latency_s=statistics.median(latencies) if latencies else None,
            outcomes=tuple(outcomes.most_common())))
    return out
