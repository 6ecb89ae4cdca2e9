"""The strategy bench's output: plain-text tables, the summary against TPE, and the JSON file.

:func:`format_space` prints one space (a header line, then :func:`format_table`: the evaluation
figures, and a second table of the anytime figures: best/optimum after 10/25/50/100/200
evaluations, the normalised area under that curve with its 95% interval, and time per ask);
:func:`format_summary` one line per space comparing each strategy with ``tpe`` in evaluations to 1%,
one comparing their best/optimum at the checkpoints (:mod:`.compare`), then one line per space
of every strategy's anytime figures, and the goals of :mod:`.goals` met or missed; :func:`to_json` is
the one conversion of the bench's records to JSON (:func:`write_json` writes it).

JSON shape (``version`` 1)::

    {"version": 1, "thresholds": [0.01, 0.05, 0.1], "spaces": [
      {"space", "device", "feasible", "grid_size", "optimum_ms", "optimum_point", "budget", "seeds",
       "stopped_at_1pct" (each run ended once within 1%), "warm_from" (a space name or null),
       "warm_points" (how many of its points every run asked first), "checkpoints": [10, 25, ...],
       "strategies": [{"strategy", "median_evaluations": {"0.01": n, ...}, "hit_rate": {"0.01": f, ...},
                       "median_best_ratio", "median_best_ratio_at": {"10": r, ...}, "area", "area_interval": [low, high],
                       "median_best_ratio_interval_at": {"10": [low, high], ...}, "ask_ms_median",
                       "ask_ms_p95", "median_free_tells", "seconds",
                       "vs_tpe": {"fraction", "bound", "interval": [low, high], "hit_rate", "tpe_hit_rate",
                                  "at": {"25": {"fraction", "interval": [low, high]}, ...}}
                                  (absent for tpe; intervals: 95% bootstrap intervals of the fractions;
                                  ``at``: median best/optimum as a fraction of tpe's, :mod:`.compare`),
                       "runs": [{"seed", "evaluations", "free_tells", "best_ms", "reached": {"0.01": n|null},
                                 "best_ms_at": {"25": ms|null}, "trace": [[n, ms], ...] (each evaluation n at
                                 which the best improved, and the new best), "ask_ms_median", "ask_ms_p95",
                                 "seconds"}]}]}

The fields ``warm_from``, ``warm_points``, ``area``, ``area_interval``, ``trace``,
``median_best_ratio_interval_at`` and ``vs_tpe.at`` were added to version 1 (issue 34); files
written before lack them.

A median of evaluations counts a seed that missed as ``budget + 1``; a ratio with no success is null.
"""

from __future__ import annotations

import json
import math
import statistics
from pathlib import Path
from typing import Any, Sequence

from kernelforge.strategies.bench.compare import Relative, relative
from kernelforge.strategies.bench.goals import Goal, bench_goals, tally_text
from kernelforge.strategies.bench.outputs import write_output
from kernelforge.strategies.bench.run import (FLOOR, LEVEL, REFERENCE, THRESHOLDS, BenchRow, BenchRun, SpaceBench,
                                          evaluations_text, percentile, space_label)

JSON_VERSION = 1


def _ratio_text(value: float) -> str:
    return "-" if math.isinf(value) else f"{value:.3f}"


def _lay_out(lines: list[list[str]]) -> list[str]:
    """Columns padded to their widest cell (the first left-aligned), a rule under the header."""
    widths = [max(len(line[i]) for line in lines) for i in range(len(lines[0]))]
    out = []
    for i, line in enumerate(lines):
        out.append("  ".join(c.ljust(w) if j == 0 else c.rjust(w) for j, (c, w) in enumerate(zip(line, widths))))
        if i == 0:
            out.append("  ".join("-" * w for w in widths))
    return out


def format_table(rows: Sequence[BenchRow]) -> str:
    """Two plain-text tables of bench rows (one line per strategy each): evaluations to each
    threshold, hit rates, final best/optimum, free tells and seconds; then best/optimum at each
    checkpoint and the median and 95th percentile time per ask."""
    if not rows:
        return "(no strategies)"
    first = rows[0]
    head = ["strategy"]
    head += [f"evals to {t:.0%}" for t in THRESHOLDS]
    head += [f"hit {t:.0%}" for t in THRESHOLDS]
    head += ["best/opt", "free tells", "seconds"]
    lines = [head]
    for row in rows:
        cells = [row.strategy]
        cells += [evaluations_text(row, t) for t in THRESHOLDS]
        cells += [f"{row.hit_rate[t]:.0%}" for t in THRESHOLDS]
        cells += [_ratio_text(row.median_best_ratio), f"{row.median_free_tells:g}", f"{row.seconds:.1f}"]
        lines.append(cells)
    marks = list(first.median_best_ratio_at)
    second = [["strategy"] + [f"best/opt @{c}" for c in marks] + ["area", f"area {LEVEL:.0%}"]
              + ["ask ms p50", "ask ms p95"]]
    for row in rows:
        second.append([row.strategy] + [_ratio_text(row.median_best_ratio_at[c]) for c in marks]
                      + [f"{row.area:.3f}", _interval_text(row.area_interval)]
                      + [f"{row.ask_ms_median:.2f}", f"{row.ask_ms_p95:.2f}"])
    out = [
        f"medians over {first.seeds} seeds, budget {first.budget} evaluations, optimum "
        f"{first.optimum:.6g} ms; a seed that misses a threshold counts as budget+1 "
        f"(\">{first.budget}\": most seeds missed it; \"≥m\": a seed that missed is among the middle values, so the "
        f"median is at least m)"
    ]
    out += _lay_out(lines)
    out.append("")
    out += _lay_out(second)
    return "\n".join(out)


