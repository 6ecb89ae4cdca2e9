"""Compare strategies on recorded GPU spaces: evaluations needed to get within x% of the optimum.

Each strategy runs its ask/tell loop against a :class:`~kernelforge.strategies.bench.recorded.RecordedSpace`
(replay: lookups only, no device) for a budget of evaluations, once per seed. The replay is fair:

- a configuration absent from the cache is infeasible (``Space.feasible`` excludes it): a
  constraint, so a strategy never asks it; a proposal of one that a strategy settles itself is a
  free tell, never an evaluation;
- an evaluation is an ask that returned a point; a recorded failure (``"CompilationFailedConfig"``...)
  counts and is told ``None``, as a device would have spent a compile on it;
- the random baseline samples the feasible set only.

Per strategy, over seeds: the median number of evaluations until the best time found is within
1%, 5% and 10% of the recorded optimum with the hit rate (fraction of seeds that got there within
the budget); the anytime figures of :mod:`kernelforge.strategies.bench.anytime` (the median best/optimum
after 10, 25, 50, 100 and 200 evaluations, the checkpoints within the budget, and the normalised
area under that median curve with its 95% interval) and the median best/optimum at the end; the median and 95th percentile of the time one ``ask()`` takes (ms,
measured around ``ask`` only, on this CPU); and the median free tells. A seed that never gets within
a threshold counts as ``budget + 1`` evaluations in the median, so a median is never flattered by
dropping the seeds that failed (printed ``>budget``: more than half the seeds missed).

Runs are independent (one per space, strategy and seed) and seeded, so :func:`bench_spaces` gives
the same figures (all but the times) whatever number of parallel processes runs them, and seeds
40-79 (``first_seed=40``) are the same runs whether or not seeds 0-39 ran with them. With ``stop``
each run ends once it is within 1% of the optimum, the tightest threshold: the evaluations to every
threshold are what a full run gives (a few times faster on a strategy that gets there early), and a
checkpoint after the stop reads the best at the stop.

With ``warm`` (a transfer: :mod:`kernelforge.strategies.transfer`), every run on a space first asks
the given points of that space (the best-ranked configurations another GPU recorded), as a search
with a warm start does, and they cost evaluations like any other point; a strategy that models
them (``auto``) also gets every configuration's rank there.
Formatting and JSON are in :mod:`kernelforge.strategies.bench.report`; the CLI is
``kernelforge strategy-bench PATH`` (a cache file or a folder of them).
"""

from __future__ import annotations

import math
import os
import statistics
import time
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass, field
from typing import Iterator, Mapping, Sequence

from kernelforge.errors import UserError
from kernelforge.strategies.bench import anytime
from kernelforge.strategies.bench.anytime import CHECKPOINTS, checkpoints
from kernelforge.strategies.bench.stats import LEVEL, RESAMPLES, fraction_interval, percentile
from kernelforge.strategies.names import STRATEGY_NAMES, make_strategy
from kernelforge.strategies.bench.recorded import RecordedSpace
from kernelforge.strategies.transfer import WarmStart, warm_start

#: Thresholds: "within 1%" means best <= optimum * 1.01.
THRESHOLDS = (0.01, 0.05, 0.10)
#: The strategy the summary compares the others with (Optuna's default).
REFERENCE = "tpe"
#: The strategy every figure is read against as the floor, never compared with the reference.
FLOOR = "random"
#: Seeds run from 0 to this less one (numpy's and Optuna's samplers take no larger seed).
SEED_LIMIT = 2 ** 32


def default_strategies() -> tuple[str, ...]:
    """The strategies benched when none are named: ``auto`` (when it exists), ``tpe``, ``random``."""
    return ("auto", "tpe", "random") if "auto" in STRATEGY_NAMES else ("tpe", "random")


@dataclass(frozen=True)
class BenchRun:
    """One strategy, one seed, one space.

    ``reached[t]``: the evaluation at which the best got within threshold ``t`` (None: not within
    the budget); ``best_at[c]``: the best time (ms) after ``c`` evaluations (after all of them when
    the space ran out first; None: nothing succeeded yet); ``trace``: the best time after each
    evaluation made (None: nothing succeeded yet); ``ask_ms``: the time of every ``ask()``.
    """

    strategy: str
    seed: int
    evaluations: int
    free_tells: int
    best_time: float | None
    reached: Mapping[float, int | None]
    best_at: Mapping[int, float | None]
    ask_ms: tuple[float, ...]
    seconds: float
    trace: tuple[float | None, ...] = ()


