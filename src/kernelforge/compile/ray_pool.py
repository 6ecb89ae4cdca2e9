"""Compile work on a Ray cluster's CPU workers: :class:`RayCompilePool`.

The pool has the :class:`kernelforge.compile.pool.CompilePool` interface (``submit`` -> a
concurrent Future of a :class:`~kernelforge.compile.resources.CompileReport`; ``shutdown``). Each
compile is a ``ray.remote(num_cpus=1)`` task that runs it in a
:class:`~kernelforge.compile.sandboxed.SandboxedCompilePool` of that Ray worker process (one
sandboxed compile process, kept for the worker's later tasks): the same policy check, sandbox,
limits and timeout as a local compile. The kernels folder must be at the same path on every host
(the same checkout). A policy violation is answered at once, without a task.

A search worker started by ``--ray`` finds the cluster's address in :data:`RAY_COMPILE_ENV`;
:func:`pool_from_environment` connects to it and returns the pool, which the search uses in place
of its local one.
"""

from __future__ import annotations

import os
from concurrent.futures import Future
from pathlib import Path
from typing import Any

from kernelforge.compile.pool import refused_compile
from kernelforge.compile.resources import CompileReport
from kernelforge.result import Status
from kernelforge.targets import default_target, parse_target

#: The Ray cluster a worker sends its compiles to (set by the ``--ray`` launcher).
RAY_COMPILE_ENV = "KERNELFORGE_RAY_COMPILE"

#: The sandboxed pool of this process when it is a Ray worker running compile tasks.
_WORKER_POOL: Any = None


def compile_task(source: str, block_id: str, kernels_root: str, dtype: str, target: str, timeout: float) -> CompileReport:
    """One compile in a Ray worker: through this worker's one-process sandboxed pool (created on
    its first task), so every compile gets the local pool's sandbox and timeout."""
    global _WORKER_POOL
    from kernelforge.compile.sandboxed import SandboxedCompilePool

    if _WORKER_POOL is None or _WORKER_POOL.timeout != timeout:
        _WORKER_POOL = SandboxedCompilePool(max_workers=1, timeout=timeout)
    return _WORKER_POOL.submit(source, block_id, kernels_root, dtype, target).result()


def dtype_name(dtype: Any) -> str:
    """A dtype's name in :data:`kernelforge.block.DTYPES` (a torch dtype or already its name)."""
    from kernelforge.block import DTYPES

    if isinstance(dtype, str):
        return dtype.removeprefix("torch.")
    return next(name for name, value in DTYPES.items() if value == dtype)


class RayCompilePool:
    """Compiles on the connected Ray cluster's CPUs (see the module docstring). ``ray`` must be
    initialised (``ray.init``) before the first ``submit``."""

    def __init__(self, timeout: float = 120, num_cpus: float = 1):
        import ray

        self.timeout = timeout
        self._task = ray.remote(num_cpus=num_cpus, max_retries=1)(compile_task)
        self._refs: list[Any] = []

    def submit(self, source: str, block_id: str, kernels_root: str | Path, dtype: Any,
               target: str | None = None) -> Future:
        """Queue one compile (the arguments of :meth:`CompilePool.submit`); a Future of its report."""
        refused = refused_compile(source, target)
        if refused is not None:
            return refused
        tgt = parse_target(target if target is not None else default_target())
        ref = self._task.remote(source, block_id, str(Path(kernels_root).resolve()), dtype_name(dtype), tgt.name,
                                self.timeout)
        self._refs = [r for r in self._refs if not _done(r)] + [ref]
        return ref.future()

    def compile_alone(self, source: str, block_id: str, kernels_root: str | Path, dtype: Any,
                      target: str | None = None) -> CompileReport:
        """:meth:`CompilePool.compile_alone` on the cluster: a Ray task fails alone, so a task that
        fails again (after Ray's retry) is this candidate's ``compile_error``."""
        try:
            return self.submit(source, block_id, kernels_root, dtype, target).result()
        except Exception as exc:  # the task's process died (Ray's error names how)
            name = parse_target(target if target is not None else default_target()).name
            return CompileReport.failed(name, Status.COMPILE_ERROR,
                                        f"the compile task died while compiling this candidate ({type(exc).__name__})")

    def shutdown(self, wait: bool = True, cancel_futures: bool = False) -> None:
        """Cancel the compiles not finished when ``cancel_futures``; wait for the others when ``wait``."""
        import ray

        if cancel_futures:
            for ref in self._refs:
                ray.cancel(ref)
        elif wait and self._refs:
            ray.wait(self._refs, num_returns=len(self._refs))
        self._refs = []

    def __enter__(self) -> "RayCompilePool":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.shutdown(wait=True, cancel_futures=True)


def pool_from_environment() -> RayCompilePool | None:
    """The pool of the Ray cluster named by :data:`RAY_COMPILE_ENV` (connected now), or None when
    it is not set. Ray's init replaces the process's SIGTERM handler: the caller re-installs its own."""
    address = os.environ.get(RAY_COMPILE_ENV)
    if not address:
        return None
    import ray

    ray.init(address=address, ignore_reinit_error=True, log_to_driver=False, configure_logging=False)
    return RayCompilePool()


def _done(ref: Any) -> bool:
    import ray

    ready, _ = ray.wait([ref], timeout=0)
    return bool(ready)
