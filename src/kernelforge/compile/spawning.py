"""multiprocessing's ``spawn`` start, as kernelforge's compile processes use it: each child is
exec'd with an environment of the caller's choosing, and never re-runs the caller's main module.

Plain ``spawn`` re-imports the parent's ``__main__`` in every child, so a script that calls the
search at top level (the README's Python example saved to a file) would start the search again in
each child and die there with multiprocessing's bootstrapping error. kernelforge's children run
only kernelforge functions, so they need nothing of the main module: :func:`without_main` drops
it from what the child prepares, and no ``if __name__ == "__main__":`` guard is needed.
"""

from __future__ import annotations

import io
import multiprocessing.context as mp_context
import os
import subprocess
from multiprocessing import popen_spawn_posix, reduction, spawn, util
from typing import Any


def without_main(prep_data: dict[str, Any]) -> dict[str, Any]:
    """``spawn.get_preparation_data``'s dict without the entries that make the child import the
    parent's main module (by path or by name)."""
    return {k: v for k, v in prep_data.items() if k not in ("init_main_from_path", "init_main_from_name")}


def _spawn(path: str, args: list[str], fds: list[int], environment: dict[str, str]) -> int:
    """``multiprocessing.util.spawnv_passfds`` with the child's environment given."""
    child = subprocess.Popen(args, executable=path, env=environment, pass_fds=tuple(sorted(set(fds))),
                             close_fds=True)
    child.returncode = 0  # multiprocessing waits for this child (os.waitpid); subprocess must not
    return child.pid


class _EnvironmentPopen(popen_spawn_posix.Popen):
    """The ``spawn`` start of a process (CPython's ``popen_spawn_posix.Popen._launch``, unchanged
    since 3.8), except that the child is exec'd with ``process_obj.environment`` instead of this
    process's environment, and does not re-run the caller's main module (:func:`without_main`)."""

    def _launch(self, process_obj: Any) -> None:
        from multiprocessing import resource_tracker

        tracker_fd = resource_tracker.getfd()
        self._fds.append(tracker_fd)
        prep_data = without_main(spawn.get_preparation_data(process_obj._name))
        fp = io.BytesIO()
        mp_context.set_spawning_popen(self)
        try:
            reduction.dump(prep_data, fp)
            reduction.dump(process_obj, fp)
        finally:
            mp_context.set_spawning_popen(None)
        parent_r = child_w = child_r = parent_w = None
        try:
            parent_r, child_w = os.pipe()
            child_r, parent_w = os.pipe()
            cmd = spawn.get_command_line(tracker_fd=tracker_fd, pipe_handle=child_r)
            self._fds.extend([child_r, child_w])
            self.pid = _spawn(spawn.get_executable(), cmd, self._fds, process_obj.environment)
            self.sentinel = parent_r
            with open(parent_w, "wb", closefd=False) as f:
                f.write(fp.getbuffer())
        finally:
            self.finalizer = util.Finalize(self, util.close_fds, [fd for fd in (parent_r, parent_w) if fd is not None])
            for fd in (child_r, child_w):
                if fd is not None:
                    os.close(fd)


class _EnvironmentProcess(mp_context.SpawnProcess):
    environment: dict[str, str] = {}

    @staticmethod
    def _Popen(process_obj: Any) -> _EnvironmentPopen:
        return _EnvironmentPopen(process_obj)


class EnvironmentSpawnContext(mp_context.SpawnContext):
    """multiprocessing's ``spawn`` context whose processes start with exactly ``environment``."""

    def __init__(self, environment: dict[str, str]):
        super().__init__()
        self.environment = dict(environment)

    def Process(self, *args: Any, **kwargs: Any) -> _EnvironmentProcess:  # noqa: N802 - multiprocessing's name
        process = _EnvironmentProcess(*args, **kwargs)
        process.environment = self.environment
        return process


def spawn_context(environment: dict[str, str] | None = None) -> EnvironmentSpawnContext:
    """A ``spawn`` context whose children start with ``environment`` (default: a copy of this
    process's environment at the time of the call) and never import the caller's main module."""
    return EnvironmentSpawnContext(dict(os.environ) if environment is None else environment)