def _interval_text(interval: tuple[float, float]) -> str:
    return f"{interval[0]:.3f}-{interval[1]:.3f}"


def format_space(result: SpaceBench) -> str:
    """One space: its name, device, feasible and grid sizes, then :func:`format_table`."""
    device = f" on {result.device}" if result.device else ""
    head = (f"== {result.name}{device}: {result.feasible} feasible (recorded) configurations of a "
            f"{result.grid_size}-point grid")
    seeds = sorted(run.seed for run in result.rows[0].runs) if result.rows else []
    if seeds:
        head += f"; seeds {seeds[0]}-{seeds[-1]}"
    if result.warm_from and result.warm_points:
        head += (f"; warm start: every run asked {result.warm_points} best-ranked points of {result.warm_from} "
                 f"(spread over its regions) first")
    elif result.warm_from:
        head += (f"; warm start from {result.warm_from}: none of its configurations with a recorded time is a point "
                 "of this space, so no run asked a warm point (only its ranks, where the models read them)")
    if result.stopped:
        head += "; each run stopped once within 1% (best/opt after that: the best at the stop)"
    return head + "\n" + format_table(result.rows)


def _relative_text(rel: Relative) -> str:
    fraction = "n/a" if rel.bound == "?" else f"{rel.bound}{rel.fraction:.2f}x"
    interval = f"{LEVEL:.0%} {rel.low:.2f}-{rel.high:.2f}; " if not rel.bound else ""
    return f"{rel.strategy} {fraction} ({interval}hit {rel.hit_rate:.0%} vs {rel.reference_hit_rate:.0%})"


def _checkpoints_text(rel: Relative) -> str:
    marks = " ".join(f"@{f.evaluations} {f.fraction:.3f} ({f.low:.3f}-{f.high:.3f})" for f in rel.at)
    return f"{rel.strategy} {marks or 'no checkpoint where every seed of both found a point'}"


def format_summary(results: Sequence[SpaceBench]) -> str:
    """One line per space: each strategy's median evaluations to 1% as a fraction of tpe's, and
    its hit rate to 1% against tpe's; then one line per space of each strategy's median
    best/optimum at the checkpoints as a fraction of tpe's, with intervals (none of either when tpe
    was not benched or is alone); then :func:`format_anytime` and :func:`format_goals` ("" when
    there is nothing)."""
    lines, at_lines = [], []
    for result in results:
        relatives = relative(result)
        if relatives:
            called = space_label(result.name, result.warm_from)
            lines.append(f"{called}: " + "; ".join(_relative_text(r) for r in relatives))
            at_lines.append(f"{called}: " + "; ".join(_checkpoints_text(r) for r in relatives))
    tail = "\n\n".join(part for part in (format_anytime(results), format_goals(results)) if part)
    if not lines:
        return tail
    return (f"evaluations to 1% as a fraction of {REFERENCE}'s (below 1: fewer; >x or <x: a bound, one side's "
            f"median is; n/a: both are), its {LEVEL:.0%} bootstrap interval over seeds, hit rates to 1% "
            f"against {REFERENCE}'s:\n" + "\n".join(lines)
            + f"\n\nmedian best/optimum after n evaluations as a fraction of {REFERENCE}'s (below 1: closer to the "
            f"optimum), its {LEVEL:.0%} bootstrap interval (checkpoints where every seed of both found a point"
            + ("; runs stopped within 1%: past a stop, the best at the stop" if any(r.stopped for r in results) else "")
            + "):\n"
            + "\n".join(at_lines) + ("\n\n" + tail if tail else ""))


def format_goals(results: Sequence[SpaceBench]) -> str:
    """One line per goal of :mod:`.goals` (space, strategy, verdict, the goal, both figures), under
    a count of each verdict: the goals against the reference and the floor, then the transfer
    goals of every space benched cold and warm ("" when there are none)."""
    found, moved = bench_goals(results)
    parts = [_goal_lines(f"goals against {REFERENCE} and {FLOOR}", found), _goal_lines("transfer goals", moved)]
    return "\n\n".join(part for part in parts if part)


def _goal_lines(title: str, found: Sequence[Goal]) -> str:
    if not found:
        return ""
    return (f"{title} (medians; a miss of 1% counts as budget+1): {tally_text(found)}\n"
            + "\n".join(f"{g.where} {g.strategy}: {g.verdict.value}, {g.goal} ({g.value} against {g.against})"
                        for g in found))


