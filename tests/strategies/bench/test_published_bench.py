"""The strategy-bench figures published in reports/strategy-bench/README.md are those of the runs
stored beside it (the runs each section names), not typed in by hand."""

from __future__ import annotations

import gzip
import json
import re
import statistics
from pathlib import Path

import pytest

from kernelforge.strategies.bench import anytime
from kernelforge.strategies.bench.run import fraction_interval
from markdown_tables import markdown_tables, section
from stored_runs import slice_transfer_runs, space_bench

REPORT = Path(__file__).resolve().parents[3] / "reports" / "strategy-bench"
README = REPORT / "README.md"
#: The sections with one table per metric (the shipped auto's first): title, bench file, transfer files.
HEADLINES = (("The shipped auto, one table per metric", "bench-2026-12-07-stall.json.gz",
              "transfer-2026-12-07-given-200seeds-{kind}-{target}.json.gz"),
             ("The eighth session's auto, one table per metric", "bench-2026-12-07.json.gz",
              "transfer-2026-12-07-200seeds-{kind}-{target}.json.gz"),
             ("The seventh session's auto, one table per metric", "bench-2026-12-06.json.gz",
              "transfer-2026-12-06-200seeds-{kind}-{target}.json.gz"))
#: The spaces in the order the bench ran them, by the name the README's tables give them.
LABELS = {"convolution_A4000": "convolution (RTX A4000)", "convolution_W7800": "convolution (Radeon PRO W7800)",
          "dedispersion_W6600": "dedispersion (Radeon PRO W6600)", "gemm_RTX_Titan": "gemm, CLBlast Xgemm (TITAN RTX)",
          "pnpoly_RTX_2080_Ti": "pnpoly (RTX 2080 Ti)"}


def _section(title: str) -> str:
    """The README's text from the '## ' heading that starts with ``title`` to the next heading."""
    return section(README.read_text(), title)


def _tables(text: str) -> list[list[list[str]]]:
    """Each Markdown table of ``text``: its body rows, each a list of stripped cells."""
    return [rows[2:] for rows in markdown_tables(text)]  # without the header and the |---| line


def _load(name: str) -> dict:
    path = REPORT / name
    return json.loads(gzip.open(path).read() if name.endswith(".gz") else path.read_text())


def _cell(median: float, hit: float, budget: int) -> str:
    shown = f">{budget}" if median > budget else f"{median:g}"
    return f"{shown} ({round(100 * hit)}%)"


def _with_interval(value: float, interval: list[float]) -> str:
    return f"{value:.3f} ({interval[0]:.3f}-{interval[1]:.3f})"


def _to_1pct(strategy: dict, budget: int) -> list[int]:
    return [r["reached"]["0.01"] if r["reached"]["0.01"] is not None else budget + 1 for r in strategy["runs"]]


def _trace(run: dict) -> list:
    """A run's best after each evaluation, from its stored improvements."""
    improved = {int(n): best for n, best in run["trace"]}
    out, best = [], None
    for n in range(1, run["evaluations"] + 1):
        best = improved.get(n, best)
        out.append(best)
    return out


def _check_evaluations_table(rows: list[list[str]], data: dict) -> None:
    assert len(rows) == len(data["spaces"]) == 5
    for space, (_, sizes, *cells, fraction, interval) in zip(data["spaces"], rows):
        assert sizes == f"{space['feasible']} of {space['grid_size']}"
        by_name = {s["strategy"]: s for s in space["strategies"]}
        for name, cell in zip(("auto", "tpe", "random"), cells):
            s = by_name[name]
            assert cell == _cell(s["median_evaluations"]["0.01"], s["hit_rate"]["0.01"], space["budget"]), (space["space"], name)
        vs = by_name["auto"]["vs_tpe"]
        assert fraction == f"{vs['bound']}{vs['fraction']:.2f}", space["space"]
        # The interval is the stored one, and the stored one is what the runs give.
        low, high = fraction_interval(_to_1pct(by_name["auto"], space["budget"]), _to_1pct(by_name["tpe"], space["budget"]))
        assert vs["interval"] == [low, high] and interval == f"{low:.2f}-{high:.2f}", space["space"]


def test_the_first_bench_table_is_its_stored_run():
    data = _load("bench.json")
    section = _section("The first 20-seed bench of auto")
    _check_evaluations_table(_tables(section)[0], data)
    assert f"--seeds {data['spaces'][0]['seeds']} --budget {data['spaces'][0]['budget']}" in section


