"""Many workers of one job from one command: ``kernelforge search JOB --workers N`` (N local worker
processes), ``--gpus all|0,1,5`` (one per local GPU, each seeing only its own) and ``--ray
[ADDRESS]`` (one per GPU of a Ray cluster, :mod:`kernelforge.cli.launch.ray_cluster`).

Each worker is the same ``kernelforge search`` command line with the launcher options removed,
plus ``--no-report`` and ``--progress jsonl``; the workers cooperate through the job's database
(the shared ledger), which must therefore be shareable: a SQLite file (one host) or a server URL.
The launcher forwards SIGINT and SIGTERM to every worker (a second signal kills them), relays their
output (JSON progress lines on stdout with a ``"worker": "w1"`` field added, so the stream stays
JSON lines; every other line on stderr prefixed ``[w1]``), waits for all, writes the report once,
and exits 0 when every worker did, 130 after SIGINT, 143 after SIGTERM, else with the exit status of
the first worker that failed (in time).

Each worker's compile pool gets ``max(1, cpus // N)`` processes, passed in the environment
variable ``KERNELFORGE_COMPILE_WORKERS`` (read by
:func:`kernelforge.compile.pool.compile_workers_from_env`).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import threading
from typing import Any, Callable

import click
from click.core import ParameterSource

from kernelforge.errors import UserError
from kernelforge.compile.pool import COMPILE_WORKERS_ENV
from kernelforge.cli.launch.supervise import (STORAGE_ENV, Relay, Stop, WorkerSpec, check_shareable_storage,
                                          compile_share, die_with_launcher, exit_status, pump)

#: The search command's options that choose the launcher; never passed on to a worker.
LAUNCHER_OPTIONS = ("workers", "gpus", "ray_address")


# -- the worker command line -------------------------------------------------------------------

def _option_args(ctx: click.Context, skip: tuple[str, ...], replace: dict[str, list[str]]) -> list[str]:
    """The options and arguments the user gave ``ctx``'s command (defaults left out, so a worker
    gets the same defaults), except ``skip``; ``replace`` gives the tokens of some options."""
    positional: list[str] = []
    options: list[str] = []
    for param in ctx.command.params:
        name = param.name or ""
        if name in replace:
            options += replace[name]
            continue
        if name in skip:
            continue
        value = ctx.params.get(name)
        if isinstance(param, click.Argument):
            positional += [str(v) for v in value] if isinstance(value, (tuple, list)) else [str(value)]
            continue
        if ctx.get_parameter_source(name) in (None, ParameterSource.DEFAULT, ParameterSource.DEFAULT_MAP):
            continue
        assert isinstance(param, click.Option)
        opt = max(param.opts, key=len)
        if param.is_flag:
            if param.secondary_opts:
                options.append(opt if value else max(param.secondary_opts, key=len))
            elif value:
                options.append(opt)
        elif param.multiple:
            for item in value:
                options += [opt, str(item)]
        elif value is not None:
            options += [opt, str(value)]
    return positional + options


def worker_argv(ctx: click.Context, *, device: str | None = None) -> tuple[str, ...]:
    """The worker's command line for the ``search`` invocation ``ctx``: the same command (group
    options such as ``--kernels`` included) without the launcher options, with ``--no-report``
    and ``--progress jsonl``, and ``--device device`` when given."""
    argv = [sys.executable, "-m", "kernelforge"]
    if ctx.parent is not None:
        argv += _option_args(ctx.parent, (), {})
    argv.append(ctx.info_name or "search")
    # The storage travels in the environment (STORAGE_ENV), not on the command line.
    replace = {"progress_mode": ["--progress", "jsonl"], "report": ["--no-report"], "storage": []}
    if device is not None:
        replace["device_name"] = ["--device", device]
    argv += _option_args(ctx, LAUNCHER_OPTIONS, replace)
    return tuple(argv)


# -- what may be launched ----------------------------------------------------------------------

def count_local_gpus() -> list[str]:
    """The GPUs this host's workers may use: the entries of CUDA_VISIBLE_DEVICES when it is set
    (a launcher inside a restricted set keeps to it), else torch's count, else ``nvidia-smi -L``'s."""
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    if visible is not None:
        return [g.strip() for g in visible.split(",") if g.strip() and not g.strip().startswith("-")]
    count = 0
    try:
        import torch

        count = torch.cuda.device_count()
    except Exception:  # a broken CUDA install: nvidia-smi may still answer
        count = 0
    if count == 0 and shutil.which("nvidia-smi"):
        try:
            listing = subprocess.run(["nvidia-smi", "-L"], capture_output=True, text=True, timeout=30).stdout
            count = sum(1 for line in listing.splitlines() if line.startswith("GPU "))
        except (OSError, subprocess.SubprocessError):
            count = 0
    return [str(i) for i in range(count)]


def parse_gpus(spec: str, available: Callable[[], list[str]] = count_local_gpus) -> list[str]:
    """``all`` -> every local GPU (``available``); ``0,1,5`` -> those. UserError when none."""
    if spec.strip() == "all":
        gpus = available()
        if not gpus:
            raise UserError("--gpus all: no GPU found on this host (torch.cuda.device_count() and nvidia-smi -L "
                            "found none); name them (--gpus 0,1), or use --workers N for workers without GPUs")
        return gpus
    gpus = [g.strip() for g in spec.split(",")]
    if not all(g.isdigit() or g.startswith(("GPU-", "MIG-")) for g in gpus):
        raise UserError(f"--gpus {spec}: give 'all' or GPU indices separated by commas, e.g. --gpus 0,1,5")
    if len(set(gpus)) != len(gpus):
        raise UserError(f"--gpus {spec}: a GPU is named twice; one worker per GPU")
    return gpus


def plan_local(argv: tuple[str, ...], workers: int | None, gpus: list[str] | None,
               extra: tuple[tuple[str, str], ...] = ()) -> list[WorkerSpec]:
    """The local workers: one per GPU of ``gpus`` (CUDA_VISIBLE_DEVICES set to it), else ``workers``;
    ``extra``: environment every worker gets (its storage)."""
    count = len(gpus) if gpus else (workers or 1)
    share = (COMPILE_WORKERS_ENV, str(compile_share(count)))
    if gpus:
        return [WorkerSpec(i + 1, argv, (("CUDA_VISIBLE_DEVICES", gpu), share, *extra)) for i, gpu in enumerate(gpus)]
    return [WorkerSpec(i + 1, argv, (share, *extra)) for i in range(count)]


def start_worker(spec: WorkerSpec, relay: Relay, cwd: str | None = None) -> tuple[subprocess.Popen, list[threading.Thread]]:
    """Start one worker in a session of its own (a terminal's Ctrl-C reaches only the launcher,
    which forwards it once), its output pumped into ``relay``."""
    proc = subprocess.Popen(list(spec.argv), env=spec.environment(dict(os.environ)), cwd=cwd, stdin=subprocess.DEVNULL,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, bufsize=1,
                            start_new_session=True, preexec_fn=die_with_launcher)
    assert proc.stdout is not None and proc.stderr is not None
    threads = [pump(proc.stdout, lambda t: relay.line(spec.label, "stdout", t)),
               pump(proc.stderr, lambda t: relay.line(spec.label, "stderr", t))]
    return proc, threads


def run_local(specs: list[WorkerSpec], relay: Relay, stop: Stop) -> int:
    """Start ``specs``, forward signals to them, wait for all; the launcher's exit status."""
    procs: list[subprocess.Popen] = []
    threads: list[threading.Thread] = []
    failures: list[int] = []
    forwarded = 0
    for spec in specs:
        if stop.signum is not None:  # stopped during start-up: start no more
            break
        proc, pumps = start_worker(spec, relay)
        procs.append(proc)
        threads += pumps
    running = set(range(len(procs)))
    while running:
        if stop.count > forwarded:
            forwarded = stop.count
            for i in running:
                procs[i].send_signal(stop.forward_signal())
        for i in sorted(running):
            code = procs[i].poll()
            if code is not None:
                running.discard(i)
                if code != 0:
                    failures.append(code)
        stop.event.wait(0.1)
        stop.event.clear()
    for thread in threads:
        thread.join(10)
    return exit_status(stop, failures)


