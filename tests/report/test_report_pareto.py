"""The report's time-energy Pareto front per block, from stored rows: the synthetic H200 store
(energy proportional to time: one point wins both) plus hand-written rows of a slower candidate
that uses less energy, so the front has a real trade-off; and the note where energy was not measured."""

from __future__ import annotations

import re
from pathlib import Path

from kernelforge.candidate import Candidate
from kernelforge.catalog import Catalog
from kernelforge.job import load_job
from kernelforge.objective import by_candidate, geomean
from kernelforge.report.collect import collect
from kernelforge.report.html import render_html
from kernelforge.report.markdown import to_markdown
from kernelforge.report.pareto import block_fronts, pareto_front
from kernelforge.result import Status, StoredResult, env_key, format_seconds
from kernelforge.store.store import Store
import kf_synthetic_store as synthetic  # tests/fixtures (pytest pythonpath)

ROOT = Path(__file__).resolve().parents[2]
KERNELS = ROOT / "kernels"

BLOCK = "attention/gpt_oss_decode"


def add_frugal(store: Store, catalog: Catalog, slower: float, energy: float) -> str:
    """A decode candidate stored on every shape at ``slower`` x the baseline's time and ``energy`` x its joules."""
    template = catalog.baseline(BLOCK)
    frugal = Candidate.from_template(template, {**template.baseline, "num_warps": 2, "NUM_KV_SPLITS": 2}, origin="optuna")
    store.add_candidate(frugal, "h200")
    base_rows = [r for r in store.results(block=BLOCK) if r.candidate_id != frugal.id]
    by_shape: dict[str, StoredResult] = {}
    for r in sorted(base_rows, key=lambda r: -r.median_s):  # the slowest row of each shape: its baseline
        by_shape.setdefault(r.shape, r)
    for shape, r in by_shape.items():
        store.add_result(StoredResult(
            candidate_id=frugal.id, block=BLOCK, shape=shape, dtype="bfloat16", device=r.device, env_key=r.env_key,
            status=Status.OK, rel_error=1e-3, median_s=r.median_s * slower, p20_s=r.median_s * slower,
            p80_s=r.median_s * slower, samples=50, timing_method=r.timing_method, timing_label=r.timing_label,
            joules=r.joules * energy, flops=r.flops, bytes=r.bytes, message="", env=r.env, job="h200",
            created=r.created + 5000.0))
    return frugal.id


def stored_front(store: Store, shapes: list[str]):
    """The front recomputed here from the stored numbers (geomeans over every shape)."""
    table = by_candidate(store.results(block=BLOCK, dtype="bfloat16"))
    measured = [(cid, geomean([rows[s].median_s for s in shapes]), geomean([rows[s].joules for s in shapes]))
                for cid, rows in table.items() if all(s in rows and rows[s].ok for s in shapes)]
    return pareto_front("all", measured)


def test_the_page_draws_the_stored_front_of_each_block(tmp_path):
    catalog = Catalog.discover(KERNELS)
    path, expected = synthetic.build(tmp_path, catalog)
    job = load_job(path, catalog)
    store = Store(job.storage_url)
    frugal = add_frugal(store, catalog, slower=1.5, energy=0.3)  # slower than every candidate, far more frugal
    report = collect(job, catalog, store)
    block = report.block(BLOCK)
    shapes = [r.shape for r in block.shapes]
    [front] = block.pareto
    want = stored_front(store, shapes)
    assert front.front == want.front and len(front.front) == 2 and front.note == ""
    winner = expected[(BLOCK, shapes[0])]["winner"]
    assert [p.candidate for p in front.front] == [winner, frugal]  # the fastest, then the frugal one
    # Energy proportional to time (the other blocks): the fastest is also the most frugal, alone on the front.
    prefill = report.block("attention/gpt_oss_prefill").pareto[0]
    assert len(prefill.front) == 1 and len(prefill.points) > 1

    html = render_html(report)
    assert "objective time." in html
    groups = html.split('<div class="pareto-group"')[1:]
    assert len(groups) == len(report.blocks)  # one front per block page
    decode = next(g for g in groups if f'data-candidate="{frugal}"' in g)
    assert re.findall(r'<tr data-candidate="([0-9a-f]+)">', decode) == [p.candidate for p in front.front]
    svgs = re.findall(r'<svg class="pareto".*?</svg>', html, re.S)
    assert len(svgs) == len(report.blocks)
    decode_svg = next(s for s in svgs if f'data-candidate="{frugal}"' in s)
    on_front = re.findall(r'<circle class="front" data-candidate="([0-9a-f]+)"', decode_svg)
    assert sorted(on_front) == sorted(p.candidate for p in front.front)
    assert len(re.findall(r'<circle class="dominated"', decode_svg)) == len(front.points) - len(front.front)
    check_labels_inside(decode_svg)

    md = to_markdown(report)
    assert "objective time." in md
    for p in front.front:
        assert f"| `{p.candidate}` | {format_seconds(p.time_s)} | {p.joules:.4g} J |" in md


def check_labels_inside(svg: str) -> None:
    """Every label fits the viewBox (11 px sans-serif: at most ~6.5 px per character)."""
    width, height = map(float, re.search(r'viewBox="0 0 (\d+) (\d+)"', svg).groups())
    for x, y, anchor, text in re.findall(r'<text x="([\d.]+)" y="([\d.]+)" text-anchor="(\w+)">([^<]*)</text>', svg):
        x, y, w = float(x), float(y), 6.5 * len(text)
        left = {"start": x, "middle": x - w / 2, "end": x - w}[anchor]
        assert 0 <= left and left + w <= width and 11 <= y <= height, (text, x, y)
    for cx, cy in re.findall(r'cx="([\d.]+)" cy="([\d.]+)"', svg):
        assert 0 < float(cx) < width and 0 < float(cy) < height


def result(cid: str, shape: str, seconds: float, joules: float | None, env: dict) -> StoredResult:
    return StoredResult(candidate_id=cid, block="b", shape=shape, dtype="float16", device=env["device_name"],
                        env_key=env_key(env), status=Status.OK, rel_error=0.0, median_s=seconds, p20_s=seconds,
                        p80_s=seconds, samples=5, timing_method="interpreter", timing_label="", joules=joules,
                        flops=None, bytes=None, message="", env=env, job="j", created=0.0)


def test_no_energy_gives_the_note_instead_of_a_front():
    interp = {"device": "interpret", "device_name": "Triton interpreter (CPU)", "timing": "interpreter wall time"}
    table = by_candidate([result("a", "s", 1e-3, None, interp), result("b", "s", 2e-3, None, interp)])
    [front] = block_fronts([("all", ["s"])], table, interp)
    assert front.points == () and front.unmeasured == 2
    assert front.note == "energy was not measurable on Triton interpreter (CPU) (Triton interpreter): no Pareto front"
    gpu = {"device": "cuda", "device_name": "NVIDIA H200", "energy": "no energy: NVML did not start (x)"}
    [front] = block_fronts([("all", ["s"])], by_candidate([result("a", "s", 1e-3, None, gpu)]), gpu)
    assert front.note == "energy was not measurable on NVIDIA H200 (no energy: NVML did not start (x)): no Pareto front"
    assert front.svg() == ""


def test_a_one_point_front_has_one_label_per_axis_inside_the_view():
    svg = str(pareto_front("all", [("only", 2e-5, 0.5)]).svg())
    assert svg.count(">20.00 us</text>") == 1 and svg.count(">0.5 J</text>") == 1
    assert len(re.findall(r'<circle class="front" data-candidate="only"', svg)) == 1
    check_labels_inside(svg)
