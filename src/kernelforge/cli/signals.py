"""How a command stops: SIGTERM and SIGHUP (a closed terminal or SSH session) become
:class:`~kernelforge.errors.Terminated`, a KeyboardInterrupt, so they stop like Ctrl-C (a message,
claims released, trials closed, nothing stored lost), and the exit status says which: 130 for
Ctrl-C, 143 for SIGTERM, 129 for SIGHUP (128 + the signal's number, as shells report a process
killed by it)."""

from __future__ import annotations

import signal
from typing import Any

from kernelforge.errors import Terminated

EXIT_INTERRUPTED = 130
EXIT_TERMINATED = 143
#: The signals handled like SIGTERM.
TERMINATING = (signal.SIGTERM, signal.SIGHUP)


def install_stop_signals() -> Any:
    """Make SIGTERM and SIGHUP raise Terminated in the main thread; returns the handlers they
    replaced (a command run in-process, from a test or a notebook, puts them back when done with
    :func:`restore_stop_signals`)."""
    return {signum: signal.signal(signum, _terminate) for signum in TERMINATING}


def restore_stop_signals(previous: Any) -> None:
    """Put back the handlers :func:`install_stop_signals` replaced."""
    for signum, handler in previous.items():
        signal.signal(signum, handler if handler is not None else signal.SIG_DFL)


_received: list[int] = []  # the last terminating signal this process received


def _terminate(signum: int, frame: object) -> None:
    _received[:] = [signum]
    # Raised once: a second stop signal during the clean-up must not cut it short.
    for other in TERMINATING:
        signal.signal(other, signal.SIG_IGN)
    raise Terminated(signum)


def stop_status(exc: BaseException) -> int:
    """The exit status of a command stopped by ``exc`` (a KeyboardInterrupt)."""
    if isinstance(exc, Terminated):
        return 128 + terminating_signal(exc)
    return EXIT_INTERRUPTED


def terminating_signal(exc: Terminated) -> int:
    """The signal that raised ``exc`` (SIGTERM when it does not say)."""
    return int(exc.args[0]) if exc.args and isinstance(exc.args[0], int) else int(signal.SIGTERM)


def stopped_status(reason: str) -> int:
    """The exit status of a search that stopped for ``reason`` ("terminated" or "interrupted")."""
    if reason == "terminated":
        return 128 + (_received[0] if _received else int(signal.SIGTERM))
    return EXIT_INTERRUPTED
