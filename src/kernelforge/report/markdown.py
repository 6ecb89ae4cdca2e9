"""REPORT.md and results.json of a collected :class:`~kernelforge.report.records.Report`.

REPORT.md: per block the speedup table, candidates, winner diffs, roofline and compile resources;
then the model-level projection and the environments the numbers came from. Interpreter and
replayed timings are labelled as such, and never placed against a GPU ceiling.
"""

from __future__ import annotations

import json
from typing import Sequence

from kernelforge.environment import Timings, timings_of
from kernelforge.report.format import (baseline_ref, baseline_spread_text, baselines_text, fmt_delta, fmt_joules,
                                       fmt_speedup, fmt_time, inert_text, measured_text, params_text, roofline_cells,
                                       same_work_as, search_text, speedup_text)
from kernelforge.report.llm_markdown import llm_markdown
from kernelforge.report.moe_table import moe_markdown
from kernelforge.report.pareto import front_markdown
from kernelforge.report.projection.of_report import NOTHING_PROJECTED
from kernelforge.report.records import BlockReport, Confirmation, PhaseRow, ProjectionReport, Report, ShapeRow

def results_json(report: Report) -> str:
    """results.json: every record of the report as plain data."""
    return json.dumps(report.to_json(), indent=1, default=str) + "\n"


def to_markdown(report: Report) -> str:
    """REPORT.md: per block the speedup table, candidates, winner diff, roofline and compile
    resources; then the model-level projection and the environments the numbers came from."""
    lines = [f"# kernelforge report: {report.job}", ""]
    lines.append(f"Job `{report.job_file}`, dtype {report.dtype}, tuning {report.tune}, strategy {report.strategy}, "
                 f"objective {report.objective}. "
                 "Every number below is read from the job's results database; speedup = baseline time / winner "
                 "time, with its p20-p80 spread (from interleaved re-timing pairs where marked confirmed).")
    lines.append("")
    if report.dashboard:  # every evaluation as a trial of the job's Optuna studies
        lines.extend([f"Optuna dashboard of every evaluation: `{report.dashboard}` (`kernelforge dashboard {report.job}` refreshes and opens it).", ""])
    for env in report.environments.values():
        if timings_of(env) is not Timings.GPU:  # interpreter or replayed timings: a banner everywhere
            lines.append(f"> **{env.get('timing', env.get('device'))}** ({env.get('device_name')}): "
                         "these timings are not GPU measurements of speed.")
            lines.append("")
    for block in report.blocks:
        lines.extend(_block_markdown(block))
    lines.extend(llm_markdown(report.llm))
    lines.extend(_projection_markdown(report.projection))
    lines.append("## Environment")
    lines.append("")
    for key, env in report.environments.items():
        lines.append(f"- `{key}`: " + ", ".join(f"{k} {v}" for k, v in sorted(env.items())))
    lines.append("")
    return "\n".join(lines)


