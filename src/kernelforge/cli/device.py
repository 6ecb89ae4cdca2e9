"""Commands that measure the device itself: ``ceilings`` (copy bandwidth and bf16 matmul rate) and
``crosscheck`` (every baseline of some jobs timed three ways). The GPU proof runs both first
(scripts/gpu_check.py; docs/gpu.md)."""

from __future__ import annotations

import json
from pathlib import Path

import click

from kernelforge.cli.common import dtype_of, err_console, load_job
from kernelforge.errors import UserError


@click.command()
@click.option("--device", "device_name", default="cuda", show_default=True, help="cuda or cuda:N.")
@click.option("--json", "json_path", type=click.Path(dir_okay=False), default=None,
              help="Write the measured ceilings here (KERNELFORGE_CEILINGS=FILE makes reports use them).")
def ceilings(device_name: str, json_path: str | None) -> None:
    """Measure this GPU's copy bandwidth and bf16 matmul rate (the practical roofline)."""
    from kernelforge.devices.measure import measure_ceilings

    if device_name != "cuda" and not device_name.startswith("cuda:"):
        raise UserError(f"--device {device_name}: ceilings are measured on a GPU (cuda or cuda:N); the "
                        "interpreter's times are no hardware's")
    measured = measure_ceilings(int(device_name.split(":", 1)[1]) if ":" in device_name else 0)
    click.echo(f"{measured.device_name}: copy {measured.bandwidth / 1e12:.2f} TB/s, bf16 matmul "
               f"{measured.flops / 1e12:.0f} TFLOP/s ({measured.method})")
    if json_path:
        measured.write(Path(json_path))
        err_console.print(f"wrote {json_path}", markup=False)


@click.command()
@click.argument("job_files", nargs=-1, required=True, metavar="JOB...")
@click.option("--device", "device_name", default=None, help="cuda or interpret (default: each job's device).")
@click.option("--json", "json_path", type=click.Path(dir_okay=False), default=None,
              help="Write every row, its ratios and flags, with the device, to this JSON file.")
@click.pass_context
def crosscheck(ctx: click.Context, job_files: tuple[str, ...], device_name: str | None, json_path: str | None) -> None:
    """Time the human baseline of every block and shape of JOB(s) three ways: kernelforge's method,
    triton.testing.do_bench and do_bench_cudagraph (medians); flag ratios far from 1."""
    from kernelforge.devices.registry import get_device
    from kernelforge.execute.timing.crosscheck import AGREEMENT, cross_check

    loaded = [load_job(ctx, path, None) for path in job_files]
    names = {device_name or job.device for job, _ in loaded}
    if len(names) != 1:
        raise UserError(f"the jobs name different devices ({', '.join(sorted(names))}): pass --device")
    device = get_device(names.pop())
    rows = []
    for job, catalog in loaded:
        rows += cross_check(catalog, [(spec.id, spec.shapes) for spec in job.blocks], dtype_of(job.dtype), device)
    label = "GPU time" if device.measures_hardware else "interpreter wall time on the CPU, not GPU speed"
    click.echo(f"{'block':28} {'shape':30} {'kernelforge':>12} {'method':12} {'way 2':>10} {'graph':>10} "
                  f"{'ratio 2':>8} {'graph/kf':>8}  ({label})")
    for row in rows:
        r = row.ratios
        click.echo(f"{row.block:28} {row.shape[:30]:30} {_us(row.kernelforge_s):>12} {row.kernelforge_method[:12]:12} "
                      f"{_us(row.do_bench_s):>10} {_us(row.cudagraph_s):>10} {_ratio(r['do_bench']):>8} "
                      f"{_ratio(r['cudagraph']):>8}{'  FLAGGED' if row.flagged else ''}"
                      f"{'  ' + row.note if row.note else ''}")
    flagged = sum(row.flagged for row in rows)
    err_console.print(f"{len(rows)} baselines, {flagged} flagged (a ratio outside {AGREEMENT[0]}-{AGREEMENT[1]}, "
                      "or no timing)", markup=False)
    if json_path:
        Path(json_path).write_text(json.dumps({"device": device.describe(), "agreement": AGREEMENT,
                                               "rows": [row.to_json() for row in rows]}, indent=2) + "\n",
                                   encoding="utf-8")
        err_console.print(f"wrote {json_path}", markup=False)


def _us(seconds: float | None) -> str:
    return f"{seconds * 1e6:.1f} us" if seconds else "-"


def _ratio(value: float | None) -> str:
    return f"{value:.2f}" if value else "-"