@pytest.fixture(scope="module", params=HEADLINES, ids=["shipped", "eighth", "seventh"])
def headline(request) -> tuple[dict, list[list[list[str]]], str, str]:
    title, bench, transfers = request.param
    section = _section(title)
    return _load(bench), _tables(section), section, transfers


def test_the_headline_evaluations_table_is_the_stored_run(headline):
    data, tables, section, _ = headline
    _check_evaluations_table(tables[0], data)
    assert [s["space"] for s in data["spaces"]] == list(LABELS)
    assert [row[0] for row in tables[0]] == list(LABELS.values())
    space = data["spaces"][0]
    assert f"--seeds {space['seeds']} \\\n        --budget {space['budget']}" in section and not space["stopped_at_1pct"]


def test_the_headline_goals_are_the_stored_run_read_by_the_bench():
    from kernelforge.strategies.bench.goals import Verdict, goals, tally

    found = [goal for space in _load(HEADLINES[0][1])["spaces"] for goal in goals(space_bench(space))]
    counts = tally(found)
    assert {g.strategy for g in found} == {"auto"} and len(found) == 5 * 6
    met, missed = counts[Verdict.MET], counts[Verdict.MISSED]
    assert f"The bench's goals on this run: met {met} of {len(found)}, missed {missed}" in _section(HEADLINES[0][0])


def test_the_headline_checkpoint_table_is_the_stored_run(headline):
    data, tables, _, _ = headline
    rows = iter(tables[1])
    for space in data["spaces"]:
        by_name = {s["strategy"]: s for s in space["strategies"]}
        for c in map(str, space["checkpoints"]):
            label, evaluations, *cells, fraction = next(rows)
            assert (label, evaluations) == (LABELS[space["space"]], c)
            for name, cell in zip(("auto", "tpe", "random"), cells):
                s = by_name[name]
                assert cell == _with_interval(s["median_best_ratio_at"][c], s["median_best_ratio_interval_at"][c])
            at = by_name["auto"]["vs_tpe"]["at"][c]
            assert fraction == _with_interval(at["fraction"], at["interval"])
    assert next(rows, None) is None


def test_the_headline_area_table_is_the_stored_run_and_the_runs_give_it(headline):
    data, tables, _, _ = headline
    assert len(tables[2]) == len(data["spaces"])
    for space, (label, *cells) in zip(data["spaces"], tables[2]):
        assert label == LABELS[space["space"]]
        by_name = {s["strategy"]: s for s in space["strategies"]}
        for name, cell in zip(("auto", "tpe", "random"), cells):
            assert cell == _with_interval(by_name[name]["area"], by_name[name]["area_interval"])
    # ... and the stored figures are what the stored runs' traces give (one space: the rest is the same code).
    space = data["spaces"][0]
    auto = next(s for s in space["strategies"] if s["strategy"] == "auto")
    found = anytime.intervals([_trace(r) for r in auto["runs"]], space["optimum_ms"], space["budget"])
    assert list(found.area) == auto["area_interval"]
    assert {str(c): list(i) for c, i in found.at.items()} == auto["median_best_ratio_interval_at"]


TRANSFERS = (*((title, transfers) for title, _, transfers in HEADLINES),
             ("Transfer and anytime figures", "transfer-2026-12-06-{kind}-{target}.json"))


