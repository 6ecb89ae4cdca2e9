"""Per-shape baselines in the report: every shape's speedup is over that shape's own baseline (the
baseline template rendered at ``Template.baseline_for(shape).point``), and REPORT.md, index.html,
results.json and the export name each baseline's source.

The store is written row by row (fixture data, not measurements) for the fixture block
tests/fixtures/kernels/toy/axpy_pershape, whose ``[[baselines]]`` rules give its four shapes three
sources and four different points. The candidate at the ``[baseline]`` point is also stored,
much slower, on the shapes a rule covers: a report that used it there would be far off.
"""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest

from kernelforge.candidate import Candidate
from kernelforge.catalog import Catalog
from kernelforge.job import load_job
from kernelforge.report.collect import collect, shape_baselines
from kernelforge.report.compare import compare, compare_markdown
from kernelforge.report.export.formats import export
from kernelforge.report.html import render_html
from kernelforge.report.markdown import to_markdown
from kernelforge.result import Status, StoredResult, env_key
from kernelforge.store.store import Store

ROOT = Path(__file__).resolve().parents[2]
FIXTURES = ROOT / "tests" / "fixtures" / "kernels"
BLOCK = "toy/axpy_pershape"
SHAPES = ("n1", "n7", "n63", "n1000")
ENV = {"device": "cuda", "device_name": "NVIDIA H200", "capability": "sm_90", "torch": "2.8.0", "triton": "3.4.0",
       "python": "3.11.7", "kernelforge": "0.1.0", "timing": "CUDA events (median, p20/p80)"}

#: Stored median times (s): each shape's own baseline, the variant, and the [baseline]-point
#: candidate on the shapes where it is NOT the baseline (the decoy).
BASE_S = {"n1": 2e-3, "n7": 4e-3, "n63": 6e-3, "n1000": 8e-3}
VARIANT_S = {"n1": 4e-3, "n7": 2e-3, "n63": 12e-3, "n1000": 2e-3}
DECOY_S = 1.0

SOURCE_A, SOURCE_B, SOURCE_DEFAULT = ("toy rule A: a single element", "toy rule B: tuned table by N",
                                      "toy default point")

JOB = """
[job]
name = "{name}"
device = "cuda"
dtype = "float16"
tune = "{tune}"
storage = "sqlite:///{db}"

[strategy]
name = "tpe"
evaluations = 2

[[blocks]]
id = "toy/axpy_pershape"
shapes = "report"
"""


def _result(candidate: Candidate, shape: str, seconds: float, created: float) -> StoredResult:
    return StoredResult(
        candidate_id=candidate.id, block=BLOCK, shape=shape, dtype="float16", device=ENV["device_name"],
        env_key=env_key(ENV), status=Status.OK, rel_error=1e-4, median_s=seconds, p20_s=0.99 * seconds,
        p80_s=1.01 * seconds, samples=20, timing_method="cuda-events", timing_label=ENV["timing"], joules=None,
        flops=2.0, bytes=6.0, message="", env=ENV, job="pershape", created=created)


@pytest.fixture(scope="module")
def stored(tmp_path_factory):
    folder = tmp_path_factory.mktemp("pershape")
    catalog = Catalog.discover(FIXTURES)
    template = catalog.baseline(BLOCK)
    shapes = catalog.block(BLOCK).shapes("report")
    baselines = {s.name: Candidate.from_template(template, template.baseline_for(s).point, origin="baseline")
                 for s in shapes}
    fallback = Candidate.from_template(template)
    variant = Candidate.from_template(template, {"BLOCK": 1024, "num_warps": 4}, origin="optuna")
    store = Store(f"sqlite:///{folder / 'p.db'}")
    now = time.time() - 100.0
    for c in (*baselines.values(), fallback, variant):
        store.add_candidate(c, "pershape")
    for shape in SHAPES:
        now += 1.0
        store.add_result(_result(baselines[shape], shape, BASE_S[shape], now))
        if baselines[shape].id != fallback.id:
            store.add_result(_result(fallback, shape, DECOY_S, now + 0.1))
        store.add_result(_result(variant, shape, VARIANT_S[shape], now + 0.2))
    store.close()
    jobs = {}
    for tune in ("per-shape", "all-shapes"):
        path = folder / f"{tune}.toml"
        path.write_text(JOB.format(name="pershape", tune=tune, db=folder / "p.db"))
        jobs[tune] = load_job(path, catalog)
    return {"catalog": catalog, "jobs": jobs, "baselines": baselines, "fallback": fallback, "variant": variant,
            "folder": folder}


def test_the_fixture_shapes_have_different_baseline_points(stored):
    chosen = shape_baselines(stored["catalog"], BLOCK, stored["catalog"].block(BLOCK).shapes("report"))
    assert {s: b.candidate for s, b in chosen.items()} == {s: c.id for s, c in stored["baselines"].items()}
    assert len({b.candidate for b in chosen.values()}) == 4
    assert chosen["n7"].params == {"BLOCK": 256, "num_warps": 1} and chosen["n63"].params["num_warps"] == 2
    assert (chosen["n1"].rule, chosen["n7"].rule, chosen["n1000"].rule) == (0, 1, None)
    assert chosen["n1000"].candidate == stored["fallback"].id  # the [baseline] point: the fallback


