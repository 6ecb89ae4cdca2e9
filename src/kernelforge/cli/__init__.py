"""The ``kernelforge`` command line: ``main`` (the click group) in :mod:`.main`, one module per group
of commands, the helpers they share in :mod:`.common`, and the launchers of many workers of one job
in :mod:`.launch`. The console script is :func:`.entry.main`."""

__all__ = ["entry", "main", "launch"]
