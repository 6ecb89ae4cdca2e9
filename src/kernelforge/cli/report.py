"""Commands that read a job's stored results: ``report`` and ``export``."""

from __future__ import annotations

from pathlib import Path

import click

from kernelforge.cli.common import check_holds, console, err_console, load_job, storage_option
from kernelforge.cli.dashboard import refresh_mirror
from kernelforge.errors import UserError


@click.command()
@click.argument("job_file", metavar="JOB")
@storage_option()
@click.option("--compare", "compare_file", metavar="JOB", default=None,
              help="A second job, file or name (e.g. the same job on another GPU or Triton version): print both side by "
                   "side and write reports/compare-<a>-vs-<b>.html.")
@click.option("--compare-storage", default=None, help="SQLAlchemy URL of the --compare job's database (default: its own).")
@click.pass_context
def report(ctx: click.Context, job_file: str, storage: str | None, compare_file: str | None,
           compare_storage: str | None) -> None:
    """Write reports/<job>/REPORT.md, results.json and index.html from the stored results of JOB.

    JOB is a job file, or the name of a job under search/ (``demo`` is search/demo.toml).
    """
    from kernelforge.report.collect import collect
    from kernelforge.report.write import write_compare, write_report
    from kernelforge.store.store import Store

    job, catalog = load_job(ctx, job_file, storage)
    other = load_job(ctx, compare_file, compare_storage, "--compare-storage")[0] if compare_file else None
    if other is not None and (other.name, other.storage_url) == (job.name, job.storage_url):
        raise UserError(f"--compare {compare_file}: that is job {job.name} in the same storage; "
                        "compare two different jobs (or the same job in another --compare-storage)")
    if other is not None and not {b.id for b in job.blocks} & {b.id for b in other.blocks}:
        raise UserError(f"--compare {compare_file}: jobs {job.name} ({', '.join(b.id for b in job.blocks)}) and "
                        f"{other.name} ({', '.join(b.id for b in other.blocks)}) share no block; compare jobs of the "
                        "same blocks (on two GPUs, or two Triton versions)")
    store = Store(job.storage_url, create=False)
    check_holds(store, job, "--storage")
    if other is not None:
        other_store = Store(other.storage_url, create=False)
        check_holds(other_store, other, "--compare-storage")
        text, html = write_compare(collect(job, catalog, store), collect(other, catalog, other_store))
        click.echo(text)  # raw Markdown: no wrapping or markup interpretation
        err_console.print(f"wrote {html}")
        return
    refresh_mirror(job, catalog, store, optional=True)  # the job's Optuna studies (kernelforge dashboard)
    path = write_report(job, catalog, store)
    click.echo(path.read_text(encoding="utf-8"))  # raw Markdown: no wrapping or markup interpretation
    err_console.print(f"wrote {path}, {path.with_name('results.json')} and {path.with_name('index.html')}")


@click.command()
@click.argument("job_file", metavar="JOB")
@click.option("--format", "fmt", type=click.Choice(["vllm", "triton", "source"]), required=True,
              help="vllm: fused_moe config JSON per (E, N); triton: per block, the winners' modules and a "
                   "dispatcher by token count; source: the winning rendered sources.")
@click.option("--out", "out_dir", type=click.Path(file_okay=False), default=None,
              help="Output folder (default: reports/<job>/export/).")
@storage_option()
@click.option("--layout", type=click.Choice(["vllm", "sglang"]), default="vllm", show_default=True,
              help="--format vllm: whose loader the config files are named and placed for.")
@click.option("--split-down", is_flag=True, default=False,
              help="--format vllm --layout sglang: also write each winner's GEMM2 configuration as <name>_down.json.")
@click.pass_context
def export(ctx: click.Context, job_file: str, fmt: str, out_dir: str | None, storage: str | None, layout: str,
           split_down: bool) -> None:
    """Export the winners of JOB for vLLM, as a Triton module, or as sources.

    JOB is a job file, or the name of a job under search/ (``demo`` is search/demo.toml).
    """
    from kernelforge.report.export.formats import export as run_export
    from kernelforge.store.store import Store

    job, catalog = load_job(ctx, job_file, storage)
    store = Store(job.storage_url, create=False)
    written, notes = run_export(job, catalog, store, fmt, Path(out_dir) if out_dir else None, layout, split_down)
    for path in written:
        console.print(f"wrote {path}", markup=False)
    for note in notes:
        err_console.print(f"note: {note}", markup=False)
