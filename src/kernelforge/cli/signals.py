"""How a command stops: SIGTERM becomes :class:`~kernelforge.errors.Terminated`, a KeyboardInterrupt,
so it stops like Ctrl-C (a message, claims released, trials closed, nothing stored lost), and the
exit status says which: 130 for Ctrl-C, 143 for SIGTERM (128 + the signal's number, as shells
report a process killed by it)."""

from __future__ import annotations

import signal
from typing import Any

from kernelforge.errors import Terminated

EXIT_INTERRUPTED = 130
EXIT_TERMINATED = 143


def install_stop_signals() -> Any:
    """Make SIGTERM raise Terminated in the main thread; returns the handler it replaced (a
    command run in-process, from a test or a notebook, puts it back when done)."""
    return signal.signal(signal.SIGTERM, _terminate)


def _terminate(signum: int, frame: object) -> None:
    # Raised once: a second SIGTERM during the clean-up must not cut it short.
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    raise Terminated()


def stop_status(exc: BaseException) -> int:
    """The exit status of a command stopped by ``exc`` (a KeyboardInterrupt)."""
    return EXIT_TERMINATED if isinstance(exc, Terminated) else EXIT_INTERRUPTED
