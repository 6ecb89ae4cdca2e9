"""The figures of the bench README's section on the stall rule (issue 34, tenth session) are those of
the ``benchmarks/anytime_variants.py`` runs stored beside it, not typed in by hand."""

from __future__ import annotations

import gzip
import json
import statistics
from pathlib import Path

from markdown_tables import markdown_tables, section
from stored_runs import jsonl_runs, median_to_1pct

FOLDER = Path(__file__).resolve().parents[3] / "reports" / "strategy-bench" / "stall-2026-12-07"
TEXT = section((FOLDER.parent / "README.md").read_text(), "Stalled searches move other basins")
#: The spaces of half A of the split; the others are half B.
HALF_A = ("convolution_A4000", "dedispersion", "pnpoly")
VARIANTS = {"stall 10": "10", "stall 20": "20", "stall 30": "30", "stall 20, leaders in turn": "20-spread"}


def runs(name: str) -> dict[str, dict]:
    return jsonl_runs(FOLDER / f"{name}.jsonl.gz")


def to_1pct(record: dict) -> float:
    assert len(record["to_1pct"]) == 40
    return median_to_1pct(record)


def tables() -> list[list[list[str]]]:
    return [rows[2:] for rows in markdown_tables(TEXT)]


def test_the_split_table_is_its_stored_runs():
    split, _, _ = tables()
    none = runs("cold-none-0-39")
    assert len(none) == 32 and all(r["budget"] == 300 and r["seeds"] == list(range(40)) for r in none.values())
    halves = [[n for n in none if n.startswith(HALF_A) == (half == "A")] for half in "AB"]
    assert [len(h) for h in halves] == [20, 12]
    assert [row[0] for row in split] == list(VARIANTS)
    for label, *cells in split:
        variant = runs(f"cold-{VARIANTS[label]}-0-39")
        assert variant.keys() == none.keys()
        expected = []
        for names in halves:
            expected.append(statistics.geometric_mean([to_1pct(variant[n]) / to_1pct(none[n]) for n in names]))
            expected.append(max(statistics.median(variant[n]["at"][c]) / statistics.median(none[n]["at"][c])
                                for n in names for c in ("25", "50", "100")))
        expected.append(statistics.geometric_mean([to_1pct(variant[n]) / to_1pct(none[n]) for n in none]))
        assert cells == [f"{x:.3f}" for x in expected], label


def test_the_seeds_table_and_its_summary_are_the_stored_runs():
    _, seeds, _ = tables()
    pairs = [(runs("cold-none-0-39"), runs("cold-20-0-39")), (runs("cold-none-40-79"), runs("cold-20-40-79"))]
    assert pairs[1][0]["pnpoly_RTX_2080_Ti"]["seeds"] == list(range(40, 80))
    assert [row[0] for row in seeds] == list(pairs[0][0])
    for name, *cells in seeds:
        assert cells == [f"{to_1pct(r[name]):g}" for pair in pairs for r in pair], name
    text = " ".join(TEXT.split())
    for (none, stall), seed_set in zip(pairs, ("Seeds 0-39", "Seeds 40-79")):
        ratios = [to_1pct(stall[n]) / to_1pct(none[n]) for n in none]
        better, worse = sum(r < 1 for r in ratios), sum(r > 1 for r in ratios)
        assert f"{seed_set}: {'geometric mean ' if seed_set.endswith('39') else ''}" \
               f"{statistics.geometric_mean(ratios):.3f}, better on {better}" in text
        assert f"worse on {worse}" in text


def test_the_warm_table_is_its_stored_runs():
    *_, warm = tables()
    labels = {"none (shipped before)": "none", **VARIANTS}
    assert [row[0] for row in warm] == list(labels)

    def capped(record: dict) -> float:  # budget 200 warm: a miss (or a cold run past 200) counts 201
        return median_to_1pct(record, cap=200)

    for label, *cells in warm:
        hot, cold = runs(f"warm-{labels[label]}"), runs(f"cold-{labels[label]}-0-39")
        assert len(hot) == 14 and all(r["warm_from"] and r["budget"] == 200 for r in hot.values())
        ratios = [capped(hot[n]) / capped(cold[n]) for n in hot]
        assert cells == [f"{statistics.geometric_mean(ratios):.3f}", str(sum(r <= 0.5 for r in ratios)),
                         str(sum(r > 1 for r in ratios))], label
    trap = "convolution_W7800[use_padding=1]"
    before, after = (runs(f"warm-{v}")[trap]["to_1pct"] for v in ("none", "20"))
    text = " ".join(TEXT.split())
    assert f"from {statistics.median(before):g} to {statistics.median(after):g}" in text
    assert f"{sum(n <= 43 for n in after)} of the 40 are within 1% after at most 43" in text
    assert f"({sum(n <= 43 for n in before)} before)" in text
    assert f"{min(n for n in after if n > 43)}-{max(after)} ({min(n for n in before if n > 43)}-{max(before)} before)" in text
    rounds = runs("warm-given-rounds1")
    assert f"{statistics.median(rounds[trap]['to_1pct']):g} on the trap" in text


def test_the_slices_against_tpe_are_the_stored_runs():
    """This auto's seeds 0-19 on the slices against tpe's stored runs of the slices section."""
    tpe = {}
    for path in (FOLDER.parent / "slices-2026-12-07").glob("*.json.gz"):
        for space in json.loads(gzip.open(path).read())["spaces"]:
            assert space["seeds"] == 20
            tpe[space["space"]] = next(s for s in space["strategies"] if s["strategy"] == "tpe")["median_evaluations"]["0.01"]
    stall = runs("cold-20-0-39")
    assert len(tpe) == 27 and set(tpe) <= set(stall)
    auto = {n: statistics.median(k if k is not None else 301 for k in stall[n]["to_1pct"][:20]) for n in tpe}
    slow = [n for n in tpe if tpe[n] > 30]
    worse = [n for n in slow if auto[n] > tpe[n]]
    text = " ".join(TEXT.split())
    assert (f"tpe needs more than 30 evaluations ({len(slow)} slices), `auto`'s median is at most two thirds of "
            f"tpe's on {sum(auto[n] <= 2 / 3 * tpe[n] for n in slow)}, as before, and worse than tpe's on {len(worse)}"
            ) in text
    assert worse == ["convolution_A4000[read_only=1]"]
    assert f"`read_only=1`: {auto[worse[0]]:g} against {tpe[worse[0]]:g})" in text


def test_the_later_variants_are_their_stored_runs():
    none, stall = runs("cold-none-0-39"), runs("cold-20-0-39")
    text = " ".join(TEXT.split())

    def mean(variant: dict, base: dict, names) -> str:
        return f"{statistics.geometric_mean([to_1pct(variant[n]) / to_1pct(base[n]) for n in names]):.3f}"

    margin, alternate = runs("cold-20-margin-0-39"), runs("cold-20-alternate-0-39")
    assert f"geometric mean {mean(margin, stall, stall)} of stall 20's evaluations to 1%" in text
    halves = [[n for n in none if n.startswith(HALF_A) == (half == "A")] for half in "AB"]
    assert (f"in turn: {mean(alternate, none, none)} of none's, as stall 20, but {mean(alternate, none, halves[0])} "
            f"on half A and {mean(alternate, none, halves[1])} on half B") in text
    assert mean(stall, none, none) == mean(alternate, none, none)
