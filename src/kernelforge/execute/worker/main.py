"""The worker process: runs candidates for :class:`kernelforge.execute.worker.runner.WorkerRunner`.

Started as ``python -m kernelforge.execute.worker.main FD_IN FD_OUT PARENT_PID LIMIT FD_ARENA``
(by :class:`~kernelforge.execute.worker.process.WorkerProcess` only) in the sandbox of
:mod:`kernelforge.sandbox.roles`: limits set before anything heavy is imported, killed with its
parent, the OS sandbox applied after the imports and before any candidate is loaded. ``FD_ARENA``
is the shared arena (:mod:`kernelforge.execute.worker.arena`) the trusted process places tensors in.
It builds its own copy of the search's device (the :class:`~kernelforge.execute.worker.protocol.Init`
request), then answers requests (in on ``FD_IN``, out on ``FD_OUT``, never stdout, which candidate
code could write to), all of them records of :mod:`kernelforge.execute.worker.protocol`:
:class:`~kernelforge.execute.worker.serve.WorkerSession` answers a candidate's requests, this module
:class:`~kernelforge.execute.worker.protocol.Probe` and :class:`~kernelforge.execute.worker.protocol.Exit`.

The worker decides no verdict: it loads candidates and calls them on tensors the trusted process
shares with it, and reports what it saw. A failure of the harness itself is answered
:class:`~kernelforge.execute.worker.protocol.HarnessError` and ends the worker.
"""

from __future__ import annotations

import os
import sys
import threading
import traceback
from multiprocessing.connection import Connection
from typing import Any, Callable

from kernelforge.sandbox.roles import apply_worker_sandbox, die_with_parent, limit_process
from kernelforge.textsafe import LINE, MESSAGE, cut, error_text


def _make_device(init: Any) -> Any:
    import importlib

    import torch

    if init.threads:
        torch.set_num_threads(int(init.threads))
    # Start torch's intra-op thread pool now (it starts at the first parallel operation): the
    # trusted side counts this process's threads around every call, and a pool started inside an
    # honest candidate's call would look like a thread the candidate left running.
    torch.zeros(1 << 20).add_(1.0)
    module_name, _, class_name = init.device_class.partition(":")
    device = getattr(importlib.import_module(module_name), class_name)(**init.device_kwargs)
    device.prepare()
    return device


def _health_check(device: Any) -> Callable[[], str | None]:
    """A function saying why this worker must no longer serve candidates (or None): a candidate
    changed it (patched a harness function, left a thread running, flipped the interpreter
    switch, kept device memory allocated), or the CUDA context is broken. Compared with the worker as it is now, clean."""
    import triton

    from kernelforge.execute.judge.harness import harness_changes, harness_snapshot
    from kernelforge.execute.worker.memory_watch import device_growth_reason

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
                return error_text(exc, LINE)
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
    """Answer requests until :class:`Exit`, the pipe's end, or a reason to retire."""
    from kernelforge.execute.worker import protocol as wire

    init = wire.decode_request(receive.recv_bytes())
    assert isinstance(init, wire.Init)
    try:
        import resource

        device = _make_device(init)
        from kernelforge.execute.worker.arena import ArenaView
        from kernelforge.execute.worker.serve import WorkerSession
        apply_worker_sandbox(device.sandbox_role)  # Landlock and seccomp: after the imports, before any candidate
    except BaseException as exc:
        send.send_bytes(wire.encode_answer(wire.InitError(f"{type(exc).__name__}: {exc}")))
        return
    limit = resource.getrlimit(resource.RLIMIT_AS)[0]
    send.send_bytes(wire.encode_answer(wire.Ready(os.getpid(), device.name, limit if limit >= 0 else -1)))
    session = WorkerSession(device, ArenaView(arena_fd) if arena_fd >= 0 else None, _health_check(device))
    while True:
        try:
            request = wire.decode_request(receive.recv_bytes())
        except (EOFError, OSError):
            return
        if isinstance(request, wire.Exit):
            return
        try:
            answer = wire.Probed(_probe()) if isinstance(request, wire.Probe) else session.handle(request)
        except Exception as exc:  # a bug of the harness surfaced by a candidate: reported, then a fresh worker
            send.send_bytes(wire.encode_answer(wire.HarnessError(
                cut(f"{type(exc).__name__}: {exc}\n{traceback.format_exc(limit=6)}", 2 * MESSAGE))))
            return
        send.send_bytes(wire.encode_answer(answer))
        if isinstance(answer, wire.Released) and answer.retire:
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
