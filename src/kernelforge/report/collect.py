"""Collect a job's report from its results database into :class:`~kernelforge.report.records.Report`
records. Only stored measurements are read; nothing is measured here.

Per block: each shape's human baseline (the block's baseline template at the shape's baseline
point, :func:`shape_baselines`) and the sources those points come from, the environment of the
latest baseline measurement (the latest search's device), the winner of each study (shapes grouped
as the search grouped them: ``job.tune.groups``), each shape's speedup over its own baseline with
its spread (from the interleaved confirmation pairs when the search confirmed it,
else from the two timing bands), counts by status and origin, every candidate with its origin and
parent, the search's progress, the winners' diffs against the baseline source, compile resources,
and where each timing sits against the device's roofline.
"""

from __future__ import annotations

import difflib
from collections import Counter
from dataclasses import replace
from typing import Any, Sequence

from kernelforge.baseline_timing import BaselineSeries, baseline_at
from kernelforge.block import Shape
from kernelforge.candidate import Candidate
from kernelforge.catalog import Catalog
from kernelforge.devices.base import quantiles
from kernelforge.devices.hardware import Ceilings, assess, ceilings_for, timed_device_name
from kernelforge.environment import Timings, timings_of
from kernelforge.job import BlockSpec, Job, Tune
from kernelforge.objective import (baseline_results, by_candidate, geomean, geomean_speedup, rank, speedup,
                                   speedup_spread)
from kernelforge.redact import redact_url
from kernelforge.report.export.dashboard import dashboard_command
from kernelforge.report.llm_section import collect_llm
from kernelforge.report.pareto import block_fronts
from kernelforge.report.projection.of_report import collect_projection
from kernelforge.report.records import (Banner, BaselineSource, BlockReport, CandidateRow, CompileRow, Progress,
                                        ProgressPoint, Report, RooflineMeta, ShapeBaseline, ShapeRoofline, ShapeRow,
                                        Suspect, Winner)
from kernelforge.result import StoredResult
from kernelforge.report.library import library_lines
from kernelforge.search.plan import baseline_candidates
from kernelforge.shipped import baseline_claim, covering
from kernelforge.store.records import StoredCandidate, StoredConfirmation
from kernelforge.store.store import Store

Table = dict[str, dict[str, StoredResult]]  # candidate id -> shape -> result
Baselines = dict[str, ShapeBaseline]  # shape name -> the shape's baseline


def shape_baselines(catalog: Catalog, block_id: str, shapes: Sequence[Shape]) -> Baselines:
    """shape name -> the shape's human baseline: the block's baseline template rendered at
    ``Template.baseline_for(shape).point`` (the very candidate the search measures as that shape's
    baseline, :func:`kernelforge.search.plan.baseline_candidates`), with the point's source."""
    template = catalog.baseline(block_id)
    rendered = baseline_candidates(catalog, block_id, shapes)
    out = {}
    for shape in shapes:
        chosen, candidate = template.baseline_for(shape), rendered[shape.name]
        out[shape.name] = ShapeBaseline(shape=shape.name, candidate=candidate.id, params=candidate.point,
                                        source=chosen.source, rule=chosen.rule)
    return out


def baseline_sources(baselines: Baselines) -> tuple[BaselineSource, ...]:
    """The distinct sources of a block's baselines with the shapes each covers, in shape order."""
    groups: dict[tuple[str, int | None], list[str]] = {}
    for b in baselines.values():
        groups.setdefault((b.source, b.rule), []).append(b.shape)
    return tuple(BaselineSource(source=source, rule=rule, shapes=tuple(names)) for (source, rule), names in groups.items())


def collect(job: Job, catalog: Catalog, store: Store) -> Report:
    """Everything the report shows (``Report.to_json()`` is results.json)."""
    confirmations = store.confirmations(job.name)
    blocks = []
    environments: dict[str, dict[str, Any]] = {}
    for spec in job.blocks:
        blocks.append(_collect_block(job, catalog, store, spec, confirmations, environments))
    banners = {b.env_key: b.banner for b in blocks if b.banner}
    return Report(
        job=job.name, job_file=str(job.path), dtype=job.dtype, tune=job.tune, strategy=job.strategy.name,
        storage=redact_url(job.storage_url), blocks=tuple(blocks), environments=environments, banners=tuple(banners.values()),
        projection=collect_projection(blocks, catalog), llm=collect_llm(job, store, blocks),
        dashboard=dashboard_command(job), objective=str(job.objective),
    )


