"""``kernelforge search JOB --ray [ADDRESS]``: one worker per GPU of a Ray cluster.

The driver connects to the cluster (``ray.init(address=ADDRESS)``, ``auto`` by default), counts
its GPUs (``ray.cluster_resources()["GPU"]``) and runs that many Ray tasks with ``num_gpus=1``.
Each task runs the same worker command line as a local launcher would
(``kernelforge.cli.launch.local.worker_argv``) as a subprocess, in the driver's working folder:
Ray sets CUDA_VISIBLE_DEVICES for the task and the subprocess inherits it. Ray only places the
workers; the workers cooperate through the job's database. Every host therefore needs the same
checkout at the same path (the same virtualenv, the job file, the kernels) and a storage URL all
of them reach (PostgreSQL; a SQLite file only on a one-node cluster).

The workers' output comes back through a small actor (:class:`LineHub`) and is relayed as the
local launcher relays it. Ctrl-C or SIGTERM of the driver tells the hub which signal it was and
cancels the tasks (``ray.cancel``); a cancelled task forwards that signal to its subprocess and
waits for it. Exit statuses are the local launcher's.
"""

from __future__ import annotations

import os
import signal
import subprocess
import threading
import time
from typing import Any

from kernelforge.errors import UserError
from kernelforge.compile.ray_pool import RAY_COMPILE_ENV
from kernelforge.compile.pool import COMPILE_WORKERS_ENV
from kernelforge.cli.launch.supervise import (Relay, Stop, WorkerSpec, check_shareable_storage,
                                          die_with_launcher, exit_status)

#: How long a cancelled task waits for its worker to stop before killing it.
STOP_GRACE_S = 120.0


def connect(address: str) -> Any:
    """``ray`` connected to the cluster at ``address``; UserError when Ray is missing or no
    cluster answers."""
    try:
        import ray
    except ImportError:
        raise UserError("--ray needs Ray, which is not installed: pip install kernelforge[ray]") from None
    _probe(address)
    try:
        ray.init(address=address, log_to_driver=False, ignore_reinit_error=True, include_dashboard=False)
    except (ConnectionError, RuntimeError, ValueError) as exc:
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise UserError(f"--ray {address}: no Ray cluster answers ({first}); start one (ray start --head on "
                        "the head node, ray start --address HEAD:PORT on the others) or give its address") from None
    return ray


def _probe(address: str) -> None:
    """A HOST:PORT address that nobody listens on is refused at once (ray.init would retry for
    minutes); ``auto`` and ``ray://`` addresses are left to Ray."""
    import socket

    host, sep, port = address.rpartition(":")
    if not sep or not port.isdigit() or "://" in address:
        return
    try:
        socket.create_connection((host or "127.0.0.1", int(port)), timeout=10).close()
    except OSError as exc:
        raise UserError(f"--ray {address}: no Ray cluster answers ({exc.strerror or exc}); start one (ray start "
                        "--head on the head node) or give the address it printed") from None


class LineHub:
    """The actor between the tasks and the driver: the workers' output lines, and the signal the
    driver received (what a cancelled task forwards)."""

    def __init__(self) -> None:
        self.lines: list[tuple[str, str, str]] = []
        self.signum: int | None = None

    def put(self, batch: list[tuple[str, str, str]]) -> None:
        self.lines.extend(batch)

    def take(self) -> list[tuple[str, str, str]]:
        batch, self.lines = self.lines, []
        return batch

    def set_signal(self, signum: int) -> None:
        self.signum = signum

    def stop_signal(self) -> int | None:
        return self.signum


