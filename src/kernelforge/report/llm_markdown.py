"""The "## LLM" section of REPORT.md from a collected :class:`~kernelforge.report.llm_section.LLMSection`:
per model the calls, tokens, latency, outcomes and (when priced) the cost estimate; the lineage
of each block's templates as nested lists; each LLM-written template's prompt and answer in a
collapsed ``<details>`` block."""

from __future__ import annotations

import re

from kernelforge.report.format import fmt_speedup, fmt_time
from kernelforge.report.llm_section import LLMLineageNode, LLMSection, ShownText, outcomes_text
from kernelforge.textsafe import LINE, cut


def fmt_cost(value: float | None) -> str:
    """An estimated cost in USD ("$0.0123"), or "-"."""
    return "-" if value is None else f"${value:.4g}"


def fmt_price(value: float | None) -> str:
    """A price per million tokens ("$2.5/M"), or "-"."""
    return "-" if value is None else f"${value:g}/M"


def llm_markdown(section: LLMSection | None) -> list[str]:
    """The lines of REPORT.md's LLM section ([] without one)."""
    if section is None:
        return []
    lines = ["## LLM", "",
             f"{section.requests} LLM request(s) stored for this job ({section.replayed} replayed). Per model: its "
             "live calls (replayed calls cost nothing and are not counted), read from the job's call log; latency "
             "is the median of its HTTP attempts.", ""]
    cost = " | est. cost (USD) | prices in / out" if section.priced else ""
    lines.append("| model | endpoint | requests | HTTP attempts | prompt tokens | completion tokens | median latency"
                 f"{cost} | outcomes |")
    lines.append("|---" * (10 if section.priced else 8) + "|")
    for m in section.models:
        priced = (f" | {fmt_cost(m.cost_usd)} | {fmt_price(m.price_in_per_mtok)} / {fmt_price(m.price_out_per_mtok)}"
                  if section.priced else "")
        lines.append(f"| {m.model} | {m.base_url} | {m.requests} | {m.attempts} | {m.prompt_tokens} | "
                     f"{m.completion_tokens} | {fmt_time(m.median_latency_s)}{priced} | {outcomes_text(m.outcomes)} |")
    lines.append("")
    if section.priced:
        lines.extend([f"{section.cost_note} Total estimate: {fmt_cost(section.cost_usd)}.", ""])
    if section.lineages:
        lines.extend(["### Lineage of the LLM templates", "",
                      "Each template under the template whose candidate it was written from; speedup: the best "
                      "geometric-mean speedup of its candidates measured on every shape (from the block's Candidates "
                      "table: the same device and timing as that block's numbers).", ""])
        for tree in section.lineages:
            lines.extend([f"#### {tree.block}", ""])
            for root in tree.roots:
                lines.extend(_tree_lines(root, 0))
            lines.append("")
    if section.templates:
        lines.extend(["### Prompts and answers of the LLM templates", ""])
    for t in section.templates:
        parent = f"`{t.parent}` (template {t.parent_template or '?'})" if t.parent else "-"
        lines.append(f"#### `{t.template_id}` ({t.block})")
        lines.append("")
        lines.append(f"Model {t.model or '?'}, request #{t.call_seq if t.call_seq is not None else '?'} "
                     f"({t.purpose or '?'}), written from {parent}; outcome {t.outcome or 'pending'}"
                     + (f": {_one_line(t.message)}" if t.message else "") + ".")
        lines.append("")
        lines.extend(_details("Prompt", t.prompt))
        lines.extend(_details("Answer", t.answer))
    return lines


def _tree_lines(node: LLMLineageNode, depth: int) -> list[str]:
    who = "human" if node.origin == "human" else f"{node.origin}, {node.model or '?'}"
    outcome = f", outcome {node.outcome}" if node.outcome else ""
    out = [f"{'  ' * depth}- `{node.template_id}` ({who}{outcome}), speedup {fmt_speedup(node.best_speedup)}"]
    for child in node.children:
        out.extend(_tree_lines(child, depth + 1))
    return out


def _one_line(text: str) -> str:
    text = " ".join(text.split())
    return text if len(text) <= LINE else cut(text, LINE) + "..."


def _details(title: str, text: ShownText) -> list[str]:
    """A collapsed block holding ``text`` in a fence longer than any backtick run inside it."""
    longest = max((len(run) for run in re.findall(r"`+", text.text)), default=0)
    fence = "`" * max(3, longest + 1)
    note = f" {text.note}" if text.note else ""
    return [f"<details><summary>{title}{note}</summary>", "", f"{fence}text", text.text, fence, "", "</details>", ""]
