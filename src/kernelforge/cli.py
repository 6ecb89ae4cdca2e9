"""The ``kernelforge`` command line.

User mistakes (unknown names, bad parameters, malformed files) print one line naming the thing and
the fix, and exit with status 2; a check that finds a failing shape exits with status 1.
"""

from __future__ import annotations

import re
import sys
from pathlib import Path
from typing import Any

import click
from rich.console import Console
from rich.markup import escape
from rich.table import Table

from kernelforge.errors import UserError

# Logs and CI are not terminals: give tables room instead of rich's 80-column default.
_WIDTH = None if sys.stdout.isatty() else 160
console = Console(highlight=False, width=_WIDTH)
err_console = Console(stderr=True, highlight=False, width=_WIDTH)

#: Above this many FLOPs per call a shape is refused on the interpreter (it manages roughly
#: 1e8-1e9 FLOP/s, so this is already minutes).
INTERPRETER_FLOP_LIMIT = 5e10


def _catalog(ctx: click.Context):
    from kernelforge.catalog import Catalog

    return Catalog.discover(ctx.obj.get("kernels"))


def _parse_params(pairs: tuple[str, ...]) -> dict[str, Any]:
    from kernelforge.space import parse_value

    params: dict[str, Any] = {}
    for pair in pairs:
        name, sep, value = pair.partition("=")
        if not sep or not name:
            raise UserError(f"parameter {pair!r} must be written NAME=VALUE, e.g. BLOCK_M=64")
        params[name.strip()] = parse_value(value.strip())
    return params


def _dtype(name: str):
    from kernelforge.block import DTYPES

    if name not in DTYPES:
        raise UserError(f"--dtype {name!r} is not one of {', '.join(DTYPES)}")
    return DTYPES[name]


class _Group(click.Group):
    """Turns UserError into one clear line and exit status 2."""

    def invoke(self, ctx: click.Context) -> Any:
        try:
            return super().invoke(ctx)
        except UserError as exc:
            # Escaped: messages name TOML tables such as [llm], which rich would take for markup.
            err_console.print(f"[bold red]kernelforge:[/] {escape(str(exc))}")
            ctx.exit(2)


@click.group(cls=_Group)
@click.option("--kernels", type=click.Path(file_okay=False), envvar="KERNELFORGE_KERNELS",
              help="Kernels folder (default: kernels/ of this checkout).")
@click.pass_context
def main(ctx: click.Context, kernels: str | None) -> None:
    """kernelforge: find faster GPU kernels for the attention and MoE blocks of large models."""
    ctx.ensure_object(dict)
    ctx.obj["kernels"] = kernels


@main.command()
@click.pass_context
def blocks(ctx: click.Context) -> None:
    """List the blocks and their shape sets."""
    catalog = _catalog(ctx)
    table = Table(title="blocks")
    for column in ("block", "family", "shape sets", "description"):
        table.add_column(column)
    for block_id, block in catalog.blocks.items():
        sets = ", ".join(f"{name} ({len(shapes)})" for name, shapes in block.shape_sets().items())
        table.add_row(block_id, block.family, sets, block.description)
    console.print(table)


@main.command()
@click.argument("block_id", required=False)
@click.pass_context
def templates(ctx: click.Context, block_id: str | None) -> None:
    """List the templates (of one block, or all) with their spaces and baseline points."""
    catalog = _catalog(ctx)
    table = Table(title="templates")
    for column in ("template", "role", "origin", "points", "baseline point"):
        table.add_column(column)
    chosen = catalog.templates(block_id) if block_id else catalog.all_templates()
    for template in chosen:
        point = " ".join(f"{k}={v}" for k, v in template.baseline.items())
        table.add_row(template.id, template.role, template.origin, str(template.space.size), point)
    console.print(table)


@main.command()
@click.argument("template_id")
@click.argument("params", nargs=-1)
@click.pass_context
def render(ctx: click.Context, template_id: str, params: tuple[str, ...]) -> None:
    """Print TEMPLATE rendered at its baseline point, with PARAM=VALUE overrides."""
    template = _catalog(ctx).resolve(template_id)
    point = {**template.baseline, **_parse_params(params)}
    click.echo(template.render(point), nl=False)