@dataclass(frozen=True)
class BenchRow:
    """One strategy over all seeds.

    ``median_evaluations[t]`` counts a seed that never reached threshold ``t`` as ``budget + 1``;
    ``hit_rate[t]`` is the fraction of seeds that reached it within the budget. Ratios are best /
    optimum (``inf`` for a seed with no success), ``median_best_ratio_at`` the median curve at the
    checkpoints (``median_best_ratio_interval_at``: their 95% intervals) and ``area`` its normalised
    area with the 95% interval ``area_interval`` (:mod:`kernelforge.strategies.bench.anytime`);
    ``ask_ms_*`` pool every ask of every seed.
    """

    strategy: str
    seeds: int
    budget: int
    optimum: float
    median_evaluations: Mapping[float, float]
    hit_rate: Mapping[float, float]
    median_best_ratio: float
    median_best_ratio_at: Mapping[int, float]
    ask_ms_median: float
    ask_ms_p95: float
    median_free_tells: float
    seconds: float
    runs: tuple[BenchRun, ...]
    area: float = 0.0
    area_interval: tuple[float, float] = (0.0, 0.0)
    median_best_ratio_interval_at: Mapping[int, tuple[float, float]] = field(default_factory=dict)


@dataclass(frozen=True)
class SpaceBench:
    """Every strategy on one recorded space: ``feasible`` recorded configurations of a
    ``grid_size``-point grid, the optimum in ms, and one row per strategy (given order);
    ``stopped``: each run ended once within 1% of the optimum; ``warm_from``: the space whose
    best-ranked points every run asked first (``warm_points`` of them), None for a cold start."""

    name: str
    device: str | None
    feasible: int
    grid_size: int
    optimum: float
    optimum_point: Mapping[str, object]
    budget: int
    seeds: int
    rows: tuple[BenchRow, ...]
    stopped: bool = False
    warm_from: str | None = None
    warm_points: int = 0


def space_label(name: str, warm_from: str | None = None, device: str | None = None) -> str:
    """A space as every table and summary line of the bench names it: ``conv``, ``conv (GPU A)``,
    ``conv (warm from other)``, ``conv (GPU A; warm from other)`` (a bench may hold both starts)."""
    notes = [note for note in (device, f"warm from {warm_from}" if warm_from else None) if note]
    return f"{name} ({'; '.join(notes)})" if notes else name


def run_one(space: RecordedSpace, strategy: str, seed: int, budget: int, *, stop: bool = False,
            first: Sequence[Mapping[str, object]] = (), transfer: Mapping | None = None) -> BenchRun:
    """Run one strategy with one seed for up to ``budget`` evaluations on the recorded space (with
    ``stop``: until it is within the tightest threshold, 1%, of the optimum), asking the points
    ``first`` before any other (a warm start; they are evaluations like any other) and giving a
    strategy that models them the rank scores ``transfer`` (:mod:`kernelforge.strategies.transfer`).

    Raises RuntimeError when the strategy asks a configuration that is not recorded: the space's
    feasible set excludes those, so that is a broken strategy, not a measurement.
    """
    _, optimum = space.optimum()
    marks = set(checkpoints(budget))
    start = time.perf_counter()
    chosen = make_strategy(strategy, space.space, seed=seed, baseline=list(first) or None, transfer=transfer)
    reached: dict[float, int | None] = {t: None for t in THRESHOLDS}
    best_at: dict[int, float | None] = {}
    ask_ms: list[float] = []
    trace: list[float | None] = []
    best: float | None = None
    evaluations = 0
    while evaluations < budget:
        before = time.perf_counter()
        point = chosen.ask()
        ask_ms.append((time.perf_counter() - before) * 1000)
        if point is None:
            break
        if space.key(point) not in space.records:
            raise RuntimeError(f"strategy {strategy!r} asked {point}, which is not a recorded (feasible) configuration")
        evaluations += 1
        value = space.lookup(point)  # None for a recorded failure: told as failed, counted
        chosen.tell(point, value)
        if value is not None and (best is None or value < best):
            best = value
            for t in THRESHOLDS:
                if reached[t] is None and best <= optimum * (1 + t):
                    reached[t] = evaluations
        trace.append(best)
        if evaluations in marks:
            best_at[evaluations] = best
        if stop and reached[min(THRESHOLDS)] is not None:
            break
    for mark in sorted(marks - set(best_at)):
        best_at[mark] = best  # the strategy ran out (or stopped) first: its best stands
    return BenchRun(
        strategy=strategy,
        seed=seed,
        evaluations=evaluations,
        free_tells=chosen.free_tells,
        best_time=best,
        reached=reached,
        best_at=dict(sorted(best_at.items())),
        ask_ms=tuple(ask_ms),
        seconds=time.perf_counter() - start,
        trace=tuple(trace),
    )


