"""What every export format shares: the provenance record of one exported (block, shape)
(:class:`ExportEntry`, :func:`provenance`), module names of blocks (:func:`slug`) and the files of
a block's distinct winners (:func:`winner_files`)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from kernelforge.report.records import BlockReport, ShapeRow
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
