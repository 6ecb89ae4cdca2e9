"""SIGKILL at a random moment: the kill loops of the fault tests (a search's results, and its Optuna
studies, after ten kills and a final run equal an uninterrupted run's)."""

from __future__ import annotations

import random
import signal
import subprocess
import time


def kill_at_a_random_moment(proc: subprocess.Popen, rng: random.Random, attempt: int, *, first: float = 0.2,
                            events: int = 5, settle: float = 0.15) -> bool:
    """SIGKILL ``proc``, a search printing its progress as JSON lines, unless it ends first; True when
    killed. A run spends ~2 s importing and well under a second per evaluation, so a kill at a
    uniformly random time would nearly always land in start-up: every third ``attempt`` is killed
    at a random time (``first`` to 4 s), the others a random delay (up to ``settle`` s) after a
    random progress event (1 to ``events``: the baseline, an evaluation, the confirmation...)."""
    try:
        if attempt % 3 == 0:
            proc.wait(timeout=rng.uniform(first, 4.0))
        else:
            for _ in range(rng.randint(1, events)):
                if not proc.stdout.readline():
                    break
            time.sleep(rng.uniform(0.0, settle))
            proc.wait(timeout=0.001)
    except subprocess.TimeoutExpired:
        proc.send_signal(signal.SIGKILL)
        return True
    return False