@pytest.mark.parametrize("title, pattern", TRANSFERS, ids=["shipped", "eighth", "seventh", "first"])
def test_a_transfer_table_is_its_stored_runs(title: str, pattern: str):
    """A cold/warm table (issue 34) is what its four stored transfer runs give."""
    tables = [t for t in _tables(_section(title)) if t and re.fullmatch(r"convolution \w+ \(from \w+\)", t[0][0])]
    rows = tables[0]  # the first table of the section whose rows name a transfer: the cold/warm one
    assert len(rows) == 2
    for (label, cold_cell, warm_cell, fraction, interval, cold_area, warm_area) in rows:
        target, source = re.fullmatch(r"convolution (\w+) \(from (\w+)\)", label).groups()
        runs = {}
        for kind in ("cold", "warm"):
            (space,) = _load(pattern.format(kind=kind, target=target))["spaces"]
            runs[kind] = (space, next(s for s in space["strategies"] if s["strategy"] == "auto"))
        assert runs["cold"][0]["warm_from"] is None and runs["warm"][0]["warm_from"] == f"convolution_{source}"
        budget = runs["cold"][0]["budget"]
        cold, warm = runs["cold"][1], runs["warm"][1]
        assert cold_cell == _cell(cold["median_evaluations"]["0.01"], cold["hit_rate"]["0.01"], budget)
        assert warm_cell == _cell(warm["median_evaluations"]["0.01"], warm["hit_rate"]["0.01"], budget)
        assert fraction == f"{warm['median_evaluations']['0.01'] / cold['median_evaluations']['0.01']:.2f}"
        low, high = fraction_interval(_to_1pct(warm, budget), _to_1pct(cold, budget))
        assert interval == f"{low:.2f}-{high:.2f}"
        for cell, s in ((cold_area, cold), (warm_area, warm)):
            assert cell == _with_interval(s["area"], s["area_interval"])
            # ... and the stored area is what the stored runs' traces give.
            traces = [_trace(run) for run in s["runs"]]
            optimum = runs["cold"][0]["optimum_ms"]
            assert anytime.area(anytime.median_curve(traces, optimum, budget)) == s["area"]
            assert list(anytime.area_interval(traces, optimum, budget)) == s["area_interval"]


def test_the_headline_transfer_checkpoints_are_the_stored_runs(headline):
    _, tables, _, transfers = headline
    rows = next(t for t in tables if t and re.fullmatch(r"convolution \w+", t[0][0]))
    assert len(rows) == 8
    for label, evaluations, cold_cell, warm_cell in rows:
        target = label.split()[1]
        for kind, cell in (("cold", cold_cell), ("warm", warm_cell)):
            (space,) = _load(transfers.format(kind=kind, target=target))["spaces"]
            auto = next(s for s in space["strategies"] if s["strategy"] == "auto")
            assert cell == _with_interval(auto["median_best_ratio_at"][evaluations],
                                          auto["median_best_ratio_interval_at"][evaluations])


SLICES = "Slices of the shared spaces"
#: The parameters held, in the order of the slices table, and the folders of the two stored runs.
SLICED = ("read_only", "use_padding", "use_shmem", "tile_stride_x", "tile_stride_y", "SA", "SB", "between_method",
          "use_method")


def _slice_runs(folder: str) -> dict[str, dict]:
    return {space["space"]: space for name in SLICED for space in _load(f"{folder}/{name}.json.gz")["spaces"]}


def test_the_slices_table_is_its_stored_runs():
    rows = _tables(_section(SLICES))[0]
    now, before = _slice_runs("slices-2026-12-07"), _slice_runs("slices-2026-12-06-before")
    assert [row[0] for row in rows] == list(now) and len(rows) == 27
    for name, feasible, *cells, fraction, interval, at, before_cell in rows:
        space = now[name]
        assert space["seeds"] == 20 and space["budget"] == 300 and space["stopped_at_1pct"]
        assert feasible == str(space["feasible"])
        by_name = {s["strategy"]: s for s in space["strategies"]}
        for strategy, cell in zip(("auto", "tpe", "random"), cells):
            s = by_name[strategy]
            assert cell == _cell(s["median_evaluations"]["0.01"], s["hit_rate"]["0.01"], 300), (name, strategy)
        vs = by_name["auto"]["vs_tpe"]
        assert fraction == f"{vs['bound']}{vs['fraction']:.2f}", name
        if vs["bound"]:
            assert interval == "-"
        else:
            low, high = fraction_interval(_to_1pct(by_name["auto"], 300), _to_1pct(by_name["tpe"], 300))
            assert interval == f"{low:.2f}-{high:.2f}", name
        assert at == ", ".join(f"{vs['at'][c]['fraction']:.3f}" for c in ("25", "50", "100")), name
        old = next(s for s in before[name]["strategies"] if s["strategy"] == "auto")
        assert before_cell == _cell(old["median_evaluations"]["0.01"], old["hit_rate"]["0.01"], 300), name


TRANSFER_SLICES = "Transfer on slices"


#: The 100-seed cold/warm tables of slices: the section, the folder of its stored runs, the table's index.
SLICE_TRANSFERS = ((TRANSFER_SLICES, "transfer-slices-2026-12-07", 0),
                   ("A warm start costs its points", "given-2026-12-07/slices", 3))


