"""The ``kernelforge`` command line: ``main`` (the click group) in ``kernelforge.cli.main``, one
module per group of commands, and the helpers they share in ``kernelforge.cli.common``."""