def _collect_block(job: Job, catalog: Catalog, store: Store, spec: BlockSpec,
                   confirmations: list[StoredConfirmation], environments: dict[str, dict[str, Any]]) -> BlockReport:
    block = catalog.block(spec.id)
    shape_objs = block.shapes(spec.shapes)
    shapes = [s.name for s in shape_objs]
    fallback_id = Candidate.from_template(catalog.baseline(block.id)).id
    baselines = shape_baselines(catalog, block.id, shape_objs)
    baseline_ids = {b.candidate for b in baselines.values()}
    rows = [r for r in store.results(block=block.id, dtype=job.dtype) if r.shape in shapes]
    for r in rows:
        environments.setdefault(r.env_key, r.env)
    env_key = _pick_env(rows, baselines)
    rows = [r for r in rows if r.env_key == env_key]
    env = rows[0].env if rows else {}
    table = by_candidate(rows)
    # Each shape's speedups are over that shape's own baseline (never another shape's point).
    # Each candidate's result against the baseline as timed most recently before it.
    base = BaselineSeries(baseline_results(table, {s: b.candidate for s, b in baselines.items()}),
                          store.baseline_timings(block.id, job.dtype, env_key))
    candidates = {c.id: c for c in store.candidates(block.id)}
    statuses: Counter = Counter()
    worst: dict[str, str] = {}
    for cid, per_shape in table.items():
        worst[cid] = next((r.status.value for r in per_shape.values() if not r.ok), "ok")
        statuses[worst[cid]] += 1
    origin_of = {cid: (candidates[cid].origin if cid in candidates else "?") for cid in table}
    origins = Counter(origin_of[cid] for cid in table if cid in candidates)
    origin_status: dict[str, Counter] = {}
    for cid in table:
        origin_status.setdefault(origin_of[cid], Counter())[worst[cid]] += 1
    ceilings = _ceilings(env)
    confirmed = [c for c in confirmations if c.block == block.id and c.env_key == env_key]
    shape_rows = [replace(row, claim=baseline_claim(block.shipped, shape)) for row, shape in
                  zip(_shape_rows(job.tune, shape_objs, table, baselines, base, candidates, confirmed, ceilings),
                      [s for group in job.tune.groups(shape_objs) for s in group])]
    speedups = [r.speedup for r in shape_rows if r.speedup]
    order = sorted(table, key=lambda cid: (min(r.created for r in table[cid].values()),
                                           candidates[cid].created if cid in candidates else 0.0))
    winners = _winners(shape_rows, candidates)
    compiles = [CompileRow(**vars(c), role="baseline" if c.candidate_id in baseline_ids else "winner")
                for c in store.compiles([*dict.fromkeys(b.candidate for b in baselines.values()),
                                         *[w.id for w in winners]], job.dtype)]
    compiles.sort(key=lambda r: (r.target, r.role != "baseline"))  # baseline first, then winners
    return BlockReport(
        block=block.id, description=block.description, shapes=tuple(shape_rows),
        geomean_speedup=geomean(speedups) if speedups else None,
        statuses=dict(statuses), origins=dict(origins), candidates=len(table),
        origin_status={k: dict(v) for k, v in origin_status.items()},
        env_key=env_key, baseline=fallback_id, banner=_banner(env) if env else None,
        device_name=env.get("device_name"),
        candidate_rows=_candidate_rows(order, table, base, shapes, candidates, origin_of, worst),
        progress=_progress(order, table, base, shapes, origin_of, job.tune),
        winners=tuple(winners), compiles=tuple(compiles),
        roofline=_roofline_meta(env, ceilings),
        suspects=_suspects(table, ceilings), baselines=baseline_sources(baselines),
        library=tuple(library_lines(store, block.id, shapes, job.dtype, env_key).values()),  # issue 11
        shipped=covering(block.shipped, shape_objs),
        pareto=block_fronts([("all", shapes)], table, env),  # one front over the block's shapes
    )


