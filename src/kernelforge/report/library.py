"""Reading a block's library reference back from the store for the report
(:class:`kernelforge.library.LibraryLine`)."""

from __future__ import annotations

from typing import Sequence

from kernelforge.library import ORIGIN, LibraryLine, library_key
from kernelforge.result import Status
from kernelforge.store.store import Store


def library_lines(store: Store, block_id: str, shapes: Sequence[str], dtype: str, env_key: str
                  ) -> dict[str, LibraryLine]:
    """Shape name -> the block's library line on that shape, for the shapes that have one in
    ``env_key`` (results from the same device and versions as the rest of the report)."""
    labels = {c.id: str(c.params.get("implementation", c.params.get("backend", "library")))
              for c in store.candidates(library_key(block_id))}
    lines: dict[str, LibraryLine] = {}
    for r in store.results(block=library_key(block_id), dtype=dtype):
        if r.env_key != env_key or r.shape not in shapes or r.status is not Status.OK or not r.median_s:
            continue
        if r.shape not in lines or r.median_s < lines[r.shape].median_s:
            lines[r.shape] = LibraryLine(r.shape, r.candidate_id, labels.get(r.candidate_id, ORIGIN), r.median_s,
                                         r.p20_s, r.p80_s, r.timing_method, r.joules)
    return lines
