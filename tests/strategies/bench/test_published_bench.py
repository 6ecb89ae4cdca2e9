"""The strategy-bench figures published in reports/strategy-bench/README.md are those of the
bench.json stored beside it (the run the README names), not typed in by hand."""

from __future__ import annotations

import json
import re
from pathlib import Path

from kernelforge.strategies.bench import anytime
from kernelforge.strategies.bench.run import fraction_interval

REPORT = Path(__file__).resolve().parents[3] / "reports" / "strategy-bench"


def _cell(median: float, hit: float, budget: int) -> str:
    shown = f">{budget}" if median > budget else f"{median:g}"
    return f"{shown} ({round(100 * hit)}%)"


def _to_1pct(strategy: dict, budget: int) -> list[int]:
    return [r["reached"]["0.01"] if r["reached"]["0.01"] is not None else budget + 1 for r in strategy["runs"]]


def test_the_readme_table_is_the_stored_run():
    data = json.loads((REPORT / "bench.json").read_text())
    readme = (REPORT / "README.md").read_text()
    rows = re.findall(r"^\| (\w[^|]*?) \| (\d+) of (\d+) \| ([^|]+) \| ([^|]+) \| ([^|]+) \| ([^|]+) \| ([^|]+) \|$",
                      readme, re.M)
    assert len(rows) == len(data["spaces"]) == 5
    for space, row in zip(data["spaces"], rows):
        _, feasible, grid, *cells, fraction, interval = (c.strip() for c in row)
        assert (int(feasible), int(grid)) == (space["feasible"], space["grid_size"])
        by_name = {s["strategy"]: s for s in space["strategies"]}
        for name, cell in zip(("auto", "tpe", "random"), cells):
            s = by_name[name]
            assert cell == _cell(s["median_evaluations"]["0.01"], s["hit_rate"]["0.01"], space["budget"]), (space["space"], name)
        vs = by_name["auto"]["vs_tpe"]
        assert fraction == f"{vs['bound']}{vs['fraction']:.2f}", space["space"]
        # The interval is the stored one, and the stored one is what the runs give.
        low, high = fraction_interval(_to_1pct(by_name["auto"], space["budget"]), _to_1pct(by_name["tpe"], space["budget"]))
        assert vs["interval"] == [low, high] and interval == f"{low:.2f}-{high:.2f}", space["space"]
    assert f"--seeds {data['spaces'][0]['seeds']} --budget {data['spaces'][0]['budget']}" in readme


def test_the_transfer_table_is_the_stored_runs():
    """The README's cold/warm table (issue 34) is what the four stored transfer runs give."""
    readme = (REPORT / "README.md").read_text()
    rows = re.findall(r"^\| convolution (\w+) \(from (\w+)\) \| ([^|]+) \| ([^|]+) \| ([^|]+) \| ([^|]+) \| ([^|]+) \| "
                      r"([^|]+) \|$", readme, re.M)
    assert len(rows) == 2
    for target, source, cold_cell, warm_cell, fraction, interval, cold_area, warm_area in rows:
        runs = {}
        for kind in ("cold", "warm"):
            (space,) = json.loads((REPORT / f"transfer-2026-12-06-{kind}-{target}.json").read_text())["spaces"]
            runs[kind] = (space, next(s for s in space["strategies"] if s["strategy"] == "auto"))
        assert runs["cold"][0]["warm_from"] is None and runs["warm"][0]["warm_from"] == f"convolution_{source}"
        budget = runs["cold"][0]["budget"]
        cold, warm = runs["cold"][1], runs["warm"][1]
        assert cold_cell.strip() == _cell(cold["median_evaluations"]["0.01"], cold["hit_rate"]["0.01"], budget)
        assert warm_cell.strip() == _cell(warm["median_evaluations"]["0.01"], warm["hit_rate"]["0.01"], budget)
        assert fraction.strip() == f"{warm['median_evaluations']['0.01'] / cold['median_evaluations']['0.01']:.2f}"
        low, high = fraction_interval(_to_1pct(warm, budget), _to_1pct(cold, budget))
        assert interval.strip() == f"{low:.2f}-{high:.2f}"
        for cell, s in ((cold_area, cold), (warm_area, warm)):
            assert cell.strip() == f"{s['area']:.3f} ({s['area_interval'][0]:.3f}-{s['area_interval'][1]:.3f})"
            # ... and the stored area is what the stored runs' traces give.
            traces = [_trace(run) for run in s["runs"]]
            optimum = runs["cold"][0]["optimum_ms"]
            assert anytime.area(anytime.median_curve(traces, optimum, budget)) == s["area"]
            assert list(anytime.area_interval(traces, optimum, budget)) == s["area_interval"]


def _trace(run: dict) -> list:
    """A run's best after each evaluation, from its stored improvements."""
    improved = {int(n): best for n, best in run["trace"]}
    out, best = [], None
    for n in range(1, run["evaluations"] + 1):
        best = improved.get(n, best)
        out.append(best)
    return out
