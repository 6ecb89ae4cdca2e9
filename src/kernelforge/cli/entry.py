"""The ``kernelforge`` command's entry point: the stop signals are set before anything heavy is
imported, so Ctrl-C or SIGTERM while Python still imports the command line (torch, triton: seconds
on a loaded host) exits 130 or 143 with one line, not a traceback."""

from __future__ import annotations

import sys

from kernelforge.cli.signals import install_stop_signals, stop_status


def main() -> None:
    install_stop_signals()
    try:
        from kernelforge.cli.main import main as command_line
    except KeyboardInterrupt as exc:
        print("kernelforge: interrupted", file=sys.stderr)
        sys.exit(stop_status(exc))
    command_line()
