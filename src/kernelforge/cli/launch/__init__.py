"""The launchers of ``kernelforge search``, beside the command line that starts them: many workers
of one job, each an ordinary ``kernelforge search`` process sharing the job's database.

- :mod:`.local`: ``--workers N`` and ``--gpus LIST`` on this host (:func:`.local.launch`);
- :mod:`.ray_cluster`: ``--ray ADDRESS``, one worker per GPU of a Ray cluster;
- :mod:`.supervise`: what both share: a worker (:class:`.supervise.WorkerSpec`), the launcher's
  signals (:class:`.supervise.Stop`), the relay of the workers' output and the exit status.
"""

__all__ = ["local", "ray_cluster", "supervise"]
