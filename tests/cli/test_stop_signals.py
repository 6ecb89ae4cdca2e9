"""Ctrl-C, SIGTERM and SIGHUP while the command line is still starting (Python importing torch and
triton, seconds on a loaded host): one line and exit status 130, 143 or 129, never a traceback or
Click's "Aborted!" with status 1."""

from __future__ import annotations

import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]


def _as_from_a_terminal() -> None:
    # A shell's background job, or the test runner, may ignore SIGINT; a terminal's Ctrl-C is not.
    signal.signal(signal.SIGINT, signal.SIG_DFL)
    signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT, signal.SIGTERM, signal.SIGHUP})


@pytest.mark.parametrize("signum, status", [(signal.SIGINT, 130), (signal.SIGTERM, 143), (signal.SIGHUP, 129)],
                         ids=["ctrl-c", "sigterm", "sighup"])
def test_a_stop_signal_during_start_up(tmp_path, signum, status):
    proc = subprocess.Popen([sys.executable, "-m", "kernelforge", "search", "demo", "--dry-run",
                             "--storage", f"sqlite:///{tmp_path / 'dry.db'}"], cwd=REPO,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, preexec_fn=_as_from_a_terminal)
    # Past Python's own start (milliseconds), within the imports (seconds) or the command: either
    # way the same exit (signals that land in the imports are held back until they are done).
    time.sleep(0.5)
    proc.send_signal(signum)
    out, err = proc.communicate(timeout=120)
    if proc.returncode == 0:
        pytest.skip("the command finished before the signal arrived (a very fast machine)")
    assert proc.returncode == status, err
    assert "Traceback" not in err and "Aborted!" not in err
    assert "kernelforge: interrupted" in err
