"""The LLM call log: every HTTP attempt of the LLM generator (kf_llm_calls) and the templates it
wrote (kf_templates), so that a resumed or replayed search rebuilds them and the budgets carry over.

Every row is redacted (:mod:`kernelforge.redact`) as it is written. Functions of an engine;
:class:`kernelforge.store.store.Store` exposes them as its methods.
"""

from __future__ import annotations

import time
from typing import Any

import sqlalchemy as sa
from sqlalchemy.engine import Engine
from sqlalchemy.exc import IntegrityError

from kernelforge.redact import redact_data
from kernelforge.store.records import LLMCall, LLMUsage, StoredTemplate, llm_call_record, template_record
from kernelforge.store.schema import llm_calls_table, templates_table


def add_template(engine: Engine, template_id: str, block: str, text: str, *, origin: str = "llm",
                 parent: str | None = None, call_seq: int | None = None, job: str | None = None) -> None:
    """Store a generated template's full text; a no-op when it is already stored."""
    row = {"id": template_id, "block": block, "text": text, "origin": origin, "parent": parent,
           "call_seq": call_seq, "job": job, "created": time.time()}
    with engine.begin() as conn:
        exists = conn.execute(sa.select(templates_table.c.id).where(templates_table.c.id == template_id)).first()
        if exists is None:
            try:
                conn.execute(templates_table.insert(), redact_data(row))
            except IntegrityError:
                pass


def templates(engine: Engine, block: str | None = None, job: str | None = None) -> list[StoredTemplate]:
    """Stored generated templates, oldest first."""
    query = sa.select(templates_table).order_by(templates_table.c.created, templates_table.c.id)
    if block:
        query = query.where(templates_table.c.block == block)
    if job:
        query = query.where(templates_table.c.job == job)
    with engine.connect() as conn:
        return [template_record(r) for r in conn.execute(query).mappings()]


def add_llm_calls(engine: Engine, rows: list[dict[str, Any]]) -> list[int]:
    """Store the attempts of one request (one transaction); returns their row ids. ``rows`` map
    kf_llm_calls column names to values (``created`` defaults to now)."""
    ids = []
    with engine.begin() as conn:
        for row in rows:
            row = {"created": time.time(), **row}
            ids.append(conn.execute(llm_calls_table.insert(), redact_data(row)).inserted_primary_key[0])
    return ids


def set_llm_outcome(engine: Engine, row_id: int, kind: str, message: str | None = None, *,
                    template_id: str | None = None, candidate_id: str | None = None) -> None:
    """Record what became of a response (its final attempt's row)."""
    values: dict[str, Any] = {"kind": kind}
    if message is not None:
        values["message"] = message
    if template_id is not None:
        values["template_id"] = template_id
    if candidate_id is not None:
        values["candidate_id"] = candidate_id
    with engine.begin() as conn:
        conn.execute(llm_calls_table.update().where(llm_calls_table.c.id == row_id).values(**redact_data(values)))


def llm_calls(engine: Engine, job: str | None = None, *, final_only: bool = False) -> list[LLMCall]:
    """Stored LLM attempts in the order they were taken in (run, seq, attempt)."""
    query = sa.select(llm_calls_table).order_by(llm_calls_table.c.run, llm_calls_table.c.seq,
                                                llm_calls_table.c.attempt)
    if job:
        query = query.where(llm_calls_table.c.job == job)
    if final_only:
        query = query.where(llm_calls_table.c.final == sa.true())
    with engine.connect() as conn:
        return [llm_call_record(r) for r in conn.execute(query).mappings()]


def llm_usage(engine: Engine, job: str) -> LLMUsage:
    """Requests, attempts, tokens and the last run and sequence numbers the generator used for
    ``job`` (live calls only: replayed ones cost nothing)."""
    c = llm_calls_table.c
    live = (c.job == job) & c.replayed_from.is_(None)
    with engine.connect() as conn:
        requests = conn.execute(sa.select(sa.func.count()).where(live & (c.final == sa.true()))).scalar_one()
        attempts, prompt, completion = conn.execute(sa.select(
            sa.func.count(), sa.func.coalesce(sa.func.sum(c.prompt_tokens), 0),
            sa.func.coalesce(sa.func.sum(c.completion_tokens), 0)).where(live)).one()
        last_run = conn.execute(sa.select(sa.func.coalesce(sa.func.max(c.run), 0)).where(c.job == job)).scalar_one()
        last_seq = conn.execute(sa.select(sa.func.coalesce(sa.func.max(c.seq), 0)).where(c.job == job)).scalar_one()
    return LLMUsage(requests=requests, attempts=attempts, tokens=int(prompt) + int(completion),
                    last_run=int(last_run), last_seq=int(last_seq))
