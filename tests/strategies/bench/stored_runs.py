"""Reading stored runs back (``benchmarks/anytime_variants.py --json`` and ``strategy-bench --json``,
gzipped), for the tests of the bench README's sections."""

from __future__ import annotations

import gzip
import json
import statistics
from functools import cache
from pathlib import Path


@cache
def jsonl_runs(path: Path) -> dict[str, dict]:
    """A stored run of the loop: its record per space, in the order it ran (each file read once)."""
    return {r["space"]: r for r in map(json.loads, gzip.open(path).read().splitlines())}


def median_to_1pct(record: dict, cap: int | None = None) -> float:
    """The median evaluations to 1% over the record's seeds, a miss counting as the budget + 1; with
    ``cap``, a run past ``cap`` counts as ``cap + 1`` too (a cold run of budget 300 against warm runs
    of budget 200)."""
    last = record["budget"] if cap is None else cap
    return statistics.median(min(n, last + 1) if n is not None else last + 1 for n in record["to_1pct"])


@cache
def slice_transfer_runs(folder: Path) -> dict[tuple[str, str], dict]:
    """The auto runs of a 100-seed cold/warm transfer on the 12 convolution slices (``strategy-bench
    --fix ... [--warm-from]``, ``{cold,warm}-{A4000,W7800}-{read_only,use_padding,use_shmem}.json.gz``
    in ``folder``), by (kind, slice); each file read once."""
    runs = {}
    for kind in ("cold", "warm"):
        for target in ("A4000", "W7800"):
            for name in ("read_only", "use_padding", "use_shmem"):
                for space in json.loads(gzip.open(folder / f"{kind}-{target}-{name}.json.gz").read())["spaces"]:
                    assert space["seeds"] == 100 and space["budget"] == 200 and space["stopped_at_1pct"]
                    assert (space["warm_from"] is None) == (kind == "cold")
                    runs[kind, space["space"]] = next(s for s in space["strategies"] if s["strategy"] == "auto")
    return runs


def space_bench(space: dict):
    """A stored space of ``strategy-bench --json`` as the bench's :class:`SpaceBench`, with the
    figures its rows hold (medians, hit rates, checkpoints), not its runs: what the goals read."""
    from kernelforge.strategies.bench.run import BenchRow, SpaceBench

    rows = tuple(BenchRow(
        strategy=s["strategy"], seeds=space["seeds"], budget=space["budget"], optimum=space["optimum_ms"],
        median_evaluations={float(t): v for t, v in s["median_evaluations"].items()},
        hit_rate={float(t): v for t, v in s["hit_rate"].items()},
        median_best_ratio=s["median_best_ratio"] if s["median_best_ratio"] is not None else float("inf"),
        median_best_ratio_at={int(c): v if v is not None else float("inf") for c, v in s["median_best_ratio_at"].items()},
        ask_ms_median=s["ask_ms_median"], ask_ms_p95=s["ask_ms_p95"], median_free_tells=s["median_free_tells"],
        seconds=s["seconds"], runs=()) for s in space["strategies"])
    return SpaceBench(name=space["space"], device=space["device"], feasible=space["feasible"],
                      grid_size=space["grid_size"], optimum=space["optimum_ms"], optimum_point=space["optimum_point"],
                      budget=space["budget"], seeds=space["seeds"], rows=rows, stopped=space["stopped_at_1pct"],
                      warm_from=space["warm_from"], warm_points=space["warm_points"])