@main.command()
@click.argument("names", nargs=-1)
@click.option("--device", "device_name", default=None, help="cuda or interpret (default: cuda when a GPU is visible).")
@click.option("--shapes", "shape_set", default="smoke", show_default=True, help="Shape set or shape name.")
@click.option("--dtype", "dtype_name", default="bfloat16", show_default=True)
@click.option("--no-time", is_flag=True, help="Verify only.")
@click.option("--json", "json_path", type=click.Path(dir_okay=False), default=None,
              help="Also write every result, with the device and versions, to this JSON file.")
@click.pass_context
def check(ctx: click.Context, names: tuple[str, ...], device_name: str | None, shape_set: str, dtype_name: str,
          no_time: bool, json_path: str | None) -> None:
    """Verify (and time) blocks' baselines or templates on a shape set.

    NAMES are block ids (meaning their baseline template) or template ids; none means every block.
    PARAM=VALUE arguments override the baseline point.
    """
    from kernelforge.candidate import Candidate
    from kernelforge.devices.device import default_device_name, get_device
    from kernelforge.execute.evaluate import evaluate
    from kernelforge.result import format_seconds

    point_args = tuple(n for n in names if "=" in n)
    names = tuple(n for n in names if "=" not in n)
    catalog = _catalog(ctx)
    dtype = _dtype(dtype_name)
    device = get_device(device_name or default_device_name())
    targets = [catalog.resolve(name) for name in names] or [catalog.baseline(b) for b in catalog.blocks]
    overrides = _parse_params(point_args)
    plans = []
    for template in targets:
        block = catalog.block(template.block_id)
        shapes = block.shapes(shape_set)
        if device.name == "interpret":
            heavy = [s for s in shapes if block.counts(s, dtype).flops > INTERPRETER_FLOP_LIMIT]
            if heavy:
                raise UserError(
                    f"--shapes {shape_set}: {heavy[0].name} of {block.id} needs "
                    f"{block.counts(heavy[0], dtype).flops:.2g} FLOP per call, far too much for the "
                    "interpreter; use --device cuda, or --shapes smoke / check on a CPU"
                )
        candidate = Candidate.from_template(template, {**template.baseline, **overrides})
        plans.append((template, block, shapes, candidate))
    device.prepare()
    env = device.describe()
    console.print(f"device: [bold]{env['device_name']}[/]  torch {env['torch']}  triton {env['triton']}")
    failures = 0
    records: list[dict[str, Any]] = []
    for template, block, shapes, candidate in plans:
        table = Table(title=f"{candidate.describe()}  ({dtype_name}, {device.name})", title_justify="left")
        for column in ("shape", "status", "rel. error", "worst/tol", "time (median)", "p20-p80", "timing"):
            table.add_column(column, justify="right" if column in ("rel. error", "worst/tol", "time (median)") else "left")
        evaluations = evaluate(block, candidate.source, shapes, dtype, device,
                               deterministic=template.deterministic, timed=not no_time)
        for ev in evaluations:
            v, t = ev.verification, ev.timing
            failures += not v.ok
            style = "green" if v.ok else "bold red"
            table.add_row(
                ev.shape.name,
                f"[{style}]{v.status.value}[/]",
                "-" if v.rel_error is None else f"{v.rel_error:.2e}",
                "-" if v.excess is None else f"{v.excess:.2f}",
                format_seconds(t.median_s) if t else "-",
                f"{format_seconds(t.p20_s)} - {format_seconds(t.p80_s)}" if t else "-",
                t.label if t else "",
            )
        console.print(table)
        records.extend(_record(candidate, dtype_name, ev) for ev in evaluations)
        for ev in evaluations:
            if not ev.verification.ok:
                console.print(f"  [red]{ev.verification.status.value}[/]: {ev.verification.message}")
    if json_path:
        _write_json(Path(json_path), {"environment": env, "results": records})
    if failures:
        console.print(f"[bold red]{failures} shape(s) failed[/]")
        ctx.exit(1)
    console.print("[bold green]all shapes passed[/]")


def _record(candidate, dtype_name: str, ev) -> dict[str, Any]:
    from dataclasses import asdict

    timing = asdict(ev.timing) if ev.timing else None
    return {
        "block": candidate.block_id, "template": candidate.template_id, "candidate": candidate.id,
        "params": candidate.point, "shape": ev.shape.name, "dims": ev.shape.as_dict(), "dtype": dtype_name,
        "status": ev.verification.status.value, "rel_error": ev.verification.rel_error,
        "message": ev.verification.message, "flops": ev.counts.flops, "bytes": ev.counts.bytes, "timing": timing,
    }