@pytest.mark.parametrize("title, folder, index", SLICE_TRANSFERS, ids=["eighth", "eleventh"])
def test_a_transfer_slices_table_is_its_stored_runs(title: str, folder: str, index: int):
    runs = slice_transfer_runs(REPORT / folder)
    rows = _tables(_section(title))[index]
    assert len(rows) == 12
    for label, cold_cell, warm_cell, fraction, interval, cold_area, warm_area in rows:
        name, source = re.fullmatch(r"(\S+) \(from (\w+)\)", label).groups()
        assert source not in name
        cold, warm = runs["cold", name], runs["warm", name]
        assert cold_cell == _cell(cold["median_evaluations"]["0.01"], cold["hit_rate"]["0.01"], 200)
        assert warm_cell == _cell(warm["median_evaluations"]["0.01"], warm["hit_rate"]["0.01"], 200)
        assert fraction == f"{warm['median_evaluations']['0.01'] / cold['median_evaluations']['0.01']:.2f}"
        low, high = fraction_interval(_to_1pct(warm, 200), _to_1pct(cold, 200))
        assert interval == f"{low:.2f}-{high:.2f}", name
        assert cold_area == _with_interval(cold["area"], cold["area_interval"])
        assert warm_area == _with_interval(warm["area"], warm["area_interval"])


def test_the_transfer_slices_parts_table_is_its_stored_runs():
    folder = "transfer-slices-2026-12-07"
    runs = slice_transfer_runs(REPORT / folder)
    tables = _tables(_section(TRANSFER_SLICES))
    # The parts: the medians of benchmarks/transfer_parts.py's stored runs (a miss counts 201).
    parts = {}
    for name in ("read_only", "use_padding", "use_shmem"):
        parts.update(_load(f"{folder}/parts-{name}.json"))
    assert len(tables[1]) == 6
    for name, cold_cell, points, ranks, both in tables[1]:
        assert cold_cell == f"{runs['cold', name]['median_evaluations']['0.01']:g}"
        assert both == f"{runs['warm', name]['median_evaluations']['0.01']:g}"
        for cell, part in ((points, "points"), (ranks, "ranks")):
            reached = parts[f"{name} {part}"]
            assert len(reached) == 100
            assert cell == f"{statistics.median(n if n is not None else 201 for n in reached):g}"