def _block_markdown(block: BlockReport) -> list[str]:
    lines = [f"## {block.block}", ""]
    if block.description:
        lines.append(block.description)
        lines.append("")
    geo = block.geomean_speedup
    lines.append(f"Geometric-mean speedup: **{geo:.3f}x** over {len(block.shapes)} shape(s); "
                 f"{block.candidates} candidates evaluated; by status: "
                 + ", ".join(f"{k} {v}" for k, v in sorted(block.statuses.items()))
                 + "; by origin: " + ", ".join(f"{k} {v}" for k, v in sorted(block.origins.items())) + "."
                 if geo else "No timed results.")
    lines.append("")
    if block.baselines:
        lines.append(baselines_text(block) + " Each shape's speedup is over its own baseline.")
        lines.append("")
    lines.append("Each row's baseline, best and speedup come from one measurement (`measured by`): the "
                 "confirmation's interleaved pairs (their medians; speedup = baseline / best, spread = p20-p80 of "
                 "the per-pair speedups) or the search's single timings. The search's timings of a row measured "
                 "by pairs are in the last column.")
    lines.append("")
    lines.append("| shape | baseline | best | speedup (p20-p80) | measured by | confirmed | winner | parameters "
                 "| search: baseline -> best (speedup) |")
    lines.append("|---|---|---|---|---|---|---|---|---|")
    for row in block.shapes:
        winner = "baseline" if row.winner_is_baseline else f"`{row.winner}` ({row.template})"
        confirmed = _confirmation_cell(row)
        base = " ".join(filter(None, (fmt_time(row.baseline_s), baseline_ref(block, row))))
        lines.append(
            f"| {row.shape} | {base} | {fmt_time(row.best_s)} | {speedup_text(row)} | {measured_text(row)} | "
            f"{confirmed} | {winner} | {params_text(row.params)} | {search_text(row)} |"
        )
    lines.extend(_library_markdown(block))  # issue 11: the library reference line
    lines.extend(moe_markdown(block))  # default versus tuned per token count
    lines.extend(front_markdown(block.pareto))  # the time-energy Pareto front
    if inert_text(block):
        lines.extend(["", inert_text(block)])
    labels = sorted({r.timing_label for r in block.shapes if r.timing_label})
    if labels:
        lines.append("")
        lines.append("Timing: " + "; ".join(labels) + ".")
    lines.append("")
    lines.extend(_baselines_markdown(block))
    if block.candidate_rows:
        lines.append(f"### Candidates of {block.block}")
        lines.append("")
        lines.append("| # | id | template | origin | parent | status | geomean speedup | parameters |")
        lines.append("|---|---|---|---|---|---|---|---|")
        for c in block.candidate_rows:
            lines.append(f"| {c.order} | `{c.id}` | {c.template} | {c.origin} | "
                         f"{('`' + c.parent + '`') if c.parent else '-'} | {c.status} | "
                         f"{fmt_speedup(c.geomean_speedup)} | {params_text(c.params)}"
                         + (" (same interpreter work as the baseline)" if same_work_as(block, c.params) else "") + " |")
        lines.append("")
    for w in block.winners:
        lines.append(f"### Winner `{w.id}` against the baseline source")
        lines.append("")
        against = f" (diff against `{w.against}`, the baseline of {w.shapes[0]})" if w.against else ""
        lines.append(f"Template {w.template}, origin {w.origin}, parent "
                     f"{('`' + w.parent + '`') if w.parent else '-'}; chosen for {', '.join(w.shapes)}{against}.")
        lines.append("")
        lines.append("```diff")
        lines.append(w.diff.rstrip("\n") or "(identical sources)")
        lines.append("```")
        lines.append("")
    if not block.winners and block.candidate_rows:
        lines.append("No candidate beat the baseline: the baseline stays the winner (no diff).")
        lines.append("")
    lines.extend(_roofline_markdown(block))
    for s in block.suspects:
        lines.append(f"**Faster than physically possible — suspect:** candidate `{s.candidate}` on {s.shape}: "
                     f"{fmt_time(s.median_s)} measured, the datasheet roofline allows no less than "
                     f"{fmt_time(s.roofline_s)}.")
        lines.append("")
    if block.compiles:
        lines.append(f"### Compile resources of {block.block}")
        lines.append("")
        lines.append("| role | candidate | target | status | kernel | registers | spills st/ld (B) | shared mem (B) | warps | stages |")
        lines.append("|---|---|---|---|---|---|---|---|---|---|")
        for c in block.compiles:
            for k in c.kernels or ({},):
                lines.append(f"| {c.role} | `{c.candidate_id}` | {c.target} | {c.status} | "
                             f"{k.get('name', '-')} | {k.get('registers', '-')} | "
                             f"{k.get('spill_stores', '-')}/{k.get('spill_loads', '-')} | {k.get('shared_bytes', '-')} | "
                             f"{k.get('num_warps', '-')} | {k.get('num_stages', '-')} |")
        lines.append("")
    return lines


