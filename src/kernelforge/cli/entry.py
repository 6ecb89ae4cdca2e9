"""The ``kernelforge`` command's entry point: the stop signals are set before anything heavy is
imported, so Ctrl-C or SIGTERM while Python still imports the command line (torch, triton: seconds
on a loaded host) exits 130 or 143 with one line, not a traceback.

While the command line is imported the two signals are held back, then acted on: torch's C
initialisation imports numpy and swallows an exception raised inside it (measured: a Ctrl-C landing
there was lost in 2 of 8 tries and the process aborted in 1), so a signal must not interrupt it.
"""

from __future__ import annotations

import signal
import sys

from kernelforge.cli.signals import install_stop_signals, stop_status

STOPS = {signal.SIGINT, signal.SIGTERM, signal.SIGHUP}


def main() -> None:
    install_stop_signals()
    signal.pthread_sigmask(signal.SIG_BLOCK, STOPS)
    try:
        from kernelforge.cli.main import main as command_line

        signal.pthread_sigmask(signal.SIG_UNBLOCK, STOPS)  # a signal held back is acted on here
    except KeyboardInterrupt as exc:
        print("kernelforge: interrupted", file=sys.stderr)
        sys.exit(stop_status(exc))
    command_line()
