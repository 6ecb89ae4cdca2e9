"""The model-level projection of a report (TTFT/TBT, see :mod:`kernelforge.report.projection.model`)
from the collected blocks' per-call times, as report records: the phases with a measured part
(the dense parts as labelled roofline estimates at the ceilings of the GPU that measured the
blocks), the phases that do not fit that GPU's memory, and every shape a profile needs that the
job did not measure, with why."""

from __future__ import annotations

import re
from typing import Any, Sequence

from kernelforge.catalog import Catalog
from kernelforge.devices.hardware import ceilings_for
from kernelforge.report.projection import model as proj
from kernelforge.report.records import (BlockReport, ComponentRow, MissingGroup, MissingShape, PhaseRow,
                                        ProfileReport, ProjectionReport)

#: Said when a job measured none of the shapes a projection needs (e.g. the demo's smoke shapes).
NOTHING_PROJECTED = ("**Nothing is projected:** this job measured none of the model preset shapes the projection "
                     "needs (it ran other shapes, e.g. smoke shapes); the shapes each profile needs are listed below.")

PROJECTED_BLOCKS = proj.PROJECTED_BLOCKS


def collect_projection(blocks: Sequence[BlockReport], catalog: Catalog, *, chunk: int | None = None) -> ProjectionReport:
    """The model-level projection from the collected blocks (winner and baseline per-call times
    of the attention and MoE blocks' shapes). ``chunk``: the job's prefill chunk size (None: the
    MoE prefill is one pass over the prompt). Estimates and the memory check use the ceilings of
    the GPU that measured the prefill (TTFT) or decode (TBT) attention; none on the interpreter or
    an unknown GPU."""
    measured: dict[tuple[str, str], proj.Measured] = {}
    devices: dict[str, str] = {}
    for b in blocks:
        if b.block not in PROJECTED_BLOCKS:
            continue
        devices[b.block] = str(b.device_name)
        for r in b.shapes:
            if r.baseline_s and r.best_s:
                measured[(b.block, r.shape)] = proj.Measured(r.baseline_s, r.best_s, r.baseline_j, r.best_j)
    known: dict[str, set[str]] = {}
    for block_id in PROJECTED_BLOCKS:
        if block_id in catalog.blocks:
            known[block_id] = {s.name for shapes in catalog.block(block_id).shape_sets().values() for s in shapes}
    moe_tokens: dict[str, list[int]] = {}
    for model in proj.MODELS.values():
        stored = [int(shape.rsplit("/T", 1)[1]) for (block, shape) in measured
                  if block == model.moe_block and shape.startswith(model.moe_set + "/T")
                  and shape.rsplit("/T", 1)[1].isdigit()]
        if not stored:
            # Nothing stored: name the presets the block defines, so "missing" names a real shape.
            stored = [int(s.rsplit("/T", 1)[1]) for s in known.get(model.moe_block, ())
                      if s.startswith(model.moe_set + "/T") and s.rsplit("/T", 1)[1].isdigit()]
        moe_tokens[model.name] = sorted(stored)
    ceilings = {block: ceilings_for(name) for block, name in devices.items()}
    # The GPU that measured the attention sets the estimates' ceilings (else any GPU that measured a block).
    known_gpu = next((c for c in ceilings.values() if c is not None), None)
    prefill = ceilings.get(proj.PREFILL_BLOCK) or known_gpu
    decode = ceilings.get(proj.DECODE_BLOCK) or ceilings.get(proj.MLA_DECODE_BLOCK) or known_gpu
    projection = proj.project(measured, moe_tokens, chunk=chunk, prefill_ceilings=prefill, decode_ceilings=decode)
    profiles = []
    for pname, profile in proj.PROFILES.items():
        phases = projection.for_profile(pname)
        missing = sorted({m for p in phases for m in p.missing}, key=lambda m: (m[0], _natural(m[1])))
        listed = [MissingShape(block=b, shape=s,
                               why=("not a preset of the block" if b in known and s not in known[b]
                                    and not s.endswith("*") else "not measured in this job"))
                  for b, s in missing]
        groups: dict[tuple[str, str], list[str]] = {}
        for m in listed:
            groups.setdefault((m.block, m.why), []).append(m.shape)
        profiles.append(ProfileReport(
            profile=pname, input_tokens=profile.input_tokens, output_tokens=profile.output_tokens,
            phases=tuple(_phase_row(p) for p in phases if _measured(p)),
            missing=tuple(listed),
            missing_groups=tuple(MissingGroup(block=b, why=why, shapes=tuple(shapes))
                                 for (b, why), shapes in groups.items()),
            measured_any=any(_measured(p) for p in phases),
            infeasible=tuple(p.fit for p in phases if p.fit is not None and not p.feasible),
        ))
    return ProjectionReport(profiles=tuple(profiles), devices=devices, not_measured=tuple(proj.NOT_MEASURED),
                            measured_any=any(p.measured_any for p in profiles),
                            models={m.name: m.summary() for m in proj.MODELS.values()}, estimated=proj.ESTIMATED)


def _measured(phase: proj.Phase) -> bool:
    """A feasible phase with a measured part (an estimate alone is not a projection)."""
    return phase.feasible and any(c.complete and not c.estimate for c in phase.components)


def _natural(text: str) -> list[Any]:
    """Sort key that orders embedded numbers by value (T8 before T64 before T4096)."""
    return [int(part) if part.isdigit() else part for part in re.split(r"(\d+)", text)]


def _phase_row(p: proj.Phase) -> PhaseRow:
    return PhaseRow(
        kind=p.kind, model=p.model, batch=p.batch, tokens=p.tokens, complete=p.complete,
        baseline_s=p.baseline_s, winner_s=p.winner_s, change_s=p.change_s, speedup=p.speedup,
        baseline_j_per_token=p.baseline_j_per_token, winner_j_per_token=p.winner_j_per_token,
        components=tuple(ComponentRow(
            block=c.block, label=c.label, complete=c.complete, calls=c.calls_per_layer,
            baseline_s=c.baseline_s, winner_s=c.winner_s,
            change_s=(c.winner_s - c.baseline_s) if c.complete else None,
            baseline_j_per_token=c.baseline_j / p.tokens if c.baseline_j is not None else None,
            winner_j_per_token=c.winner_j / p.tokens if c.winner_j is not None else None,
            missing=tuple(s for _, s in c.missing), note=c.note, estimate=c.estimate,
        ) for c in p.components),
    )
