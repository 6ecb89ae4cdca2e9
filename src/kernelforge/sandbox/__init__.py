"""The OS sandbox of every process that runs candidate code: the evaluation worker and the compile
pool's processes.

- :mod:`.roles`: the one place a process's confinement is decided, per role (what it may read,
  write and execute, its memory limit, its scrubbed environment), and applied.
- :mod:`.landlock`: Landlock rules (file system, execution, network) for Linux 5.13+.
- :mod:`.seccomp`: the system calls a candidate never needs, refused through libseccomp.

The sandbox is a second wall; the first is the static policy of :mod:`kernelforge.policy`.
"""

__all__ = ["roles", "landlock", "seccomp"]
