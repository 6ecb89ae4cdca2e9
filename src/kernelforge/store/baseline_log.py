"""The baseline's re-timings through a search (kf_baseline_timings): written as each is taken,
read back as :class:`~kernelforge.baseline_timing.BaselineTiming` records. Functions of an
engine; :class:`kernelforge.store.store.Store` exposes them as its methods.
"""

from __future__ import annotations

import dataclasses

import sqlalchemy as sa
from sqlalchemy.engine import Engine

from kernelforge.baseline_timing import BaselineTiming
from kernelforge.redact import redact_data
from kernelforge.store.schema import baseline_timings_table

_FIELDS = tuple(f.name for f in dataclasses.fields(BaselineTiming))


def add_baseline_timing(engine: Engine, timing: BaselineTiming) -> None:
    """Store one re-timing of a shape's baseline."""
    with engine.begin() as conn:
        conn.execute(baseline_timings_table.insert(), redact_data(dataclasses.asdict(timing)))


def baseline_timings(engine: Engine, block: str, dtype: str | None = None,
                     env_key: str | None = None) -> list[BaselineTiming]:
    """The stored re-timings of ``block``'s baselines (of one dtype and environment), oldest first."""
    t = baseline_timings_table
    query = sa.select(t).where(t.c.block == block).order_by(t.c.created, t.c.id)
    if dtype:
        query = query.where(t.c.dtype == dtype)
    if env_key:
        query = query.where(t.c.env_key == env_key)
    with engine.connect() as conn:
        return [BaselineTiming(**{name: row[name] for name in _FIELDS}) for row in conn.execute(query).mappings()]