def _shape_rows(tune: Tune, shapes: list[Shape], table: Table, baselines: Baselines, base_rows: BaselineSeries,
                candidates: dict[str, StoredCandidate], confirmations: list[StoredConfirmation],
                ceilings: Ceilings | None) -> list[ShapeRow]:
    """One row per shape: the winner of the shape's study (the best candidate over the group that
    beat the group's per-shape baselines, else each shape's own baseline) against the shape's
    baseline."""
    rows = []
    for group in tune.groups(shapes):
        names = [s.name for s in group]
        ranked = rank(table, base_rows, names)
        group_winner = ranked[0][0] if ranked and ranked[0][1] > 1.0 else None
        for shape in group:
            own = baselines[shape.name]
            winner = group_winner or own.candidate
            best = table.get(winner, {}).get(shape.name)
            # The baseline as timed most recently before the winner's result (its first timing for
            # the baseline itself): the search's figures of the row are one comparison.
            base = baseline_at(base_rows, best) if best is not None else base_rows.get(shape.name)
            # Only pairs against this shape's own baseline back its speedup; a re-run's confirmation
            # supersedes earlier ones.
            confirmed = [c for c in confirmations if c.shape == shape.name and c.candidate_id == winner
                         and c.baseline_id == own.candidate]
            conf = confirmed[-1] if confirmed else None
            search = speedup(base, best)
            rows.append(ShapeRow(
                shape=shape.name, dims=shape.as_dict(),
                **_measurement(base, best, conf),
                baseline_j=base.joules if base else None, best_j=best.joules if best else None,
                winner_rel_error=best.rel_error if best else None,
                winner=winner, winner_is_baseline=winner == own.candidate,
                params=candidates[winner].params if winner in candidates else {},
                template=candidates[winner].template if winner in candidates else None,
                confirmed=bool(conf), pairs=len(conf.speedups) if conf else 0,
                significant=bool(conf and conf.p20 > 1.0),
                search_baseline_s=base.median_s if base else None, search_best_s=best.median_s if best else None,
                search_speedup=search, pair_speedup=conf.median if conf else None,
                baseline_timings=_baseline_timings(base_rows, own.candidate, shape.name, confirmations),
                flops=base.flops if base else None, bytes=base.bytes if base else None,
                timing_label=base.timing_label if base else None, timing_method=base.timing_method if base else None,
                roofline=ShapeRoofline(
                    baseline=assess(base.flops, base.bytes, base.median_s, ceilings) if base and base.ok else None,
                    winner=assess(best.flops, best.bytes, best.median_s, ceilings) if best and best.ok else None),
                baseline=own.candidate, baseline_source=own.source, baseline_params=own.params,
            ))
    return rows


def _baseline_timings(base: BaselineSeries, baseline_id: str, shape: str,
                      confirmations: list[StoredConfirmation]) -> tuple[float, ...]:
    """Every stored timing of a shape's baseline: the search's (its first, then each re-timing
    beside the candidates), then the baseline half of each confirmation pair against it (any
    candidate's), in stored order."""
    first = base.get(shape)
    search = base.timings(shape) if first is not None and first.ok else ()
    pairs = tuple(b for c in confirmations if c.shape == shape and c.baseline_id == baseline_id
                  for b, _ in c.pair_times)
    return search + pairs


