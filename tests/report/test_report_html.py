"""Reports rendered from stored databases: REPORT.md, results.json and the self-contained index.html,
opened in headless Chromium (a screenshot and the rendered DOM), plus the compare page.

Two stored databases: a real search on the toy block in the interpreter (with a real LLM-origin
candidate measured after it), and GPT-OSS rows "measured on an H200" written through Store
(tests/fixtures/kf_synthetic_store.py) for the roofline, the projection and the compare page.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from click.testing import CliRunner

from kernelforge.catalog import Catalog
from kernelforge.cli.main import main
from kernelforge.devices.hardware import ceilings_for
from kernelforge.job import load_job
from kernelforge.report.markdown import to_markdown
from kernelforge.report.records import BlockReport, Report
from kernelforge.report.write import write_report
from kernelforge.store.store import Store
import kf_synthetic_store as synthetic  # tests/fixtures (pytest pythonpath)
from kf_headless import dom_text, render_in_browser

ROOT = Path(__file__).resolve().parents[2]
KERNELS = ROOT / "kernels"

SECTIONS = ("Summary", "Speedup over the human baseline", "Candidates by origin and status", "Search progress",
            "Candidates", "Winning source against the baseline", "Roofline", "Compile resources",
            "Model-level projection (TTFT / TBT)", "Device and versions")


def check_candidates_with_origin_and_parent(toy):
    md, store = toy["md"], toy["store"]
    stored = store.candidates("toy/axpy")
    evaluated = {r.candidate_id for r in store.results(block="toy/axpy")}
    assert "### Candidates of toy/axpy" in md
    rows = [line for line in md.splitlines() if re.match(r"\| \d+ \| `[0-9a-f]{16}` \|", line)]
    assert len(rows) == len(evaluated) == 1 + 4 + 1  # baseline, the budget, the LLM candidate
    for c in stored:
        if c.id in evaluated:
            row = next(line for line in rows if f"`{c.id}`" in line)
            assert f"| {c.origin} |" in row
    llm_row = next(line for line in rows if f"`{toy['llm'].id}`" in line)
    assert f"| llm | `{toy['baseline']}` |" in llm_row  # its origin, then its parent
    assert "not GPU measurements" in md


def check_winner_diff_and_compile_resources(toy):
    data, store, md = toy["data"], toy["store"], toy["md"]
    [block] = data["blocks"]
    base_source = store.candidate(toy["baseline"]).source
    winners = block["winners"]
    if not winners:  # interpreter timings are noise: no candidate may beat the baseline
        assert "No candidate beat the baseline" in md
    for w in winners:
        source = store.candidate(w["id"]).source
        added = [line[1:] for line in w["diff"].splitlines() if line.startswith("+") and not line.startswith("+++")]
        removed = [line[1:] for line in w["diff"].splitlines() if line.startswith("-") and not line.startswith("---")]
        assert added and removed
        assert set(added) <= set(source.splitlines()) and set(removed) <= set(base_source.splitlines())
        assert f"### Winner `{w['id']}` against the baseline source" in md and "```diff" in md
    compiled = {c["candidate_id"]: c for c in block["compiles"]}
    assert toy["baseline"] in compiled and compiled[toy["baseline"]]["status"] == "ok"
    kernel = compiled[toy["baseline"]]["kernels"][0]
    stored = store.compile(toy["baseline"], "sm_90", "float16").kernels[0]
    assert kernel["registers"] == stored["registers"] and kernel["shared_bytes"] == stored["shared_bytes"]
    assert f"| baseline | `{toy['baseline']}` | sm_90 | ok | {kernel['name']} | {kernel['registers']} |" in md


def check_progress_and_interpreter_rates(toy):
    [block] = toy["data"]["blocks"]
    points = block["progress"]["points"]
    first = {}
    for r in toy["store"].results(block="toy/axpy"):
        first[r.candidate_id] = min(first.get(r.candidate_id, r.created), r.created)
    assert [p["candidate"] for p in points] == sorted(first, key=first.get)
    assert points[0]["origin"] == "baseline" and points[0]["speedup"] == pytest.approx(1.0)
    assert points[-1]["candidate"] == toy["llm"].id and points[-1]["origin"] == "llm"
    best = [b for _, b in block["progress"]["best"]]
    assert best == sorted(best)  # best so far never decreases
    ok = [p["speedup"] for p in points if p["speedup"] is not None and p["origin"] != "llm"]
    assert best[-2] == pytest.approx(max(ok))
    # Interpreter timings are placed against no ceiling: rates only, no percent, no bound.
    for row in block["shapes"]:
        assert row["roofline"]["baseline"]["percent"] is None and row["roofline"]["baseline"]["bound"] is None
    assert block["roofline"]["ceilings"] is None and "no GPU ceiling" in block["roofline"]["note"]


def check_html_self_contained_and_renders(toy, tmp_path):
    page = toy["folder"] / "index.html"
    html = page.read_text()
    # No network: no scripts, stylesheets, images or fonts fetched; the only URL is the SVG namespace.
    assert "<script" not in html and "<link" not in html and "src=" not in html and "@import" not in html
    assert set(re.findall(r"https?://[^\s\"')]+", html)) <= {"http://www.w3.org/2000/svg"}
    dom = render_in_browser(page, tmp_path)
    text = dom_text(dom)
    for heading in SECTIONS:
        assert heading in text, heading
    assert "Interpreter timings" in text and "measure no GPU" in text
    assert dom.count("<svg") >= 3  # speedup bars, progress, achieved rates
    assert toy["llm"].id in text and "llm" in text


def test_report_of_a_real_toy_search(toy, tmp_path):
    """One test for the toy database, so that xdist runs its search once, not once per worker."""
    check_candidates_with_origin_and_parent(toy)
    check_winner_diff_and_compile_resources(toy)
    check_progress_and_interpreter_rates(toy)
    check_html_self_contained_and_renders(toy, tmp_path)


# -- the H200 store: roofline, suspects, projection -----------------------------------------------

def test_roofline_percent_bound_and_suspect(h200):
    data, expected = h200["data"], h200["expected"]
    h = ceilings_for("NVIDIA H200")
    blocks = {b["block"]: b for b in data["blocks"]}
    for block_id, block in blocks.items():
        assert block["roofline"]["ceilings"]["name"] == "H200"
        for row in block["shapes"]:
            exp = expected[(block_id, row["shape"])]
            base = row["roofline"]["baseline"]
            assert base["percent"] == pytest.approx(100 * synthetic.BASE_FRACTION)
            assert base["bound"] == h.bound(exp["flops"], exp["bytes"], practical=True)
            assert base["achieved_bandwidth"] == pytest.approx(exp["bytes"] / exp["baseline_s"])
    bounds = {r["shape"]: r["roofline"]["baseline"]["bound"] for r in blocks["attention/gpt_oss_decode"]["shapes"]}
    assert set(bounds.values()) == {"memory"}  # decode reads the whole cache: memory-bound
    assert blocks["attention/gpt_oss_prefill"]["shapes"][0]["roofline"]["baseline"]["bound"] == "compute"
    suspects = blocks["moe/gpt_oss_experts"]["suspects"]
    assert [s["shape"] for s in suspects] == [synthetic.SUSPECT_SHAPE]
    assert all(not b["suspects"] for k, b in blocks.items() if k != "moe/gpt_oss_experts")
    assert "Faster than physically possible — suspect" in h200["md"]
    assert "Interpreter timings" not in (h200["folder"] / "index.html").read_text()


def test_each_block_says_what_serving_runs_and_its_library_lines_state(h200):
    """Issue 31: every block of the report names the shipped path of its shapes and whether its
    library line can run on the GPU image, with the reason by name where it cannot, whether or not
    a library line was measured (the synthetic store measured none)."""
    from kernelforge.shipped import covering

    catalog = h200["catalog"]
    html = (h200["folder"] / "index.html").read_text()
    data = h200["data"]
    for entry in data["blocks"]:
        block = catalog.block(entry["block"])
        shapes = [s for row in entry["shapes"] for s in block.shapes(row["shape"])]
        paths = covering(block.shipped, shapes)
        assert paths, entry["block"]
        assert [p["presets"] for p in entry["shipped"]] == [p.presets for p in paths]
        for p in paths:
            line = f"`{p.presets}`: {p.engine} runs {p.path} ({p.source}). Library: {p.library_status}."
            assert line in h200["md"], line
            assert p.library in html
            if not p.on_image:
                assert p.why_not and p.why_not in p.library_status


def test_projection_in_the_report_matches_the_stored_times(h200):
    from kernelforge.report.projection import model as proj

    e = h200["expected"]
    profiles = {p["profile"]: p for p in h200["data"]["projection"]["profiles"]}
    inter = profiles["interactive"]
    # TTFT: the MoE prefill is one pass over the 8000-token prompt (T8000), which this store lacks:
    # attention is shown, the phase has no total, and the shape is named.
    ttft = next(p for p in inter["phases"] if p["kind"] == "TTFT" and p["model"] == "gpt-oss-120b")
    assert not ttft["complete"] and ttft["baseline_s"] is None
    full, window = e[("attention/gpt_oss_prefill", "gpt-oss/interactive/full")], \
        e[("attention/gpt_oss_prefill", "gpt-oss/interactive/window")]
    attention = next(c for c in ttft["components"] if c["block"] == "attention/gpt_oss_prefill")
    assert attention["baseline_s"] == pytest.approx(18 * full["baseline_s"] + 18 * window["baseline_s"])
    tbt = next(p for p in inter["phases"] if p["kind"] == "TBT" and p["model"] == "gpt-oss-120b" and p["batch"] == 8)
    dfull = e[("attention/gpt_oss_decode", "gpt-oss/interactive/b8/full")]
    dwin = e[("attention/gpt_oss_decode", "gpt-oss/interactive/b8/window128")]
    m8 = e[("moe/gpt_oss_experts", "gpt-oss-120b/T8")]
    # The dense parts are a labelled roofline estimate at the H200's ceilings, the same on both sides.
    [dense] = [c for c in tbt["components"] if c["estimate"]]
    estimate = proj.dense_estimate(proj.MODELS["gpt-oss-120b"], [(8, 1)], 8, ceilings_for("NVIDIA H200"))
    assert dense["winner_s"] == pytest.approx(estimate.winner_s) == pytest.approx(dense["baseline_s"])
    want = 18 * dfull["winner_s"] + 18 * dwin["winner_s"] + 36 * m8["winner_s"] + estimate.winner_s
    assert tbt["winner_s"] == pytest.approx(want) and tbt["complete"]
    joules = 18 * dfull["winner_j"] + 18 * dwin["winner_j"] + 36 * m8["winner_j"]  # measured blocks only
    assert tbt["winner_j_per_token"] == pytest.approx(joules / 8)
    # 20b shares the attention shapes but its MoE presets were not measured: named, no total.
    t20 = next(p for p in inter["phases"] if p["kind"] == "TBT" and p["model"] == "gpt-oss-20b")
    assert not t20["complete"] and t20["baseline_s"] is None
    missing = {(m["block"], m["shape"]) for m in inter["missing"]}
    assert {("moe/gpt_oss_experts", "gpt-oss-20b/T8"), ("moe/gpt_oss_experts", "gpt-oss-120b/T8000")} <= missing
    why = {(m["shape"]): m["why"] for m in profiles["8k1k"]["missing"]}
    assert why["gpt-oss/8k1k/full"] == "not measured in this job"  # 8k1k has its prefill presets now
    assert why["gpt-oss/8k1k/b8/full"] == "not measured in this job"
    # The long-context batch-64 decode needs more memory than an H200 has: reported, not projected.
    infeasible = profiles["long_context"]["infeasible"]
    assert any(f["model"] == "gpt-oss-120b" and f["batch"] == 64 and not f["feasible"] for f in infeasible)
    assert "`gpt-oss/rag/full`" in h200["md"] and "roofline estimate, not measured" in h200["md"]
    assert "Does not fit the GPU's memory (not projected)" in h200["md"]
    assert next(f["message"] for f in infeasible if f["batch"] == 64) in h200["md"]


def test_h200_page_and_compare_page_render(h200, tmp_path, monkeypatch):
    dom = render_in_browser(h200["folder"] / "index.html", tmp_path)
    text = dom_text(dom)
    for heading in SECTIONS:
        assert heading in text, heading
    assert "H200 datasheet" in text and "H200 measured" in text  # the roofline chart's ceiling lines
    assert "Faster than physically possible — suspect" in text
    # The store lacks the one-pass MoE prefill (T8000): TTFT shows its attention part, no total.
    assert "TTFT: attention (prefill)" in text and "TBT total (these blocks, dense parts estimated)" in text
    assert "Does not fit the GPU's memory (not projected)" in text
    # The same job measured on another GPU, side by side.
    other_env = {**synthetic.ENV, "device_name": "NVIDIA H100 80GB HBM3", "triton": "3.5.0"}
    other_dir = h200["root"] / "other"
    other_dir.mkdir()
    other_path, other = synthetic.build(other_dir, h200["catalog"], name="h100", env=other_env)
    monkeypatch.chdir(tmp_path)  # the compare page goes to ./reports/
    result = CliRunner().invoke(main, ["--kernels", str(KERNELS), "report", str(h200["path"]), "--compare",
                                       str(other_path)], catch_exceptions=False)
    assert result.exit_code == 0, result.output
    out = result.output
    assert "NVIDIA H200" in out and "NVIDIA H100 80GB HBM3" in out and "triton 3.5.0" in out
    key = ("attention/gpt_oss_decode", "gpt-oss/interactive/b8/full")
    ratio = h200["expected"][key]["winner_s"] / other[key]["winner_s"]
    row = next(line for line in out.splitlines() if line.startswith("| gpt-oss/interactive/b8/full |"))
    assert row.rstrip().endswith(f"| {ratio:.3f}x |")
    page = tmp_path / "reports" / "compare-h200-vs-h100.html"
    assert page.exists()
    text = dom_text(render_in_browser(page, tmp_path))
    assert "kernelforge comparison: h200 (A) vs h100 (B)" in text and "NVIDIA H100 80GB HBM3" in text


def test_markdown_renderer_still_accepts_old_data():
    """to_markdown works on report data without the new sections (e.g. an older results.json)."""
    data = Report(job="old", job_file="x.toml", dtype="bfloat16", tune="all-shapes", strategy="tpe",
                  environments={}, blocks=(BlockReport(block="b", description="", geomean_speedup=None, shapes=(),
                                                       statuses={}, origins={}, candidates=0),))
    assert "## b" in to_markdown(data)


def test_a_job_with_nothing_stored_still_gets_a_report(tmp_path):
    path = tmp_path / "empty.toml"
    db = tmp_path / "e.db"
    path.write_text(f'[job]\nname = "empty"\nstorage = "sqlite:///{db}"\n'
                    '[[blocks]]\nid = "moe/gpt_oss_experts"\nshapes = "gpt-oss-120b"\n')
    catalog = Catalog.discover(KERNELS)
    job = load_job(path, catalog)
    md = write_report(job, catalog, Store(job.storage_url), tmp_path / "r").read_text()
    assert "No timed results." in md and "### Roofline" not in md
    html = (tmp_path / "r" / "index.html").read_text()
    assert "No evaluations stored." in html and "Model-level projection" in html