def _confirmation_cell(row: ShapeRow) -> str:
    """The confirmation state in words, bold when confirmed faster ("**confirmed faster** (20 pairs)")."""
    state = row.confirmation
    text = f"**{state.value}**" if state is Confirmation.FASTER else f"_{state.value}_" \
        if state is Confirmation.PENDING else state.value
    if row.confirmed and not row.significant and row.speedup_p80 is not None and row.speedup_p80 < 1.0:
        text += ", slower on this shape"
    return text + (f" ({row.pairs} pairs)" if row.confirmed else "")


def _library_markdown(block: BlockReport) -> list[str]:
    """Issue 11: the library reference (kernelforge.search.library) beside the baseline and the
    best candidate of each shape: speedup = library time / their time. Issue 31: above it, what
    serving runs for these shapes and whether its library line could run on the GPU image (named,
    with the reason, where it could not), measured or not."""
    lines = ["", f"What serving runs for these shapes (`kernelforge shipped {block.block}`):", ""] if block.shipped else []
    lines.extend(f"- `{p.presets}`: {p.summary}" for p in block.shipped)
    if not block.library:
        return lines
    rows = {r.shape: r for r in block.shapes}
    lines += ["", "| shape | library reference | library time | search's baseline vs library | search's best vs library |",
              "|---|---|---|---|---|"]
    for lib in block.library:
        row = rows.get(lib.shape)
        # The search's timings: the library reference was timed beside them, not beside the pairs.
        base, best = (row.search_baseline_s, row.search_best_s) if row else (None, None)
        lines.append(f"| {lib.shape} | {lib.implementation} | {fmt_time(lib.median_s)} | "
                     f"{fmt_speedup(lib.speedup_of(base))} | {fmt_speedup(lib.speedup_of(best))} |")
    return lines


def _baselines_markdown(block: BlockReport) -> list[str]:
    """Each shape's baseline: the candidate, its point and where the point comes from."""
    if not block.baselines:
        return []
    lines = [f"### Baselines of {block.block}", "",
             "Timings: every stored timing of the shape's baseline (the search's first, its re-timings beside the "
             "candidates, and the baseline half of each confirmation pair), fastest to slowest and their ratio: how far the baseline itself drifted.", "",
             "| shape | baseline | point | source | timings | a speedup here is |", "|---|---|---|---|---|---|"]
    for row in block.shapes:
        lines.append(f"| {row.shape} | `{row.baseline}` | {params_text(row.baseline_params)} | "
                     f"{' '.join(filter(None, (baseline_ref(block, row), row.baseline_source)))} | "
                     f"{baseline_spread_text(row)} | {row.claim} |")
    lines.append("")
    return lines


def _roofline_markdown(block: BlockReport) -> list[str]:
    if not any(r.roofline.baseline or r.roofline.winner for r in block.shapes):
        return []
    has = block.roofline is not None and block.roofline.ceilings is not None
    lines = [f"### Roofline of {block.block}", "", block.roofline.note if block.roofline else "", ""]
    lines.append("| shape | FLOP/byte | bound | baseline FLOP/s | baseline B/s | baseline % roof | "
                 "winner FLOP/s | winner B/s | winner % roof |")
    lines.append("|---|---|---|---|---|---|---|---|---|")
    for r in block.shapes:
        b, w = r.roofline.baseline, r.roofline.winner
        point = b or w
        intensity = point.intensity if point else None
        bound = point.bound if has and point else None
        lines.append(f"| {r.shape} | {intensity:.3g} | {bound or 'n/a'} | "
                     + " | ".join(roofline_cells(b, has)) + " | " + " | ".join(roofline_cells(w, has)) + " |"
                     if intensity is not None else f"| {r.shape} | - | - | - | - | - | - | - | - |")
    lines.append("")
    return lines


def _by_model(phases: Sequence[PhaseRow]) -> dict[str, list[PhaseRow]]:
    """Phases grouped by model, in the order the models first appear."""
    out: dict[str, list[PhaseRow]] = {}
    for ph in phases:
        out.setdefault(ph.model, []).append(ph)
    return out


