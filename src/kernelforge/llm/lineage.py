"""Where each template of a block came from: its family (the human template it descends from), its
parent and its depth, read from the store, and the typed lineage of a job's LLM templates that a
report draws as a tree.

The store is the truth: every LLM template is stored in ``kf_templates`` with the candidate the
model was asked to improve on (``parent``) and the sequence number of the response that wrote it
(``call_seq``); the response's row in ``kf_llm_calls`` names the model and what became of it.
A template the policy refused is not in ``kf_templates`` (it never ran), but its one candidate is
stored with origin ``llm`` and the same parent, so a repair written from it still finds its family.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Mapping

if TYPE_CHECKING:
    from kernelforge.store.records import StoredCandidate
    from kernelforge.store.store import Store

#: The origin of a template the model did not write (a root of the tree).
HUMAN = "human"


class Ancestry:
    """The family tree of one block's templates, as stored (build it with :meth:`from_store`).

    A human template is its own family at depth 0; a generated template's parent template is the
    template of its parent candidate, its family that template's family, its depth one more (a
    generated template without a parent is its own family at depth 1).
    """

    def __init__(self, candidates: Mapping[str, "StoredCandidate"], parents: Mapping[str, str | None]):
        self._candidates = candidates
        #: generated template id -> its parent candidate id (None: written from nothing)
        self._parents = parents

    @classmethod
    def from_store(cls, store: "Store", block: str) -> "Ancestry":
        candidates = {c.id: c for c in store.candidates(block)}
        parents: dict[str, str | None] = {t.id: t.parent for t in store.templates(block=block)}
        # Templates refused by the policy: every candidate of theirs was written by the model.
        by_template: dict[str, list["StoredCandidate"]] = {}
        for c in candidates.values():
            by_template.setdefault(c.template, []).append(c)
        for template, members in by_template.items():
            if template not in parents and all(c.origin == "llm" for c in members):
                parents[template] = members[0].parent  # oldest first: the template's own point
        return cls(candidates, parents)

    def generated(self, template_id: str) -> bool:
        """Whether the model wrote ``template_id``."""
        return template_id in self._parents

    def parent_candidate(self, template_id: str) -> str | None:
        """The candidate a generated template was written from (None for a human template)."""
        return self._parents.get(template_id)

    def parent_template(self, template_id: str) -> str | None:
        """The template of :meth:`parent_candidate` (None when there is none or it is not stored)."""
        parent = self._candidates.get(self.parent_candidate(template_id) or "")
        return parent.template if parent else None

    def chain(self, template_id: str) -> list[str]:
        """``template_id`` and its ancestors' templates, nearest first (a stored cycle stops it)."""
        out = [template_id]
        while self.generated(out[-1]):
            parent = self.parent_template(out[-1])
            if parent is None or parent in out:
                break
            out.append(parent)
        return out

    def family(self, template_id: str) -> str:
        """The human template ``template_id`` descends from (itself when it has no known root)."""
        return self.chain(template_id)[-1]

    def depth(self, template_id: str) -> int:
        """0 for a human template, 1 for one written from a human template's candidate, 2 for one
        written from such a template's candidate, ..."""
        chain = self.chain(template_id)
        return len(chain) - 1 + (1 if self.generated(chain[-1]) else 0)


@dataclass(frozen=True)
class LineageNode:
    """One template in the tree of a job's templates.

    ``origin``: ``human`` for a root, else the stored origin (``llm``). ``parent_template`` and
    ``parent_candidate``: what it was written from (None for a root). ``family``: the human template
    it descends from. ``outcome``: what became of the response that wrote it (``ok``, ``wrong``,
    ...; None when unknown); ``best_speedup``: its best verified candidate's geometric-mean speedup
    over the baseline, when given (see :func:`lineage`). ``model`` and ``call_seq``: who wrote it and
    the response's sequence number in ``kf_llm_calls`` (None for a root)."""

    template_id: str
    origin: str
    parent_template: str | None
    parent_candidate: str | None
    family: str
    depth: int
    outcome: str | None = None
    best_speedup: float | None = None
    model: str | None = None
    call_seq: int | None = None


def lineage(store: "Store", job: str, block: str, *,
            speedups: Mapping[str, float] | None = None) -> list[LineageNode]:
    """The templates ``job`` wrote for ``block`` and the human templates they descend from, as
    nodes: roots first (by id), then the generated ones in the order they were stored.

    ``speedups`` (template id -> best speedup, e.g. :meth:`kernelforge.llm.archive.Archive.best_by_template`)
    fills ``best_speedup``; without it the field is None. Reads only what is stored: the same
    answer for a resumed or a finished job."""
    ancestry = Ancestry.from_store(store, block)
    speedups = speedups or {}
    # A job's sequence numbers go on across its runs: one final row per seq.
    calls = {c.seq: c for c in store.llm_calls(job, final_only=True) if c.block == block}
    nodes = []
    for row in store.templates(block=block, job=job):
        call = calls.get(row.call_seq) if row.call_seq is not None else None
        nodes.append(LineageNode(
            template_id=row.id, origin=row.origin, parent_template=ancestry.parent_template(row.id),
            parent_candidate=row.parent, family=ancestry.family(row.id), depth=ancestry.depth(row.id),
            outcome=call.kind if call else None, best_speedup=speedups.get(row.id),
            model=call.model if call else None, call_seq=row.call_seq))
    roots = sorted({n.family for n in nodes if not ancestry.generated(n.family)}
                   | {n.parent_template for n in nodes if n.parent_template and not ancestry.generated(n.parent_template)})
    return [LineageNode(r, HUMAN, None, None, r, 0, best_speedup=speedups.get(r)) for r in roots] + nodes


__all__ = ["HUMAN", "Ancestry", "LineageNode", "lineage"]
