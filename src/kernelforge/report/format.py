"""How the report writes numbers and records as text: times, changes, rates, speedups, parameter
points, roofline cells. Shared by REPORT.md, the HTML pages and the comparison."""

from __future__ import annotations

from typing import Any

from kernelforge.devices.hardware import RooflinePoint
from kernelforge.report.records import BlockReport, ShapeRow
from kernelforge.result import format_seconds


def fmt_time(value: float | None) -> str:
    """A stored time for a table, or "-"."""
    return format_seconds(value) if value else "-"


def fmt_delta(value: float | None) -> str:
    """A signed change of time (negative = saved)."""
    if value is None:
        return "-"
    return ("-" if value < 0 else "+") + format_seconds(abs(value))


def fmt_rate(value: float | None, unit: str) -> str:
    """A rate with a T/G/M prefix ("4.3 TB/s"), or "-"."""
    if value is None:
        return "-"
    scale, prefix = (1e12, "T") if value >= 1e11 else (1e9, "G") if value >= 1e8 else (1e6, "M")
    return f"{value / scale:.3g} {prefix}{unit}"


def fmt_speedup(value: float | None) -> str:
    """A speedup as "1.234x", or "-"."""
    return "-" if value is None else f"{value:.3f}x"


def fmt_joules(value: float | None) -> str:
    """An energy as "0.1234 J", or "-"."""
    return "-" if value is None else f"{value:.4g} J"


def params_text(params: dict[str, Any]) -> str:
    """A point of a space as "NAME=value ..."."""
    return " ".join(f"{k}={v}" for k, v in params.items())


def speedup_text(row: ShapeRow) -> str:
    """A shape's speedup with its p20-p80 spread ("1.234x (1.200-1.250)"), or "-"."""
    if row.speedup is None:
        return "-"
    text = f"{row.speedup:.3f}x"
    if row.speedup_p20 is not None:
        text += f" ({row.speedup_p20:.3f}-{row.speedup_p80:.3f})"
    return text


def measured_text(row: ShapeRow) -> str:
    """Which measurement a row's times and speedup come from: "2 pairs" or "search"."""
    return f"{row.pairs} pairs" if row.measured_by == "pairs" else "search"


def search_text(row: ShapeRow) -> str:
    """The search's own single timings of a row measured by pairs ("1.2 ms -> 1.0 ms (1.200x)"),
    labelled apart from the row's times; "same" when the row's figures are the search's."""
    if row.measured_by != "pairs":
        return "same"
    return f"{fmt_time(row.search_baseline_s)} -> {fmt_time(row.search_best_s)} ({fmt_speedup(row.search_speedup)})"


def baseline_spread_text(row: ShapeRow) -> str:
    """A shape's baseline timings and their spread ("5 timings, 1.2 ms-1.5 ms, 1.25x"), or "1 timing"."""
    times = row.baseline_timings
    if len(times) < 2:
        return f"{len(times)} timing" + ("" if len(times) == 1 else "s")
    return f"{len(times)} timings, {fmt_time(min(times))}-{fmt_time(max(times))}, {row.baseline_spread:.2f}x"


#: Launch parameters that cannot change the work Triton's CPU interpreter does (it runs each program
#: alone, ignoring warps, pipelining stages, CTAs and register caps): a candidate that differs from
#: another only in them does the same interpreter work, and their timings differ by noise.
INTERPRETER_INERT = ("num_warps", "num_stages", "num_ctas", "maxnreg")


def inert_text(block: BlockReport) -> str:
    """The sentence that marks the interpreter-inert parameters of an interpreter-timed block, or ""."""
    if block.banner is None or block.banner.kind != "interpret":
        return ""
    names = [n for n in INTERPRETER_INERT if any(n in c.params for c in block.candidate_rows)]
    if not names:
        return ""
    return (f"Interpreter: {', '.join(names)} cannot change the interpreter's work (it runs one program at a time "
            "on the CPU); candidates that differ only in them do the same work, and their timings differ by noise "
            "(marked \"same interpreter work\" below).")


def same_work_as(block: BlockReport, params: dict[str, Any]) -> str | None:
    """On an interpreter-timed block, the id of the block's baseline when ``params`` differ from the
    baseline's point only in :data:`INTERPRETER_INERT` parameters (and are not the point itself)."""
    if block.banner is None or block.banner.kind != "interpret":
        return None
    base = next((c for c in block.candidate_rows if c.id == block.baseline), None)
    if base is None or params == base.params or set(params) != set(base.params):
        return None
    differ = {k for k in params if params[k] != base.params[k]}
    return base.id if differ <= set(INTERPRETER_INERT) else None


def roofline_cells(point: RooflinePoint | None, has_ceiling: bool) -> tuple[str, str, str]:
    """(FLOP rate, bandwidth, percent of roofline) cells of one timed result."""
    if not point:
        return "-", "-", "-"
    pct = "-"
    if has_ceiling and point.percent is not None:
        pct = f"{point.percent:.1f}%"
        if point.suspect:
            pct += " SUSPECT"
    return fmt_rate(point.achieved_flops, "FLOP/s"), fmt_rate(point.achieved_bandwidth, "B/s"), pct


def env_title(env: dict[str, Any]) -> str:
    """Device and versions of an env in one short line."""
    if not env:
        return "no results"
    parts = [str(env.get("device_name", env.get("device", "?")))]
    for key in ("triton", "torch", "cuda", "driver"):
        if env.get(key):
            parts.append(f"{key} {env[key]}")
    return ", ".join(parts)


def baselines_text(block: BlockReport) -> str:
    """Each distinct baseline source of a block with the shapes it covers: "Baseline: <source> for
    a, b; <source> for c." ("" for a block without shapes, e.g. an older results.json)."""
    if not block.baselines:
        return ""
    numbered = len(block.baselines) > 1
    return "Baseline: " + "; ".join((f"[{i}] " if numbered else "") + f"{b.source} for {', '.join(b.shapes)}"
                                    for i, b in enumerate(block.baselines, start=1)) + "."


def baseline_ref(block: BlockReport, row: ShapeRow) -> str:
    """The number of a shape's baseline source among the block's ("[2]"; "" with one source)."""
    if len(block.baselines) < 2:
        return ""
    number = next((i for i, b in enumerate(block.baselines, start=1) if row.shape in b.shapes), None)
    return f"[{number}]" if number else ""
