"""Which judge a job's stored verdicts of a block were given under: one ``kf_meta`` row per
(job, block) holding the block's judge hash (:meth:`kernelforge.catalog.Catalog.judge`: the code of
its folder). A search compares it with the block's code now before it answers anything from the
store (:mod:`kernelforge.search.search`): a stored verdict holds only for the judge that gave it.
"""

from __future__ import annotations

import hashlib
import json

import sqlalchemy as sa
from sqlalchemy.engine import Engine
from sqlalchemy.exc import IntegrityError

from kernelforge.store.schema import meta_table


def _key(job: str, block: str) -> str:
    """The row's key (kf_meta keys are at most 64 characters, job and block names are not)."""
    return "judge:" + hashlib.sha256(f"{job}\0{block}".encode()).hexdigest()[:40]


def judge_of(engine: Engine, job: str, block: str) -> str | None:
    """The judge hash ``job``'s verdicts of ``block`` were stored under; None when none is recorded
    (a new job, or a database from before the record)."""
    with engine.connect() as conn:
        value = conn.execute(sa.select(meta_table.c.value).where(meta_table.c.key == _key(job, block))).scalar()
    return json.loads(value)["judge"] if value else None


def record_judge(engine: Engine, job: str, block: str, judge: str) -> None:
    """Record ``judge`` as the one ``job``'s verdicts of ``block`` are given under from now on."""
    value = json.dumps({"job": job, "block": block, "judge": judge})
    key = _key(job, block)
    try:
        with engine.begin() as conn:
            if conn.execute(sa.update(meta_table).where(meta_table.c.key == key).values(value=value)).rowcount == 0:
                conn.execute(meta_table.insert(), {"key": key, "value": value})
    except IntegrityError:
        pass  # another worker of the job recorded it at the same moment: the same judge
