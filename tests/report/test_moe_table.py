"""The MoE report's default-versus-tuned table per token count (kernelforge.report.moe_table), from
the stored H200 search: each row's times are the stored baseline and winner of that token count."""

from __future__ import annotations

from pathlib import Path

from kernelforge.catalog import Catalog
from kernelforge.job import load_job
from kernelforge.report.collect import collect
from kernelforge.report.format import fmt_time
from kernelforge.report.html import render_html
from kernelforge.report.markdown import to_markdown
from kernelforge.report.moe_table import moe_tables
from kernelforge.store.store import Store
import kf_synthetic_store as synthetic  # tests/fixtures (pytest pythonpath)

ROOT = Path(__file__).resolve().parents[2]
KERNELS = ROOT / "kernels"


def test_default_versus_tuned_per_token_count(tmp_path):
    catalog = Catalog.discover(KERNELS)
    path, expected = synthetic.build(tmp_path, catalog)
    job = load_job(path, catalog)
    report = collect(job, catalog, Store(job.storage_url, create=False))
    blocks = {b.block: b for b in report.blocks}
    assert moe_tables(blocks["attention/gpt_oss_decode"]) == ()  # no token-count table off MoE
    [table] = moe_tables(blocks["moe/gpt_oss_experts"])
    assert table.family == "E=128, I=2880, H=2880, TOPK=4, ROUTING=uniform"
    assert [t.tokens for t in table.rows] == [1, 8, 32, 64, 128, 256, 512, 1024, 2048, 4096]
    for t in table.rows:
        want = expected[("moe/gpt_oss_experts", t.shape)]
        assert t.default_s == want["baseline_s"] and t.tuned_s == want["winner_s"]
        assert abs(t.speedup - want["baseline_s"] / want["winner_s"]) < 1e-9
        assert t.tuned_params == want["params"]
    markdown = to_markdown(report)
    assert "Default versus tuned per token count (E=128, I=2880, H=2880, TOPK=4, ROUTING=uniform)" in markdown
    row8 = next(t for t in table.rows if t.tokens == 8)
    assert f"| 8 | {fmt_time(row8.default_s)} | {fmt_time(row8.tuned_s)} | {row8.speedup:.3f}x" in markdown
    html = render_html(report)
    assert html.count('<table class="moe-table">') == 1 and "get_default_config" in html