def bench(space: RecordedSpace, strategies: Sequence[str], seeds: int, budget: int, *, jobs: int = 1) -> list[BenchRow]:
    """Run every strategy for seeds ``0..seeds-1`` with ``budget`` evaluations each on one space
    (see :func:`bench_spaces`); rows in the order given, random last when it was added."""
    (result,) = bench_spaces([space], strategies, seeds=seeds, budget=budget, jobs=jobs)
    return list(result.rows)


def strategy_list(strategies: Sequence[str]) -> list[str]:
    """The strategies to bench: ``strategies`` without repeats, ``random`` appended when missing
    (the baseline every figure is read against). Raises UserError when none is named."""
    names = list(dict.fromkeys(s for s in strategies if s))
    if not names:
        raise UserError(f"--strategy names no strategy; give a comma-separated list of {', '.join(STRATEGY_NAMES)}")
    if "random" not in names:
        names.append("random")
    return names


def bench_spaces(
    spaces: Sequence[RecordedSpace], strategies: Sequence[str], *, seeds: int, budget: int, jobs: int | None = 1,
    first_seed: int = 0, stop: bool = False, warm: RecordedSpace | None = None,
) -> Iterator[SpaceBench]:
    """Bench every strategy (see :func:`strategy_list`) for ``seeds`` seeds from ``first_seed`` with
    ``budget`` evaluations on each space (with ``stop``, each run ends within 1% of the optimum: see
    the module docstring), yielding one :class:`SpaceBench` per space in order as soon as its runs
    are done. With ``warm``, every run on a space first asks the best-ranked points of ``warm``
    there, spread over its regions (:func:`kernelforge.strategies.transfer.warm_points`; UserError for a space that is not
    another recording of its kernel).

    ``jobs``: parallel processes (None: ``os.cpu_count()``); each (space, strategy, seed) run is a
    task; 1 runs them in this process. The figures do not depend on ``jobs`` (runs are seeded),
    only the measured times do. Unknown strategy names, or one whose packages are missing, raise
    UserError before any run starts.
    """
    if seeds < 1 or budget < 1 or first_seed < 0:
        raise ValueError("seeds and budget must be at least 1, first_seed at least 0")
    if first_seed + seeds > SEED_LIMIT:
        raise UserError(f"--first-seed {first_seed} --seeds {seeds}: the last seed, {first_seed + seeds - 1}, is past "
                        f"{SEED_LIMIT - 1}, the largest seed every strategy takes; start lower")
    names = strategy_list(strategies)
    spaces = list(spaces)
    for space in spaces:
        space.optimum()  # a space with no recorded time: UserError now, not in a worker
        if len(space.records) < 2:
            raise UserError(f"{space.name}: only one configuration is recorded, so every strategy finds it first; a "
                            "bench compares how soon strategies find the fastest of several, so give a recording (or "
                            "--fix a slice) of at least two")
    setup = _Setup(
        spaces=tuple(spaces), budget=budget, stop=stop,
        warm=tuple(warm_start(warm, space) for space in spaces),
    )
    for name in names if spaces else ():
        make_strategy(name, spaces[0].space, seed=0)
    tasks = [_Task(space=i, strategy=name, seed=seed) for i in range(len(spaces)) for name in names
             for seed in range(first_seed, first_seed + seeds)]
    jobs = min(jobs or os.cpu_count() or 1, max(1, len(tasks)))
    per_space = len(names) * seeds
    warm_name = warm.name if warm is not None else None
    if jobs == 1:
        runs = (setup.run(task) for task in tasks)
        yield from _group(setup, names, seeds, runs, per_space, warm_name)
        return
    # The setup goes to each worker once (initializer), the tasks are small records.
    with ProcessPoolExecutor(max_workers=jobs, initializer=_init_worker, initargs=(setup,)) as pool:
        runs = pool.map(_run_task, tasks, chunksize=1)  # results in task order, whatever finishes first
        yield from _group(setup, names, seeds, runs, per_space, warm_name)


@dataclass(frozen=True)
class _Task:
    """One run of a bench: the index of its space in the :class:`_Setup`, a strategy and a seed."""

    space: int
    strategy: str
    seed: int


