"""The run context: what every stage of one search run shares, fixed once the executor is ready.

Built by :meth:`kernelforge.search.search.Search.prepare` after the executor described its
environment; the measuring pipeline, the confirmation and the proposers read it instead of
reaching into the search.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Callable, Mapping

from kernelforge.block import DTYPES
from kernelforge.candidate import Candidate
from kernelforge.catalog import Catalog
from kernelforge.job import Job
from kernelforge.objective import Objective

if TYPE_CHECKING:
    import torch

    from kernelforge.execute.executor import Executor
    from kernelforge.search.progress import Progress
    from kernelforge.store.ledger import Ledger
    from kernelforge.store.store import Store


@dataclass(frozen=True)
class RunContext:
    """One search run's fixed facts.

    ``env`` is the executor's description of the environment (device, versions) and ``env_key``
    its key: results are looked up and stored under it. ``target`` is the ahead-of-time compile
    target (None when nothing is compiled). ``baselines``: block id -> shape name -> the human
    baseline candidate of that shape (:func:`kernelforge.search.plan.baseline_candidates`; shapes
    that share a baseline point share the candidate). ``ledger``: this worker's place among the job's workers
    under ``env_key`` (:mod:`kernelforge.store.ledger`). ``objective``: what this run tunes for,
    the job's objective where energy is measurable, else time (:mod:`kernelforge.search.energy`).
    """

    job: Job
    catalog: Catalog
    store: "Store"
    executor: "Executor"
    progress: "Progress"
    env: Mapping[str, Any]
    env_key: str
    baselines: Mapping[str, Mapping[str, Candidate]]
    ledger: "Ledger"
    target: str | None = None
    objective: Objective = Objective.TIME
    #: The point adviser factory of the run (:data:`kernelforge.search.proposer.AdvisorFactory`;
    #: None: no study is advised), given by whoever wires the run.
    advisor: Callable[..., Any] | None = None

    @property
    def dtype_name(self) -> str:
        return self.job.dtype

    @property
    def dtype(self) -> "torch.dtype":
        return DTYPES[self.job.dtype]

    def baseline_ids(self, block_id: str) -> set[str]:
        """The ids of every baseline candidate of ``block_id`` (on any shape)."""
        return {c.id for c in self.baselines[block_id].values()}

    def first_baseline(self, block_id: str) -> Candidate:
        """The baseline candidate of the block's first shape: for single-reference uses (the LLM's
        standings); exact when one point is the baseline of every shape."""
        return next(iter(self.baselines[block_id].values()))

    @property
    def device_name(self) -> str:
        """The device as results and events name it."""
        return str(self.env.get("device_name", self.executor.kind))


#: New proposals stop at this fraction of ``[strategy] max_minutes``, so the confirmation re-timing
#: still fits in the cap.
PROPOSALS_SHARE = 0.8


@dataclass(frozen=True)
class JobClock:
    """The wall-clock cap of one run (``[strategy] max_minutes``), counted from when its baselines
    and library references are measured: a cold start (JIT compiles, FlexAttention's first
    compile) must not eat the search. ``proposals_end``: when new proposals stop; ``end``: when
    the confirmation stops too (``time.time()`` seconds; None without a cap)."""

    proposals_end: float | None = None
    end: float | None = None

    @classmethod
    def start(cls, max_minutes: float | None, now: float | None = None) -> "JobClock":
        if not max_minutes:
            return cls()
        now = time.time() if now is None else now
        return cls(now + PROPOSALS_SHARE * 60 * max_minutes, now + 60 * max_minutes)
