"""The HTML report: one self-contained page per job (``reports/<job>/index.html``) and a compare page
for two jobs, rendered from a collected :class:`~kernelforge.report.records.Report` (nothing else is
read) and a :class:`~kernelforge.report.compare.Comparison`.

Self-contained means it opens from a file with no network: CSS inline, charts inline SVG (see
:mod:`kernelforge.report.svg`), no JavaScript. The Jinja templates live in ``report/templates/``.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from jinja2 import Environment, PackageLoader, StrictUndefined, select_autoescape
from markupsafe import Markup

from kernelforge.job import Tune
from kernelforge.report import space_view, svg
from kernelforge.report.compare import CompareBlock, Comparison
from kernelforge.report.format import (baseline_ref, baseline_spread_text, baselines_text, env_title, fmt_delta,
                                       inert_text, measured_text, same_work_as, search_text,
                                       fmt_joules, fmt_rate, fmt_speedup, fmt_time, params_text, roofline_cells)
from kernelforge.report.moe_table import moe_tables
from kernelforge.report.records import Banner, BlockReport, Confirmation, Report, Winner
from kernelforge.report.space_view import SpaceView


@dataclass(frozen=True)
class BlockPage:
    """What the page shows of one block beyond its record: its anchor, its charts, each winner
    with its diff split into (css class, text) lines, and the origin x status table's axes."""

    block: BlockReport
    anchor: str
    charts: dict[str, Markup]
    winners: tuple[tuple[Winner, list[tuple[str, str]]], ...]
    origin_names: tuple[str, ...]
    status_names: tuple[str, ...]
    space: SpaceView | None = None
    tag: str = ""  # "(interpreter timings)": the block's timings are of a banner's kind


#: CSS class of each confirmation state (the text is the enum's value).
CONFIRMATION_CLASS = {Confirmation.FASTER: "conf-faster", Confirmation.NOISE: "conf-noise",
                      Confirmation.PENDING: "conf-pending"}
#: The short tag a block gets when its timings are of a banner's kind (the full banner is at the top).
BANNER_TAG = {"interpret": "(interpreter timings)", "replay": "(replayed timings)"}


def banner_tag(banner: Banner) -> str:
    """The short tag of a banner's kind ("(interpreter timings)")."""
    return BANNER_TAG.get(banner.kind, f"({banner.kind} timings)")


def top_banners(report: Report) -> tuple[Banner, ...]:
    """One banner per distinct kind and device, in the order the blocks name them."""
    seen: dict[tuple[str, str], Banner] = {}
    for b in (*report.banners, *(blk.banner for blk in report.blocks if blk.banner)):
        seen.setdefault((b.kind, b.device_name), b)
    return tuple(seen.values())


@dataclass(frozen=True)
class ComparePage:
    """One block of the compare page: its record, its anchor and its chart."""

    block: CompareBlock
    anchor: str
    chart: Markup


def _env() -> Environment:
    env = Environment(loader=PackageLoader("kernelforge.report", "templates"),
                      autoescape=select_autoescape(["html", "j2"], default=True),
                      undefined=StrictUndefined, trim_blocks=True, lstrip_blocks=True)
    env.filters.update(time=fmt_time, delta=fmt_delta, rate=fmt_rate, speedup=fmt_speedup, params=params_text,
                       joules=fmt_joules)
    env.globals.update(roofline_cells=roofline_cells, origin_colour=svg.origin_colour, env_title=env_title,
                       baselines_text=baselines_text, baseline_ref=baseline_ref, measured_text=measured_text,
                       search_text=search_text, baseline_spread_text=baseline_spread_text, inert_text=inert_text,
                       same_work_as=same_work_as)
    env.globals.update(moe_tables=moe_tables)  # for _moe_table.html.j2
    return env


def anchor(text: str) -> str:
    """An HTML id from a block id ("attention/gpt_oss_prefill" -> "attention-gpt_oss_prefill")."""
    return re.sub(r"[^A-Za-z0-9_-]+", "-", text).strip("-")


def _diff_lines(diff: str) -> list[tuple[str, str]]:
    """(css class, text) per line of a unified diff."""
    out = []
    for line in diff.splitlines():
        if line.startswith(("+++", "---")):
            kind = "file"
        elif line.startswith("@@"):
            kind = "hunk"
        elif line.startswith("+"):
            kind = "add"
        elif line.startswith("-"):
            kind = "del"
        else:
            kind = "ctx"
        out.append((kind, line))
    return out