def test_per_shape_speedups_are_over_each_shapes_own_baseline(stored):
    report = collect(stored["jobs"]["per-shape"], stored["catalog"], Store(stored["jobs"]["per-shape"].storage_url))
    [block] = report.blocks
    rows = {r.shape: r for r in block.shapes}
    for shape in SHAPES:
        row = rows[shape]
        assert row.baseline == stored["baselines"][shape].id
        assert row.baseline_s == pytest.approx(BASE_S[shape])
        assert row.baseline_params == stored["baselines"][shape].point
        wins = VARIANT_S[shape] < BASE_S[shape]
        assert row.winner_is_baseline is not wins
        assert row.winner == (stored["variant"].id if wins else stored["baselines"][shape].id)
        assert row.speedup == pytest.approx(BASE_S[shape] / VARIANT_S[shape] if wins else 1.0)
    assert [r.baseline_source for r in block.shapes] == [SOURCE_A, SOURCE_B, SOURCE_B, SOURCE_DEFAULT]
    assert [(b.source, b.rule, b.shapes) for b in block.baselines] == [
        (SOURCE_A, 0, ("n1",)), (SOURCE_B, 1, ("n7", "n63")), (SOURCE_DEFAULT, None, ("n1000",))]
    assert block.geomean_speedup == pytest.approx((2.0 * 4.0 * 1.0 * 1.0) ** 0.25)
    # The variant's geomean over all four shapes, each against its own baseline (not the decoy).
    [variant] = [c for c in block.candidate_rows if c.id == stored["variant"].id]
    assert variant.geomean_speedup == pytest.approx((0.5 * 2.0 * 0.5 * 4.0) ** 0.25)
    # Its diff is against the baseline of the first shape it won (n7's point, not [baseline]).
    [winner] = block.winners
    assert winner.shapes == ("n7", "n1000") and winner.against == stored["baselines"]["n7"].id
    assert "num_warps=1" in winner.diff and "num_warps=4" in winner.diff


def test_all_shapes_tuning_ranks_against_the_per_shape_baselines(stored):
    job = stored["jobs"]["all-shapes"]
    [block] = collect(job, stored["catalog"], Store(job.storage_url)).blocks
    # The variant's geomean over the per-shape baselines is 2 ** 0.25 > 1: it wins the one group, and
    # each shape's speedup is over that shape's own baseline (slower than it on n1 and n63; against
    # the decoy it would show 250x there).
    assert all(r.winner == stored["variant"].id and not r.winner_is_baseline for r in block.shapes)
    assert [r.speedup for r in block.shapes] == pytest.approx([BASE_S[s] / VARIANT_S[s] for s in SHAPES])
    assert [r.baseline for r in block.shapes] == [stored["baselines"][s].id for s in SHAPES]
    assert block.geomean_speedup == pytest.approx(2.0 ** 0.25)


def test_markdown_html_and_results_json_name_every_source(stored):
    job = stored["jobs"]["per-shape"]
    report = collect(job, stored["catalog"], Store(job.storage_url))
    line = (f"Baseline: [1] {SOURCE_A} for n1; [2] {SOURCE_B} for n7, n63; [3] {SOURCE_DEFAULT} for n1000.")
    md = to_markdown(report)
    assert line in md and f"### Baselines of {BLOCK}" in md
    assert f"| n63 | `{stored['baselines']['n63'].id}` | BLOCK=256 num_warps=2 | [2] {SOURCE_B} |" in md
    assert "| n7 | 4.000 ms [2] |" in md  # the baseline time carries its source's number
    html = render_html(report)
    assert line in html and '<table class="baselines">' in html
    assert f"<code>{stored['baselines']['n1'].id}</code>" in html
    data = json.loads(json.dumps(report.to_json(), default=str))
    [block] = data["blocks"]
    assert [r["baseline_source"] for r in block["shapes"]] == [SOURCE_A, SOURCE_B, SOURCE_B, SOURCE_DEFAULT]
    assert block["baselines"][1] == {"source": SOURCE_B, "rule": 1, "shapes": ["n7", "n63"]}


@pytest.mark.parametrize("fmt", ["source", "triton"])
def test_the_export_carries_each_shapes_baseline_source(stored, tmp_path, fmt):
    job = stored["jobs"]["per-shape"]
    written, _ = export(job, stored["catalog"], Store(job.storage_url), fmt, tmp_path)
    meta = json.loads((tmp_path / f"kernelforge-export-{fmt}.json").read_text())
    assert tmp_path / f"kernelforge-export-{fmt}.json" in written
    entries = {e["shape"]: e for e in meta["entries"]}
    assert set(entries) == set(SHAPES)
    for shape, source in zip(SHAPES, (SOURCE_A, SOURCE_B, SOURCE_B, SOURCE_DEFAULT)):
        assert entries[shape]["block"] == BLOCK and entries[shape]["baseline_source"] == source
        assert entries[shape]["baseline"] == stored["baselines"][shape].id
        assert entries[shape]["baseline_params"] == stored["baselines"][shape].point
    assert entries["n7"]["speedup"] == pytest.approx(2.0) and entries["n63"]["is_baseline"]


def test_compare_flags_shapes_whose_baselines_differ(stored):
    job = stored["jobs"]["per-shape"]
    a = collect(job, stored["catalog"], Store(job.storage_url))
    # B: the same report, but n1 timed at another baseline (as if its rules had changed).
    [block] = a.blocks
    changed = tuple(r if r.shape != "n1" else type(r)(**{**vars(r), "baseline": stored["fallback"].id})
                    for r in block.shapes)
    b = type(a)(**{**vars(a), "blocks": (type(block)(**{**vars(block), "shapes": changed}),)})
    cmp = compare(a, b)
    assert [r.shape for r in cmp.blocks[0].rows if not r.same_baseline] == ["n1"]
    assert "different baselines (other baseline points or sources) on: n1." in compare_markdown(cmp)
