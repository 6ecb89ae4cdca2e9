"""``kernelforge tune FILE.py::KERNEL``: search an existing @triton.autotune'd kernel's configs with
kernelforge's verification, timing, store and report (the fastest way in; docs/tune.md)."""

from __future__ import annotations

from pathlib import Path

import click

from kernelforge.cli.common import dtype_of
from kernelforge.cli.search import search


@click.command()
@click.argument("target", metavar="FILE.py::KERNEL")
@click.option("--device", "device", type=click.Choice(["interpret", "cuda"]), default=None,
              help="Where to verify and time (default: cuda when a GPU is visible, else the interpreter).")
@click.option("--dtype", default="float16", show_default=True, help="The dtype of the inputs and output.")
@click.option("--evaluations", type=click.IntRange(min=1), default=None,
              help="Configs to measure (default: every declared config).")
@click.pass_context
def tune(ctx: click.Context, target: str, device: str | None, dtype: str, evaluations: int | None) -> None:
    """Tune KERNEL of FILE.py over its @triton.autotune configs: each verified against FILE.py's
    reference, timed, stored, the winner confirmed and reported, as `kernelforge search` does.

    FILE.py holds the kernel, run (its host wrapper), reference, make_inputs, make_output and SHAPES
    (docs/tune.md). Everything goes to reports/tune-KERNEL/ (the generated block and job, the
    database, the report), like any job's folder. Rerunning continues the stored search.
    """
    from kernelforge.tune import prepare, split_target

    dtype_of(dtype)  # an unknown dtype: one line, before anything is written
    _, kernel = split_target(target)
    if device is None:
        import torch

        device = "cuda" if torch.cuda.is_available() else "interpret"
    folder = Path("reports") / f"tune-{kernel}"  # the job's own report folder (Job.report_dir)
    prepared = prepare(target, folder, device, dtype, evaluations)
    if prepared.kept_apart is not None:
        click.echo(f"note: the stored results in {folder} were judged by another reference, inputs, output or "
                   f"shapes than {target.rpartition('::')[0]}'s: they are kept in {prepared.kept_apart}, and every "
                   "config is measured afresh", err=True)
    ctx.obj["kernels"] = str(prepared.kernels)
    ctx.invoke(search, job_file=str(prepared.job))
