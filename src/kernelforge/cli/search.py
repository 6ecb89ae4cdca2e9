"""Commands that search: ``search`` (run or resume a job) and ``strategy-bench``."""

from __future__ import annotations

import itertools
import sys
from pathlib import Path

import click

from kernelforge.cli.common import load_job, storage_option
from kernelforge.cli.dry_run import print_plan
from kernelforge.cli.signals import install_stop_signals, stopped_status
from kernelforge.cli.summary import print_summary
from kernelforge.errors import UserError
from kernelforge.strategies.names import STRATEGY_NAMES


@click.command()
@click.argument("job_file", metavar="JOB")
@storage_option()
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
@click.option("--dry-run", is_flag=True,
              help="Print the plan (templates, budgets, shapes, device, target, storage) and what is already "
                   "stored, then exit without evaluating anything.")
@click.option("--reconfirm", is_flag=True,
              help="Re-time the winners of a job that is already complete (a plain rerun changes nothing).")
@click.option("--accept-block-change", is_flag=True,
              help="A block's code changed since this job stored results of it, in a way that cannot alter a "
                   "verdict (a new shape set, a comment): keep its stored verdicts (without it, the search stops).")
@click.option("--warm-start", "warm_start", multiple=True, metavar="JOB|shapes",
              help="Ask first the best stored configurations of job JOB in the same storage (measured on any "
                   "device), or of the template's other shapes ('shapes'); repeatable or comma-separated; "
                   "replaces the job's [strategy] warm_start.")
# -- launcher options (kernelforge.cli.launch.local): many workers of this job -------------------------
@click.option("--workers", type=click.IntRange(1), default=None, metavar="N",
              help="Start N worker processes of this job on this host (they share the job's database).")
@click.option("--gpus", default=None, metavar="all|0,1,5",
              help="Start one worker per local GPU (all, or the indices), each seeing only its GPU.")
@click.option("--ray", "ray_address", is_flag=False, flag_value="auto", default=None, metavar="[ADDRESS]",
              help="Start one worker per GPU of a Ray cluster (ADDRESS, default auto); needs kernelforge[ray].")
# -- end of launcher options ------------------------------------------------------------------------
@click.pass_context
def search(ctx: click.Context, job_file: str, storage: str | None, device_name: str | None,
           progress_mode: str | None, no_compile: bool, report: bool, llm_mode: str | None,
           llm_model: str | None, llm_key_env: str | None, in_process: bool = False, dry_run: bool = False,
           reconfirm: bool = False, warm_start: tuple[str, ...] = (), workers: int | None = None, gpus: str | None = None,
           ray_address: str | None = None, accept_block_change: bool = False) -> None:
    """Run (or resume) the search described by JOB; rerunning continues where it stopped.

    JOB is a job file, or the name of a job under search/ (``demo`` is search/demo.toml).
    """
    if (workers is not None or gpus is not None or ray_address is not None) and not dry_run:
        from kernelforge.cli.launch.local import launch  # many workers of this job (--workers/--gpus/--ray)

        ctx.exit(launch(ctx, workers, gpus, ray_address))
    job, catalog = load_job(ctx, job_file, storage)
    job = with_llm(job, llm_mode, llm_model, llm_key_env)
    if warm_start:
        from dataclasses import replace

        from kernelforge.job import warm_sources

        sources = warm_sources([s.strip() for item in warm_start for s in item.split(",") if s.strip()], "--warm-start")
        job = replace(job, strategy=replace(job.strategy, warm_start=sources))
    if dry_run:  # what the run would refuse, it refuses too, then shows the plan
        print_plan(job, catalog, device_name=device_name, compile_enabled=not no_compile)
        return

    from kernelforge.report.write import write_report
    from kernelforge.search.progress import make_progress
    from kernelforge.compile.ray_pool import pool_from_environment
    from kernelforge.search.warm import check_sources
    from kernelforge.start import preflight, run_search
    from kernelforge.store.store import Store

    preflight(job, catalog, device_name)
    store = Store(job.storage_url)
    check_sources(store, job.name, job.strategy.warm_start)  # an unknown source: one line, before anything runs
    mode = progress_mode or ("live" if sys.stdout.isatty() else "jsonl")
    progress = make_progress(mode)
    pool = None if no_compile else pool_from_environment()  # a --ray worker compiles on the cluster's CPUs
    install_stop_signals()  # again: Ray's init replaces the SIGTERM handler
    try:
        outcome = run_search(job, catalog, store, progress, device_name=device_name,
                             compile_enabled=not no_compile, in_process=in_process, pool=pool, reconfirm=reconfirm,
                             accept_block_change=accept_block_change)
    finally:
        progress.close()
    store.verify()  # the summary names where the results are only once they are known to be there
    path = write_report(job, catalog, store) if report else None
    print_summary(job, catalog, store, outcome, path)
    store.close()  # the WAL checkpointed into the .db file: no big -wal stays behind
    if outcome.stopped:
        ctx.exit(stopped_status(outcome.reason))


