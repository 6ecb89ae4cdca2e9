"""The report's LLM section: what each model of a job cost and what became of its answers, the
prompt and answer behind every template the LLM wrote, and the lineage of those templates as a
tree (human template -> LLM children -> grandchildren), all read from the job's call log
(``kf_llm_calls``) and ``kf_templates``. :func:`collect_llm` builds it; the records are frozen and
go into results.json with the rest of :class:`~kernelforge.report.records.Report`.

Per model: :meth:`~kernelforge.store.store.Store.llm_model_stats` as stored (live calls only:
replayed calls cost nothing). Cost is an estimate, shown only for a priced model: prompt tokens x
``price_in_per_mtok`` + completion tokens x ``price_out_per_mtok`` (USD per million tokens, from
the job file's ``[llm]`` table). A stored call's model is matched to the job file's
:class:`~kernelforge.llm_spec.ModelSpec` by model name and redacted base URL; when none matches
both (the endpoint was changed on the command line, say), by the model name alone if exactly one
entry has that name; otherwise the model is shown unpriced.

Prompts and answers are stored redacted; they are redacted again here and cut to
:data:`MAX_SHOWN_CHARS` characters (the cut is said). The report writer masks the final text too.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from typing import TYPE_CHECKING, Any, Iterable, Protocol, Sequence

from kernelforge.llm.lineage import HUMAN, LineageNode, lineage
from kernelforge.redact import redact, redact_url
from kernelforge.store.llm_stats import ModelStats

if TYPE_CHECKING:
    from kernelforge.job import Job
    from kernelforge.llm_spec import ModelSpec
    from kernelforge.store.records import LLMCall
    from kernelforge.store.store import Store

#: The most characters of one prompt or answer the report shows.
MAX_SHOWN_CHARS = 20_000

#: What the report says of the cost column.
COST_NOTE = ("Cost is an estimate: the stored token counts times the prices in the job file "
             "(price_in_per_mtok, price_out_per_mtok; USD per million tokens), not a bill.")


class ReportedBlock(Protocol):
    """What the section reads of a :class:`~kernelforge.report.records.BlockReport` (a protocol:
    records.py imports this module, so this module does not import it)."""

    @property
    def block(self) -> str: ...

    @property
    def shapes(self) -> Sequence[Any]: ...

    @property
    def candidate_rows(self) -> Sequence[Any]: ...


@dataclass(frozen=True)
class ShownText:
    """A prompt or an answer as the report shows it: redacted, at most :data:`MAX_SHOWN_CHARS`
    characters (``truncated``: how many more there were)."""

    text: str
    truncated: int = 0

    @property
    def note(self) -> str:
        """"(truncated: N more characters)", or "" when nothing was cut."""
        return f"(truncated: {self.truncated} more characters)" if self.truncated else ""


@dataclass(frozen=True)
class LLMModelRow(ModelStats):
    """One model's statistics (:class:`~kernelforge.store.llm_stats.ModelStats`: requests, attempts,
    tokens, median latency, outcomes; URL redacted) and, when the job file prices it, the prices
    and the estimated cost in USD."""

    price_in_per_mtok: float | None = None
    price_out_per_mtok: float | None = None
    cost_usd: float | None = None


@dataclass(frozen=True)
class LLMTemplateRow:
    """A template the LLM wrote: its block, the model, what it was written from (``parent``: the
    parent candidate; ``parent_template``: that candidate's template), the request's purpose and
    sequence number, what became of it (``outcome``, ``message``) and the prompt and answer."""

    template_id: str
    block: str
    model: str | None
    parent: str | None
    parent_template: str | None
    call_seq: int | None
    purpose: str | None
    outcome: str | None
    message: str | None
    prompt: ShownText
    answer: ShownText


@dataclass(frozen=True)
class LLMLineageNode:
    """One template in a block's lineage tree: a human template (``origin`` ``human``) or one the
    LLM wrote, with who wrote it, what became of the answer, the best geometric-mean speedup of
    its candidates measured on every shape (as in the block's Candidates table; None: none) and
    the templates written from its candidates (``children``)."""

    template_id: str
    origin: str
    depth: int
    model: str | None
    outcome: str | None
    best_speedup: float | None
    children: tuple["LLMLineageNode", ...] = ()


@dataclass(frozen=True)
class LLMBlockLineage:
    """The lineage of one block: its roots (human templates, then any LLM template whose parent is
    not known), each with its descendants."""

    block: str
    roots: tuple[LLMLineageNode, ...]


@dataclass(frozen=True)
class LLMSection:
    """The report's LLM section (None on a :class:`~kernelforge.report.records.Report` whose job
    made no LLM calls). ``priced``: whether any model has a cost estimate."""

    models: tuple[LLMModelRow, ...]
    templates: tuple[LLMTemplateRow, ...]
    lineages: tuple[LLMBlockLineage, ...]
    requests: int
    replayed: int
    priced: bool
    cost_usd: float | None
    cost_note: str = COST_NOTE


def shown(text: str | None, limit: int = MAX_SHOWN_CHARS) -> ShownText:
    """``text`` redacted and cut to ``limit`` characters."""
    text = redact(text or "")
    if len(text) <= limit:
        return ShownText(text)
    return ShownText(text[:limit], len(text) - limit)


def prompt_text(request: str) -> str:
    """The messages of a stored request (its JSON body) as text: each as ``[role]`` then its
    content; the raw text when it is not a chat request."""
    try:
        messages = json.loads(request).get("messages")
    except (ValueError, AttributeError):
        return request
    if not isinstance(messages, list):
        return request
    parts = []
    for message in messages:
        if not isinstance(message, dict):
            continue
        content = message.get("content")
        if isinstance(content, list):  # content parts: keep the text ones
            content = "\n".join(str(p.get("text", "")) for p in content if isinstance(p, dict))
        parts.append(f"[{message.get('role', '?')}]\n{content if content is not None else ''}")
    return "\n\n".join(parts)


def price_for(stats: "ModelStats", specs: Sequence["ModelSpec"]) -> "ModelSpec | None":
    """The job file's entry that prices ``stats``' model: same model and redacted base URL, else
    the only entry of that model name; None when unpriced or ambiguous."""
    priced = [s for s in specs if s.price_in_per_mtok is not None and s.price_out_per_mtok is not None]
    exact = [s for s in priced if s.model == stats.model and redact_url(s.base_url) == stats.base_url]
    if exact:
        return exact[0]
    named = [s for s in specs if s.model == stats.model]
    return named[0] if len(named) == 1 and named[0] in priced else None


def model_row(stats: "ModelStats", spec: "ModelSpec | None") -> LLMModelRow:
    """A model's row: its stored statistics and, with a priced ``spec``, the cost estimate."""
    price_in = spec.price_in_per_mtok if spec else None
    price_out = spec.price_out_per_mtok if spec else None
    cost = None
    if price_in is not None and price_out is not None:
        cost = (stats.prompt_tokens * price_in + stats.completion_tokens * price_out) / 1e6
    return LLMModelRow(**asdict(stats), price_in_per_mtok=price_in, price_out_per_mtok=price_out, cost_usd=cost)


def template_speedups(blocks: Iterable[ReportedBlock]) -> dict[str, dict[str, float]]:
    """block -> template -> the best geometric-mean speedup of its candidates that were measured
    correct on every shape of the block (the numbers of the report's Candidates tables)."""
    out: dict[str, dict[str, float]] = {}
    for block in blocks:
        best = out.setdefault(block.block, {})
        for c in block.candidate_rows:
            if c.status == "ok" and c.geomean_speedup is not None and c.shapes == len(block.shapes):
                best[c.template] = max(best.get(c.template, 0.0), c.geomean_speedup)
    return out


def lineage_tree(block: str, nodes: Sequence[LineageNode]) -> LLMBlockLineage:
    """The nodes of :func:`kernelforge.llm.lineage.lineage` as a tree: each template under the
    template it was written from; a template whose parent is not among them is a root."""
    ids = {n.template_id for n in nodes}
    children: dict[str, list[LineageNode]] = {}
    roots = []
    for n in nodes:
        if n.origin != HUMAN and n.parent_template in ids and n.parent_template != n.template_id:
            children.setdefault(n.parent_template, []).append(n)  # type: ignore[arg-type]
        else:
            roots.append(n)

    def build(node: LineageNode, seen: frozenset[str]) -> LLMLineageNode:
        seen = seen | {node.template_id}
        kids = tuple(build(c, seen) for c in children.get(node.template_id, []) if c.template_id not in seen)
        return LLMLineageNode(template_id=node.template_id, origin=node.origin, depth=node.depth, model=node.model,
                              outcome=node.outcome, best_speedup=node.best_speedup, children=kids)

    return LLMBlockLineage(block=block, roots=tuple(build(r, frozenset()) for r in roots))


def collect_llm(job: "Job", store: "Store", blocks: Sequence[ReportedBlock] = ()) -> LLMSection | None:
    """The LLM section of ``job``'s report (None when the job made no LLM calls). ``blocks``: the
    report's blocks, whose Candidates tables give each template's best speedup in the lineage."""
    calls = store.llm_calls(job.name)
    if not calls:
        return None
    specs = job.llm.endpoints() if job.llm is not None else ()
    models = tuple(model_row(s, price_for(s, specs)) for s in store.llm_model_stats(job.name))
    finals: dict[int, "LLMCall"] = {c.seq: c for c in calls if c.final}
    speedups = template_speedups(blocks)
    rows, block_ids = [], []
    for t in store.templates(job=job.name):
        call = finals.get(t.call_seq) if t.call_seq is not None else None
        if t.block not in block_ids:
            block_ids.append(t.block)
        rows.append((t, call))
    lineages = []
    parents: dict[str, str | None] = {}
    order = [s.id for s in job.blocks]  # the job's blocks first, in its order; any other after them
    for block in sorted(block_ids, key=lambda b: order.index(b) if b in order else len(order)):
        nodes = lineage(store, job.name, block, speedups=speedups.get(block, {}))
        parents.update({n.template_id: n.parent_template for n in nodes})
        lineages.append(lineage_tree(block, nodes))
    templates = tuple(LLMTemplateRow(
        template_id=t.id, block=t.block, model=call.model if call else None, parent=t.parent,
        parent_template=parents.get(t.id), call_seq=t.call_seq, purpose=call.purpose if call else None,
        outcome=call.kind if call else None, message=redact(call.message) if call else None,
        prompt=shown(prompt_text(call.request) if call else ""), answer=shown(call.response if call else ""),
    ) for t, call in rows)
    costs = [m.cost_usd for m in models if m.cost_usd is not None]
    return LLMSection(models=models, templates=templates, lineages=tuple(lineages),
                      requests=sum(1 for c in calls if c.final),
                      replayed=sum(1 for c in calls if c.final and c.replayed_from is not None),
                      priced=bool(costs), cost_usd=sum(costs) if costs else None)


def outcomes_text(outcomes: Sequence[tuple[str, Any]]) -> str:
    """``(kind, count)`` pairs as "ok 2, no_code 1", or "-"."""
    return ", ".join(f"{kind} {count}" for kind, count in outcomes) or "-"


__all__ = ["COST_NOTE", "MAX_SHOWN_CHARS", "LLMBlockLineage", "LLMLineageNode", "LLMModelRow", "LLMSection",
           "LLMTemplateRow", "ShownText", "collect_llm", "lineage_tree", "outcomes_text", "price_for", "prompt_text",
           "shown"]