def _model_table(model: str, phases: Sequence[PhaseRow]) -> list[str]:
    """One model's table of a profile: every complete component, each complete phase's total, the notes."""
    lines = [f"#### {model}", "",
             "| phase | batch | baseline blocks | winner blocks | change | speedup | J/token baseline | J/token winner | calls |",
             "|---|---|---|---|---|---|---|---|---|"]
    for ph in phases:
        for c in ph.components:
            if not c.complete:
                continue
            lines.append(f"| {ph.kind} {c.label} | {ph.batch or '-'} | {fmt_time(c.baseline_s)} | {fmt_time(c.winner_s)} | "
                         f"{fmt_delta(c.change_s)} | {fmt_speedup(c.baseline_s / c.winner_s if c.winner_s else None)} | "
                         f"{fmt_joules(c.baseline_j_per_token)} | {fmt_joules(c.winner_j_per_token)} | {c.calls} |")
        if ph.complete:
            extra = ", dense parts estimated" if any(c.estimate for c in ph.components) else ""
            lines.append(f"| **{ph.kind} total (these blocks{extra})** | {ph.batch or '-'} | {fmt_time(ph.baseline_s)} | "
                         f"{fmt_time(ph.winner_s)} | {fmt_delta(ph.change_s)} | {fmt_speedup(ph.speedup)} | "
                         f"{fmt_joules(ph.baseline_j_per_token)} | {fmt_joules(ph.winner_j_per_token)} | "
                         f"all parts measured |")
    lines.append("")
    notes = sorted({c.note for ph in phases for c in ph.components if c.note and c.complete})
    lines.extend(line for n in notes for line in (f"Note: {n}.", ""))
    return lines


def _projection_markdown(projection: ProjectionReport | None) -> list[str]:
    if not projection:
        return []
    lines = ["## Model-level projection (TTFT / TBT)", ""]
    lines.append("What the measured per-call times of the attention and MoE blocks mean for each whole model. TTFT: "
                 "prefill attention on every layer plus the MoE experts over the prefill tokens; TBT: one decode step "
                 "at batch B at the profile's full context. Only these blocks' contribution changes; not measured and "
                 "not included: " + ", ".join(projection.not_measured) + ".")
    lines.append("")
    lines.extend(f"- **{name}**: {summary}" for name, summary in projection.models.items())
    lines.append("")
    if projection.devices:
        lines.append("Per-call times from: " + "; ".join(f"{b} on {d}" for b, d in projection.devices.items())
                     + " (versions under Environment).")
        lines.append("")
    if not projection.measured_any:
        missing = sum(len(p.missing) for p in projection.profiles)
        lines.extend([f"<details><summary>Nothing projected: {missing} shapes missing</summary>", "",
                      NOTHING_PROJECTED, ""])
    for p in projection.profiles:
        lines.append(f"### {p.profile} ({p.input_tokens} in / {p.output_tokens} out)")
        lines.append("")
        measured = _by_model(p.phases)
        for model in projection.models:
            if model in measured:
                lines.extend(_model_table(model, measured[model]))
            else:
                lines.extend([f"#### {model}", "", f"Nothing of {model} was measured for this profile "
                              "(the shapes it needs are listed below).", ""])
        if p.infeasible:
            lines.append("Does not fit the GPU's memory (not projected):")
            lines.append("")
            lines.extend(f"- {f.message}" for f in p.infeasible)
            lines.append("")
        if p.missing_groups:
            lines.append(f"<details><summary>Missing shapes: {len(p.missing)} (no projection is made from them)"
                         "</summary>")
            lines.append("")
            for g in p.missing_groups:
                lines.append(f"- {g.block}, {g.why}: " + ", ".join(f"`{s}`" for s in g.shapes))
            lines.append("")
            lines.append("</details>")
            lines.append("")
    if not projection.measured_any:
        lines.extend(["</details>", ""])
    return lines