def format_anytime(results: Sequence[SpaceBench]) -> str:
    """One line per space and strategy: the median best/optimum at each checkpoint within the
    budget and the area under that curve with its interval ("" for no results)."""
    lines = []
    for result in results:
        for row in result.rows:
            marks = " ".join(f"@{c} {_ratio_text(r)}{_bracket(row.median_best_ratio_interval_at.get(c))}"
                             for c, r in row.median_best_ratio_at.items())
            lines.append(f"{space_label(result.name, result.warm_from)} {row.strategy}: {marks}; "
                         f"area {row.area:.3f} ({LEVEL:.0%} {_interval_text(row.area_interval)})")
    if not lines:
        return ""
    return (f"anytime: median best/optimum after n evaluations (@n) with its {LEVEL:.0%} interval, and the "
            "normalised area under that curve (mean optimum/best over the budget; 1 is the optimum from the first "
            "evaluation):\n" + "\n".join(lines))


def _bracket(interval: tuple[float, float] | None) -> str:
    if interval is None or not all(math.isfinite(v) for v in interval):
        return ""
    return f" ({_interval_text(interval)})"


def _finite(value: float | None) -> float | None:
    return None if value is None or not math.isfinite(value) else value


def _run_json(run: BenchRun) -> dict[str, Any]:
    asks = sorted(run.ask_ms)
    return {
        "seed": run.seed,
        "evaluations": run.evaluations,
        "free_tells": run.free_tells,
        "best_ms": run.best_time,
        "reached": {str(t): n for t, n in run.reached.items()},
        "best_ms_at": {str(c): v for c, v in run.best_at.items()},
        "trace": _improvements(run.trace),
        "ask_ms_median": statistics.median(asks) if asks else 0.0,
        "ask_ms_p95": percentile(asks, 0.95),
        "seconds": run.seconds,
    }


def _improvements(trace: Sequence[float | None]) -> list[list[float]]:
    """[[n, best], ...]: each evaluation n (from 1) at which the best improved, and the new best."""
    out: list[list[float]] = []
    for n, best in enumerate(trace, start=1):
        if best is not None and (not out or best < out[-1][1]):
            out.append([n, best])
    return out


def _row_json(row: BenchRow, against: Relative | None) -> dict[str, Any]:
    out: dict[str, Any] = {
        "strategy": row.strategy,
        "median_evaluations": {str(t): v for t, v in row.median_evaluations.items()},
        "hit_rate": {str(t): v for t, v in row.hit_rate.items()},
        "median_best_ratio": _finite(row.median_best_ratio),
        "median_best_ratio_at": {str(c): _finite(v) for c, v in row.median_best_ratio_at.items()},
        "area": row.area,
        "area_interval": list(row.area_interval),
        "median_best_ratio_interval_at": {str(c): [_finite(v) for v in interval]
                                          for c, interval in row.median_best_ratio_interval_at.items()},
        "ask_ms_median": row.ask_ms_median,
        "ask_ms_p95": row.ask_ms_p95,
        "median_free_tells": row.median_free_tells,
        "seconds": row.seconds,
    }
    if against is not None:
        out[f"vs_{against.reference}"] = {
            "fraction": against.fraction,
            "bound": against.bound,
            "interval": [against.low, against.high],
            "hit_rate": against.hit_rate,
            f"{against.reference}_hit_rate": against.reference_hit_rate,
            "at": {str(f.evaluations): {"fraction": f.fraction, "interval": [f.low, f.high]} for f in against.at},
        }
    out["runs"] = [_run_json(run) for run in row.runs]
    return out


def _space_json(result: SpaceBench) -> dict[str, Any]:
    relatives = {r.strategy: r for r in relative(result)}
    return {
        "space": result.name,
        "device": result.device,
        "feasible": result.feasible,
        "grid_size": result.grid_size,
        "optimum_ms": result.optimum,
        "optimum_point": dict(result.optimum_point),
        "budget": result.budget,
        "seeds": result.seeds,
        "stopped_at_1pct": result.stopped,
        "warm_from": result.warm_from,
        "warm_points": result.warm_points,
        "checkpoints": list(result.rows[0].median_best_ratio_at) if result.rows else [],
        "strategies": [_row_json(row, relatives.get(row.strategy)) for row in result.rows],
    }


def to_json(results: Sequence[SpaceBench]) -> dict[str, Any]:
    """The bench's results as a JSON-ready object (shape in this module's docstring)."""
    return {"version": JSON_VERSION, "thresholds": list(THRESHOLDS), "spaces": [_space_json(r) for r in results]}


def write_json(results: Sequence[SpaceBench], path: str | Path) -> None:
    """Write :func:`to_json` to ``path``; UserError naming it when it cannot be written."""
    write_output("--json", path, json.dumps(to_json(results), indent=1, allow_nan=False) + "\n")
