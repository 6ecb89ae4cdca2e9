"""The sandboxed worker: candidate code runs in a child process, verdicts are made in this one.

The parent's side:

- :mod:`.executor`: :class:`~kernelforge.execute.worker.executor.WorkerExecutor`, the default
  executor of a search (checks the policy, keeps a worker per device, restarts it when it dies).
- :mod:`.runner`: :class:`~kernelforge.execute.worker.runner.WorkerRunner`, the runner the trusted
  judge calls; it places the judge's tensors in shared memory and asks the worker to call.
- :mod:`.process`: one worker process seen from its parent: started in the sandbox, talked to,
  killed for sure.

Both sides:

- :mod:`.protocol`: every request and answer that crosses the pipe, as frozen records, with the one
  place they are encoded and decoded.
- :mod:`.arena` (CPU) and :mod:`.cuda_share` (CUDA IPC): memory shared with the worker.

The child's side:

- :mod:`.main`: the worker process's entry point (``python -m kernelforge.execute.worker.main``).
- :mod:`.serve`: the candidate session that answers the requests: load, call, time.
"""

__all__ = ["executor", "runner", "process", "protocol", "arena", "cuda_share", "main", "serve"]
