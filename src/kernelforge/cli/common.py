"""What the commands share: the consoles, the catalog, and parsing of PARAM=VALUE, --dtype and jobs.

Every helper raises :class:`kernelforge.errors.UserError` for a user's mistake; the group in
``kernelforge.cli.main`` turns it into one line and exit status 2.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import click
from rich.console import Console

from kernelforge.errors import UserError

# Logs and CI are not terminals: give tables room instead of rich's 80-column default.
#: The environment variable every command's ``--storage`` reads (and how a launcher hands its
#: workers the database): a database set once in the shell is the one the search writes and the
#: report, show, export, dashboard and backup read.
STORAGE_ENV = "KERNELFORGE_STORAGE"


def storage_option(text: str = "SQLAlchemy URL of the results database (default: the job's") -> Any:
    """The ``--storage`` option of a command (``text``: its help up to the closing parenthesis)."""
    return click.option("--storage", default=None, envvar=STORAGE_ENV, help=f"{text}; env {STORAGE_ENV}).")


_WIDTH = None if sys.stdout.isatty() else 160
console = Console(highlight=False, width=_WIDTH)
err_console = Console(stderr=True, highlight=False, width=_WIDTH)


def catalog_of(ctx: click.Context):
    """The catalog of the kernels folder chosen by ``--kernels`` (default: this checkout's)."""
    from kernelforge.catalog import Catalog

    return Catalog.discover(ctx.obj.get("kernels"))


def parse_params(pairs: tuple[str, ...]) -> dict[str, Any]:
    """``("BLOCK_M=64", ...)`` -> ``{"BLOCK_M": 64}``, values parsed as in a template's space."""
    from kernelforge.space import parse_value

    params: dict[str, Any] = {}
    for pair in pairs:
        name, sep, value = pair.partition("=")
        if not sep or not name:
            raise UserError(f"parameter {pair!r} must be written NAME=VALUE, e.g. BLOCK_M=64")
        if name.strip() in params:
            raise UserError(f"parameter {name.strip()} is given twice; give each parameter once")
        params[name.strip()] = parse_value(value.strip())
    return params


def dtype_of(name: str):
    """The torch dtype named ``name`` (one of kernelforge.block.DTYPES)."""
    from kernelforge.block import DTYPES
    from kernelforge.fields import dtype_name

    return DTYPES[dtype_name("--dtype", name)]  # the check a job's [job] dtype gets


def load_job(ctx: click.Context, job_file: str, storage: str | None, option: str = "--storage"):
    """(job, catalog) for ``job_file`` (a job file or a job name, see :func:`kernelforge.job.job_path`), with
    ``storage`` (the command's ``option``) overriding the job's storage URL (its password registered
    with the redactor)."""
    from dataclasses import replace

    from kernelforge.job import job_path, load_job as load
    from kernelforge.redact import register_url

    register_url(storage)
    check_storage_folder(storage, option)
    catalog = catalog_of(ctx)
    job = load(job_path(job_file), catalog)
    if storage:
        job = replace(job, storage=storage)
    return job, catalog


def check_storage_folder(storage: str | None, option: str = "--storage") -> None:
    """Refuse a ``--storage sqlite:///PATH`` (or the command's other ``option``) whose folder does not
    exist (a mistyped path must not create folders and run a whole search there). The job's default
    database folder is created."""
    from kernelforge.storage_url import sqlite_file

    path = sqlite_file(storage) if storage else None
    if path is None or path.parent.is_dir():
        return
    if path.parent.exists():
        raise UserError(f"{option} {storage}: {path.parent} is a file, not a folder; fix the path")
    raise UserError(f"{option} {storage}: folder {path.parent} does not exist; create it first or fix the path")


def check_holds(store, job, option: str) -> None:
    """Refuse a storage that holds other jobs' results and none of ``job``'s: a report of it would be
    empty and overwrite the job's real one (``option``: the command's option that named it)."""
    from kernelforge.redact import redact_url

    jobs = store.jobs()
    if jobs and job.name not in jobs:
        raise UserError(f"{option} {redact_url(store.url)}: holds no results of job {job.name}, only of "
                        f"{', '.join(jobs)}; give the database of job {job.name} (its default: leave {option} out)")


def yes(flag: bool | None) -> str:
    """A table cell for a yes/no/unknown flag."""
    return "-" if flag is None else ("yes" if flag else "no")
