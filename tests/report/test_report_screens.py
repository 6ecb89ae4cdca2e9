"""The report's pages as a reader sees them, in real headless Chromium: a screenshot, and a script
run in a copy of the page that measures every chart label against its chart and every heading
against its box, writing what it found into the DOM (read back with --dump-dom).

Pages: the synthetic H200 store (tests/fixtures/kf_synthetic_store.py) with the confirmation of
two shapes set on the collected records (the fixture stores no confirmation pairs), and a real
toy search in the interpreter (the `toy` fixture, conftest.py), for the banner.
"""

from __future__ import annotations

import dataclasses
import json
import re
from pathlib import Path

import pytest

from kernelforge.job import load_job
from kernelforge.report.collect import collect
from kernelforge.report.html import render_html
from kernelforge.report.markdown import to_markdown
from kernelforge.report.records import Confirmation, Report
from kernelforge.report.space_view import MIN_MEASURED, TOO_FEW, space_view
from kf_headless import dom_after_scripts, dom_text, render_in_browser

ROOT = Path(__file__).resolve().parents[2]

#: Run in the page: every svg <text>'s box (mapped into its svg's user space) against the viewBox,
#: and every heading, summary and banner: no horizontal overflow. The result goes into the DOM.
MEASURE = """<script>
window.addEventListener("load", function () {
  var bad = [], texts = 0;
  document.querySelectorAll("svg").forEach(function (svg) {
    var vb = svg.viewBox.baseVal, inv = svg.getScreenCTM().inverse();
    svg.querySelectorAll("text").forEach(function (t) {
      texts++;
      var b = t.getBBox(), m = inv.multiply(t.getScreenCTM()), xs = [], ys = [];
      [[b.x, b.y], [b.x + b.width, b.y], [b.x, b.y + b.height], [b.x + b.width, b.y + b.height]].forEach(function (c) {
        var p = new DOMPoint(c[0], c[1]).matrixTransform(m); xs.push(p.x); ys.push(p.y);
      });
      if (Math.min.apply(null, xs) < vb.x - 0.5 || Math.max.apply(null, xs) > vb.x + vb.width + 0.5 ||
          Math.min.apply(null, ys) < vb.y - 0.5 || Math.max.apply(null, ys) > vb.y + vb.height + 0.5) {
        bad.push("svg text '" + t.textContent + "' [" + Math.min.apply(null, xs).toFixed(1) + ", " +
                 Math.max.apply(null, xs).toFixed(1) + "] outside 0-" + vb.width);
      }
    });
  });
  var boxes = 0;
  document.querySelectorAll("h1, h2, h3, h4, summary, .banner, .card, .timing-tag").forEach(function (e) {
    if (!e.getClientRects().length) { return; }
    boxes++;
    if (e.scrollWidth > e.clientWidth + 1) { bad.push(e.tagName + " '" + e.textContent.slice(0, 60) + "' overflows"); }
  });
  var out = document.createElement("pre");
  out.id = "kf-measure";
  out.textContent = JSON.stringify({texts: texts, boxes: boxes, bad: bad});
  document.body.appendChild(out);
});
</script>"""


def _measured(page: Path, tmp: Path) -> tuple[dict, str]:
    """Screenshot the page, then load a copy with the measuring script and return what it wrote
    and the text of the DOM."""
    html = page.read_text()
    render_in_browser(page, tmp)  # a real, non-blank screenshot of the shipped page
    copy = tmp / ("measured-" + page.name)
    copy.write_text(html.replace("</body>", MEASURE + "\n</body>"))
    done = dom_after_scripts(copy, tmp)
    found = re.search(r'<pre id="kf-measure">(.*?)</pre>', done.stdout, re.S)
    assert found, done.stderr[-2000:]
    return json.loads(found.group(1).replace("&quot;", '"').replace("&amp;", "&")), done.stdout


def _confirmed_variant(report: Report) -> Report:
    """The report with its first block's first shape confirmed faster and its second within noise."""
    block = report.blocks[0]
    rows = list(block.shapes)
    rows[0] = dataclasses.replace(rows[0], confirmed=True, significant=True, pairs=20)
    rows[1] = dataclasses.replace(rows[1], confirmed=True, significant=False, pairs=20)
    return dataclasses.replace(report, blocks=(dataclasses.replace(block, shapes=tuple(rows)), *report.blocks[1:]))