def _measurement(base: StoredResult | None, best: StoredResult | None,
                 conf: StoredConfirmation | None) -> dict[str, Any]:
    """The times, bands, sample counts and speedup of one shape row, all from one measurement (the
    contract of :class:`ShapeRow`): the confirmation pairs when they carry their times, else the
    search's stored results. Rows confirmed before pairs stored their times fall back to the search."""
    if conf is not None and conf.pair_times:
        b_med, b20, b80 = quantiles([b for b, _ in conf.pair_times])
        c_med, c20, c80 = quantiles([c for _, c in conf.pair_times])
        return dict(measured_by="pairs", baseline_s=b_med, best_s=c_med, baseline_p20_s=b20, baseline_p80_s=b80,
                    best_p20_s=c20, best_p80_s=c80, baseline_samples=len(conf.pair_times),
                    best_samples=len(conf.pair_times), speedup=b_med / c_med if c_med else None,
                    speedup_p20=conf.p20, speedup_p80=conf.p80)
    band = speedup_spread(base, best) if base and best else None
    return dict(measured_by="search",
                baseline_s=base.median_s if base else None, best_s=best.median_s if best else None,
                baseline_p20_s=base.p20_s if base else None, baseline_p80_s=base.p80_s if base else None,
                best_p20_s=best.p20_s if best else None, best_p80_s=best.p80_s if best else None,
                baseline_samples=base.samples if base else None, best_samples=best.samples if best else None,
                speedup=speedup(base, best), speedup_p20=band[0] if band else None,
                speedup_p80=band[1] if band else None)


def _candidate_rows(order: list[str], table: Table, base_rows: dict[str, StoredResult], shapes: list[str],
                    candidates: dict[str, StoredCandidate], origin_of: dict[str, str],
                    worst: dict[str, str]) -> tuple[CandidateRow, ...]:
    rows = []
    for index, cid in enumerate(order):
        c = candidates.get(cid)
        measured = [table[cid][s] for s in shapes if s in table[cid]]
        rows.append(CandidateRow(
            order=index, id=cid, template=c.template if c else "?", origin=origin_of[cid],
            parent=c.parent if c else None, status=worst[cid],
            geomean_speedup=geomean_speedup(measured, base_rows), shapes=len(measured),
            params=c.params if c else {},
        ))
    return tuple(rows)


def _winners(shape_rows: list[ShapeRow], candidates: dict[str, StoredCandidate]) -> list[Winner]:
    """The candidates that won some shape, with their diff against the source of the baseline of
    the first shape each won."""
    winners = []
    for wid in dict.fromkeys(r.winner for r in shape_rows if not r.winner_is_baseline):
        c = candidates.get(wid)
        if c is None:
            continue
        won = [r for r in shape_rows if r.winner == wid and not r.winner_is_baseline]
        against = won[0].baseline
        base = candidates.get(against)
        winners.append(Winner(
            id=wid, template=c.template, origin=c.origin, parent=c.parent, params=c.params,
            shapes=tuple(r.shape for r in won), source=c.source,
            diff=_diff(base.source, c.source, against, wid) if base else "", against=against,
        ))
    return winners


def _progress(order: list[str], table: Table, base: dict[str, StoredResult], shapes: list[str],
              origins: dict[str, str], tune: Tune) -> Progress:
    """Speedup of each evaluation in stored order and the best speedup so far.

    All-shapes tuning: a candidate's speedup is its geometric mean over the block's shapes and the
    best so far is the running maximum. Per-shape tuning: every shape has its own best; the line is
    the geometric mean over shapes of the best so far per shape (the baseline, 1x, until a shape
    finds better). Every speedup is over the shape's own baseline (``base``: shape -> its result).
    """
    points, best_line = [], []
    best_all = 0.0
    best_per_shape = {s: 1.0 for s in shapes}
    for index, cid in enumerate(order):
        rows = table[cid]
        measured = [s for s in shapes if s in rows]
        value = geomean_speedup([rows[s] for s in measured], base)
        status = "ok" if value is not None else next((rows[s].status.value for s in measured if not rows[s].ok), "ok")
        origin = origins.get(cid, "?")
        points.append(ProgressPoint(index=index, candidate=cid, origin=origin, speedup=value, status=status,
                                    label=f"#{index} {cid} ({origin}): "
                                          + (f"{value:.3f}x" if value is not None else status)))
        if tune is Tune.PER_SHAPE:
            if value is not None:
                for s in measured:
                    here = speedup(baseline_at(base, rows[s]), rows[s])
                    best_per_shape[s] = max(best_per_shape[s], here)  # type: ignore[type-var]
            best_line.append((index, geomean(list(best_per_shape.values()))))
        else:
            if value is not None and len(measured) == len(shapes):
                best_all = max(best_all, value)
            best_line.append((index, best_all if best_all else 1.0))
    return Progress(points=tuple(points), best=tuple(best_line), mode=tune)


