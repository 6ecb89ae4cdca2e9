"""The figures of the bench README's section on given points and the aligned start (issue 34,
eleventh session), and the shipped headline's transfer sentences, are those of the runs stored
beside it, not typed in by hand."""

from __future__ import annotations

import gzip
import json
import statistics
from pathlib import Path

from markdown_tables import markdown_tables, section
from stored_runs import jsonl_runs, median_to_1pct, slice_transfer_runs

REPORT = Path(__file__).resolve().parents[3] / "reports" / "strategy-bench"
FOLDER = REPORT / "given-2026-12-07"
README = (REPORT / "README.md").read_text()
TEXT = " ".join(section(README, "A warm start costs its points, not the aligned start").split())
#: The tried variants of the last table, by its first column, and their stored runs.
TRIED = {"rank agreement at least 0.3": "tried-rank-agreement-0.3",
         "rank agreement at least 0": "tried-rank-agreement-0.0",
         "a given point the best": "tried-given-best",
         "shipped, and a given point the best": "tried-aligned-and-given-best"}


def stored(name: str) -> dict[str, dict]:
    return jsonl_runs((FOLDER if "/" not in name else REPORT) / f"{name}.jsonl.gz")


def cold(seeds: str) -> dict[str, dict]:
    return stored(f"stall-2026-12-07/cold-20-{seeds}")


def warm(seeds: str, source: str, when: str) -> dict[str, dict]:
    """The 14 pairs' warm runs: ``source`` "real" or "shuffled", ``when`` "before" or "now"."""
    if (seeds, source, when) == ("0-39", "real", "before"):
        return stored("stall-2026-12-07/warm-20")
    shuffle = {"0-39": "1", "40-79": "2"}[seeds] if source == "shuffled" else ""
    runs = stored(f"{'warm' if when == 'now' else 'before'}-{source}{shuffle}-{seeds}")
    assert len(runs) == 14 and all(r["budget"] == 200 and r["warm_from"] for r in runs.values())
    assert all(r["seeds"] == list(range(int(seeds[:2].rstrip("-")), int(seeds[-2:]) + 1)) for r in runs.values())
    assert all((r["shuffle_source"] == int(shuffle)) if shuffle else not r.get("shuffle_source") for r in runs.values())
    return runs


def capped(record: dict) -> float:
    return median_to_1pct(record, cap=200)


def ratios(hot: dict[str, dict], seeds: str) -> dict[str, float]:
    base = cold(seeds)
    return {name: capped(record) / capped(base[name]) for name, record in hot.items()}


def tables() -> list[list[list[str]]]:
    return [rows[2:] for rows in markdown_tables(section(README, "A warm start costs its points"))]


def test_the_parts_table_is_its_stored_runs():
    parts, *_ = tables()
    found = {}
    for record in map(json.loads, gzip.open(FOLDER / "tried-parts-shuffled.jsonl.gz").read().splitlines()):
        assert len(record["reached"]) == 40 and "shuf" in record["source"]
        found.setdefault(record["target"], {})[record["part"]] = statistics.median(
            n if n is not None else 201 for n in record["reached"])
    assert [row[0] for row in parts] == list(found)
    for name, *cells in parts:
        assert cells == [f"{capped(cold('0-39')[name]):g}", f"{found[name]['points']:g}", f"{found[name]['ranks']:g}"]


def test_the_pairs_table_is_its_stored_runs():
    _, pairs, *_ = tables()
    now = warm("0-39", "real", "now")
    assert [row[0].split(" (from ")[0] for row in pairs] == list(now)
    for label, *cells in pairs:
        name = label.split(" (from ")[0]
        assert label.endswith("(from W7800)" if name.startswith("convolution_A4000") else "(from A4000)")
        expected = [capped(cold("0-39")[name])] + [capped(warm("0-39", source, when)[name])
                                                   for source in ("real", "shuffled") for when in ("before", "now")]
        assert cells == [f"{x:g}" for x in expected], name


def test_the_summary_table_and_its_reading_are_the_stored_runs():
    _, _, summary, *_ = tables()
    keys = [(seeds, source, when) for seeds in ("0-39", "40-79") for source in ("real", "shuffled")
            for when in ("before", "now")]
    assert len(summary) == len(keys)
    found = {}
    for (seeds, source, when), (row_seeds, label, row_when, *cells) in zip(keys, summary):
        assert (row_seeds, row_when) == (seeds, when) and ("shuffled" in label) == (source == "shuffled")
        r = found[seeds, source, when] = ratios(warm(seeds, source, when), seeds)
        worst = max(r, key=r.get)
        assert cells == [f"{statistics.geometric_mean(r.values()):.3f}", str(sum(x <= 0.5 for x in r.values())),
                         str(sum(x > 1 for x in r.values())), f"{r[worst]:.2f} ({worst})"]

    def mean(*key) -> str:
        return f"{statistics.geometric_mean(found[key].values()):.3f}"

    def worse(*key) -> int:
        return sum(x > 1 for x in found[key].values())

    assert (f"{mean('0-39', 'shuffled', 'before')} to {mean('0-39', 'shuffled', 'now')} on seeds 0-39, and "
            f"{mean('40-79', 'shuffled', 'before')} to {mean('40-79', 'shuffled', 'now')} on seeds 40-79") in TEXT
    assert (f"({worse('0-39', 'shuffled', 'before')} to {worse('0-39', 'shuffled', 'now')}, and "
            f"{worse('40-79', 'shuffled', 'before')} to {worse('40-79', 'shuffled', 'now')})") in TEXT
    assert (f"{mean('0-39', 'real', 'before')} to {mean('0-39', 'real', 'now')} and "
            f"{mean('40-79', 'real', 'before')} to {mean('40-79', 'real', 'now')}") in TEXT
    high = {key: max(found[key].values()) for key in found}
    assert (f"{high['0-39', 'real', 'now']:.2f}x (from {high['0-39', 'real', 'before']:.2f}x) and "
            f"{high['40-79', 'real', 'now']:.2f}x (from {high['40-79', 'real', 'before']:.2f}x)") in TEXT
    assert f"by up to {high['0-39', 'shuffled', 'now']:.2f}x" in TEXT


