"""The few lines a search ends with: what it evaluated, the best speedup per block and whether the
confirmation pairs back it, the failures by status, and where the report is.

The numbers are the report's own (:func:`kernelforge.report.collect.collect`), so the summary and
REPORT.md never disagree; the full report stays in its file.
"""

from __future__ import annotations

from collections import Counter
from pathlib import Path

from kernelforge.cli.common import err_console


def print_summary(job, catalog, store, outcome, report_path: Path | None) -> None:
    """Print the end-of-search summary of ``job`` to stderr (stdout may carry JSON progress),
    redacted: the storage URL without its password, no registered secret in any line."""
    from kernelforge.redact import redact, redact_url
    from kernelforge.report.collect import collect

    report = collect(job, catalog, store)
    stored = sum(b.candidates for b in report.blocks)
    say = lambda text: err_console.print(redact(text), markup=False, soft_wrap=True)  # noqa: E731
    ran = ("already complete: nothing ran" if outcome.complete else
           f"{outcome.evaluations} evaluations this run, {outcome.duplicates} answered from the store"
           + (f", {outcome.from_peers} by other workers" if outcome.from_peers else "")
           + (f", {outcome.infeasible} rejected by the compile for the target's resources (no evaluation)"
              if outcome.infeasible else ""))
    say(f"{job.name}: {ran}; {stored} candidates of this job stored in {redact_url(job.storage_url)}")
    width = max((len(b.block) for b in report.blocks), default=0)
    failures: Counter = Counter()
    for block in report.blocks:
        say(f"  {block.block.ljust(width)}  {block_line(block)}")
        failures.update({status: n for status, n in block.statuses.items() if status != "ok"})
    if failures:
        say("  failed candidates: " + ", ".join(f"{status} {n}" for status, n in failures.most_common()))
    else:
        say("  failed candidates: none")
    if outcome.llm:
        llm = outcome.llm
        kinds = ", ".join(f"{k} {v}" for k, v in sorted(llm["kinds"].items())) or "none"
        say(f"  llm: {llm['requests']} requests ({llm['attempts']} attempts, {llm['tokens']} tokens); answers: {kinds}"
            + (f"; stopped: {llm['stopped']}" if llm["stopped"] else ""))
    if report_path is not None:
        say(f"report: {report_path} (and index.html beside it)")


def block_line(block) -> str:
    """One block's best speedup over its shapes' baselines and how far the confirmation backs it."""
    if not block.shapes or all(row.baseline_s is None for row in block.shapes):
        return "nothing measured yet"
    beaten = [row for row in block.shapes if not row.winner_is_baseline and row.speedup]
    if not beaten:
        return f"no candidate faster than the baseline ({block.candidates} candidates)"
    best = f"{block.geomean_speedup:.2f}x" if block.geomean_speedup else "?"
    confirmed = sum(row.confirmed for row in beaten)
    significant = sum(row.significant for row in beaten)
    shapes = f"{len(beaten)} of {len(block.shapes)} shapes" if len(beaten) < len(block.shapes) else \
        f"{len(block.shapes)} shapes"
    paired = sum(row.measured_by == "pairs" for row in block.shapes)
    if not confirmed:
        backing = "not confirmed (no interleaved re-timing)"
    elif significant == len(beaten):
        backing = f"confirmed on {confirmed} of {len(beaten)} (p20 of the pairs above 1 on all)"
    else:
        backing = f"confirmed on {confirmed} of {len(beaten)}, p20 above 1 on {significant}: within the noise elsewhere"
    # Per-shape baselines (Template.baseline_for): say so when the shapes' baselines have several sources.
    against = "the baseline" if len(block.baselines) <= 1 else f"each shape's baseline ({len(block.baselines)} sources)"
    timed = f"; times from the confirmation pairs on {paired} of {len(block.shapes)} shapes, the search's elsewhere" \
        if 0 < paired < len(block.shapes) else "; times from the confirmation pairs" if paired else ""
    return f"best {best} over {against} (geomean, {shapes}); {backing}{timed}"
