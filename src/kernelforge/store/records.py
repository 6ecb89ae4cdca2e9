"""Frozen records of the rows the store hands out (one per table), and their conversion from
database rows. Stored results are :class:`kernelforge.result.StoredResult` (they sit beside the
other result records: the objective and the reports read them without the store).

JSON columns are decoded here: a record holds Python values, never JSON text.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any, Mapping

from kernelforge.result import Status, StoredResult


@dataclass(frozen=True)
class StoredCandidate:
    """A stored candidate: its full rendered source and where it came from (``origin``:
    baseline, optuna, llm, ...; ``parent``: the candidate it was derived from)."""

    id: str
    block: str
    template: str
    params: dict[str, Any]
    origin: str
    parent: str | None
    source: str
    job: str | None
    created: float


@dataclass(frozen=True)
class StoredCompile:
    """The ahead-of-time compile of one candidate for one target and dtype. ``kernels`` holds one
    mapping of resources per compiled kernel (name, registers, spill_stores, spill_loads,
    shared_bytes, num_warps, num_stages, uses_wgmma, ...: see kernelforge.compile.resources.KernelResources)."""

    candidate_id: str
    target: str
    dtype: str
    status: str
    message: str
    kernels: tuple[dict[str, Any], ...]
    created: float


@dataclass(frozen=True)
class Confirmation:
    """One interleaved re-timing of a candidate against the baseline of one shape, as the confirm
    step measures it (what :meth:`kernelforge.store.store.Store.add_confirmation` stores):
    ``speedups`` holds baseline time / candidate time per pair; median, p20 and p80 summarise them;
    ``pair_times`` the (baseline_s, candidate_s) of each pair (empty in confirmations stored before
    issue 32)."""

    job: str
    block: str
    shape: str
    dtype: str
    candidate_id: str
    baseline_id: str
    env_key: str
    speedups: tuple[float, ...]
    median: float
    p20: float
    p80: float
    pair_times: tuple[tuple[float, float], ...] = ()

    @property
    def winner(self) -> bool:
        """Faster than the baseline in at least 80% of the pairs."""
        return self.p20 > 1.0


@dataclass(frozen=True, kw_only=True)
class StoredConfirmation(Confirmation):
    """A stored :class:`Confirmation`, with its row id and when it was stored."""

    id: int
    created: float


@dataclass(frozen=True)
class StoredTemplate:
    """A template written by the LLM generator, with the candidate it improved on (``parent``) and
    the sequence number of the response that wrote it (``call_seq``)."""

    id: str
    block: str
    text: str
    origin: str
    parent: str | None
    call_seq: int | None
    job: str | None
    created: float


@dataclass(frozen=True)
class LLMCall:
    """One stored HTTP attempt of the LLM generator (see kernelforge.store.schema.llm_calls_table):
    attempts of one request share (run, seq); the final one carries ``kind``, what became of it."""

    id: int
    job: str
    run: int
    seq: int
    attempt: int
    final: bool
    block: str
    purpose: str
    parent: str | None
    depth: int
    model: str
    base_url: str
    request: str  # JSON text, as sent: a replay re-sends it unchanged
    request_hash: str
    response: str | None
    finish_reason: str | None
    status: str
    http_status: int | None
    error: str | None
    prompt_tokens: int | None
    completion_tokens: int | None
    latency_s: float | None
    tick: int
    kind: str | None
    message: str | None
    template_id: str | None
    candidate_id: str | None
    replayed_from: str | None
    created: float


@dataclass(frozen=True)
class LLMUsage:
    """What the live generator has spent on a job (replayed calls cost nothing), and the last run
    and sequence numbers it used (a resumed search continues after them)."""

    requests: int
    attempts: int
    tokens: int
    last_run: int
    last_seq: int


@dataclass(frozen=True)
class StoreCounts:
    """How many candidates and results a database holds."""

    candidates: int
    results: int


@dataclass(frozen=True)
class LockHolder:
    """The lock row of a running job: who holds it (``holder`` is host:pid:process start time),
    when it was taken and when its holder last said it was alive (seconds since the epoch)."""

    job: str
    holder: str
    host: str
    pid: int
    started: float
    heartbeat: float


# -- rows -> records --------------------------------------------------------------------------

def candidate_record(row: Mapping[str, Any]) -> StoredCandidate:
    return StoredCandidate(row["id"], row["block"], row["template"], json.loads(row["params"]), row["origin"],
                           row["parent"], row["source"], row["job"], row["created"])


def result_record(row: Mapping[str, Any]) -> StoredResult:
    return StoredResult(
        candidate_id=row["candidate_id"], block=row["block"], shape=row["shape"], dtype=row["dtype"],
        device=row["device"], env_key=row["env_key"], status=Status(row["status"]), rel_error=row["rel_error"],
        median_s=row["median_s"], p20_s=row["p20_s"], p80_s=row["p80_s"], samples=row["samples"],
        timing_method=row["timing_method"], timing_label=row["timing_label"], joules=row["joules"],
        flops=row["flops"], bytes=row["bytes"], message=row["message"], env=json.loads(row["env"]),
        job=row["job"], created=row["created"], excess=row["excess"], host_launch_s=row.get("host_launch_s"),
    )


def compile_record(row: Mapping[str, Any]) -> StoredCompile:
    return StoredCompile(row["candidate_id"], row["target"], row["dtype"], row["status"], row["message"],
                         tuple(json.loads(row["kernels"])), row["created"])


def confirmation_record(row: Mapping[str, Any]) -> StoredConfirmation:
    times = json.loads(row["pair_times"]) if row.get("pair_times") else []
    return StoredConfirmation(**{**row, "speedups": tuple(json.loads(row["speedups"])),
                                 "pair_times": tuple((float(b), float(c)) for b, c in times)})


def template_record(row: Mapping[str, Any]) -> StoredTemplate:
    return StoredTemplate(**row)


def llm_call_record(row: Mapping[str, Any]) -> LLMCall:
    return LLMCall(**{**row, "final": bool(row["final"])})


def lock_record(row: Mapping[str, Any]) -> LockHolder:
    return LockHolder(**row)