def _write_json(path: Path, payload: dict[str, Any]) -> None:
    import json

    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(payload, indent=1, default=str) + "\n", encoding="utf-8")
    except OSError as exc:
        raise UserError(f"--json {path}: cannot write ({exc.strerror}); choose a writable path") from None


@main.command(name="compile")
@click.argument("template_id")
@click.argument("params", nargs=-1)
@click.option("--target", default=None, help="sm_90 (default without a GPU), sm_80, sm_89, gfx942, ...")
@click.option("--dtype", "dtype_name", default="bfloat16", show_default=True)
@click.pass_context
def compile_(ctx: click.Context, template_id: str, params: tuple[str, ...], target: str | None, dtype_name: str) -> None:
    """Compile TEMPLATE ahead of time for a GPU target (no GPU needed) and print its resources."""
    from kernelforge.compile import aot
    from kernelforge.candidate import Candidate

    catalog = _catalog(ctx)
    template = catalog.resolve(template_id)
    _dtype(dtype_name)
    candidate = Candidate.from_template(template, {**template.baseline, **_parse_params(params)})
    report = aot.compile_candidate(candidate.source, template.block_id, catalog.root, dtype_name, target)
    table = Table(title=f"{candidate.describe()} -> {report.target}", title_justify="left")
    for column in ("kernel", "shared mem (B)", "registers", "spill st/ld (B)", "warps", "stages", "wgmma", "TMA", "cp.async", "compile (s)"):
        table.add_column(column)
    for k in report.kernels:
        table.add_row(
            k.name, str(k.shared_bytes), "-" if k.registers is None else str(k.registers),
            "-" if k.spill_stores is None else f"{k.spill_stores}/{k.spill_loads}",
            str(k.num_warps), str(k.num_stages), _yes(k.uses_wgmma), _yes(k.uses_tma), _yes(k.uses_cp_async),
            f"{k.compile_seconds:.2f}",
        )
    if report.kernels:
        console.print(table)
    if report.status != "ok":
        err_console.print(f"[bold red]{report.status}:[/] {report.message}")
        ctx.exit(1)


def _load_job(ctx: click.Context, job_file: str, storage: str | None):
    from dataclasses import replace

    from kernelforge.job import load_job

    catalog = _catalog(ctx)
    job = load_job(job_file, catalog)
    if storage:
        job = replace(job, storage=storage)
    return job, catalog


@main.command()
@click.argument("job_file", type=click.Path(dir_okay=False))
@click.option("--storage", default=None, help="SQLAlchemy URL of the results database (default: the job's).")
@click.option("--device", "device_name", default=None, help="Override the job's device: cuda, interpret or replay:PATH.")
@click.option("--progress", "progress_mode", type=click.Choice(["live", "jsonl", "quiet"]), default=None,
              help="Live terminal view (default on a terminal), JSON lines, or quiet.")
@click.option("--no-compile", is_flag=True, help="Skip ahead-of-time compilation of candidates.")
@click.option("--report/--no-report", default=True, show_default=True, help="Write the report when done.")
@click.option("--llm", "llm_mode", default=None, metavar="URL|replay[:PATH]|off",
              help="LLM generator: an OpenAI-compatible base URL (enables or overrides the job's [llm]), "
                   "'replay' to answer from the job database's stored transcripts offline, 'replay:PATH' "
                   "from another job database, or 'off'.")
@click.option("--llm-model", default=None, help="Model name for --llm URL (overrides [llm] model).")
@click.option("--llm-key-env", default=None, metavar="NAME",
              help="Environment variable holding the API key (overrides [llm] api_key_env).")
@click.option("--in-process", is_flag=True,
              help="Evaluate candidates in this process instead of an isolated worker (debugging trusted "
                   "templates: a crashing or hanging candidate then takes the search down).")
