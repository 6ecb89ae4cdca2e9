"""Two collected reports side by side (the same job on two GPUs, two Triton versions, ...): the
records of the comparison and its Markdown (printed by ``kernelforge report A --compare B``)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from kernelforge.report.format import env_title, fmt_speedup, fmt_time, speedup_text
from kernelforge.report.records import Banner, Report, ShapeRow


@dataclass(frozen=True)
class CompareSide:
    """One job of a comparison."""

    job: str
    job_file: str
    dtype: str
    banners: tuple[Banner, ...]
    environments: dict[str, dict[str, Any]]


@dataclass(frozen=True)
class CompareRow:
    """One shape in both jobs (None: the job has no such shape). The ratios are A's time over
    B's: above 1, B is faster. ``same_baseline``: both jobs timed the same baseline candidate on
    this shape (False: the baseline ratio compares two different kernels)."""

    shape: str
    a: ShapeRow | None
    b: ShapeRow | None
    winner_ratio: float | None
    baseline_ratio: float | None
    same_baseline: bool = True


@dataclass(frozen=True)
class CompareBlock:
    """One block in both jobs, with each job's geometric-mean speedup and environment."""

    block: str
    rows: tuple[CompareRow, ...]
    geomean_a: float | None
    geomean_b: float | None
    env_a: dict[str, Any]
    env_b: dict[str, Any]


@dataclass(frozen=True)
class Comparison:
    """Two reports side by side, A first."""

    a: CompareSide
    b: CompareSide
    blocks: tuple[CompareBlock, ...]


def compare(a: Report, b: Report) -> Comparison:
    """The blocks and shapes of two collected reports side by side. Blocks and shapes present in
    only one are listed with the other side empty."""

    def side(report: Report, block: str, shape: str) -> ShapeRow | None:
        found = report.block(block)
        return next((r for r in found.shapes if r.shape == shape), None) if found else None

    def env_of(report: Report, block: str) -> dict[str, Any]:
        found = next((blk for blk in report.blocks if blk.block == block and blk.env_key), None)
        return report.env(found) if found else {}

    def ratio(x: float | None, y: float | None) -> float | None:
        return x / y if x and y else None

    blocks = []
    for block in dict.fromkeys([x.block for x in a.blocks] + [x.block for x in b.blocks]):
        shapes = [r.shape for report in (a, b) for blk in report.blocks if blk.block == block for r in blk.shapes]
        rows = []
        for shape in dict.fromkeys(shapes):
            ra, rb = side(a, block, shape), side(b, block, shape)
            rows.append(CompareRow(
                shape=shape, a=ra, b=rb,
                winner_ratio=ratio(ra.best_s, rb.best_s) if ra and rb else None,
                baseline_ratio=ratio(ra.baseline_s, rb.baseline_s) if ra and rb else None,
                same_baseline=not (ra and rb and ra.baseline and rb.baseline and ra.baseline != rb.baseline),
            ))
        geo_a, geo_b = (next((blk.geomean_speedup for blk in r.blocks if blk.block == block), None) for r in (a, b))
        blocks.append(CompareBlock(block=block, rows=tuple(rows), geomean_a=geo_a, geomean_b=geo_b,
                                   env_a=env_of(a, block), env_b=env_of(b, block)))
    return Comparison(a=_side(a), b=_side(b), blocks=tuple(blocks))


def _side(report: Report) -> CompareSide:
    return CompareSide(job=report.job, job_file=report.job_file, dtype=report.dtype, banners=report.banners,
                       environments=report.environments)


def compare_markdown(cmp: Comparison) -> str:
    """The comparison as Markdown."""
    a, b = cmp.a, cmp.b
    lines = [f"# kernelforge comparison: {a.job} (A) vs {b.job} (B)", ""]
    lines.append(f"A: `{a.job_file}`; B: `{b.job_file}`. Speedups are each job's winner over its own baseline; "
                 "'A/B winner time' > 1 means B's winner is faster than A's.")
    lines.append("")
    for name, side in (("A", a), ("B", b)):
        for banner in side.banners:
            lines.append(f"> **{name}: {banner.text}**")
            lines.append("")
    for blk in cmp.blocks:
        lines.append(f"## {blk.block}")
        lines.append("")
        lines.append(f"A: {env_title(blk.env_a)}. B: {env_title(blk.env_b)}.")
        lines.append("")
        lines.append(f"Geometric-mean speedup: A {fmt_speedup(blk.geomean_a)}, B {fmt_speedup(blk.geomean_b)}.")
        lines.append("")
        lines.append("| shape | A baseline | A winner | A speedup | B baseline | B winner | B speedup | "
                     "A/B baseline time | A/B winner time |")
        lines.append("|---|---|---|---|---|---|---|---|---|")
        for r in blk.rows:
            cells = []
            for row in (r.a, r.b):
                cells += [fmt_time(row.baseline_s if row else None), fmt_time(row.best_s if row else None),
                          speedup_text(row) if row else "-"]
            lines.append(f"| {r.shape} | " + " | ".join(cells) + f" | {fmt_speedup(r.baseline_ratio)}"
                         + ("" if r.same_baseline else " (different baselines)") + f" | {fmt_speedup(r.winner_ratio)} |")
        lines.append("")
        differ = [r.shape for r in blk.rows if not r.same_baseline]
        if differ:
            lines.append("A and B timed different baselines (other baseline points or sources) on: "
                         + ", ".join(differ) + ".")
            lines.append("")
    return "\n".join(lines)
