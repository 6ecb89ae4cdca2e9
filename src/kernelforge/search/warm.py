"""Warm start: a study first asks the best configurations other searches stored for its template.

A job names its sources with ``[strategy] warm_start = ["JOB", ...]`` or ``kernelforge search JOB
--warm-start SOURCE`` (which replaces the job file's list). A source is

- the name of a job in the same storage, measured on any device or environment (the point of it:
  a job tuned on another GPU, or on other shapes); when that job has successful results on this
  study's shapes in this job's dtype, only those rank its points, else all of its results do;
- ``shapes``: every stored result of the template on shapes this study does not tune (any job,
  any device), e.g. the other shapes of a per-shape job, or an earlier job on another shape set.

Ranking, one rule for every source. A time is only compared with times measured in the same
conditions: a group is one (environment key, dtype, shape). In each group a configuration's median
time is divided by the fastest successful median of the template there (1.0: the fastest); its
score is the geometric mean of those ratios over the groups it was measured in. A configuration
that failed in any group is left out (it may not run here either). When every configuration was
measured on the same shapes, this is exactly the order of the source's own objective (the
geometric-mean speedup over its baseline: the baseline's time is one constant per shape), and it
needs no baseline, so sources whose baselines differ (other devices, shapes or baseline rules) rank
by the same rule. Ties: the configuration measured in more groups first, then the one stored first.

Of the distinct points that are valid in the study's space (a stored point from an older space
that no longer fits is skipped) and not already known (the study's baseline points, points this job
measured on the study's shapes), :data:`DEFAULT_LIMIT` are asked right after the baseline points,
taken in rank order but spread out: the best ones that differ pairwise in at least two parameters
first, the next best filling up when there are too few (:func:`kernelforge.strategies.transfer.spread`;
why: that module's docstring). :func:`kernelforge.search.study.make_strategy_for` passes them as
extra start points, so a strategy asks them first and an Optuna strategy enqueues them. They cost
evaluations like any point; their candidates keep the strategy's origin (a candidate's id is shared
with the source's, and its stored origin is the first writer's), and a ``warm_start`` progress
event records which points came from which source. Where the source measured in the same conditions (same environment
and shape), the stored results answer for free, as for any point already measured.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Iterable, Mapping, Sequence

from kernelforge.block import Shape
from kernelforge.errors import UserError
from kernelforge.result import StoredResult
from kernelforge.space import Space
from kernelforge.strategies.transfer import DEFAULT_LIMIT as WARM_LIMIT
from kernelforge.strategies.transfer import scores_of, spread
from kernelforge.template import Template

if TYPE_CHECKING:
    from kernelforge.search.context import RunContext
    from kernelforge.store.store import Store

#: The source meaning "other shapes of the same template in this storage".
SHAPES = "shapes"
#: How many warm points a study asks at most (the strategy bench's ``--warm-from`` asks as many).
DEFAULT_LIMIT = WARM_LIMIT


@dataclass(frozen=True)
class WarmPoint:
    """One configuration a study asks first: ``point`` of the study's space, found in ``source``
    (the first source, in the order given, that stored it), as candidate ``candidate_id``;
    ``score``: the geometric mean of its time ratios to the fastest per group (1.0: fastest in
    every group it was measured in); ``groups``: how many (environment, dtype, shape) it was in."""

    point: Mapping[str, Any]
    source: str
    candidate_id: str
    score: float
    groups: int


@dataclass(frozen=True)
class WarmStart:
    """What :func:`collect` found: the points in rank order, the sources that gave nothing (no
    successful result of the template), and ``scores``: the rank score of every ranked or failed
    point of the study's space (key in the space's parameter order; see the module docstring)."""

    points: tuple[WarmPoint, ...]
    empty: tuple[str, ...]
    scores: Mapping[tuple, float] = field(default_factory=dict)


def check_sources(store: "Store | None", job_name: str, sources: Sequence[str]) -> None:
    """Raise UserError for a source that is neither ``shapes`` nor a job with results in ``store``
    (naming the stored jobs; None: no database yet, so none), or that is the job itself."""
    stored = None
    for source in sources:
        if source == SHAPES:
            continue
        if source == job_name:
            raise UserError(f"warm start {source!r}: that is this job itself, whose points its own search "
                            f"already knows; name another job, or {SHAPES!r} for the template's other shapes")
        stored = (store.jobs() if store is not None else []) if stored is None else stored
        if source not in stored:
            listing = ", ".join(stored) if stored else "none yet"
            raise UserError(f"warm start {source!r}: no job of that name stored results in this storage; its jobs: "
                            f"{listing} (give --storage the database of the job to start from, or {SHAPES!r})")


def collect(store: "Store", *, job_name: str, dtype: str, template: Template, shapes: Sequence[Shape],
            sources: Sequence[str], exclude: Iterable[Mapping[str, Any]] = (),
            limit: int = DEFAULT_LIMIT) -> WarmStart:
    """The best stored configurations of ``template`` in ``sources`` for a study of job
    ``job_name`` over ``shapes`` in ``dtype``, ranked by the module's rule, at most ``limit``,
    none in ``exclude`` (points of the template's space) or already measured by this job on these
    shapes. Raises UserError for an unknown source (:func:`check_sources`)."""
    check_sources(store, job_name, sources)
    space = template.space
    names = {shape.name for shape in shapes}
    candidates = {c.id: c for c in store.candidates(template.block_id) if c.template == template.id}
    rows = [r for r in store.results(block=template.block_id) if r.candidate_id in candidates]
    known = {_key(space, point) for point in exclude}
    known |= {_key(space, candidates[r.candidate_id].params) for r in rows
              if r.job == job_name and r.shape in names and r.dtype == dtype}
    chosen: dict[tuple[str, str, str, str], StoredResult] = {}
    found_in: dict[str, str] = {}
    empty = []
    for source in sources:
        picked = _source_rows(rows, source, job_name, dtype, names)
        if not any(r.ok for r in picked):
            empty.append(source)
            continue
        for r in picked:
            chosen.setdefault((r.candidate_id, r.shape, r.dtype, r.env_key), r)
            found_in.setdefault(r.candidate_id, source)
    points: list[WarmPoint] = []
    ranking = rank(chosen.values())
    for candidate_id, score, groups in ranking:
        point = _point_of(space, candidates[candidate_id].params)
        if point is None or _key(space, point) in known:
            continue
        known.add(_key(space, point))
        points.append(WarmPoint(point, found_in[candidate_id], candidate_id, score, groups))
    points = spread(points, limit, key=lambda p: _key(space, p.point))
    return WarmStart(tuple(points), tuple(empty), _scores(space, candidates, ranking, chosen.values()))


def _scores(space: Space, candidates: Mapping[str, Any], ranking: list[tuple[str, float, int]],
            results: Iterable[StoredResult]) -> dict[tuple, float]:
    """The rank score of every ranked and every failed candidate that is a point of ``space``."""
    ranked_ids = {cid for cid, _, _ in ranking}
    keys = {}
    for cid in [cid for cid, _, _ in ranking] + [r.candidate_id for r in results if r.candidate_id not in ranked_ids]:
        point = _point_of(space, candidates[cid].params)
        if point is not None:
            keys.setdefault(cid, _key(space, point))
    return scores_of([keys[cid] for cid, _, _ in ranking if cid in keys],
                     [key for cid, key in keys.items() if cid not in ranked_ids])


def rank(results: Iterable[StoredResult]) -> list[tuple[str, float, int]]:
    """(candidate id, score, groups) of every candidate that succeeded wherever it was measured,
    best first (the module's rule); ``results`` in the order they were stored."""
    best: dict[tuple[str, str, str], float] = {}
    failed: set[str] = set()
    rows = list(results)
    for r in rows:
        if r.ok and r.median_s and r.median_s > 0:
            group = (r.env_key, r.dtype, r.shape)
            best[group] = min(best.get(group, r.median_s), r.median_s)
        else:
            failed.add(r.candidate_id)
    logs: dict[str, list[float]] = {}
    for r in rows:
        if r.candidate_id not in failed:
            logs.setdefault(r.candidate_id, []).append(math.log(r.median_s / best[(r.env_key, r.dtype, r.shape)]))
    order = {cid: i for i, cid in enumerate(logs)}  # first stored first, on ties
    scored = [(cid, math.exp(sum(v) / len(v)), len(v)) for cid, v in logs.items()]
    return sorted(scored, key=lambda item: (item[1], -item[2], order[item[0]]))


def warm_start_points(run: "RunContext", template: Template, shapes: Sequence[Shape],
                      firsts: Sequence[Mapping[str, Any]]) -> tuple[list[dict[str, Any]], dict[tuple, float]]:
    """The warm points of a study of ``template`` over ``shapes`` in this run (none without
    ``[strategy] warm_start``), after the baseline points ``firsts``, and the rank scores of every
    point the sources ranked (:class:`WarmStart`); says what it found as progress events
    (``warm_start`` with the points and their sources; a ``warning`` for a source without a
    successful result of the template, the search going on without it)."""
    sources = run.job.strategy.warm_start
    if not sources:
        return [], {}
    found = collect(run.store, job_name=run.job.name, dtype=run.job.dtype, template=template, shapes=shapes,
                    sources=sources, exclude=firsts)
    scope = ", ".join(shape.name for shape in shapes)
    for source in found.empty:
        what = (f"no shape other than {scope} has a successful result of {template.id} in this storage"
                if source == SHAPES else f"job {source!r} has no successful result of {template.id}")
        run.progress.event("warning", message=f"warm start: {what}; the search starts without it")
    if found.points:
        run.progress.event(
            "warm_start", template=template.id, shapes=[shape.name for shape in shapes],
            points=[{"source": p.source, "candidate": p.candidate_id, "params": dict(p.point),
                     "score": round(p.score, 4)} for p in found.points],
            message=f"warm start of {template.id} on {scope}: {len(found.points)} stored configurations "
                    f"first (from {', '.join(dict.fromkeys(p.source for p in found.points))})")
    return [dict(p.point) for p in found.points], dict(found.scores)


def _source_rows(rows: list[StoredResult], source: str, job_name: str, dtype: str,
                 names: set[str]) -> list[StoredResult]:
    """The results ``source`` contributes (see the module docstring)."""
    if source == SHAPES:
        return [r for r in rows if r.shape not in names]
    mine = [r for r in rows if r.job == source]
    matching = [r for r in mine if r.shape in names and r.dtype == dtype]
    return matching if any(r.ok for r in matching) else mine


def _point_of(space: Space, params: Mapping[str, Any]) -> dict[str, Any] | None:
    """``params`` as a valid point of ``space`` (None: a parameter is missing or out of the space)."""
    if any(name not in params for name in space.names):
        return None
    point = {name: params[name] for name in space.names}
    return None if space.problems(point) else point


def _key(space: Space, point: Mapping[str, Any]) -> tuple:
    return tuple(point.get(name) for name in space.names)
