"""The worker process: runs candidates for :class:`kernelforge.execute.worker_runner.WorkerRunner`.

Started as ``python -m kernelforge.execute.worker_main FD_IN FD_OUT PARENT_PID LIMIT FD_ARENA``
(by :class:`~kernelforge.execute.worker_process.WorkerProcess` only) in the sandbox of
:mod:`kernelforge.execute.sandbox`: limits set before anything heavy is imported, killed with its
parent, the OS sandbox applied after the imports and before any candidate is loaded. ``FD_ARENA``
is the shared arena (:mod:`kernelforge.execute.arena`) the trusted process places tensors in.
It builds its own copy of the search's device, then answers requests (pickles in on ``FD_IN``;
JSON answers out on ``FD_OUT``, never stdout, which candidate code could write to): see
:class:`~kernelforge.execute.worker_serve.WorkerSession` for the requests, plus ``("probe",)``
(what the worker sees, for tests) and ``("exit",)``.

The worker decides no verdict: it loads candidates and calls them on tensors the trusted process
shares with it, and reports what it saw. A failure of the harness itself is answered
``{"kind": "error"}`` and ends the worker.
"""

from __future__ import annotations

import json
import os
import sys
import threading
import traceback
from multiprocessing.connection import Connection
from typing import Any, Callable

from kernelforge.execute.sandbox import apply_worker_sandbox, die_with_parent, limit_process


def _answer(send: Connection, kind: str, **fields: Any) -> None:
    send.send_bytes(json.dumps({"kind": kind, **fields}).encode("utf-8"))


def _make_device(spec: tuple[str, dict[str, Any]], threads: int | None) -> Any:
    import importlib

    import torch

    if threads:
        torch.set_num_threads(int(threads))
    # Start torch's intra-op thread pool now (it starts at the first parallel operation): the
    # trusted side counts this process's threads around every call, and a pool started inside an
    # honest candidate's call would look like a thread the candidate left running.
    torch.zeros(1 << 20).add_(1.0)
    module_name, _, class_name = spec[0].partition(":")
    device = getattr(importlib.import_module(module_name), class_name)(**spec[1])
    device.prepare()
    return device


def _health_check(device: Any) -> Callable[[], str | None]:
    """A function saying why this worker must no longer serve candidates (or None): a candidate
    changed it (patched a harness function, left a thread running, flipped the interpreter
    switch, kept device memory allocated), or the CUDA context is broken. Compared with the worker as it is now, clean."""
    import triton

    from kernelforge.execute.harness import harness_changes, harness_snapshot
    from kernelforge.execute.memory_watch import device_growth_reason

    pristine = harness_snapshot()
    threads = threading.active_count()

    def switches() -> tuple:
        knobs = getattr(triton, "knobs", None)
        return (os.environ.get("TRITON_INTERPRET"), getattr(getattr(knobs, "runtime", None), "interpret", None))

    settings = switches()
    device_memory = device.memory_held()

    def healthy() -> str | None:
        changed = harness_changes(pristine)
        if changed:
            return f"a candidate replaced {', '.join(changed[:3])}"
        if threading.active_count() > threads:
            return "a candidate left threads running"
        if switches() != settings:
            return "a candidate changed Triton's interpreter switch"
        held = device_growth_reason(device_memory, device.memory_held())
        if held is not None:
            return held
        if device.fatal_errors is not None:  # a device whose errors can stick: surface one now
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


def serve(receive: Connection, send: Connection, arena_fd: int = -1) -> None:
    """Answer requests until ``exit``, the pipe's end, or a reason to retire."""
    kind, device_spec, threads = receive.recv()
    assert kind == "init"
    try:
        import resource

        device = _make_device(device_spec, threads)
        from kernelforge.execute.arena import ArenaView
        from kernelforge.execute.wire import encode
        from kernelforge.execute.worker_serve import WorkerSession
        apply_worker_sandbox(device.sandbox_role)  # Landlock and seccomp: after the imports, before any candidate
    except BaseException as exc:
        _answer(send, "init_error", message=f"{type(exc).__name__}: {exc}")
        return
    _answer(send, "ready", info={"pid": os.getpid(), "device": device.name,
                                 "memory_limit": resource.getrlimit(resource.RLIMIT_AS)[0]})
    session = WorkerSession(device, ArenaView(arena_fd) if arena_fd >= 0 else None, _health_check(device))
    while True:
        try:
            message = receive.recv()
        except (EOFError, OSError):
            return
        kind = message[0]
        if kind == "exit":
            return
        if kind == "probe":
            _answer(send, "probe", info=_probe())
            continue
        try:
            answer = session.handle(message)
        except Exception as exc:  # a bug of the harness surfaced by a candidate: reported, then a fresh worker
            _answer(send, "error", message=f"{type(exc).__name__}: {exc}\n{traceback.format_exc(limit=6)}"[:4000])
            return
        send.send_bytes(encode(**answer))
        if kind == "release" and answer.get("retire"):
            return


def main(argv: list[str]) -> None:
    """Entry of the worker process (see the module docstring for the arguments)."""
    fd_in, fd_out, parent_pid, limit = (int(a) for a in argv[:4])
    arena_fd = int(argv[4]) if len(argv) > 4 else -1
    # Limits first: nothing heavy is imported yet, so the limit covers everything after.
    limit_process(limit)
    die_with_parent(parent_pid)
    receive = Connection(fd_in, writable=False)
    send = Connection(fd_out, readable=False)
    try:
        serve(receive, send, arena_fd)
    finally:
        try:
            send.close()
        except OSError:
            pass


if __name__ == "__main__":
    main(sys.argv[1:])