@click.pass_context
def search(ctx: click.Context, job_file: str, storage: str | None, device_name: str | None,
           progress_mode: str | None, no_compile: bool, report: bool, llm_mode: str | None,
           llm_model: str | None, llm_key_env: str | None, in_process: bool = False) -> None:
    """Run (or resume) the search described by JOB_FILE; rerunning continues where it stopped."""
    from kernelforge.job import require_llm_endpoint
    from kernelforge.search.progress import make_progress
    from kernelforge.report.report import write_report
    from kernelforge.search.loop import Search
    from kernelforge.store.store import Store

    job, catalog = _load_job(ctx, job_file, storage)
    job = _with_llm(job, llm_mode, llm_model, llm_key_env)
    require_llm_endpoint(job)
    store = Store(job.storage_url)
    mode = progress_mode or ("live" if sys.stdout.isatty() else "jsonl")
    progress = make_progress(mode)
    try:
        outcome = Search(job, catalog, store, progress, device_name=device_name,
                         compile_enabled=not no_compile, in_process=in_process).run()
    finally:
        progress.close()
    if report:
        path = write_report(job, catalog, store)
        err_console.print(f"report: {path}")
    counts = store.counts()
    err_console.print(f"{job.name}: {outcome.evaluations} evaluations this run, {outcome.duplicates} answered "
                      f"from the store; {counts['candidates']} candidates and {counts['results']} results stored "
                      f"in {job.storage_url}")
    if outcome.llm:
        llm = outcome.llm
        kinds = ", ".join(f"{k} {v}" for k, v in sorted(llm["kinds"].items())) or "none"
        err_console.print(f"llm: {llm['requests']} requests ({llm['attempts']} attempts, {llm['tokens']} tokens); "
                          f"answers: {kinds}" + (f"; stopped: {llm['stopped']}" if llm["stopped"] else ""),
                          markup=False, soft_wrap=True)
    if outcome.stopped:
        ctx.exit(130)


def _with_llm(job, mode: str | None, model: str | None, key_env: str | None):
    """The job with the command line's --llm options applied (see ``search --help``)."""
    from dataclasses import replace

    from kernelforge.job import LLMSpec, check_base_url, parse_llm

    if mode is None and model is None and key_env is None:
        return job
    if mode == "off":
        return replace(job, llm=None)
    spec = job.llm
    if mode is not None and (mode == "replay" or mode.startswith("replay:")):
        source = mode.partition(":")[2]
        if source and "://" not in source:
            if not Path(source).is_file():
                raise UserError(f"--llm {mode}: no such job database; give the kernelforge.db of the search to replay")
            source = f"sqlite:///{source}"
        return replace(job, llm=replace(spec or LLMSpec(), replay=source or job.storage_url))
    if spec is None:
        if mode is None:
            raise UserError("--llm-model/--llm-key-env need --llm URL (or an [llm] table in the job)")
        spec = parse_llm({}, "--llm", require_endpoint=False)
    if mode is not None:
        check_base_url(mode, "--llm")
        spec = replace(spec, base_url=mode)
    if model is not None:
        spec = replace(spec, model=model)
    if key_env is not None:
        spec = replace(spec, api_key_env=parse_llm({"api_key_env": key_env}, "--llm-key-env",
                                                   require_endpoint=False).api_key_env)
    if not spec.model:
        raise UserError("--llm URL needs --llm-model NAME (or [llm] model in the job)")
    return replace(job, llm=spec)


@main.command()
@click.argument("job_file", type=click.Path(dir_okay=False))
@click.option("--storage", default=None, help="SQLAlchemy URL of the results database (default: the job's).")
@click.option("--compare", "compare_file", type=click.Path(dir_okay=False), default=None,
              help="A second job file (e.g. the same job on another GPU or Triton version): print both side by "
                   "side and write reports/compare-<a>-vs-<b>.html.")
@click.option("--compare-storage", default=None, help="SQLAlchemy URL of the --compare job's database (default: its own).")
@click.pass_context
def report(ctx: click.Context, job_file: str, storage: str | None, compare_file: str | None,
           compare_storage: str | None) -> None:
    """Write reports/<job>/REPORT.md, results.json and index.html from the stored results of JOB_FILE."""
    from kernelforge.report.report import collect, write_compare, write_report
    from kernelforge.store.store import Store

    job, catalog = _load_job(ctx, job_file, storage)
    store = Store(job.storage_url, create=False)
    if compare_file:
        other, _ = _load_job(ctx, compare_file, compare_storage)
        other_store = Store(other.storage_url, create=False)
        text, html = write_compare(collect(job, catalog, store), collect(other, catalog, other_store))
        click.echo(text)  # raw Markdown: no wrapping or markup interpretation
        err_console.print(f"wrote {html}")
        return
    path = write_report(job, catalog, store)
    click.echo(path.read_text(encoding="utf-8"))  # raw Markdown: no wrapping or markup interpretation
    err_console.print(f"wrote {path}, {path.with_name('results.json')} and {path.with_name('index.html')}")