@dataclass(frozen=True)
class _Setup:
    """What every run of one bench shares: the spaces, each with its warm start (cold without one),
    the budget and the stop rule."""

    spaces: tuple[RecordedSpace, ...]
    budget: int
    stop: bool
    warm: tuple[WarmStart, ...]

    def run(self, task: _Task) -> BenchRun:
        i = task.space
        return run_one(self.spaces[i], task.strategy, task.seed, self.budget, stop=self.stop,
                       first=self.warm[i].first, transfer=self.warm[i].transfer)


def _group(setup: _Setup, names: list[str], seeds: int, runs: Iterator[BenchRun], per_space: int,
           warm_name: str | None) -> Iterator[SpaceBench]:
    runs = iter(runs)
    for space, warm in zip(setup.spaces, setup.warm):
        done = [next(runs) for _ in range(per_space)]
        point, optimum = space.optimum()
        rows = tuple(
            summarise(name, tuple(done[k * seeds:(k + 1) * seeds]), setup.budget, optimum)
            for k, name in enumerate(names)
        )
        yield SpaceBench(
            name=space.name,
            device=space.device,
            feasible=len(space.records),
            grid_size=space.space.size,
            optimum=optimum,
            optimum_point=point,
            budget=setup.budget,
            seeds=seeds,
            rows=rows,
            stopped=setup.stop,
            warm_from=warm_name,
            warm_points=len(warm.first),
        )


#: A worker process's :class:`_Setup`, set once by its initializer (the pool's processes are ours).
_WORKER_SETUP: list[_Setup] = []


def _init_worker(setup: _Setup) -> None:
    _WORKER_SETUP[:] = [setup]


def _run_task(task: _Task) -> BenchRun:
    return _WORKER_SETUP[0].run(task)


def summarise(name: str, runs: tuple[BenchRun, ...], budget: int, optimum: float) -> BenchRow:
    """The figures of one strategy's runs (see :class:`BenchRow`)."""
    median_evaluations = {}
    hit_rate = {}
    for t in THRESHOLDS:
        counts = evaluations_to(runs, t, budget)
        median_evaluations[t] = statistics.median(counts)
        hit_rate[t] = sum(r.reached[t] is not None for r in runs) / len(runs)
    traces = [r.trace for r in runs]
    curve = anytime.median_curve(traces, optimum, budget)
    intervals = anytime.intervals(traces, optimum, budget, resamples=RESAMPLES, level=LEVEL)
    asks = sorted(ms for r in runs for ms in r.ask_ms)
    return BenchRow(
        strategy=name,
        seeds=len(runs),
        budget=budget,
        optimum=optimum,
        median_evaluations=median_evaluations,
        hit_rate=hit_rate,
        median_best_ratio=statistics.median(ratio(r.best_time, optimum) for r in runs),
        median_best_ratio_at=anytime.at_checkpoints(curve),
        ask_ms_median=statistics.median(asks) if asks else 0.0,
        ask_ms_p95=percentile(asks, 0.95),
        median_free_tells=statistics.median(r.free_tells for r in runs),
        seconds=sum(r.seconds for r in runs),
        runs=runs,
        area=anytime.area(curve),
        area_interval=intervals.area,
        median_best_ratio_interval_at=intervals.at,
    )


def ratio(best: float | None, optimum: float) -> float:
    """best / optimum; ``inf`` when nothing succeeded."""
    return best / optimum if best is not None else math.inf


def evaluations_to(runs: Sequence[BenchRun], threshold: float, budget: int) -> list[int]:
    """Each run's evaluations to ``threshold``, a miss counted as ``budget + 1``."""
    return [r.reached[threshold] if r.reached[threshold] is not None else budget + 1 for r in runs]


def median_is_bound(row: BenchRow, threshold: float) -> bool:
    """Whether ``row``'s median evaluations to ``threshold`` is only a lower bound: a seed that missed
    it (counted as ``budget + 1``; it would have needed more) is one of the middle values the median
    is taken of, so a longer budget would give a larger median."""
    if row.median_evaluations[threshold] > row.budget:
        return True
    values = sorted(evaluations_to(row.runs, threshold, row.budget))
    return any(v > row.budget for v in values[(len(values) - 1) // 2: len(values) // 2 + 1])


def evaluations_text(row: BenchRow, threshold: float) -> str:
    """``row``'s median evaluations to ``threshold`` as every table prints it: ``>budget`` when most
    seeds missed it, ``≥m`` when a missed seed is among its middle values (:func:`median_is_bound`),
    else the median."""
    median = row.median_evaluations[threshold]
    if median > row.budget:
        return f">{row.budget}"
    return f"≥{median:g}" if median_is_bound(row, threshold) else f"{median:g}"
