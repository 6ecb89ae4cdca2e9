"""What every export format shares: the provenance record of one exported (block, shape)
(:class:`ExportEntry`, :func:`provenance`), module names of blocks (:func:`slug`), the files of
a block's distinct winners (:func:`winner_files`), and the rule that ships a shape's baseline where
the winner was measured slower on it (:func:`shipped`)."""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

from kernelforge.report.records import BlockReport, Report, ShapeRow
from kernelforge.store.store import Store


@dataclass(frozen=True, kw_only=True)
class ExportEntry:
    """The provenance of one exported (block, shape) in kernelforge-export-<format>.json: the file
    it went into (``token_count``: its key in a vLLM file), the winner exported, its speedup over
    the shape's baseline, and that baseline (candidate, point, source)."""

    file: str
    block: str
    shape: str
    token_count: str | None = None
    candidate: str
    template: str | None
    is_baseline: bool
    speedup: float | None
    speedup_p20: float | None
    speedup_p80: float | None
    confirmed: bool
    significant: bool
    params: dict[str, Any]
    baseline: str
    baseline_source: str
    baseline_params: dict[str, Any]


def provenance(file: str, block: str, row: ShapeRow, token_count: str | None = None) -> ExportEntry:
    """The provenance entry of one exported shape."""
    return ExportEntry(file=file, block=block, shape=row.shape, token_count=token_count, candidate=row.winner,
                       template=row.template, is_baseline=row.winner_is_baseline, speedup=row.speedup,
                       speedup_p20=row.speedup_p20, speedup_p80=row.speedup_p80, confirmed=row.confirmed,
                       significant=row.significant, params=row.params, baseline=row.baseline,
                       baseline_source=row.baseline_source, baseline_params=row.baseline_params)


def slug(block_id: str) -> str:
    """A Python module name for a block id ("moe/gpt_oss_experts" -> "moe_gpt_oss_experts")."""
    return "".join(c if c.isalnum() else "_" for c in block_id)


def winner_files(block: BlockReport, store: Store, files: dict[str, str]) -> list[tuple[ShapeRow, str]]:
    """Each timed shape of ``block`` whose winner's source is stored, with the file holding that
    source (``<block slug>__<candidate id>.py``); every distinct winner's source is added to
    ``files`` (file name -> source) once."""
    out = []
    for row in block.shapes:
        if row.best_s is None:
            continue
        name = f"{slug(block.block)}__{row.winner}.py"
        if name not in files:
            cand = store.candidate(row.winner)
            if cand is None:
                continue
            files[name] = cand.source
        out.append((row, name))
    return out


def shipped(data: Report, store: Store) -> tuple[Report, list[str]]:
    """``data`` as an export ships it, and a note per change: a shape where one configuration
    serves several (``tune = "all-shapes"``) and its winner was measured slower than the shape's
    own baseline (the whole p20-p80 of its speedup below 1) ships that baseline, since it is what
    is fastest there of what was measured. The report keeps the winner (it is the search's result)."""
    notes, blocks = [], []
    for block in data.blocks:
        rows = []
        for row in block.shapes:
            slower = (not row.winner_is_baseline and row.speedup_p80 is not None and row.speedup_p80 < 1.0
                      and row.baseline)
            baseline = store.candidate(row.baseline) if slower else None
            if baseline is not None:
                notes.append(f"{block.block} {row.shape}: the winner {row.winner} was measured slower than the "
                             f"shape's baseline ({row.speedup_p20:.3f}-{row.speedup_p80:.3f}x); exported the "
                             "baseline there")
                row = replace(row, winner=row.baseline, winner_is_baseline=True, params=dict(row.baseline_params),
                              template=baseline.template, best_s=row.baseline_s,
                              speedup=1.0, speedup_p20=None, speedup_p80=None, confirmed=False, significant=False)
            rows.append(row)
        blocks.append(replace(block, shapes=tuple(rows)))
    return replace(data, blocks=tuple(blocks)), notes
