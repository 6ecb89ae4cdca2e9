"""The worker process: serves evaluation requests from :class:`kernelforge.execute.worker.WorkerExecutor`.

Started as ``python -m kernelforge.execute.worker_main FD_IN FD_OUT PARENT_PID LIMIT`` (by the
executor only) in the sandbox of :mod:`kernelforge.execute.sandbox`: limits set before anything
heavy is imported, killed with its parent. It builds its own copy of the search's device, then
answers requests (pickles over the two pipes ``FD_IN``/``FD_OUT``, never stdout, which candidate
code could write to):

- ``("evaluate", root, block_id, source, shapes, dtype, deterministic, held_out)``: streams
  ``("step", label)`` when a step starts and ``("result", evaluation)`` for each shape (verdicts,
  tracebacks and timings as :func:`kernelforge.execute.evaluate.evaluate` made them), then
  ``("done", reason)`` where ``reason`` (or None) says why this worker must not serve another
  candidate;
- ``("pairs", root, block_id, baseline, candidate, shape, dtype, pairs)``: ``("pairs", speedups)``;
- ``("probe",)``: what the worker sees (environment names, directory, limits), for tests;
- ``("exit",)``.

A harness or user error is answered ``("error", kind, message)``.
"""

from __future__ import annotations

import os
import re
import sys
import threading
import traceback
from multiprocessing.connection import Connection
from typing import Any, Callable

from kernelforge.errors import UserError
from kernelforge.execute.sandbox import die_with_parent, limit_process

#: Markers of a CUDA error in a result message: the context is unusable after one.
CUDA_ERROR = re.compile(r"CUDA error|illegal memory access|device-side assert|unspecified launch failure|"
                        r"misaligned address|CUDA_ERROR|cudaError|an illegal instruction", re.IGNORECASE)


class _Retire(Exception):
    """Stop the current request and retire the worker (CUDA context poisoned)."""


def _make_device(spec: tuple[str, dict[str, Any]], threads: int | None) -> Any:
    import importlib

    import torch

    if threads:
        torch.set_num_threads(int(threads))
    module_name, _, class_name = spec[0].partition(":")
    device = getattr(importlib.import_module(module_name), class_name)(**spec[1])
    device.prepare()
    return device


def _health_check(device: Any) -> Callable[[], str | None]:
    """A function saying why this worker must no longer serve candidates (or None): a candidate
    changed it (patched a harness function, left a thread running, flipped the interpreter
    switch), or the CUDA context is broken. Compared with the worker as it is now, clean."""
    import triton

    from kernelforge.execute.harness import harness_changes, harness_snapshot

    pristine = harness_snapshot()
    threads = threading.active_count()

    def switches() -> tuple:
        knobs = getattr(triton, "knobs", None)
        return (os.environ.get("TRITON_INTERPRET"), getattr(getattr(knobs, "runtime", None), "interpret", None))

    settings = switches()

    def healthy() -> str | None:
        changed = harness_changes(pristine)
        if changed:
            return f"a candidate replaced {', '.join(changed[:3])}"
        if threading.active_count() > threads:
            return "a candidate left threads running"
        if switches() != settings:
            return "a candidate changed Triton's interpreter switch"
        if device.name == "cuda":
            try:
                device.synchronize()
            except Exception as exc:  # a sticky CUDA error surfaces at the next synchronisation
                return f"{type(exc).__name__}: {exc}"[:300]
        return None

    return healthy


def _probe() -> dict[str, Any]:
    import resource

    import torch

    environ = open("/proc/self/environ", "rb").read().decode("utf-8", "replace").split("\0") \
        if os.path.exists("/proc/self/environ") else []
    return {
        "pid": os.getpid(), "cwd": os.getcwd(), "env": sorted(os.environ),
        "exec_env": sorted(e.split("=", 1)[0] for e in environ if e),
        "rlimit_as": resource.getrlimit(resource.RLIMIT_AS)[0], "threads": torch.get_num_threads(),
        "interpret": os.environ.get("TRITON_INTERPRET"),
    }


def serve(receive: Connection, send: Connection) -> None:
    """Answer requests until ``exit``, the pipe's end, or a reason to retire."""
    kind, device_spec, threads = receive.recv()
    assert kind == "init"
    try:
        import resource

        device = _make_device(device_spec, threads)
        from kernelforge.block import DTYPES, HarnessError
        from kernelforge.catalog import Catalog
        from kernelforge.execute import evaluate as evaluate_module
    except BaseException as exc:
        send.send(("init_error", f"{type(exc).__name__}: {exc}"))
        return
    send.send(("ready", {"pid": os.getpid(), "device": device.name,
                         "memory_limit": resource.getrlimit(resource.RLIMIT_AS)[0]}))
    catalogs: dict[str, Any] = {}

    def block_of(root: str, block_id: str) -> Any:
        if root not in catalogs:
            catalogs[root] = Catalog.discover(root)
        return catalogs[root].block(block_id)

    healthy = _health_check(device)
    while True:
        try:
            message = receive.recv()
        except (EOFError, OSError):
            return
        kind = message[0]
        if kind == "exit":
            return
        if kind == "probe":
            send.send(("probe", _probe()))
            continue
        try:
            if kind == "evaluate":
                _, root, block_id, source, shapes, dtype_name, deterministic, held_out = message
                block = block_of(root, block_id)

                def on_result(ev: Any) -> None:
                    send.send(("result", ev))
                    if device.name == "cuda" and CUDA_ERROR.search(ev.verification.message or ""):
                        raise _Retire("CUDA error: " + ev.verification.message[:200])

                try:
                    evaluate_module.evaluate(block, source, shapes, DTYPES[dtype_name], device,
                                             deterministic=deterministic, held_out=held_out,
                                             on_step=lambda label: send.send(("step", label)), on_result=on_result)
                except _Retire as exc:
                    send.send(("done", str(exc)))
                    return
                send.send(("done", healthy()))
            elif kind == "pairs":
                _, root, block_id, base_src, cand_src, shape, dtype_name, pairs = message
                block = block_of(root, block_id)
                speedups = evaluate_module.pair_speedups(block, base_src, cand_src, shape, DTYPES[dtype_name], device,
                                                         pairs)
                send.send(("pairs", speedups))
                if healthy() is not None:
                    return
        except (HarnessError, UserError) as exc:
            send.send(("error", type(exc).__name__, str(exc)))
        except Exception as exc:  # a bug of the harness surfaced by a candidate: reported, then a fresh worker
            send.send(("error", "internal", f"{type(exc).__name__}: {exc}\n{traceback.format_exc(limit=6)}"))
            return


def main(argv: list[str]) -> None:
    """Entry of the worker process (see the module docstring for the arguments)."""
    fd_in, fd_out, parent_pid, limit = (int(a) for a in argv[:4])
    # Limits first: nothing heavy is imported yet, so the limit covers everything after.
    limit_process(limit)
    die_with_parent(parent_pid)
    receive = Connection(fd_in, writable=False)
    send = Connection(fd_out, readable=False)
    try:
        serve(receive, send)
    finally:
        try:
            send.close()
        except OSError:
            pass


if __name__ == "__main__":
    main(sys.argv[1:])