def run_worker_task(spec: WorkerSpec, cwd: str, hub: Any) -> int:
    """The body of a worker task: run ``spec`` as a subprocess in ``cwd`` with the task's
    environment (CUDA_VISIBLE_DEVICES from Ray) plus ``spec.env``; send its lines to ``hub``;
    return its exit status. Cancelled (KeyboardInterrupt), it forwards the driver's signal to
    the subprocess and waits up to STOP_GRACE_S for it."""
    import ray

    batch: list[tuple[str, str, str]] = []
    lock = threading.Lock()
    proc = subprocess.Popen(list(spec.argv), cwd=cwd, env=spec.environment(dict(os.environ)), stdin=subprocess.DEVNULL,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, bufsize=1,
                            start_new_session=True, preexec_fn=die_with_launcher)

    def pump(stream: Any, name: str) -> None:
        for text in stream:
            with lock:
                batch.append((spec.label, name, text))

    pumps = [threading.Thread(target=pump, args=(proc.stdout, "stdout"), daemon=True),
             threading.Thread(target=pump, args=(proc.stderr, "stderr"), daemon=True)]
    for thread in pumps:
        thread.start()

    def flush(wait: bool = False) -> None:
        with lock:
            taken = batch[:]
            batch.clear()
        if taken:
            ref = hub.put.remote(taken)
            if wait:
                ray.get(ref)

    try:
        while proc.poll() is None:
            time.sleep(0.2)
            flush()
    except KeyboardInterrupt:  # ray.cancel: stop the worker as the driver was stopped
        try:
            signum = ray.get(hub.stop_signal.remote(), timeout=10) or signal.SIGTERM
        except Exception:  # the hub is gone with the driver: stop anyway
            signum = signal.SIGTERM
        proc.send_signal(signum)
        try:
            proc.wait(STOP_GRACE_S)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        raise
    finally:
        for thread in pumps:
            thread.join(10)
        try:
            flush(wait=True)
        except Exception:  # the driver is gone: nobody to relay to
            pass
    return proc.returncode


def run_ray(argv: tuple[str, ...], job: Any, address: str, relay: Relay, stop: Stop,
            extra: tuple[tuple[str, str], ...] = ()) -> int:
    """Run the worker command line ``argv`` of ``job`` as one Ray task per GPU of the cluster at
    ``address`` (``extra``: environment every worker gets); the exit status."""
    try:
        ray = connect(address)
    except SystemExit as exc:  # ray.init's own SIGTERM handler, while it connected
        if exc.code != signal.SIGTERM:
            raise
        stop.signum, stop.count = stop.signum or signal.SIGTERM, stop.count + 1
        return exit_status(stop, [])
    stop.reclaim()
    try:
        gpus = int(ray.cluster_resources().get("GPU", 0))
        if gpus < 1:
            raise UserError(f"--ray {address}: the cluster has no GPU; start its nodes with their GPUs "
                            "(ray start ... --num-gpus N), or use --workers N on one host")
        hosts = sum(1 for node in ray.nodes() if node.get("Alive"))
        check_shareable_storage(job.storage_url, many_hosts=hosts > 1)
        cpus = int(ray.cluster_resources().get("CPU", 1))
        share = (COMPILE_WORKERS_ENV, str(max(1, cpus // gpus)))
        # Compiles go to the cluster's CPUs (RayCompilePool): each worker connects to this cluster.
        compiles = (RAY_COMPILE_ENV, ray.get_runtime_context().gcs_address)
        specs = [WorkerSpec(i + 1, argv, (share, compiles, *extra)) for i in range(gpus)]
        if stop.signum is not None:
            return exit_status(stop, [])
        hub = ray.remote(num_cpus=0)(LineHub).remote()
        # num_cpus=0: a worker's task only supervises its subprocess, whose device work is on the
        # GPU; the cluster's CPUs stay free for the compile tasks.
        task = ray.remote(num_gpus=1, num_cpus=0, max_retries=0)(run_worker_task)
        refs = {task.remote(spec, os.getcwd(), hub): spec for spec in specs}
        return _wait(ray, hub, refs, relay, stop)
    finally:
        ray.shutdown()


def _wait(ray: Any, hub: Any, refs: dict[Any, WorkerSpec], relay: Relay, stop: Stop) -> int:
    """Relay the tasks' lines until every task ends, cancelling them on a signal."""
    from ray.exceptions import RayError, TaskCancelledError

    failures: list[int] = []
    pending = list(refs)
    cancelled = 0

    def drain() -> None:
        for label, stream, text in ray.get(hub.take.remote()):
            relay.line(label, stream, text)

    while pending:
        if stop.count > cancelled:
            cancelled = stop.count
            ray.get(hub.set_signal.remote(stop.signum))
            for ref in pending:  # a second signal: no grace for the workers
                ray.cancel(ref, force=stop.count > 1)
        done, pending = ray.wait(pending, num_returns=len(pending), timeout=0.3)
        drain()
        for ref in done:
            try:
                code = ray.get(ref)
            except TaskCancelledError:
                continue
            except RayError as exc:
                relay.line(refs[ref].label, "stderr", f"the Ray task failed: {str(exc).splitlines()[0]}")
                code = 1
            if code != 0:
                failures.append(code)
    drain()
    return exit_status(stop, failures)