def test_h200_report_screens(h200, tmp_path):
    shipped = (h200["folder"] / "index.html").read_text()
    assert "<script" not in shipped
    job = load_job(h200["path"], h200["catalog"])
    report = _confirmed_variant(collect(job, h200["catalog"], h200["store"]))
    page = tmp_path / "index.html"
    page.write_text(render_html(report))
    result, dom = _measured(page, tmp_path)
    assert result["texts"] > 50 and result["boxes"] > 10, result
    assert result["bad"] == [], result["bad"]
    text = dom_text(dom)
    for heading in ("Summary", *(b.block for b in report.blocks), "Parameter importance and searched space",
                    "Model-level projection (TTFT / TBT)", "Device and versions"):
        assert heading in text, heading
    # The three states, each its own words and CSS class.
    states = {c: re.findall(rf'class="confirmation (conf-[a-z]+)">{c.value}', dom) for c in Confirmation}
    assert all(states.values()), states
    assert len({cls for found in states.values() for cls in found}) == 3
    assert len({c.value for c in Confirmation}) == 3
    md = to_markdown(report)
    assert "**confirmed faster** (20 pairs)" in md and "| within noise (20 pairs) |" in md and "_not yet confirmed_" in md
    # A real GPU: no banner. The missing shapes are folded.
    assert 'class="banner' not in dom
    assert re.search(r"<details class=\"missing\"><summary>Missing shapes", dom)
    assert "<details class=\"missing\" open" not in dom


def test_space_view_of_the_h200_blocks(h200):
    job = load_job(h200["path"], h200["catalog"])
    report = collect(job, h200["catalog"], h200["store"])
    for block in report.blocks:
        view = space_view(block)
        assert len(view.measured) == sum(1 for c in block.candidate_rows if c.status == "ok" and c.geomean_speedup)
        if len(view.measured) < MIN_MEASURED:
            assert view.importance == () and TOO_FEW in view.note
        else:
            assert sum(i.share for i in view.importance) == pytest.approx(1.0)


def test_toy_report_screens(toy, tmp_path):
    result, dom = _measured(toy["folder"] / "index.html", tmp_path)
    assert result["bad"] == [], result["bad"]
    # One interpreter banner at the top; the block and the projection carry only the short tag.
    assert len(re.findall(r'<div class="banner ', dom)) == 1
    assert 'id="timing-banner-1"' in dom and "(interpreter timings)" in dom_text(dom)
    assert dom_text(dom).count("measure no GPU") == 1
    assert re.search(r"<summary>Nothing projected: \d+ shapes missing</summary>", dom)
    text = dom_text(dom)
    for heading in ("Summary", "toy/axpy", "Parameter importance and searched space",
                    "Model-level projection (TTFT / TBT)", "Device and versions"):
        assert heading in text, heading
    assert "not yet confirmed" in text or "within noise" in text or "confirmed faster" in text


@pytest.mark.interpreter
def test_demo_report_screens(tmp_path):
    """The demo job's own report (search/demo.toml, every block, a budget of 2 evaluations so CI
    can afford it) in headless Chromium: every section, no clipped label, one banner."""
    from kernelforge.catalog import Catalog
    from kernelforge.report.write import write_report
    from kernelforge.search.search import Search
    from kernelforge.search.progress import Progress
    from kernelforge.store.store import Store

    catalog = Catalog.discover()
    job = load_job(ROOT / "search" / "demo.toml", catalog)
    job = dataclasses.replace(job, strategy=dataclasses.replace(job.strategy, evaluations=2),
                              storage=f"sqlite:///{tmp_path / 'demo.db'}")
    store = Store(job.storage_url)
    Search(job, catalog, store, Progress(), compile_enabled=False).run()
    write_report(job, catalog, store, tmp_path / "report")
    result, dom = _measured(tmp_path / "report" / "index.html", tmp_path)
    assert result["bad"] == [], result["bad"]
    assert result["texts"] > 0 and result["boxes"] > 0
    assert len(re.findall(r'<div class="banner ', dom)) == 1
    text = dom_text(dom)
    for heading in ("Summary", *(b.id for b in job.blocks), "Parameter importance and searched space",
                    "Model-level projection (TTFT / TBT)", "Device and versions"):
        assert heading in text, heading
    # The MoE block's default-versus-tuned table and the energy note are on its page.
    assert "energy was not measurable" in text
