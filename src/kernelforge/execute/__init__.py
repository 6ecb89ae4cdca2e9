"""Running candidates: where a candidate is verified and timed.

- :mod:`.executor`: the executor seam and the one factory that picks it (in-process, the sandboxed
  worker of :mod:`.worker`, replay of a recording).
- :mod:`.evaluate`: one candidate over a list of shapes: load, verify, then time what verified.
- :mod:`.runner`: the runner seam below the executors (what calls a candidate for the judge), and
  :mod:`.trusted_runner` for the blocks' library references.
- :mod:`.judge`: the trusted verdict of a shape.
- :mod:`.timing`: timing rounds and their checks, and the timing cross-check.
- :mod:`.worker`: the sandboxed worker process and its typed protocol.
- :mod:`.inprocess` and :mod:`.replay`: the other two executors.

The static policy and the OS sandbox are packages of their own (:mod:`kernelforge.policy`,
:mod:`kernelforge.sandbox`), since the compile pool uses them too.
"""

__all__ = ["executor", "evaluate", "runner", "trusted_runner", "judge", "timing", "worker", "inprocess", "replay"]
