"""What the generator reads of the running search, and the prompt it builds from it.

Everything comes through the search's public :class:`~kernelforge.search.proposer.SearchView`
(the run's context, the reserve's capacity, the proposed templates) and the store (standings,
compile resources, earlier failures).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import re

from kernelforge.block import Shape, iter_shapes
from kernelforge.llm.prompts import (device_facts, dims, new_prompt, production_facts, resources, standings,
                                     verification_facts)
from kernelforge.llm.target import target_gpu
from kernelforge.search.plan import block_spec
from kernelforge.search.proposer import Outcome, SearchView

if TYPE_CHECKING:
    from kernelforge.template import Template

#: How many of the best candidates a parent is chosen from.
PARENT_POOL = 4
#: Outcomes that earn the conversation a repair turn (when turns are left).
REPAIRABLE = frozenset(o.value for o in (
    Outcome.NO_CODE, Outcome.TRUNCATED, Outcome.INVALID_TEMPLATE, Outcome.INVALID_POINTS, Outcome.POLICY,
    Outcome.COMPILE_ERROR, Outcome.WRONG, Outcome.REJECTED, Outcome.RUNTIME_ERROR, Outcome.TIMEOUT,
    Outcome.INVALID_DIFF,
))


class PromptContext:
    """The search as the generator sees it: blocks, capacity, standings, templates, prompts."""

    def __init__(self, view: SearchView):
        self.view = view

    @property
    def blocks(self) -> list[str]:
        return [spec.id for spec in self.view.run.job.blocks]

    @property
    def tick(self) -> int:
        return self.view.tick

    def capacity(self, block_id: str) -> int:
        return self.view.capacity(block_id)

    def _shapes(self, block_id: str) -> list[Shape]:
        run = self.view.run
        return run.catalog.block(block_id).shapes(block_spec(run.job, block_id).shapes)

    def standings(self, block_id: str, limit: int = PARENT_POOL) -> list[dict[str, Any]]:
        run = self.view.run
        return standings(run.store, block_id, [x.name for x in self._shapes(block_id)], run.dtype_name, run.env_key,
                         run.first_baseline(block_id).id, limit)

    def template(self, template_id: str) -> "Template | None":
        return self.view.template(template_id)

    def parent_text(self, candidate_id: str | None) -> str | None:
        """The template text of stored candidate ``candidate_id`` (what a diff edit of it applies
        to): the search's template of that id, else the stored generated one; None when unknown."""
        stored = self.view.run.store.candidate(candidate_id) if candidate_id else None
        if stored is None:
            return None
        template = self.template(stored.template)
        if template is not None:
            return template.text
        return next((t.text for t in self.view.run.store.templates(stored.block) if t.id == stored.template), None)

    def prompt(self, block_id: str, parent_id: str | None) -> str:
        run = self.view.run
        block = run.catalog.block(block_id)
        shapes = self._shapes(block_id)
        baseline = run.catalog.baseline(block_id)
        rows = self.standings(block_id, limit=5)
        parent = None
        stored = run.store.candidate(parent_id) if parent_id else None
        if stored is not None:
            template = self.template(stored.template)
            parent = {"template_id": stored.template, "origin": stored.origin, "id": stored.id,
                      "point": " ".join(f"{k}={v}" for k, v in stored.params.items()),
                      "text": (template.text.rstrip() if template else stored.source.rstrip())}
        base_times = {r.shape: r.median_s for r in self.view.baseline_results(block_id).values() if r.median_s}
        failures = []
        for c in run.store.llm_calls(run.job.name, final_only=True):
            if c.block == block_id and c.kind in REPAIRABLE:
                failing = self.failing_shape(block_id, c.message or "")
                failures.append({"what": c.template_id or f"answer #{c.seq}", "status": c.kind,
                                 "message": c.message or "", "shape": dims(failing) if failing else ""})
        template_ids = list(self.view.proposed_templates(block_id)) or [baseline.id]
        template_ids = list(dict.fromkeys([baseline.id, *template_ids]))
        # The kernel is written for the job's target GPU and production shapes, whatever device
        # and shapes this search verifies on (the interpreter's smoke shapes say nothing of a GPU).
        gpu = target_gpu(dict(run.env), run.target or run.job.target)
        return new_prompt(
            block=block, dtype_name=run.dtype_name, shapes=shapes, baseline=baseline,
            baseline_point=dict(baseline.baseline), parent=parent, standings_rows=rows,
            resource_lines=resources(run.store, [r["id"] for r in rows], run.target, run.dtype_name),
            failures=failures, device=device_facts(dict(run.env), block, shapes, run.dtype, base_times),
            target=run.target, template_ids=template_ids, gpu=gpu,
            production=production_facts(block, block_spec(run.job, block_id).shapes, run.dtype, gpu),
            verification=verification_facts(block, run.dtype_name, dict(run.env), shapes),
        )

    def failing_shape(self, block_id: str, message: str) -> Shape | None:
        """The shape a failure message is about (verification messages start with the shape's
        name, after an optional ``[held-out]``-style flag), or None (a compile error, ...)."""
        text = re.sub(r"^(\[[^\]]*\]\s*)+", "", message.strip())
        found = None
        for _, shape in iter_shapes(self.view.run.catalog.block(block_id)):
            name = shape.name
            if text.startswith(name) and text[len(name):len(name) + 1] in (":", " ", "") and (
                    found is None or len(name) > len(found.name)):
                found = shape
        return found
