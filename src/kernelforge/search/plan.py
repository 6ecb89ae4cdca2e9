"""The plan of a job: which studies it runs, over which shapes, with how many evaluations each.

Planning needs only the job and the catalog (no device, no store), so ``kernelforge search
--dry-run`` shows exactly what a search would do, and the search builds its studies from the same
records: this module is the one place for study names, shape groups, budget shares and the LLM
reserve.

A job gives each block ``[strategy] evaluations`` per shape group (``tune = "all-shapes"``: one
group of every shape; ``"per-shape"``: one group per shape, see :class:`kernelforge.job.Tune`).
With ``[llm]``, ``tune_share`` of a group's evaluations is kept as the group's LLM reserve (for the
templates and points the LLM proposes); the rest is split between the block's templates in turn,
the first templates getting one more when it does not divide evenly.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

from kernelforge.block import Shape
from kernelforge.candidate import Candidate
from kernelforge.catalog import Catalog
from kernelforge.job import BlockSpec, Job
from kernelforge.search.energy import study_suffix
from kernelforge.result import resource_rejected


@dataclass(frozen=True)
class ShapeGroup:
    """The shapes of one block that share a study (and a winner).

    ``scope`` names the group in study names and reserves (``all`` or the shape's name);
    ``shape_filter`` is the shape stored results are filtered by (None: every shape).
    """

    block_id: str
    shapes: tuple[Shape, ...]
    scope: str
    shape_filter: str | None


@dataclass(frozen=True)
class PlannedStudy:
    """One template over one shape group: the study a search runs for it.

    ``budget`` is this template's share of the group's evaluations (0: the template gets no study,
    the group's evaluations went to its other templates or to the LLM reserve); ``reserve`` is the
    group's LLM reserve (the same on every study of the group; 0 without ``[llm]``).
    """

    block_id: str
    template_id: str
    shapes: tuple[Shape, ...]
    scope: str
    shape_filter: str | None
    name: str
    budget: int
    reserve: int


def study_name(job: Job, template_id: str, scope: str) -> str:
    """The name of a study (also its Optuna study's name in the job's storage); a job tuning for
    energy or time-energy gets its own names (:func:`~kernelforge.search.energy.study_suffix`)."""
    return f"{job.name}|{template_id}|{scope}|{job.dtype}{study_suffix(job.objective)}"


def llm_reserve(job: Job) -> int:
    """Evaluations of each shape group kept for what the LLM proposes (0 without ``[llm]``)."""
    if job.llm is None:
        return 0
    evaluations = job.strategy.evaluations
    return min(evaluations, round(evaluations * job.llm.tune_share))


def shares(evaluations: int, count: int) -> list[int]:
    """``evaluations`` split into ``count`` shares in turn (the first ones get the remainder)."""
    return [evaluations // count + (i < evaluations % count) for i in range(count)]


def block_spec(job: Job, block_id: str) -> BlockSpec:
    """The job's entry for ``block_id``."""
    return next(spec for spec in job.blocks if spec.id == block_id)


def shape_groups(job: Job, catalog: Catalog, block_id: str) -> list[ShapeGroup]:
    """The shape groups of one block of the job, in the block's shape order."""
    spec = block_spec(job, block_id)
    shapes = catalog.block(block_id).shapes(spec.shapes)
    return [ShapeGroup(block_id, tuple(group), job.tune.scope(group), job.tune.shape_filter(group))
            for group in job.tune.groups(shapes)]


def plan_studies(job: Job, catalog: Catalog) -> list[PlannedStudy]:
    """Every study of the human templates the job searches, block by block, group by group,
    template by template (the order a search visits them in). Studies of LLM-written templates
    are not planned: they exist only once the LLM wrote them (paid from ``reserve``)."""
    reserve = llm_reserve(job)
    planned = []
    for spec in job.blocks:
        templates = [t for t in catalog.templates(spec.id, spec.templates or None)
                     if not spec.templates or t.name in spec.templates]
        for group in shape_groups(job, catalog, spec.id):
            for template, share in zip(templates, shares(job.strategy.evaluations - reserve, len(templates))):
                planned.append(PlannedStudy(
                    block_id=spec.id, template_id=template.id, shapes=group.shapes, scope=group.scope,
                    shape_filter=group.shape_filter, name=study_name(job, template.id, group.scope),
                    budget=share, reserve=reserve,
                ))
    return planned


def baseline_candidate(catalog: Catalog, block_id: str) -> Candidate:
    """The human baseline of a block at its ``[baseline]`` point (single-point uses: render,
    check without shapes); a search compares each shape with :func:`baseline_candidates`."""
    return Candidate.from_template(catalog.baseline(block_id), origin="baseline")


def baseline_candidates(catalog: Catalog, block_id: str, shapes: Sequence[Shape]) -> dict[str, Candidate]:
    """shape name -> the human baseline rendered at that shape's baseline point (origin
    "baseline"): the reference every speedup on that shape is over. Shapes that share a point
    share the candidate (the same source, so the same id: a resumed search finds its results)."""
    template = catalog.baseline(block_id)
    rendered: dict[tuple, Candidate] = {}
    out = {}
    for shape in shapes:
        point = template.baseline_for(shape).point
        key = tuple(point[name] for name in template.space.names)
        if key not in rendered:
            rendered[key] = Candidate.from_template(template, point, origin="baseline")
        out[shape.name] = rendered[key]
    return out


def already_spent(store, job: Job, catalog: Catalog, planned: PlannedStudy) -> int:
    """Evaluations of a planned study already in ``store`` (a resumed search spends only the rest).

    An evaluation is a candidate stored on every shape of the group, as the search counts one
    when it settles a claim: a candidate a stopped run stored on some shapes only is not spent (a
    killed worker's open claim on it is counted once, by the ledger; a released one is charged
    again when asked). A baseline's own measurement is free: a baseline candidate counts only once
    the study measured it on every shape of its group where it is not the baseline."""
    if not planned.shapes:
        return 0
    evaluated = set.intersection(*(store.evaluated(job.name, planned.block_id, planned.template_id, shape.name,
                                                   job.dtype) for shape in planned.shapes))
    baselines = baseline_candidates(catalog, planned.block_id, planned.shapes)
    ids = {c.id for c in baselines.values()} & evaluated
    free = {cid for cid in ids if all(c.id == cid for c in baselines.values())}
    # A candidate the compile rejected for the target's resources cost no evaluation (issue 14).
    free |= {c.candidate_id for c in store.compiles(evaluated - free, job.dtype)
             if resource_rejected(c.status, store.results(candidate_id=c.candidate_id, dtype=job.dtype))}
    return len(evaluated - free)
