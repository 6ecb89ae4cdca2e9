"""The library reference of a block: the strongest library implementation of its computation
(``library.py`` beside the block, trusted code written by us), shown beside the human baseline so
that "faster than the expert baseline" and "faster than the best library" are both visible.

This module holds the names every stage agrees on (where the file lives, the origin and block key
its results are stored under) and the record the report shows; measuring it is
:mod:`kernelforge.search.library`, reading it back :mod:`kernelforge.report.library`.
"""

from __future__ import annotations

from dataclasses import dataclass

#: The library module's file name in a block's folder.
LIBRARY_FILE = "library.py"
#: The origin of stored library candidates.
ORIGIN = "library"
#: Suffix of the block key library results are stored under (see the module docstring).
LIBRARY_SUFFIX = "@library"


def library_key(block_id: str) -> str:
    """The block key a block's library results and candidates are stored under."""
    return f"{block_id}{LIBRARY_SUFFIX}"


@dataclass(frozen=True)
class LibraryLine:
    """The library reference on one shape, as the report shows it: the fastest stored library
    result that passed verification and was timed, with what ran (``implementation``)."""

    shape: str
    candidate_id: str
    implementation: str
    median_s: float
    p20_s: float | None
    p80_s: float | None
    timing_method: str | None
    joules: float | None

    def speedup_of(self, median_s: float | None) -> float | None:
        """How many times faster a time of ``median_s`` is than the library (None: untimed)."""
        return self.median_s / median_s if median_s else None
