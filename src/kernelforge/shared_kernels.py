"""Kernel text the project shares with templates: trusted Triton source rendered into a template's body.

Several templates need the same kernel (every MoE template aligns its tokens by expert, as vLLM's
``moe_align_block_size`` does). The template language has no include, by design
(:mod:`kernelforge.render`: a body is data). So the project gives the shared text to every render
as a string value: a body writes ``{{ moe_align }}`` where the kernel belongs, as it writes a
parameter. Why this way:

- **Trusted and fixed.** The values are files shipped inside kernelforge (``kernel_text/``), listed
  in :data:`SHARED`; nothing a template, job or LLM answer writes can name a path or add an entry.
- **The candidate is still its whole source.** The text is in the rendered candidate, so its id (the
  hash of its source) changes when the shared kernel changes and no stored result of an older
  version answers for it; the static policy reads it as any candidate code; a reader sees it in
  the candidate's source and the report's diff.
- **One place.** A fix to the shared kernel reaches every template that renders it.

A template parameter may not take a shared name (:func:`collisions`).
"""

from __future__ import annotations

import functools
from pathlib import Path
from typing import Mapping

#: Shared name -> file under ``kernel_text/`` (Python text, rendered as it is; it uses the names a
#: template imports: ``torch``, ``triton``, ``tl``).
SHARED: dict[str, str] = {
    "moe_align": "moe_align.py.txt",
}

_FOLDER = Path(__file__).resolve().parent / "kernel_text"


@functools.lru_cache(maxsize=1)
def shared_values() -> Mapping[str, str]:
    """Shared name -> its text, read once per process."""
    return {name: (_FOLDER / file).read_text() for name, file in SHARED.items()}


def collisions(names: object) -> list[str]:
    """The ``names`` (a template's parameters) that are shared names, which a template may not declare."""
    return sorted(set(SHARED) & set(names))  # type: ignore[arg-type]


__all__ = ["SHARED", "collisions", "shared_values"]