def _suspects(table: Table, ceilings: Ceilings | None) -> tuple[Suspect, ...]:
    """Results faster than the datasheet roofline allows (only where ceilings are known)."""
    if not ceilings:
        return ()
    return tuple(
        Suspect(candidate=cid, shape=shape, median_s=r.median_s,
                roofline_s=ceilings.roofline_seconds(r.flops or 0.0, r.bytes or 0.0))
        for cid, per_shape in table.items() for shape, r in per_shape.items()
        if r.ok and r.median_s and assess(r.flops, r.bytes, r.median_s, ceilings).suspect
    )


def _pick_env(rows: list[StoredResult], baselines: Baselines) -> str | None:
    """The environment a block is reported in: the one of the most recent measurement of a shape's
    baseline (the baselines are measured first in every search, so this is the latest search's device)."""
    base = [r for r in rows if r.candidate_id == baselines[r.shape].candidate]
    if not base:
        return None
    return max(base, key=lambda r: r.created).env_key


def _banner(env: dict[str, Any]) -> Banner | None:
    """What to say above numbers that are not live GPU timings (None for a real GPU)."""
    timings = timings_of(env)
    if timings is Timings.INTERPRETER:
        return Banner(kind="interpret", device_name=str(env.get("device_name", "")),
                      text=f"Interpreter timings: {env.get('timing', 'interpreter wall time')}. These are Triton "
                           "interpreter wall times on the CPU; they measure no GPU and say nothing about GPU speed. "
                           "Correctness results are real.")
    if timings is Timings.REPLAYED:
        return Banner(kind="replay", device_name=str(env.get("device_name", "")),
                      text=f"Replayed timings: {env.get('timing', 'replayed')}. The numbers were measured earlier on "
                           f"{env.get('recorded_device', '?')} and are read back from a recording, not measured now.")
    return None


def _diff(base_source: str, source: str, base_id: str, cand_id: str) -> str:
    return "".join(difflib.unified_diff(
        base_source.splitlines(keepends=True), source.splitlines(keepends=True),
        fromfile=f"baseline {base_id}", tofile=f"winner {cand_id}", n=3))


def _ceilings(env: dict[str, Any]) -> Ceilings | None:
    name = timed_device_name(env)
    return ceilings_for(name) if name else None


def _roofline_meta(env: dict[str, Any], ceilings: Ceilings | None) -> RooflineMeta:
    """Which ceilings the block's timings are placed against, and why (or why not)."""
    device = timed_device_name(env)
    if not env:
        return RooflineMeta(device=None, ceilings=None, note="no timed results")
    if device is None:
        return RooflineMeta(
            device=None, ceilings=None,
            note="Interpreter wall time on the CPU: no GPU ceiling applies. The rates below are stored "
                 "FLOP and byte counts over interpreter time: not GPU speed, not a percent of any roofline.")
    if ceilings is None:
        return RooflineMeta(device=device, ceilings=None,
                            note=f"{device}: no known ceilings in kernelforge.devices.hardware; add the device there "
                                 "to get percent of roofline.")
    return RooflineMeta(
        device=device, ceilings=ceilings,
        note=(f"{device} ({ceilings.name}): percent of roofline against "
              + ("measured ceilings " if ceilings.measured else "datasheet ceilings ")
              + f"({ceilings.practical_bandwidth / 1e12:.2f} TB/s, {ceilings.practical_flops / 1e12:.0f} "
              f"TFLOP/s; source: {ceilings.source}); suspect = faster than the datasheet roofline "
              f"({ceilings.bandwidth / 1e12:.2f} TB/s, {ceilings.flops / 1e12:.0f} TFLOP/s)."))
