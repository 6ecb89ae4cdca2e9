"""The compile pool for untrusted sources: the search's compile pool.

Compiling ahead of time runs a candidate's host code (to capture its launches), so its processes
get the sandbox of the evaluation worker (:mod:`kernelforge.sandbox.roles`): started with an
environment built from the allowlist (their exec environment: the search's secrets are never in
them, not even in ``/proc/self/environ``), in a temporary folder of the pool's own, under the
worker's address-space limit, dying with the search, and confined by Landlock and seccomp as the
``compiler`` role (ptxas may run; nothing else may be executed, written outside the folder or
read outside the system, Python and the kernels folders; no network).
"""

from __future__ import annotations

import os
import shutil
import tempfile
from concurrent.futures import Future, ProcessPoolExecutor
from pathlib import Path
from typing import Any

from kernelforge.compile.pool import CompilePool, prepare_pool_worker, refused_compile
from kernelforge.compile.spawning import EnvironmentSpawnContext
from kernelforge.sandbox.roles import (Role, apply_sandbox, default_memory_limit, die_with_parent, limit_process,
                                         sandbox_environment)


def sandboxed_pool_initializer(memory_limit: int | None, parent_pid: int, temp_dir: str,
                               read_roots: tuple[str, ...]) -> None:
    """Initializer of a :class:`SandboxedCompilePool` process (already started with the sandbox
    environment): die with the search (a pool process holds its parent's stdout and a queue
    whose write end it holds itself, so after a SIGKILLed search it would wait forever), work in
    the pool's folder under the memory limit, import what a compile needs, then confine itself."""
    die_with_parent(parent_pid)
    os.chdir(temp_dir)
    tempfile.tempdir = None  # TMPDIR is the pool's folder (spawn may have asked tempfile before)
    limit_process(memory_limit)
    prepare_pool_worker()
    apply_sandbox(Role.COMPILER, temp_dir, read_roots)


class SandboxedCompilePool(CompilePool):
    """:class:`kernelforge.compile.pool.CompilePool` for untrusted sources: ``submit`` answers a
    policy violation at once (a ``rejected`` compile report; nothing is run), and its processes
    run in the sandbox (see the module docstring) before any candidate is imported.

    Its processes may read the kernels folders named so far: a ``submit`` from another folder
    starts fresh processes that may read it too (work already queued finishes in the old ones).
    ``close``/``shutdown`` removes the pool's folder.
    """

    def __init__(self, max_workers: int | None = None, timeout: float = 120, memory_limit: int | None = None,
                 kernels_roots: tuple[str, ...] = ()):
        super().__init__(max_workers=max_workers, timeout=timeout)
        self.memory_limit = default_memory_limit() if memory_limit is None else (memory_limit or None)
        self.kernels_roots = tuple(str(Path(r).resolve()) for r in kernels_roots)
        self._folder: str | None = None

    def _new_executor(self) -> ProcessPoolExecutor:
        if self._folder is None:
            self._folder = tempfile.mkdtemp(prefix="kernelforge-compile-")
        environment = sandbox_environment(self._folder, read_roots=self.kernels_roots)
        return ProcessPoolExecutor(max_workers=self.max_workers, mp_context=EnvironmentSpawnContext(environment),
                                   initializer=sandboxed_pool_initializer,
                                   initargs=(self.memory_limit, os.getpid(), self._folder, self.kernels_roots))

    def single(self) -> "SandboxedCompilePool":
        return SandboxedCompilePool(max_workers=1, timeout=self.timeout, memory_limit=self.memory_limit or 0,
                                    kernels_roots=self.kernels_roots)

    def submit(self, source: str, block_id: str, kernels_root: Any, dtype: Any, target: str | None = None) -> Future:
        refused = refused_compile(source, target)
        if refused is not None:
            return refused
        root = str(Path(kernels_root).resolve())
        if root not in self.kernels_roots:  # the processes' sandbox cannot read it: new processes
            self.kernels_roots += (root,)
            if self._executor is not None:
                self._executor.shutdown(wait=False)
                self._executor = None
        return super().submit(source, block_id, kernels_root, dtype, target)

    def shutdown(self, wait: bool = True, cancel_futures: bool = False) -> None:
        super().shutdown(wait=wait, cancel_futures=cancel_futures)
        if self._folder is not None:
            shutil.rmtree(self._folder, ignore_errors=True)
            self._folder = None
