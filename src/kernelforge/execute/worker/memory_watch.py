"""The memory a worker holds between candidates, and when that retires it (issue 29).

A long-lived worker serves candidate after candidate, and a candidate can keep memory alive in its
module (a list of tensors it appends to). Every later candidate of that worker would then run
under what is left of the worker's limits. So after each candidate the trusted process reads what
the worker holds and compares it with what it held when it started (:func:`retire_reason`); a
worker that grew by more than a candidate may leave behind is retired, and the next candidate gets
a fresh one, with its whole limit.

What is read (:class:`MemoryReading`), all of it from outside the worker, where the candidate
cannot change it:

- the resident size (``/proc/PID/statm``): memory the candidate touched;
- the virtual size (the same file): memory it reserved without touching it (a ``torch.empty`` of
  gigabytes), which counts against the worker's address-space limit all the same;
- the device's own memory held by the worker, where the device has memory of its own and can read
  it for another process (:meth:`kernelforge.devices.base.Device.process_memory`: NVML's
  per-process figure on a GPU), a capability, never a device name.

The worker also reports the device memory its own allocator holds when a candidate's session ends
(:meth:`kernelforge.devices.base.Device.memory_held`, read in the worker: an extra signal, like the
worker's other checks), and retires itself past the same limit.
"""

from __future__ import annotations

from dataclasses import dataclass

from kernelforge.execute.timing.cputime import resident_bytes, virtual_bytes

#: Resident memory a worker may gain while serving candidates before it is retired (issue 29: a
#: candidate kept 8 GiB alive in a module and the next candidates ran under what was left).
RETIRE_MEMORY_GROWTH = 2 * 2**30
#: Address space (virtual size, less the shared arena) a worker may gain before it is retired: a
#: worker's first candidate adds about 0.3 GiB (the interpreter's first use), later ones nothing.
RETIRE_ADDRESS_SPACE_GROWTH = 2 * 2**30
#: Device memory (a GPU's) a worker may gain while serving candidates before it is retired; an
#: honest candidate leaves nothing allocated once its session ends.
RETIRE_DEVICE_MEMORY_GROWTH = 1 * 2**30


@dataclass(frozen=True)
class MemoryReading:
    """What a worker held at one moment, in bytes (None: not readable here)."""

    resident: int | None
    virtual: int | None
    device: int | None = None

    @classmethod
    def of(cls, pid: int | None, device: object = None, shared: int = 0) -> "MemoryReading":
        """Read process ``pid`` from outside. ``device`` is the trusted side's copy of the
        worker's device: it is asked for the device memory ``pid`` holds, and its virtual size
        counts only where the worker runs under an address-space limit (a GPU driver maps far more
        than it uses); ``shared`` bytes of it (the arena the trusted side shares and grows) are
        not the candidate's."""
        if pid is None:
            return cls(None, None, None)
        process_memory = getattr(device, "process_memory", None)
        virtual = virtual_bytes(pid) if getattr(device, "address_space_limit", True) else None
        return cls(resident_bytes(pid), None if virtual is None else virtual - shared,
                   process_memory(pid) if process_memory else None)


def _grew(start: int | None, now: int | None, limit: int) -> float | None:
    """GiB gained past ``limit`` (None: within it, or unknown)."""
    if start is None or now is None or now - start <= limit:
        return None
    return (now - start) / 2**30


def retire_reason(start: MemoryReading, now: MemoryReading) -> str | None:
    """Why a worker read as ``now`` must retire, having started as ``start`` (None: it need not).
    The limits are :data:`RETIRE_MEMORY_GROWTH`, :data:`RETIRE_ADDRESS_SPACE_GROWTH` and
    :data:`RETIRE_DEVICE_MEMORY_GROWTH` (read when called, so a test can lower them)."""
    for what, first, last, limit in (("resident memory", start.resident, now.resident, RETIRE_MEMORY_GROWTH),
                                     ("address space", start.virtual, now.virtual, RETIRE_ADDRESS_SPACE_GROWTH),
                                     ("device memory", start.device, now.device, RETIRE_DEVICE_MEMORY_GROWTH)):
        grown = _grew(first, last, limit)
        if grown is not None:
            return f"it holds {grown:.1f} GiB more {what} than when it started"
    return None


def device_growth_reason(start: int | None, now: int | None) -> str | None:
    """The worker's own check when a session ends: its device allocator holds ``now`` bytes,
    ``start`` when it was ready (None: no memory of its own)."""
    grown = _grew(start, now, RETIRE_DEVICE_MEMORY_GROWTH)
    return None if grown is None else f"a candidate left {grown:.1f} GiB of device memory allocated"