def with_llm(job, mode: str | None, model: str | None, key_env: str | None):
    """The job with the command line's --llm options applied (see ``search --help``)."""
    from dataclasses import replace

    from kernelforge.llm_spec import LLMSpec, check_base_url, parse_llm
    from kernelforge.redact import redact_url

    if mode is None and model is None and key_env is None:
        return job
    if mode == "off":
        return replace(job, llm=None)
    spec = job.llm
    if mode is not None and (mode == "replay" or mode.startswith("replay:")):
        from kernelforge.storage_url import sqlite_file

        source = mode.partition(":")[2]
        if source and "://" not in source:
            source = f"sqlite:///{source}"
        recording = sqlite_file(source) if source else None
        if recording is not None and not recording.is_file():
            raise UserError(f"--llm {redact_url(mode)}: no such job database; give the kernelforge.db of the search "
                            "to replay")
        return replace(job, llm=replace(spec or LLMSpec(), replay=source or job.storage_url))
    if spec is None:
        if mode is None:
            raise UserError("--llm-model/--llm-key-env need --llm URL (or an [llm] table in the job)")
        spec = parse_llm({}, "--llm", require_endpoint=False)
    # --llm URL / --llm-model NAME override the job's models with this one model.
    if mode is not None:
        check_base_url(mode, "--llm")
        hosts = {_origin(url) for url in (spec.base_url, *(m.base_url for m in spec.models)) if url}
        if key_env is None and hosts - {_origin(mode)} and (spec.api_key_env or spec.headers
                                                             or any(m.api_key_env for m in spec.models)):
            # The job's key and headers are for its own endpoint: never sent to another host unasked.
            click.echo(f"note: --llm {redact_url(mode)} is another host than the job's [llm] endpoint: its key "
                       "(api_key_env) and [llm.headers] are not sent there; pass --llm-key-env NAME to send a key",
                       err=True)
            spec = replace(spec, api_key_env="", headers=())
        spec = replace(spec, base_url=mode, models=())
    if model is not None:
        spec = replace(spec, model=model, models=())
    if key_env is not None:
        name = parse_llm({"api_key_env": key_env}, "--llm-key-env", require_endpoint=False).api_key_env
        spec = replace(spec, api_key_env=name, models=tuple(replace(m, api_key_env=name) for m in spec.models))
    if not spec.model and not spec.models:
        raise UserError("--llm URL needs --llm-model NAME (or [llm] model in the job)")
    return replace(job, llm=spec)


def _origin(url: str) -> tuple[str, str | None, int | None]:
    """Where a URL's requests go: scheme, host and port (a path on the same host is the same endpoint)."""
    from urllib.parse import urlsplit

    parts = urlsplit(url)
    return parts.scheme, parts.hostname, parts.port


@click.command(name="strategy-bench")
@click.argument("path", metavar="PATH", type=click.Path())
@click.option("--strategy", "strategies", default=None, metavar="A,B,C",
              help="Comma-separated strategies (" + ", ".join(STRATEGY_NAMES) + "); default: "
                   "auto,tpe,random when auto exists, else tpe,random; random search is always included.")
@click.option("--seeds", default=10, show_default=True, type=click.IntRange(1),
              help="Runs per strategy (seeds FIRST..FIRST+N-1).")
@click.option("--first-seed", default=0, show_default=True, type=click.IntRange(0), metavar="FIRST",
              help="The first seed: --first-seed 40 --seeds 40 runs seeds 40-79, the same runs as within a longer bench.")
@click.option("--stop", is_flag=True,
              help="End each run once within 1% of the optimum: the same evaluations to 1/5/10%, a few times faster.")
@click.option("--budget", default=100, show_default=True, type=click.IntRange(1), help="Evaluations per run.")
@click.option("--jobs", default=None, type=click.IntRange(1), metavar="J",
              help="Parallel processes, one run each at a time (default: the CPU count); the figures do not depend on it.")