def test_the_tried_table_is_its_stored_runs():
    *_, tried = tables()
    variants = {tried[0][0]: (warm("0-39", "real", "before"), warm("0-39", "shuffled", "before")),
                tried[1][0]: (warm("0-39", "real", "now"), warm("0-39", "shuffled", "now"))}
    for label, name in TRIED.items():
        records = [json.loads(line) for line in gzip.open(FOLDER / f"{name}.jsonl.gz").read().splitlines()]
        split = [{r["space"]: r for r in records if ("shuf" in r["variant"]) == shuffled} for shuffled in (False, True)]
        assert all(len(half) == 14 for half in split)
        variants[label] = tuple(split)
    assert [row[0] for row in tried] == list(variants)
    for label, *cells in tried:
        real, shuffled = (list(ratios(runs, "0-39").values()) for runs in variants[label])
        assert cells == [f"{statistics.geometric_mean(real):.3f}", str(sum(x <= 0.5 for x in real)),
                         str(sum(x > 1 for x in real)), f"{statistics.geometric_mean(shuffled):.3f}",
                         str(sum(x > 1 for x in shuffled)), f"{max(shuffled):.2f}"], label
    at_03 = variants["rank agreement at least 0.3"][0]["convolution_W7800[read_only=1]"]
    before = warm("0-39", "real", "before")["convolution_W7800[read_only=1]"]
    assert f"goes from {capped(before):g} to {capped(at_03):g}" in TEXT


def transfer(kind: str, target: str, session: str = "given") -> dict:
    path = REPORT / f"transfer-2026-12-07-{session}-200seeds-{kind}-{target}.json.gz"
    (space,) = json.loads(gzip.open(path).read())["spaces"]
    return next(s for s in space["strategies"] if s["strategy"] == "auto")


def test_cold_runs_are_unchanged_and_the_headline_reads_the_transfer_runs():
    """A cold run has no given points: this commit's 200 cold seeds repeat the tenth session's, seed by seed."""
    headline = " ".join(section(README, "The shipped auto, one table per metric").split())
    ahead, behind = [], []
    for target in ("A4000", "W7800"):
        runs = [transfer("cold", target, session)["runs"] for session in ("given", "stall")]
        assert [r["reached"] for r in runs[0]] == [r["reached"] for r in runs[1]] and len(runs[0]) == 200
        hot, base = (transfer(kind, target)["runs"] for kind in ("warm", "cold"))
        pairs = [(h["reached"]["0.01"] or 201, c["reached"]["0.01"] or 201) for h, c in zip(hot, base)]
        ahead.append(sum(h < c for h, c in pairs))
        behind.append(sum(h > c for h, c in pairs))
    assert f"ahead of cold in {ahead[0]} and {ahead[1]} of 200 seeds, behind in {behind[0]} and {behind[1]}" in headline
    now, then = (transfer("warm", "W7800", session)["median_evaluations"]["0.01"] for session in ("given", "stall"))
    assert f"The W7800 needs {now:g} instead of {then:g}" in TEXT
    shuffled = [ratios(warm(seeds, "shuffled", "now"), seeds) for seeds in ("0-39", "40-79")]
    means = sorted(f"{statistics.geometric_mean(r.values()):.2f}" for r in shuffled)
    assert f"costs a geometric {means[0]}-{means[1]}x cold, worse on single pairs by up to " \
           f"{max(max(r.values()) for r in shuffled):.2f}x" in headline
    real = [ratios(warm(seeds, "real", "now"), seeds) for seeds in ("0-39", "40-79")]
    assert (f"worse than cold on {sum(x > 1 for x in real[0].values())} with seeds 0-39 and "
            f"{sum(x > 1 for x in real[1].values())} with seeds 40-79, by at most {max(real[0].values()):.2f}x and "
            f"{max(real[1].values()):.2f}x") in headline


def test_the_slices_reading_is_the_stored_runs():
    """The sentences under the 100-seed slices table (the table itself: test_published_bench.py)."""
    fractions = {}
    for folder in ("given-2026-12-07/slices", "transfer-slices-2026-12-07"):
        runs = slice_transfer_runs(REPORT / folder)
        for kind, space in runs:
            if kind == "cold":
                fractions[folder, space] = (runs["warm", space]["median_evaluations"]["0.01"]
                                            / runs["cold", space]["median_evaluations"]["0.01"])
    now = {space: f for (folder, space), f in fractions.items() if folder.startswith("given")}
    worse = [space for space, f in now.items() if f > 1]
    then = [fractions["transfer-slices-2026-12-07", space] for space in worse]
    assert worse == [space for (folder, space), f in fractions.items() if folder.startswith("transfer") and f > 1]
    assert (f"by less: {', '.join(f'{now[s]:.2f}' for s in worse[:-1])} and {now[worse[-1]]:.2f} (then "
            f"{', '.join(f'{f:.2f}' for f in then[:-1])} and {then[-1]:.2f})") in TEXT
    assert f"It halves the evaluations on {sum(f <= 0.5 for f in now.values())} of the 12" in TEXT
