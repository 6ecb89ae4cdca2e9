"""Compare strategies on a recorded GPU space: evaluations needed to get within x% of the optimum.

Each strategy runs its ask/tell loop against a :class:`~kernelforge.strategies.recorded.RecordedSpace` (replay:
lookups only, no device) for a budget of evaluations, once per seed. An evaluation is an ask that
returned a point (a failed or unrecorded configuration counts: on a device it would have cost a
compile); proposals a strategy settles internally (duplicates, constraint violations) are free.

Per strategy the table reports, over seeds: the median number of evaluations until the best time
found is within 1%, 5% and 10% of the recorded optimum, the hit rate (fraction of seeds that got
there within the budget) and the median ratio best-found / optimum. A seed that never gets within
a threshold counts as ``budget + 1`` evaluations in the median; a median that lands there is
printed as ``>budget`` (more than half the seeds missed), so a median is never flattered by
dropping the seeds that failed.

The CLI (``kernelforge strategy-bench SPACE --strategy tpe,random --seeds N --budget B``) calls
:func:`bench` and prints :func:`format_table`.
"""

from __future__ import annotations

import statistics
import time
from dataclasses import dataclass
from typing import Mapping

from kernelforge.strategies.recorded import RecordedSpace
from kernelforge.strategies.names import make_strategy

#: Thresholds: "within 1%" means best <= optimum * 1.01.
THRESHOLDS = (0.01, 0.05, 0.10)


@dataclass(frozen=True)
class BenchRun:
    """One strategy, one seed: when it got within each threshold (None: not within the budget)."""

    strategy: str
    seed: int
    evaluations: int
    free_tells: int
    best_time: float | None
    reached: Mapping[float, int | None]
    seconds: float


@dataclass(frozen=True)
class BenchRow:
    """One strategy over all seeds.

    ``median_evaluations[t]`` counts a seed that never reached threshold ``t`` as ``budget + 1``;
    ``hit_rate[t]`` is the fraction of seeds that reached it within the budget.
    """

    strategy: str
    seeds: int
    budget: int
    optimum: float
    median_evaluations: Mapping[float, float]
    hit_rate: Mapping[float, float]
    median_best_ratio: float
    median_free_tells: float
    seconds: float
    runs: tuple[BenchRun, ...]


def run_one(space: RecordedSpace, strategy: str, seed: int, budget: int) -> BenchRun:
    """Run one strategy with one seed for up to ``budget`` evaluations on the recorded space."""
    _, optimum = space.optimum()
    start = time.perf_counter()
    chosen = make_strategy(strategy, space.space, seed=seed, baseline=None)
    reached: dict[float, int | None] = {t: None for t in THRESHOLDS}
    best: float | None = None
    evaluations = 0
    while evaluations < budget:
        point = chosen.ask()
        if point is None:
            break
        evaluations += 1
        value = space.lookup(point)
        chosen.tell(point, value)
        if value is not None and (best is None or value < best):
            best = value
            for t in THRESHOLDS:
                if reached[t] is None and best <= optimum * (1 + t):
                    reached[t] = evaluations
    return BenchRun(
        strategy=strategy,
        seed=seed,
        evaluations=evaluations,
        free_tells=chosen.free_tells,
        best_time=best,
        reached=reached,
        seconds=time.perf_counter() - start,
    )


def bench(space: RecordedSpace, strategies: list[str], seeds: int, budget: int) -> list[BenchRow]:
    """Run every strategy for seeds ``0..seeds-1`` with ``budget`` evaluations each.

    Random search is always included for reference. Rows come in the order given (random last
    when it was added).
    """
    if seeds < 1 or budget < 1:
        raise ValueError("seeds and budget must be at least 1")
    names = list(dict.fromkeys(strategies))
    if "random" not in names:
        names.append("random")
    # Validate every name (and optional packages) before spending time on any run.
    for name in names:
        make_strategy(name, space.space, seed=0)
    _, optimum = space.optimum()
    rows = []
    for name in names:
        runs = tuple(run_one(space, name, seed, budget) for seed in range(seeds))
        rows.append(_summarise(name, runs, budget, optimum))
    return rows


def _summarise(name: str, runs: tuple[BenchRun, ...], budget: int, optimum: float) -> BenchRow:
    median_evaluations = {}
    hit_rate = {}
    for t in THRESHOLDS:
        counts = [r.reached[t] if r.reached[t] is not None else budget + 1 for r in runs]
        median_evaluations[t] = statistics.median(counts)
        hit_rate[t] = sum(r.reached[t] is not None for r in runs) / len(runs)
    ratios = [r.best_time / optimum if r.best_time is not None else float("inf") for r in runs]
    return BenchRow(
        strategy=name,
        seeds=len(runs),
        budget=budget,
        optimum=optimum,
        median_evaluations=median_evaluations,
        hit_rate=hit_rate,
        median_best_ratio=statistics.median(ratios),
        median_free_tells=statistics.median(r.free_tells for r in runs),
        seconds=sum(r.seconds for r in runs),
        runs=runs,
    )


def _median_text(value: float, budget: int) -> str:
    if value > budget:
        return f">{budget}"
    return f"{value:g}"


def format_table(rows: list[BenchRow]) -> str:
    """A plain-text table of bench rows (one line per strategy)."""
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
        cells += [_median_text(row.median_evaluations[t], row.budget) for t in THRESHOLDS]
        cells += [f"{row.hit_rate[t]:.0%}" for t in THRESHOLDS]
        cells += [f"{row.median_best_ratio:.3f}", f"{row.median_free_tells:g}", f"{row.seconds:.1f}"]
        lines.append(cells)
    widths = [max(len(line[i]) for line in lines) for i in range(len(head))]
    out = [
        f"medians over {first.seeds} seeds, budget {first.budget} evaluations, optimum "
        f"{first.optimum:.6g} ms; a seed that misses a threshold counts as budget+1 "
        f"(\">{first.budget}\": most seeds missed it)"
    ]
    for i, line in enumerate(lines):
        out.append("  ".join(cell.ljust(w) if j == 0 else cell.rjust(w) for j, (cell, w) in enumerate(zip(line, widths))))
        if i == 0:
            out.append("  ".join("-" * w for w in widths))
    return "\n".join(out)
