"""The strategy bench as Markdown: one table per metric over every space, each figure with its interval.

The plain-text output (:mod:`.report`) is one block per space. A write-up reads the other way: one
metric across the spaces, the strategies side by side. :func:`format_markdown` gives three tables,
the form of the bench README's first section (``strategy-bench --markdown FILE`` writes them):

1. **evaluations to within 1% of the optimum**: per strategy, the median (``>budget`` when most
   seeds missed, ``≥m`` when a seed that missed is among its middle values) with the hit rate;
   then each strategy other than the reference and ``random`` as a fraction of the reference's
   median with its interval (``-`` where the fraction is a bound, ``>`` or ``<``: one side's
   median is; ``n/a`` where both are);
2. **median best/optimum after n evaluations**, per checkpoint within the budget, with its
   interval, and the same strategies as a fraction of the reference's with its interval (``-``
   where some seed of either had found nothing by then);
3. **the area under the anytime curve**, with its interval;
4. **the goals** of :mod:`.goals` (when the reference and ``random`` were benched): per space and
   strategy, each goal with both figures and its verdict; and the transfer goals where a space
   was benched both cold and warm (``--with-cold``).

Every figure is one the bench computed (:class:`~.run.BenchRow`, :mod:`.compare`), formatted
here only; intervals are at :data:`~.stats.LEVEL` (95%).
"""

from __future__ import annotations

import math
from typing import Sequence

from kernelforge.strategies.bench.compare import Relative, relative
from kernelforge.strategies.bench.goals import Goal, bench_goals, tally_text
from kernelforge.strategies.bench.run import (FLOOR, LEVEL, REFERENCE, THRESHOLDS, BenchRow, SpaceBench,
                                          evaluations_text, space_label)

__all__ = ["format_markdown"]


def format_markdown(results: Sequence[SpaceBench]) -> str:
    """The tables of the module docstring ("" for no results)."""
    if not results:
        return ""
    names = [row.strategy for row in results[0].rows]
    compared = [n for n in names if n not in (REFERENCE, FLOOR)] if REFERENCE in names else []
    parts = [_evaluations(results, names, compared), _checkpoints(results, names, compared), _areas(results, names)]
    found, moved = bench_goals(results)
    if found:
        parts.append(_goals(results, found, f"each strategy against {REFERENCE} and {FLOOR}",
                            f"{REFERENCE}'s or {FLOOR}'s"))
    if moved:
        parts.append(_goals(results, moved, "each strategy warm against itself cold", "cold"))
    return "\n\n".join(parts) + "\n"


def _label(result: SpaceBench) -> str:
    return space_label(result.name, result.warm_from, result.device)


def _table(header: list[str], rows: list[list[str]]) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(row) + " |" for row in rows]
    return "\n".join(lines)


def _rows_of(result: SpaceBench) -> dict[str, BenchRow]:
    return {row.strategy: row for row in result.rows}


def _relatives(result: SpaceBench) -> dict[str, Relative]:
    return {rel.strategy: rel for rel in relative(result)}


def _with_interval(value: float, interval: tuple[float, float]) -> str:
    """``1.234 (1.100-1.300)``; the value alone where the interval is not finite, ``-`` for no value."""
    if not math.isfinite(value):
        return "-"
    if not all(math.isfinite(v) for v in interval):
        return f"{value:.3f}"
    return f"{value:.3f} ({interval[0]:.3f}-{interval[1]:.3f})"


def _evaluations(results: Sequence[SpaceBench], names: list[str], compared: list[str]) -> str:
    t = THRESHOLDS[0]
    header = ["space", "feasible of grid", *names]
    for name in compared:
        header += [f"{name} / {REFERENCE}", f"{LEVEL:.0%} interval"]
    rows = []
    for result in results:
        by_name, rels = _rows_of(result), _relatives(result)
        row = [_label(result), f"{result.feasible} of {result.grid_size}"]
        for name in names:
            row.append(f"{evaluations_text(by_name[name], t)} ({round(100 * by_name[name].hit_rate[t])}%)")
        for name in compared:
            rel = rels[name]
            if rel.bound == "?":
                row += ["n/a", "-"]
            else:
                row += [f"{rel.bound}{rel.fraction:.2f}", "-" if rel.bound else f"{rel.low:.2f}-{rel.high:.2f}"]
        rows.append(row)
    return ("**Evaluations to within 1% of the optimum**: median (hit rate), and as a fraction of "
            f"{REFERENCE}'s with its {LEVEL:.0%} interval\n\n" + _table(header, rows))


def _checkpoints(results: Sequence[SpaceBench], names: list[str], compared: list[str]) -> str:
    header = ["space", "evaluations", *names, *(f"{name} / {REFERENCE}" for name in compared)]
    rows = []
    for result in results:
        by_name, rels = _rows_of(result), _relatives(result)
        fractions = {name: {f.evaluations: f for f in rels[name].at} for name in compared}
        for c in by_name[names[0]].median_best_ratio_at:
            row = [_label(result), str(c)]
            for name in names:
                found = by_name[name]
                row.append(_with_interval(found.median_best_ratio_at[c],
                                          found.median_best_ratio_interval_at.get(c, (math.nan, math.nan))))
            for name in compared:
                at = fractions[name].get(c)
                row.append(_with_interval(at.fraction, (at.low, at.high)) if at else "-")
            rows.append(row)
    return ("**Median best/optimum after n evaluations** (1.000: the optimum) with its "
            f"{LEVEL:.0%} interval, and as a "
            f"fraction of {REFERENCE}'s (below 1: closer to the optimum)"
            + ("; runs stopped within 1%: past a stop, the best at the stop" if any(r.stopped for r in results) else "")
            + "\n\n" + _table(header, rows))


def _areas(results: Sequence[SpaceBench], names: list[str]) -> str:
    rows = []
    for result in results:
        by_name = _rows_of(result)
        rows.append([_label(result), *(_with_interval(by_name[n].area, by_name[n].area_interval) for n in names)])
    return ("**Area under the anytime curve** (mean optimum/best over the budget; 1.0: the optimum from the "
            f"first evaluation) with its {LEVEL:.0%} interval\n\n" + _table(["space", *names], rows))


def _goals(results: Sequence[SpaceBench], found: Sequence[Goal], what: str, against: str) -> str:
    labels = {(result.name, result.warm_from): _label(result) for result in results}  # transfer goals: the cold one
    rows = [[labels[g.space, g.warm_from], g.strategy, g.goal, g.value, g.against, g.verdict.value] for g in found]
    return (f"**Goals** ({tally_text(found)}): {what}; a miss of 1% counts as budget+1\n\n"
            + _table(["space", "strategy", "goal", "value", against, "verdict"], rows))
