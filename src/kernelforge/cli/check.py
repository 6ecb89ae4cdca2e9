"""Commands that try one candidate: ``check`` (verify and time on a device) and ``compile``
(ahead of time for a GPU target, no GPU needed)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import click
from rich.markup import escape
from rich.table import Table

from kernelforge.cli.common import catalog_of, console, dtype_of, err_console, parse_params, yes
from kernelforge.errors import UserError

#: Above this many FLOPs per call a shape is refused on the interpreter (it manages roughly
#: 1e8-1e9 FLOP/s, so this is already minutes).
INTERPRETER_FLOP_LIMIT = 5e10


#: What ``check --trusted`` says, so nobody mistakes its verdicts for the search's.
TRUSTED_WARNING = ("--trusted: candidate code ran in this process without the sandbox; verdicts are not "
                   "trustworthy against hostile code")


@click.command()
@click.argument("names", nargs=-1)
@click.option("--device", "device_name", default=None, help="cuda or interpret (default: cuda when a GPU is visible).")
@click.option("--shapes", "shape_set", default="smoke", show_default=True, help="Shape set or shape name.")
@click.option("--dtype", "dtype_name", default="bfloat16", show_default=True)
@click.option("--no-time", is_flag=True, help="Do not show timings (the judge still times: its re-check after "
                                               "timing is part of the verdict).")
@click.option("--json", "json_path", type=click.Path(dir_okay=False), default=None,
              help="Also write every result, with the device and versions, to this JSON file.")
@click.option("--verbose", "-v", is_flag=True, help="Print the full traceback of a candidate that raised.")
@click.option("--trusted", is_flag=True, help="Run candidates in this process, without the sandboxed worker "
                                               "(debugging trusted code only).")
@click.pass_context
def check(ctx: click.Context, names: tuple[str, ...], device_name: str | None, shape_set: str, dtype_name: str,
          no_time: bool, json_path: str | None, verbose: bool = False, trusted: bool = False) -> None:
    """Verify and time blocks' baselines or templates on a shape set, judged exactly as a search
    judges them: the static policy, the sandboxed worker, the same time limits
    (``KERNELFORGE_COMPILE_TIMEOUT``, ``KERNELFORGE_RUN_TIMEOUT``) and the same verdicts.

    NAMES are block ids (meaning their baseline template) or template ids; none means every block.
    Each shape is checked at its own baseline point (a template's per-shape [[baselines]] rules);
    PARAM=VALUE arguments override it.
    """
    from kernelforge.candidate import Candidate
    from kernelforge.devices.registry import default_device_name
    from kernelforge.execute.executor import make_executor

    point_args = tuple(n for n in names if "=" in n)
    names = tuple(n for n in names if "=" not in n)
    catalog = catalog_of(ctx)
    dtype = dtype_of(dtype_name)
    device_name = device_name or default_device_name()
    if device_name.startswith("replay:"):
        raise UserError("--device replay:PATH answers from a recorded search; check runs candidates: "
                        "use --device cuda or interpret")
    executor = make_executor(device_name, in_process=trusted)
    targets = [catalog.resolve(name) for name in names] or [catalog.baseline(b) for b in catalog.blocks]
    overrides = parse_params(point_args)
    plans = []
    for template in targets:
        block = catalog.block(template.block_id)
        shapes = block.shapes(shape_set)
        if executor.kind == "interpret":
            heavy = [s for s in shapes if block.counts(s, dtype).flops > INTERPRETER_FLOP_LIMIT]
            if heavy:
                raise UserError(
                    f"--shapes {shape_set}: {heavy[0].name} of {block.id} needs "
                    f"{block.counts(heavy[0], dtype).flops:.2g} FLOP per call, far too much for the "
                    "interpreter; use --device cuda, or --shapes smoke / check on a CPU"
                )
        # Each shape at its own baseline point (the template's [[baselines]] rules), as a search
        # measures it; PARAM=VALUE overrides apply on top.
        groups: dict[str, tuple[Candidate, list]] = {}
        for shape in shapes:
            candidate = Candidate.from_template(template, {**template.baseline_for(shape).point, **overrides})
            groups.setdefault(candidate.id, (candidate, []))[1].append(shape)
        plans.extend((template, block, group, candidate) for candidate, group in groups.values())
    try:
        executor.prepare()
        env = executor.describe()
        _print_environment(env, trusted)
        failures, records = 0, []
        for template, block, shapes, candidate in plans:
            evaluations = executor.evaluate(block, candidate.source, shapes, dtype)
            failures += _print_evaluations(candidate, dtype_name, executor.kind, evaluations, no_time, verbose)
            records.extend(result_record(candidate, dtype_name, ev) for ev in evaluations)
    finally:
        executor.close()
    if json_path:
        write_json(Path(json_path), {"environment": env, "results": records})
    if failures:
        console.print(f"[bold red]{failures} shape(s) failed[/]")
        ctx.exit(1)
    console.print("[bold green]all shapes passed[/]")


def _print_environment(env: dict[str, Any], trusted: bool) -> None:
    """The device line, and what isolates the candidates from this process (once)."""
    from kernelforge.sandbox.roles import sandbox_warning

    console.print(f"device: [bold]{escape(str(env['device_name']))}[/]  torch {env['torch']}  triton {env['triton']}")
    if trusted:
        console.print(f"[yellow]{escape(TRUSTED_WARNING)}[/]")
        return
    label = str(env.get("sandbox", ""))
    console.print(f"sandbox: {escape(label)}")
    warning = sandbox_warning(env)
    if warning:
        console.print(f"[yellow]warning: {escape(warning)}[/]")


def _print_evaluations(candidate, dtype_name: str, device_name: str, evaluations: list, no_time: bool,
                       verbose: bool) -> int:
    """One candidate's table and failure messages (with ``verbose``, the tracebacks); returns the
    number of shapes that failed."""
    from kernelforge.result import format_seconds

    table = Table(title=f"{candidate.describe()}  ({dtype_name}, {device_name})", title_justify="left")
    columns = ("shape", "status", "rel. error", "worst/tol") + (() if no_time else ("time (median)", "p20-p80", "timing"))
    for column in columns:
        table.add_column(column, justify="right" if column in ("rel. error", "worst/tol", "time (median)") else "left")
    failures = 0
    for ev in evaluations:
        v, t = ev.verification, ev.timing
        failures += not v.ok
        style = "green" if v.ok else "bold red"
        row = [ev.shape.name, f"[{style}]{v.status.value}[/]", "-" if v.rel_error is None else f"{v.rel_error:.2e}",
               "-" if v.excess is None else f"{v.excess:.2f}"]
        if not no_time:
            row += [format_seconds(t.median_s) if t else "-",
                    f"{format_seconds(t.p20_s)} - {format_seconds(t.p80_s)}" if t else "-", t.label if t else ""]
        table.add_row(*row)
    console.print(table)
    for ev in evaluations:
        v = ev.verification
        if not v.ok:
            console.print(f"  [red]{v.status.value}[/]: {escape(v.message)}")
            if verbose and v.traceback:
                console.print(f"  traceback of {ev.shape.name}:", markup=False)
                click.echo(v.traceback.rstrip("\n"))  # raw: a traceback must not be wrapped or marked up
    return failures


def result_record(candidate, dtype_name: str, ev) -> dict[str, Any]:
    from dataclasses import asdict

    timing = asdict(ev.timing) if ev.timing else None
    return {
        "block": candidate.block_id, "template": candidate.template_id, "candidate": candidate.id,
        "params": candidate.point, "shape": ev.shape.name, "dims": ev.shape.as_dict(), "dtype": dtype_name,
        "status": ev.verification.status.value, "rel_error": ev.verification.rel_error,
        "message": ev.verification.message, "flops": ev.counts.flops, "bytes": ev.counts.bytes, "timing": timing,
    }


def write_json(path: Path, payload: dict[str, Any]) -> None:
    import json

    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(payload, indent=1, default=str) + "\n", encoding="utf-8")
    except OSError as exc:
        raise UserError(f"--json {path}: cannot write ({exc.strerror}); choose a writable path") from None


@click.command(name="compile")
@click.argument("template_id")
@click.argument("params", nargs=-1)
@click.option("--target", default=None, help="sm_90 (default without a GPU), sm_80, sm_89, gfx942, ...")
@click.option("--dtype", "dtype_name", default="bfloat16", show_default=True)
@click.pass_context
def compile_(ctx: click.Context, template_id: str, params: tuple[str, ...], target: str | None, dtype_name: str) -> None:
    """Compile TEMPLATE ahead of time for a GPU target (no GPU needed) and print its resources."""
    from kernelforge.compile.pool import compile_candidate
    from kernelforge.candidate import Candidate

    from kernelforge.fields import compile_target

    catalog = catalog_of(ctx)
    template = catalog.resolve(template_id)
    dtype_of(dtype_name)
    if target is not None:
        compile_target("--target", target)  # the check a job's [job] target gets
    candidate = Candidate.from_template(template, {**template.baseline, **parse_params(params)})
    report = compile_candidate(candidate.source, template.block_id, catalog.root, dtype_name, target)
    table = Table(title=f"{candidate.describe()} -> {report.target}", title_justify="left")
    for column in ("kernel", "shared mem (B)", "registers", "spill st/ld (B)", "warps", "stages", "wgmma", "TMA", "cp.async", "compile (s)"):
        table.add_column(column)
    for k in report.kernels:
        table.add_row(
            k.name, str(k.shared_bytes), "-" if k.registers is None else str(k.registers),
            "-" if k.spill_stores is None else f"{k.spill_stores}/{k.spill_loads}",
            str(k.num_warps), str(k.num_stages), yes(k.uses_wgmma), yes(k.uses_tma), yes(k.uses_cp_async),
            f"{k.compile_seconds:.2f}",
        )
    if report.kernels:
        console.print(table)
    if not report.ok:
        err_console.print(f"[bold red]{report.status}:[/] {report.message}")
        ctx.exit(1)
