"""``kernelforge search JOB --dry-run``: what a search would do, and what is already stored.

Everything shown comes from :func:`kernelforge.search.plan.plan_studies`, the same plan a search
runs (budgets, shares and study names are computed only there); nothing is evaluated, compiled or
written.
"""

from __future__ import annotations

from collections import Counter

from rich.markup import escape
from rich.table import Table

from kernelforge.cli.common import console
from kernelforge.errors import UserError
from kernelforge.job import Tune


def print_plan(job, catalog, *, device_name: str | None, compile_enabled: bool) -> None:
    """Print the plan of ``job`` (with the command line's overrides) and the stored results it
    would resume from, once the search's own checks (:func:`kernelforge.start.preflight`) found
    nothing it would refuse (a database that cannot be opened is named on the storage line)."""
    from kernelforge.redact import redact, redact_url
    from kernelforge.search.plan import already_spent, llm_reserve, plan_studies
    from kernelforge.search.warm import check_sources
    from kernelforge.start import preflight

    planned = plan_studies(job, catalog)
    preflight(job, catalog, device_name, endpoint=False)  # --llm URL may give the endpoint at run time
    store, why_not = open_existing(job.storage_url)
    check_sources(store, job.name, job.strategy.warm_start)

    line = lambda label, value: console.print(redact(f"  {label:<10}{value}"), markup=False, soft_wrap=True)  # noqa: E731
    console.print(f"[bold]{escape(job.name)}[/] ({escape(str(job.path))}): dry run, nothing is evaluated")
    if job.description:
        line("about", job.description)
    line("device", device_name or job.device)
    line("target", target_line(job, compile_enabled))
    line("dtype", job.dtype)
    line("tune", f"{job.tune} ({'one study per shape' if job.tune is Tune.PER_SHAPE else 'one study per block and template'})")
    cap = f", stops after {job.strategy.max_minutes:g} min" if job.strategy.max_minutes else ", no time cap"
    line("strategy", f"{job.strategy.name}, {job.strategy.evaluations} evaluations per shape group{cap}")
    if job.llm is not None:
        source = f"replay of {redact_url(job.llm.replay)}" if job.llm.replay else \
            f"{job.llm.model or '?'} at {redact_url(job.llm.base_url) if job.llm.base_url else '?'}"
        line("llm", f"{source}; {llm_reserve(job)} evaluations per shape group reserved for what it writes")
    line("storage", redact_url(job.storage_url) + (f"  ({why_not})" if why_not else ""))

    for spec in job.blocks:
        block = catalog.block(spec.id)
        shapes = block.shapes(spec.shapes)
        studies = [p for p in planned if p.block_id == spec.id]
        console.print()
        console.print(f"[bold]{escape(spec.id)}[/]: {len(shapes)} shape(s) of {escape(spec.shapes)}: "
                      + escape(", ".join(s.name for s in shapes)), soft_wrap=True)
        columns = ["template", "shape group", "budget", *(["llm reserve"] if job.llm else []), "already evaluated"]
        table = Table(title_justify="left")
        for column in columns:
            table.add_column(column, justify="left" if column in ("template", "shape group") else "right")
        for p in studies:
            spent = already_spent(store, job, catalog, p) if store else 0
            table.add_row(escape(p.template_id), escape(p.scope), str(p.budget),
                          *([str(p.reserve)] if job.llm else []), str(spent))
        console.print(table)
        groups = {p.scope: p.reserve for p in studies}
        total = sum(p.budget for p in studies) + sum(groups.values())
        console.print(f"  budget: {total} evaluations over {len(groups)} shape group(s)"
                      + (f", {sum(groups.values())} of them reserved for the LLM" if job.llm else ""))
        if store:
            console.print(f"  stored: {stored_line(store, job, spec.id, [s.name for s in shapes])}",
                          markup=False, soft_wrap=True)


def target_line(job, compile_enabled: bool) -> str:
    """The ahead-of-time compile target the search would use, and where it comes from."""
    if not compile_enabled:
        return "none (--no-compile)"
    if job.target:
        return job.target
    from kernelforge.targets import default_target

    return f"{default_target()} (default: the local GPU's, else sm_90)"


NOTHING_YET = "nothing stored yet"


def open_existing(url: str):
    """(the job's store, None) when its database can be read; (None, why not) otherwise: nothing
    stored yet, or a database that cannot be opened (said with any password redacted)."""
    from kernelforge.redact import redact, redact_url
    from kernelforge.store.store import Store

    from kernelforge.storage_url import sqlite_file

    path = sqlite_file(url)
    if path is not None and not path.exists():
        return None, NOTHING_YET  # not an error for a new job: the search creates it
    try:
        return Store(url, create=False), ""
    except UserError as exc:  # the store registered the URL's password: redact masks it
        return None, f"cannot be opened: {redact(str(exc).replace(url, redact_url(url)))}"


def stored_line(store, job, block_id: str, shapes: list[str]) -> str:
    """This job's stored results for one block, counted by status."""
    rows = [r for r in store.results(block=block_id, dtype=job.dtype) if r.job == job.name and r.shape in shapes]
    if not rows:
        return "no results of this job yet"
    statuses = Counter(r.status.value for r in rows)
    candidates = len({r.candidate_id for r in rows})
    by_status = ", ".join(f"{status} {count}" for status, count in statuses.most_common())
    return f"{len(rows)} results of {candidates} candidates ({by_status})"