def test_the_tried_warm_start_variants_tables_are_their_stored_runs():
    """The ninth session's tries: the warm-start variants (each cell the median of its stored
    per-seed runs, 40 seeds, a miss counts 201; the summary's geometric means and counts from the
    same) and the pair-products patch (its table and the figures its text quotes)."""
    folder = "tried-2026-12-07"
    runs = {name: _load(f"{folder}/{name}.json.gz") for name in ("base40", "lim2", "lim1", "slow", "xi01", "r1")}

    def median(name: str, key: str) -> float:
        reached = runs[name][key]
        assert len(reached) == 40
        return statistics.median(n if n is not None else 201 for n in reached)

    section = _section("Tried for the warm start's losses")
    table, summary, products = _tables(section)
    assert len(table) == 14
    pairs = []
    for label, cold, warm, two, one, slow, margin, rounds in table:
        name, source = re.fullmatch(r"(\S+) \(from (\w+)\)", label).groups()
        assert source not in name
        pairs.append(name)
        assert [cold, warm] == [f"{median('base40', f'{name} {kind}'):g}" for kind in ("cold", "warm")]
        assert [two, one, slow] == [f"{median(v, f'{name} warm'):g}" for v in ("lim2", "lim1", "slow")]
        for cell, variant in ((margin, "xi01"), (rounds, "r1")):
            assert cell == f"{median(variant, f'{name} cold'):g} / {median(variant, f'{name} warm'):g}"
    # Each variant's warm runs against the cold runs of the same auto: its own where it changes auto.
    for row, (variant, cold_of) in zip(summary, (("base40", "base40"), ("lim2", "base40"), ("lim1", "base40"),
                                                 ("slow", "base40"), ("xi01", "xi01"), ("r1", "r1"))):
        ratios = [median(variant, f"{name} warm") / median(cold_of, f"{name} cold") for name in pairs]
        geometric = statistics.geometric_mean(ratios)
        assert row[1:] == [f"{geometric:.2f}", str(sum(r <= 0.5 for r in ratios)), str(sum(r > 1 for r in ratios))]

    # The pair-products patch, cold: its table from the stored runs of both autos (seeds 0-39), and
    # the figures the text reads from them and from seeds 20-59.
    shipped, patched = _load(f"{folder}/products-cb.json.gz"), _load(f"{folder}/products-cv.json.gz")
    names = [name for name in shipped if name != "_cps"]
    assert [row[0] for row in products] == names and len(names) == 32

    def to_1pct(reached: list) -> float:
        assert len(reached) == 40
        return statistics.median(n if n is not None else 301 for n in reached)

    def at_value(runs: dict, name: str, checkpoint: str) -> float:
        return statistics.median(run[checkpoint] for run in runs["_cps"][name])

    def at(runs: dict, name: str, checkpoint: str) -> str:
        return f"{at_value(runs, name, checkpoint):.3f}"

    for name, before, after, at25, at50 in products:
        assert [before, after] == [f"{to_1pct(shipped[name]):g}", f"{to_1pct(patched[name]):g}"]
        assert at25 == f"{at(shipped, name, '25')} / {at(patched, name, '25')}"
        assert at50 == f"{at(shipped, name, '50')} / {at(patched, name, '50')}"
    later = _load(f"{folder}/products-base_20_59.json.gz"), _load(f"{folder}/products-prod_20_59.json.gz")
    means = [statistics.geometric_mean([to_1pct(p[name]) / to_1pct(b[name]) for name in names])
             for b, p in ((shipped, patched), later)]
    text = " ".join(section.split())
    assert f"is {means[0]:.2f} on seeds 0-39 and {means[1]:.2f} on seeds 20-59" in text
    worse = sum(to_1pct(patched[n]) > to_1pct(shipped[n]) for n in names)
    better = sum(to_1pct(patched[n]) < to_1pct(shipped[n]) for n in names)
    assert f"worse on {worse} of the 32 and better on {better}" in text
    longer = _load(f"{folder}/products-p2.json.gz")  # the product groups started longer
    touched = [name for name in longer if name != "_cps"]
    assert len(touched) == 27 and not any(name.startswith("gemm") for name in touched)
    figures = []
    for subset in (touched, [name for name in touched if "W7800" in name]):
        for runs in (patched, longer):
            figures.append(statistics.geometric_mean([to_1pct(runs[n]) / to_1pct(shipped[n]) for n in subset]))
    assert (f"same seeds: {figures[0]:.2f} against {figures[1]:.2f}, and on the W7800's seven "
            f"{figures[2]:.2f} against {figures[3]:.2f}") in text
    member = _load(f"{folder}/products-member.json.gz")  # the product GP as a fourth member
    ratios = [to_1pct(member[n]) / to_1pct(shipped[n]) for n in names]
    kernels = {}
    for n, r in zip(names, ratios):
        kernels.setdefault(n.split("[")[0], []).append(r)
    at25 = statistics.geometric_mean([at_value(member, n, "25") / at_value(shipped, n, "25") for n in names])
    assert f"The geometric mean was {statistics.geometric_mean(ratios):.3f} and @25 went to {at25:.3f}" in text
    assert (f"convolution on the A4000 {statistics.geometric_mean(kernels['convolution_A4000']):.2f}, the W7800 "
            f"{statistics.geometric_mean(kernels['convolution_W7800']):.2f}, dedispersion "
            f"{statistics.geometric_mean(kernels['dedispersion_W6600']):.2f}, pnpoly "
            f"{statistics.geometric_mean(kernels['pnpoly_RTX_2080_Ti']):.2f}, gemm "
            f"{statistics.geometric_mean(kernels['gemm_RTX_Titan']):.2f}") in text
    gammas = [statistics.geometric_mean([to_1pct(runs[n]) / to_1pct(shipped[n]) for n in names])
              for runs in (_load(f"{folder}/parzen-gamma{g}.json.gz") for g in ("0.10", "0.25"))]
    assert f"geometric means {gammas[0]:.3f} and {gammas[1]:.3f} against the shipped 0.15" in text
    joint = _load(f"{folder}/parzen-multivariate.json.gz")  # the Parzen member over the parameters jointly
    ratios = [to_1pct(joint[n]) / to_1pct(shipped[n]) for n in names]
    assert (f"the geometric mean was {statistics.geometric_mean(ratios):.3f}, better on "
            f"{sum(r < 1 for r in ratios)} and worse on {sum(r > 1 for r in ratios)}") in text
