"""CPU time of the thread that calls candidates, as the kernel accounts it: the trusted side's
second clock.

The interpreter's calls are CPU work done by the calling thread (the Triton interpreter is
Python; torch's thread pool makes the caller take a share of any parallel operation), so the
reported times of a timing round must account for most of the CPU time that thread spent in it.
Unlike the wall clock, this does not grow when other processes load the machine, and it never
exceeds the thread's wall time, so the check built on it
(:func:`~kernelforge.execute.timing.check.wall_problem`) cannot reject an honest candidate on a
busy host. Threads the candidate starts are refused on their own (the thread count is watched).

The reading is ``/proc/<pid>/task/<pid>/schedstat`` (nanoseconds), or that thread's user plus
system clock ticks where the kernel keeps no scheduler statistics (:data:`RESOLUTION_S` is then
the granularity a check must allow). The measured process cannot change either.
"""

from __future__ import annotations

import os
import time

_TICK_S = 1.0 / os.sysconf("SC_CLK_TCK")
_PRECISE = os.path.exists(f"/proc/{os.getpid()}/task/{os.getpid()}/schedstat")
#: What a difference of two readings may be off by.
RESOLUTION_S = 0.0 if _PRECISE else 2 * _TICK_S


def _read(path: str) -> str | None:
    try:
        with open(path, encoding="ascii") as handle:
            return handle.read()
    except OSError:
        return None


def cpu_seconds(pid: int) -> float | None:
    """CPU time used so far by the main thread of process ``pid``, or None where the kernel does
    not say (no ``/proc``, or the process is gone)."""
    if _PRECISE:
        text = _read(f"/proc/{pid}/task/{pid}/schedstat")
        try:
            return int(text.split()[0]) * 1e-9 if text else None
        except (ValueError, IndexError):
            return None
    text = _read(f"/proc/{pid}/task/{pid}/stat")
    try:  # the fields after the name: utime and stime are fields 14 and 15 of the line
        fields = text.rsplit(")", 1)[1].split() if text else []
        return (int(fields[11]) + int(fields[12])) * _TICK_S
    except (ValueError, IndexError):
        return None


def this_thread_cpu_seconds() -> float:
    """The calling thread's CPU time (for candidates called in this process)."""
    return time.thread_time()


def resident_bytes(pid: int) -> int | None:
    """The resident memory of process ``pid`` in bytes (``/proc/PID/statm``), or None where the
    kernel does not say."""
    text = _read(f"/proc/{pid}/statm")
    try:
        return int(text.split()[1]) * os.sysconf("SC_PAGE_SIZE") if text else None
    except (ValueError, IndexError, OSError):
        return None


def virtual_bytes(pid: int) -> int | None:
    """The virtual size of process ``pid`` in bytes (``/proc/PID/statm``: what counts against an
    address-space limit), or None where the kernel does not say."""
    text = _read(f"/proc/{pid}/statm")
    try:
        return int(text.split()[0]) * os.sysconf("SC_PAGE_SIZE") if text else None
    except (ValueError, IndexError, OSError):
        return None
