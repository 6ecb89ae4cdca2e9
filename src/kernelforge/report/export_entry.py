"""The provenance record of one exported (block, shape): :class:`ExportEntry` and :func:`provenance`."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from kernelforge.report.records import ShapeRow


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