def launch(ctx: click.Context, workers: int | None, gpus: str | None, ray: str | None) -> int:
    """Run the ``search`` invocation ``ctx`` as many workers (see the module docstring); the exit
    status. Signals are handled from the first line on: Ctrl-C or SIGTERM during start-up exits
    130 or 143 without a traceback."""
    stop = Stop()
    stop.install()
    try:
        return _launch(ctx, workers, gpus, ray, stop)
    finally:
        stop.uninstall()


def _launch(ctx: click.Context, workers: int | None, gpus: str | None, ray: str | None, stop: Stop) -> int:
    from kernelforge.cli.common import load_job

    given = [name for name, value in (("--workers", workers), ("--gpus", gpus), ("--ray", ray)) if value is not None]
    if len(given) > 1:
        raise UserError(f"{' and '.join(given)}: choose one way to start workers")
    params = ctx.params
    job, catalog = load_job(ctx, params["job_file"], params.get("storage"))
    device = params.get("device_name") or job.device
    mode = params.get("progress_mode") or ("live" if sys.stdout.isatty() else "jsonl")
    relay = Relay(mode)
    storage = ((STORAGE_ENV, params["storage"]),) if params.get("storage") else ()
    if ray is not None:
        from kernelforge.cli.launch.ray_cluster import run_ray

        code = run_ray(worker_argv(ctx), job, ray, relay, stop, storage)
    else:
        check_shareable_storage(job.storage_url)
        pinned = None
        if gpus is not None:
            if not (device == "cuda" or device.startswith("cuda:")):
                raise UserError(f"--gpus starts one worker per GPU, but the device is {device!r}; use --device cuda, "
                                "or --workers N for workers without GPUs")
            pinned = parse_gpus(gpus)
            device = "cuda"  # each worker sees only its GPU: cuda:0 there
        argv = worker_argv(ctx, device=device if pinned else None)
        if stop.signum is not None:
            return exit_status(stop, [])
        code = run_local(plan_local(argv, workers, pinned, storage), relay, stop)
    finish(job, catalog, relay, stop, report=params.get("report", True))
    return code


def finish(job: Any, catalog: Any, relay: Relay, stop: Stop, *, report: bool) -> None:
    """The report, written once for all workers (not after a second signal), and the summary."""
    from kernelforge.cli.summary import print_summary
    from kernelforge.report.write import write_report
    from kernelforge.search.evaluation_loop import SearchOutcome
    from kernelforge.store.store import Store

    if stop.count > 1:  # killed: as fast as possible
        return
    try:
        store = Store(job.storage_url, create=False)
    except UserError:
        return  # no database (deleted under the workers, who said so): no summary of results not there
    try:
        path = write_report(job, catalog, store) if report else None
        outcome = SearchOutcome(evaluations=relay.evaluations, duplicates=relay.duplicates,
                                stopped=stop.signum is not None)
        print_summary(job, catalog, store, outcome, path)
    finally:
        store.close()
