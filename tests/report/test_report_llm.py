"""The report's LLM section (kernelforge.report.llm_section, llm_markdown, _llm.html.j2), from a real
LLM search of the toy block against the loopback server (tests/llm_server.py, the real openai client
over HTTP): per-model calls, tokens, latency and outcomes as the store gives them, the cost estimate
from the job file's prices, each LLM template's prompt and answer in a collapsed <details>, the
lineage nesting the LLM's templates under the human template they came from; a job that made no
LLM calls has no LLM section. Also the job file's price fields and how a model finds its prices."""

from __future__ import annotations

import html
import json
import re
from pathlib import Path

import pytest

from kernelforge.catalog import Catalog
from kernelforge.errors import UserError
from kernelforge.job import load_job
from kernelforge.llm.parse import template_id_for
from kernelforge.llm_spec import parse_llm
from kernelforge.report.llm_section import MAX_SHOWN_CHARS, price_for, shown
from kernelforge.report.write import write_report
from kernelforge.search.search import Search
from kernelforge.store.llm_stats import ModelStats
from kernelforge.store.store import Store
from llm_server import FAST, Reply, ScriptedServer, fenced
from llm_toy import BLOCK, FIXTURES, Recorder, run_llm_search, write_llm_job
from kf_headless import render_in_browser
from toy_job import toy_job

PRICE_IN, PRICE_OUT = 2.5, 10.0


def _live_report(tmp_path: Path):
    """A two-request LLM search (a faster kernel, then one written from it) and its report."""
    # The second answer improves on the first one's template: a grandchild of the human template.
    wider = FAST.replace("    mask = offs < n\n", "    mask = offs < n  # one bounds check per element\n")
    script = [Reply(fenced(FAST, prose="Here is a <faster> kernel."), label="fast"),
              Reply(fenced(wider), label="wider")]
    with ScriptedServer(script) as server:
        path = write_llm_job(tmp_path, "llmrep", evaluations=8, seed=3, max_calls=2, tune_evaluations=1,
                             repair_turns=0, base_url=server.base_url, model="m", price_in_per_mtok=PRICE_IN,
                             price_out_per_mtok=PRICE_OUT)
        store, _, _ = run_llm_search(path, tmp_path / "llm.db")
    catalog = Catalog.discover(FIXTURES)
    job = load_job(path, catalog)
    report_md = write_report(job, catalog, store, tmp_path / "report")
    return store, server, report_md.read_text(), (tmp_path / "report" / "index.html").read_text(), \
        json.loads((tmp_path / "report" / "results.json").read_text()), template_id_for(BLOCK, FAST), \
        template_id_for(BLOCK, wider)


@pytest.mark.interpreter
def test_the_llm_section_shows_the_stored_calls_prompts_answers_lineage_and_cost(tmp_path):
    store, server, md, page, data, fast_id, wider_id = _live_report(tmp_path)
    assert server.served == ["fast", "wider"]
    stats = store.llm_model_stats("llmrep")
    assert len(stats) == 1 and stats[0].requests == 2 and stats[0].prompt_tokens > 0
    s = stats[0]

    # Markdown: the per-model row carries the store's numbers; the cost is tokens x the job's prices.
    assert "## LLM" in md
    cost = (s.prompt_tokens * PRICE_IN + s.completion_tokens * PRICE_OUT) / 1e6
    lines = md.splitlines()
    row = next(line for line in lines if line.startswith("| m |"))
    header = lines.index(row) - 2
    assert lines[header].count("|") == lines[header + 1].count("|") == row.count("|"), "a well-formed table"
    cells = [c.strip() for c in row.strip("|").split("|")]
    assert cells[2:6] == [str(s.requests), str(s.attempts), str(s.prompt_tokens), str(s.completion_tokens)]
    assert cells[7] == f"${cost:.4g}" and "estimate" in md
    assert cells[-1] == ", ".join(f"{k} {n}" for k, n in s.outcomes)

    # results.json holds the same records.
    section = data["llm"]
    assert section["models"][0]["prompt_tokens"] == s.prompt_tokens
    assert section["models"][0]["cost_usd"] == pytest.approx(cost)

    # HTML: the model row, the cost, the prompt and the scripted answer inside <details>.
    assert '<section id="llm">' in page and 'href="#llm"' in page
    model_row = re.search(r'<tr data-model="m">(.*?)</tr>', page, re.S).group(1)
    for name, value in (("requests", s.requests), ("attempts", s.attempts), ("prompt-tokens", s.prompt_tokens),
                        ("completion-tokens", s.completion_tokens)):
        assert f'<td class="num {name}">{value}</td>' in model_row, name
    assert f"${cost:.4g}" in model_row
    first = store.llm_calls("llmrep", final_only=True)[0]
    user_prompt = next(m["content"] for m in json.loads(first.request)["messages"] if m["role"] == "user")
    answers = re.findall(r'<details class="answer"><summary>Answer</summary><pre class="source">(.*?)</pre></details>',
                         page, re.S)
    prompts = re.findall(r'<details class="prompt"><summary>Prompt[^<]*</summary><pre class="source">(.*?)</pre>'
                         r'</details>', page, re.S)
    assert html.unescape(answers[0]) == first.response and first.response.startswith("Here is a <faster> kernel.")
    assert "&lt;faster&gt;" in answers[0], "the answer is escaped, not markup"
    assert len(prompts) == 2 and user_prompt[:1000] in html.unescape(prompts[0])

    # The lineage: the LLM's first template under the human template, the second under the first.
    tree = re.search(r'<ul class="lineage" data-block="toy/axpy">(.*?)</ul>\s*(?:<h|</section)', page, re.S).group(1)
    human = store.candidate(first.parent).template
    nested = re.compile(rf'<li data-template="{re.escape(human)}">.*?<ul>\s*<li data-template="{re.escape(fast_id)}">'
                        rf'.*?<ul>\s*<li data-template="{re.escape(wider_id)}">', re.S)
    assert nested.search(tree), tree
    # As a browser builds it: the same nesting, the prompts and answers collapsed.
    dom = render_in_browser(tmp_path / "report" / "index.html", tmp_path)
    assert nested.search(dom) and dom.count('<details class="answer">') == 2
    assert '<details class="answer" open' not in dom and '<details class="prompt" open' not in dom
    assert f"- `{human}` (human)" in md and f"  - `{fast_id}` (llm, m, outcome ok)" in md
    assert f"    - `{wider_id}` (llm, m, outcome ok)" in md
    assert re.search(r"<details><summary>Answer</summary>\n\n`{3,}text\nHere is a <faster> kernel\.", md)


