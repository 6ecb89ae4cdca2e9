"""``kernelforge dashboard``: refresh the Optuna mirror of a job's stored evaluations
(:mod:`kernelforge.report.export.dashboard`) and open it in optuna-dashboard; ``report`` refreshes it too
(:func:`refresh_mirror`)."""

from __future__ import annotations

import importlib.util

import click

from kernelforge.cli.common import console, err_console, load_job, storage_option
from kernelforge.errors import UserError

#: How to install optuna-dashboard, as every message about it says.
INSTALL = "pip install 'kernelforge[dashboard]' (or pip install optuna-dashboard)"


def refresh_mirror(job, catalog, store, *, optional: bool = False) -> list:
    """Mirror ``job``'s stored evaluations into its Optuna studies and say so on stderr; returns
    the mirrored studies. ``optional`` (``report``): without Optuna nothing is said, and a mirror
    that fails is a note, not an error (the report does not depend on it)."""
    from kernelforge.report.export.dashboard import available, dashboard_command, mirror_studies

    if not available() and optional:
        return []
    try:
        studies = mirror_studies(job, catalog, store)
    except UserError as exc:
        if not optional:
            raise
        err_console.print(f"note: the dashboard studies were not refreshed: {exc}", markup=False)
        return []
    for study in studies:
        if study.skipped:
            err_console.print(f"note: left study {study.name} alone: {study.skipped}", markup=False)
    written = [s for s in studies if not s.skipped]
    added = sum(s.added for s in written)
    command = dashboard_command(job)
    err_console.print(f"dashboard: {len(written)} Optuna {'study' if len(written) == 1 else 'studies'}, {added} new "
                      f"{'trial' if added == 1 else 'trials'}"
                      + (f"; open them with: {command}" if command else ""), markup=False)
    return studies


@click.command()
@click.argument("job_file", metavar="JOB")
@storage_option()
@click.option("--host", default="127.0.0.1", show_default=True, help="Address optuna-dashboard listens on.")
@click.option("--port", default=8080, show_default=True, type=click.IntRange(0, 65535),
              help="Port optuna-dashboard listens on.")
@click.option("--no-serve", is_flag=True, help="Only refresh the studies and print the command that opens them.")
@click.pass_context
def dashboard(ctx: click.Context, job_file: str, storage: str | None, host: str, port: int, no_serve: bool) -> None:
    """Mirror the stored evaluations of JOB into Optuna studies in its database and open them in
    optuna-dashboard (each trial: candidate id, template, origin, status, per-shape times).

    JOB is a job file, or the name of a job under search/ (``demo`` is search/demo.toml).
    """
    from kernelforge.report.export.dashboard import available, dashboard_command
    from kernelforge.store.store import Store

    job, catalog = load_job(ctx, job_file, storage)
    if not available():
        raise UserError("kernelforge dashboard needs the Python package 'optuna', which is not installed; "
                        f"pip install optuna, and for the viewer {INSTALL}")
    store = Store(job.storage_url, create=False)
    refresh_mirror(job, catalog, store)
    command = dashboard_command(job)
    if command is None:
        raise UserError(f"--storage {job.storage_url}: an in-memory database cannot be opened by another process; "
                        "use a SQLite file or a database server")
    if no_serve:
        click.echo(command)
        return
    if importlib.util.find_spec("optuna_dashboard") is None:
        raise UserError(f"optuna-dashboard is not installed; {INSTALL}, then run: {command}")
    import optuna
    import optuna_dashboard

    console.print(f"optuna-dashboard on http://{host}:{port}/ (Ctrl-C stops it)", markup=False)
    try:
        optuna_dashboard.run_server(optuna.storages.RDBStorage(store.url), host=host, port=port)
    except KeyboardInterrupt:
        err_console.print("dashboard stopped", markup=False)
    except OSError as exc:
        raise UserError(f"optuna-dashboard cannot listen on {host}:{port} ({exc.strerror}); "
                        "choose another --port") from None