def _charts(block: BlockReport) -> dict[str, Markup]:
    """The SVG charts of one block."""
    rows = []
    for r in block.shapes:
        # Green: confirmed faster (p20 of the pairs above 1); red: slower on this shape (p80 below 1,
        # possible when one configuration serves all shapes); blue: within noise (confirmed); light blue:
        # not yet confirmed; grey: the baseline.
        if r.winner_is_baseline:
            colour = "#9ca3af"
        elif r.significant:
            colour = "#16a34a"
        elif r.speedup_p80 is not None and r.speedup_p80 < 1.0:
            colour = "#dc2626"
        elif r.confirmation is Confirmation.PENDING:
            colour = "#93c5fd"
        else:
            colour = "#2563eb"
        rows.append((r.shape, r.speedup, r.speedup_p20, r.speedup_p80, colour))
    view = space_view.space_view(block)
    charts = {"importance": Markup(space_view.importance_svg(view)), "space": Markup(space_view.parallel_svg(view))}
    charts["speedup"] = Markup(svg.speedup_bars(rows, f"{block.block}: speedup over the human baseline "
                                                       "(median; bars p20-p80)"))
    progress = block.progress
    if progress and progress.points:
        title = (f"{block.block}: best speedup against evaluations"
                 + (" (geomean of each shape's best)" if progress.mode is Tune.PER_SHAPE else ""))
        charts["progress"] = Markup(svg.progress_chart(progress.points, progress.best, title))
    points = []
    for number, r in enumerate(block.shapes, start=1):
        for kind, p in (("baseline", r.roofline.baseline), ("winner", r.roofline.winner)):
            if not p or (kind == "winner" and r.winner_is_baseline):
                continue
            points.append({"intensity": p.intensity, "flops_rate": p.achieved_flops, "kind": kind,
                           "suspect": p.suspect, "number": number,
                           "label": f"{number}. {r.shape} {kind}: {fmt_rate(p.achieved_flops, 'FLOP/s')}, "
                                    f"{fmt_rate(p.achieved_bandwidth, 'B/s')}"})
    roof = block.roofline
    ceilings = roof.ceilings if roof else None
    lines = []
    if ceilings:
        lines.append((f"{ceilings.name} datasheet", ceilings.bandwidth, ceilings.flops, "6,4"))
        if ceilings.measured_bandwidth or ceilings.measured_flops:
            lines.append((f"{ceilings.name} measured", ceilings.measured_bandwidth or ceilings.bandwidth,
                          ceilings.measured_flops or ceilings.flops, ""))
    if points:
        device = roof.device if roof else None
        if ceilings:
            title = f"{block.block}: roofline on {device}"
            note = ""
        elif device is None:
            title = f"{block.block}: achieved rates in the interpreter (CPU wall time, no ceiling: not GPU speed)"
            note = " (interpreter: not GPU speed)"
        else:
            title = f"{block.block}: achieved rates on {device} (no known ceilings)"
            note = ""
        chart = svg.roofline_chart(points, lines, title, unit_note=note)
        if chart:
            charts["roofline"] = Markup(chart)
    return charts


def render_html(report: Report) -> str:
    """The job's index.html from the collected report."""
    pages = [BlockPage(
        block=block, anchor=anchor(block.block), charts=_charts(block),
        winners=tuple((w, _diff_lines(w.diff)) for w in block.winners),
        origin_names=tuple(sorted(block.origin_status)),
        status_names=tuple(sorted({s for v in block.origin_status.values() for s in v})),
        space=space_view.space_view(block),
        tag=banner_tag(block.banner) if block.banner else "",
    ) for block in report.blocks]
    template = _env().get_template("report.html.j2")
    return template.render(data=report, pages=pages, origins=svg.ORIGIN_COLOURS, banners=top_banners(report),
                           confirmation_class=CONFIRMATION_CLASS, banner_tag=banner_tag)


def render_compare(cmp: Comparison) -> str:
    """The compare page of two jobs."""
    pages = []
    for blk in cmp.blocks:
        labels = [r.shape for r in blk.rows]
        chart = svg.grouped_bars(labels, [
            (f"A: {cmp.a.job}", "#2563eb", [r.a.speedup if r.a else None for r in blk.rows]),
            (f"B: {cmp.b.job}", "#ea580c", [r.b.speedup if r.b else None for r in blk.rows]),
        ], f"{blk.block}: speedup over each job's own baseline")
        pages.append(ComparePage(block=blk, anchor=anchor(blk.block), chart=Markup(chart)))
    template = _env().get_template("compare.html.j2")
    return template.render(cmp=cmp, pages=pages)
