"""``kernelforge backup JOB [DEST]``: a consistent copy of a job's SQLite results database, safe
while a search of the job runs (:mod:`kernelforge.store.backup`)."""

from __future__ import annotations

import time

import click

from kernelforge.cli.common import err_console, load_job, storage_option


@click.command()
@click.argument("job_file", metavar="JOB")
@click.argument("destination", metavar="[DEST]", required=False)
@storage_option()
@click.pass_context
def backup(ctx: click.Context, job_file: str, destination: str | None, storage: str | None) -> None:
    """Copy the results database of JOB to DEST (a new file, or a folder; default: a time-stamped
    file beside the database), consistently even while a search of JOB writes it.

    The copy is a complete SQLite database (results, candidates, Optuna's studies): to restore it,
    put it at the job's database path, or pass --storage sqlite:///DEST.
    """
    from kernelforge.store.store import Store

    job, _catalog = load_job(ctx, job_file, storage)
    store = Store(job.storage_url, create=False)
    try:
        if destination is None:
            path = store.witness.path
            stamp = time.strftime("%Y%m%d-%H%M%S")
            destination = str(path.with_name(f"{path.stem}-backup-{stamp}{path.suffix}")) if path else "backup.db"
        target = store.backup(destination)
        counts = store.counts()
    finally:
        store.witness.close()
        store.engine.dispose()
    err_console.print(f"backed up {job.name}'s results database ({counts.results} results, {counts.candidates} "
                      f"candidates) to {target}", markup=False, soft_wrap=True)