@click.option("--json", "json_path", default=None, type=click.Path(dir_okay=False), metavar="FILE",
              help="Also write every figure and each run's raw data as JSON to FILE.")
@click.option("--markdown", "markdown_path", default=None, type=click.Path(dir_okay=False), metavar="FILE",
              help="Also write one Markdown table per metric over every space (evaluations to 1%, best/optimum at "
                   "each checkpoint, area), each figure with its 95% interval, to FILE.")
@click.option("--warm-from", "warm_from", default=None, type=click.Path(dir_okay=False), metavar="SPACE",
              help="A cache file of the same kernel on another GPU: every run first asks its best-ranked points "
                   "(ranks, not times; as many as a search's --warm-start, in its spread order). Only PATH's spaces "
                   "of that kernel are benched, never SPACE itself.")
@click.option("--with-cold", "with_cold", is_flag=True,
              help="With --warm-from: also bench every strategy cold on the same spaces and seeds, and read the "
                   "transfer goals (warm at most half of cold's median evaluations to 1%, and never more).")
@click.option("--fix", "fixes", multiple=True, metavar="NAME[=V1,V2]",
              help="Bench slices instead of whole spaces: the part of each space where parameter NAME holds one "
                   "value, a slice per value (NAME alone: each of the space's own values with a recorded time; "
                   "repeat for several parameters: a slice per combination). Spaces without NAME are left out.")
def strategy_bench(path: str, strategies: str | None, seeds: int, first_seed: int, stop: bool, budget: int,
                   jobs: int | None, json_path: str | None, warm_from: str | None = None,
                   fixes: tuple[str, ...] = (), markdown_path: str | None = None, with_cold: bool = False) -> None:
    """Compare search strategies on recorded tuning spaces: PATH is a Kernel Tuner cache file, or a
    folder whose every *.json / *.json.gz is one. Per space and strategy, over SEEDS seeds: evaluations
    to get within 1%, 5% and 10% of the optimum, best/optimum after 10-200 evaluations and the area
    under that curve, time per ask; then, against tpe and random, whether each strategy meets the
    goals auto is held to (docs/strategies.md).
    Configurations absent from a cache are infeasible (never asked, never counted); recorded failures
    count as evaluations."""
    from kernelforge.strategies.bench.markdown import format_markdown
    from kernelforge.strategies.bench.outputs import check_outputs, write_output
    from kernelforge.strategies.bench.run import bench_spaces, default_strategies
    from kernelforge.strategies.bench.report import format_space, format_summary, write_json
    from kernelforge.strategies.bench.recorded import cache_files, load_kernel_tuner_cache
    from kernelforge.strategies.bench.slices import parse_fix, sliced

    if with_cold and warm_from is None:
        raise UserError("--with-cold compares a warm start with a cold one: add --warm-from SPACE")
    files = cache_files(path)
    read = files + ([Path(warm_from)] if warm_from is not None else [])
    check_outputs({"--json": json_path, "--markdown": markdown_path}, read, Path(path) if Path(path).is_dir() else None)
    loaded = {file: load_kernel_tuner_cache(file) for file in read}
    for file, space in loaded.items():
        for note in space.notes():
            click.echo(f"note: {file} {note}", err=True)
    spaces = [loaded[file] for file in files]
    warm = None
    if warm_from is not None:
        from kernelforge.strategies.transfer import other_recordings

        warm = loaded[Path(warm_from)]
        spaces = other_recordings(warm, spaces, warm_from)
    spaces = sliced(spaces, [parse_fix(text) for text in fixes])  # after the warm filter: never a slice of SPACE
    names = default_strategies() if strategies is None else [n.strip() for n in strategies.split(",")]
    results = []
    benches = [bench_spaces(spaces, names, seeds=seeds, budget=budget, jobs=jobs, first_seed=first_seed, stop=stop,
                            warm=start) for start in ((None, warm) if with_cold else (warm,))]
    for result in itertools.chain(*benches):  # each bench starts when the one before it is done
        results.append(result)
        click.echo(format_space(result) + "\n")
        if json_path is not None:
            write_json(results, json_path)  # after every space: a cut-short bench keeps what it measured
        if markdown_path is not None:
            write_output("--markdown", markdown_path, format_markdown(results))
    summary = format_summary(results)
    if summary and len(results[0].rows) > 1:
        click.echo(summary)
