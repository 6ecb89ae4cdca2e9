"""``kernelforge show CANDIDATE_ID [JOB]``: everything stored about one candidate.

A candidate id is the hash of its rendered source (see :mod:`kernelforge.candidate`), so any
unique prefix names it. The candidate is looked up in the job's database, or, without a job, in
every ``reports/*/kernelforge.db`` under the working directory.
"""

from __future__ import annotations

from datetime import datetime
from pathlib import Path

import click
from rich.markup import escape
from rich.table import Table

from kernelforge.cli.common import console, load_job, storage_option, yes
from kernelforge.errors import UserError
from kernelforge.redact import redact_url

#: Where searches write their databases by default (kernelforge.job.Job.storage_url).
REPORTS_GLOB = "reports/*/kernelforge.db"
#: Ids are 16 hex digits; shorter prefixes than this match too much to be worth a lookup.
MIN_PREFIX = 4


@click.command()
@click.argument("candidate_id")
@click.argument("job_file", metavar="[JOB]", required=False)
@storage_option(f"SQLAlchemy URL of the database to read (default: the job's, or every {REPORTS_GLOB} without a job")
@click.option("--no-source", is_flag=True, help="Leave out the rendered source.")
@click.pass_context
def show(ctx: click.Context, candidate_id: str, job_file: str | None, storage: str | None, no_source: bool) -> None:
    """Show a stored candidate: its template, parameters, origin and parent, compile resources,
    results per shape, and its rendered source.

    CANDIDATE_ID may be any unique prefix of the id (as printed by a search and in reports). JOB is a
    job file or a job name; without it every reports/*/kernelforge.db is searched.
    """
    from kernelforge.store.store import Store

    prefix = candidate_id.strip().lower()
    if len(prefix) < MIN_PREFIX:
        raise UserError(f"candidate id {candidate_id!r} is too short; give at least {MIN_PREFIX} characters of it")
    job = load_job(ctx, job_file, storage)[0] if job_file else None
    urls = [job.storage_url] if job else [storage] if storage else found_databases()
    matches: dict[str, list[tuple[str, object]]] = {}  # candidate id -> (url, store) holding it
    for url in urls:
        store = Store(url, create=False)
        for stored in store.candidates():
            if stored.id.startswith(prefix):
                matches.setdefault(stored.id, []).append((url, store))
    where = ", ".join(map(redact_url, urls)) if len(urls) <= 3 else f"{len(urls)} databases ({REPORTS_GLOB})"
    if not matches:
        hint = "pass the job that stored it (kernelforge show ID JOB) or --storage URL"
        raise UserError(f"no candidate {candidate_id!r} in {where}; {hint}")
    if len(matches) > 1:
        ids = sorted(matches)
        listed = ", ".join(ids[:5]) + (f" and {len(ids) - 5} more" if len(ids) > 5 else "")
        raise UserError(f"candidate id {candidate_id!r} is ambiguous: it starts {listed}; give more characters")
    (full_id, holders), = matches.items()
    url, store = holders[0]
    print_candidate(store, full_id, url, no_source)
    if len(holders) > 1:
        others = ", ".join(u for u, _ in holders[1:])
        console.print(f"(also stored in {others}; pass --storage URL to read one of them)", markup=False)


def found_databases() -> list[str]:
    """The storage URLs of every job database under ``reports/``."""
    paths = sorted(Path().glob(REPORTS_GLOB))
    if not paths:
        raise UserError(f"no job databases found ({REPORTS_GLOB} is empty here); pass the job "
                        "(kernelforge show ID JOB) or --storage URL")
    return [f"sqlite:///{p}" for p in paths]


def print_candidate(store, candidate_id: str, url: str, no_source: bool) -> None:
    """Print what ``store`` holds about one candidate."""
    from kernelforge.report.format import env_title
    from kernelforge.result import format_seconds

    stored = store.candidate(candidate_id)
    results = store.results(candidate_id=candidate_id)
    created = datetime.fromtimestamp(stored.created).strftime("%Y-%m-%d %H:%M:%S")
    console.print(f"[bold]candidate {stored.id}[/]  ({escape(redact_url(url))})")
    console.print(f"  block     {stored.block}", markup=False)
    console.print(f"  template  {stored.template}", markup=False)
    console.print(f"  origin    {stored.origin}", markup=False)
    console.print(f"  parent    {stored.parent or '-'}", markup=False)
    console.print(f"  job       {stored.job or '-'}  (stored {created})", markup=False)
    params = " ".join(f"{k}={v}" for k, v in stored.params.items())
    console.print(f"  params    {params or '-'}", markup=False)

    dtypes = sorted({r.dtype for r in results}) or ["bfloat16"]
    compiles = [c for dtype in dtypes for c in store.compiles([candidate_id], dtype)]
    if compiles:
        table = Table(title="compile", title_justify="left")
        for column in ("target", "dtype", "status", "kernel", "shared mem (B)", "registers", "spill st/ld (B)",
                       "warps", "stages", "wgmma", "TMA"):
            table.add_column(column)
        for c in compiles:
            for k in c.kernels or ({},):
                table.add_row(c.target, c.dtype, c.status, k.get("name", "-"), str(k.get("shared_bytes", "-")),
                              "-" if k.get("registers") is None else str(k["registers"]),
                              "-" if k.get("spill_stores") is None else f"{k['spill_stores']}/{k.get('spill_loads')}",
                              str(k.get("num_warps", "-")), str(k.get("num_stages", "-")),
                              yes(k.get("uses_wgmma")), yes(k.get("uses_tma")))
        console.print(table)
        for c in compiles:
            if c.status != "ok" and c.message:
                console.print(f"  {c.target}: {c.message}", markup=False)
    else:
        console.print("  no compile stored for this candidate (searches compile unless --no-compile)")

    if results:
        table = Table(title="results", title_justify="left")
        for column in ("shape", "dtype", "device", "status", "time (median)", "p20-p80", "rel. error", "error"):
            table.add_column(column, overflow="fold")
        for r in results:
            style = "green" if r.ok else "bold red"
            table.add_row(
                escape(r.shape), r.dtype, escape(r.device), f"[{style}]{r.status.value}[/]",
                format_seconds(r.median_s) if r.median_s is not None else "-",
                f"{format_seconds(r.p20_s)} - {format_seconds(r.p80_s)}" if r.p20_s is not None else "-",
                "-" if r.rel_error is None else f"{r.rel_error:.2e}",
                escape(r.message) if not r.ok else "",
            )
        console.print(table)
        for env in {r.env_key: r.env for r in results}.values():  # each number with its device and versions
            timing = f"; {env['timing']}" if env.get("timing") else ""
            console.print(f"  measured with {env_title(env)}{timing}", markup=False, soft_wrap=True)
    else:
        console.print("  no results stored for this candidate")
    if not no_source:
        console.print("[bold]source[/]")
        click.echo(stored.source, nl=not stored.source.endswith("\n"))  # raw: no markup, no wrapping