@main.command()
@click.argument("job_file", type=click.Path(dir_okay=False))
@click.option("--format", "fmt", type=click.Choice(["vllm", "triton", "source"]), required=True,
              help="vllm: fused_moe config JSON per (E, N); triton: module with the winning kernels and a "
                   "triton.Config list; source: the winning rendered sources.")
@click.option("--out", "out_dir", type=click.Path(file_okay=False), default=None,
              help="Output folder (default: reports/<job>/export/).")
@click.option("--storage", default=None, help="SQLAlchemy URL of the results database (default: the job's).")
@click.pass_context
def export(ctx: click.Context, job_file: str, fmt: str, out_dir: str | None, storage: str | None) -> None:
    """Export the winners of JOB_FILE for vLLM, as a Triton module, or as sources."""
    from kernelforge.report.export import export as run_export
    from kernelforge.store.store import Store

    job, catalog = _load_job(ctx, job_file, storage)
    store = Store(job.storage_url, create=False)
    written, notes = run_export(job, catalog, store, fmt, Path(out_dir) if out_dir else None)
    for path in written:
        console.print(f"wrote {path}", markup=False)
    for note in notes:
        err_console.print(f"note: {note}", markup=False)


@main.command(name="strategy-bench")
@click.argument("space_file", type=click.Path(dir_okay=False))
@click.option("--strategy", "strategies", default="tpe,random", show_default=True,
              help="Comma-separated strategies; random search is always included for reference.")
@click.option("--seeds", default=10, show_default=True, type=click.IntRange(1))
@click.option("--budget", default=100, show_default=True, type=click.IntRange(1))
def strategy_bench(space_file: str, strategies: str, seeds: int, budget: int) -> None:
    """Compare search strategies on a recorded tuning space (a Kernel Tuner cache file): evaluations
    needed to get within 1%, 5% and 10% of the space's optimum, over SEEDS seeds."""
    from kernelforge.strategies.recorded import load_kernel_tuner_cache
    from kernelforge.strategies.bench import bench, format_table

    space = load_kernel_tuner_cache(space_file)
    names = [n.strip() for n in strategies.split(",") if n.strip()]
    rows = bench(space, names, seeds=seeds, budget=budget)
    console.print(format_table(rows))


def _yes(flag: bool | None) -> str:
    return "-" if flag is None else ("yes" if flag else "no")


@main.command()
@click.argument("name")
@click.pass_context
def new(ctx: click.Context, name: str) -> None:
    """Scaffold template BLOCK/NAME from the block's baseline, ready to edit."""
    from kernelforge.template import TEMPLATE_SUFFIX, Template

    catalog = _catalog(ctx)
    block_id, _, stem = name.rpartition("/")
    catalog.block(block_id)
    if not stem.isidentifier():
        raise UserError(f"template name {stem!r} must be a Python identifier (letters, digits, _), e.g. {block_id}/wide_tiles")
    path = Path(catalog.root) / block_id / f"{stem}{TEMPLATE_SUFFIX}"
    if path.exists():
        raise UserError(f"{path} already exists; choose another name or edit it")
    baseline = catalog.baseline(block_id)
    text = re.sub(r'(?m)^role\s*=\s*"baseline"', 'role = "variant"', baseline.text, count=1)
    text = re.sub(r'(?m)^description\s*=\s*".*"$', f'description = "Variant of {baseline.id}: describe your change"',
                  text, count=1)
    path.write_text(text, encoding="utf-8")
    Template.from_file(path, block_id)  # the scaffold must be valid as written
    console.print(f"created [bold]{path}[/] (a copy of {baseline.id}, role = variant)")
    console.print(f"next: edit it, then `kernelforge check {block_id}/{stem} --device interpret --shapes smoke`")