@pytest.mark.interpreter
def test_a_job_without_llm_calls_has_no_llm_section(tmp_path):
    catalog = Catalog.discover(FIXTURES)
    job = load_job(toy_job(tmp_path, "plain", evaluations=1), catalog)
    store = Store(f"sqlite:///{tmp_path / 'plain.db'}")
    Search(job, catalog, store, Recorder(), compile_enabled=False, in_process=True).run()
    md = write_report(job, catalog, store, tmp_path / "report").read_text()
    page = (tmp_path / "report" / "index.html").read_text()
    assert "## Environment" in md and "## LLM" not in md
    assert 'id="llm"' not in page and 'href="#llm"' not in page
    assert json.loads((tmp_path / "report" / "results.json").read_text())["llm"] is None


def test_prices_are_validated_with_the_field_named():
    where = "job.toml [llm]"
    base = {"base_url": "http://127.0.0.1:9/v1", "model": "m"}
    with pytest.raises(UserError, match=r"job\.toml \[llm\] price_in_per_mtok: must be 0 or more .* got -1"):
        parse_llm({**base, "price_in_per_mtok": -1, "price_out_per_mtok": 1}, where)
    with pytest.raises(UserError, match=r"price_out_per_mtok: expected a number of USD per million tokens"):
        parse_llm({**base, "price_in_per_mtok": 1, "price_out_per_mtok": "cheap"}, where)
    with pytest.raises(UserError, match=r"give both price_in_per_mtok and price_out_per_mtok"):
        parse_llm({**base, "price_in_per_mtok": 1}, where)
    with pytest.raises(UserError, match=r"\[\[llm\.models\]\] #2 price_out_per_mtok: must be 0 or more"):
        parse_llm({**base, "models": [{"model": "a"}, {"model": "b", "price_out_per_mtok": -0.5,
                                                        "price_in_per_mtok": 1}]}, where)
    spec = parse_llm({**base, "price_in_per_mtok": 1, "price_out_per_mtok": 4,
                      "models": [{"model": "a"}, {"model": "b", "price_in_per_mtok": 0, "price_out_per_mtok": 0.5}]},
                     where)
    assert [(m.price_in_per_mtok, m.price_out_per_mtok) for m in spec.endpoints()] == [(1.0, 4.0), (0.0, 0.5)]
    plain = parse_llm(base, where).endpoints()[0]
    assert (plain.price_in_per_mtok, plain.price_out_per_mtok) == (None, None)


def test_a_stored_model_finds_its_prices_by_name_and_endpoint_else_by_a_unique_name():
    spec = parse_llm({"models": [
        {"model": "a", "base_url": "http://127.0.0.1:1/v1", "price_in_per_mtok": 1, "price_out_per_mtok": 2},
        {"model": "a", "base_url": "http://127.0.0.1:2/v1", "price_in_per_mtok": 3, "price_out_per_mtok": 4},
        {"model": "b", "base_url": "http://127.0.0.1:3/v1", "price_in_per_mtok": 5, "price_out_per_mtok": 6},
        {"model": "c", "base_url": "http://127.0.0.1:4/v1"}]}, "job.toml [llm]")

    def stats(model: str, url: str) -> ModelStats:
        return ModelStats(model, url, 1, 1, 10, 10, 0.1, (("ok", 1),))

    specs = spec.endpoints()
    assert price_for(stats("a", "http://127.0.0.1:2/v1"), specs).price_in_per_mtok == 3.0
    assert price_for(stats("b", "http://127.0.0.1:9/v1"), specs).price_in_per_mtok == 5.0, "the only b"
    assert price_for(stats("a", "http://127.0.0.1:9/v1"), specs) is None, "two entries named a: ambiguous"
    assert price_for(stats("c", "http://127.0.0.1:4/v1"), specs) is None, "c is not priced"


def test_a_long_text_is_cut_and_says_so():
    text = shown("x" * (MAX_SHOWN_CHARS + 123))
    assert len(text.text) == MAX_SHOWN_CHARS and text.note == "(truncated: 123 more characters)"
    assert shown("short").note == ""
