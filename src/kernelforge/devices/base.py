"""The device contract: where candidates run and how they are timed.

A :class:`Device` is what the evaluation harness (:mod:`kernelforge.execute.evaluate`) runs a
candidate on. Its contract, which every device keeps:

- ``name`` identifies the kind of device (``cuda``, ``interpret``) in stored results, and
  ``torch_device`` is where the harness allocates tensors for it;
- :meth:`Device.prepare` is called once per process before any candidate module is loaded (the
  interpreter device turns ``TRITON_INTERPRET`` on there, since Triton reads it when a kernel is
  decorated);
- :meth:`Device.time` times calls it is given, taking every decision that could bias a figure
  itself (warm-up, counts fixed before timing starts, cache state) and labels what the numbers
  mean in :class:`~kernelforge.result.Timing`;
- :meth:`Device.describe` names the device and the library versions, which key stored results:
  two timings are comparable only when their descriptions agree;
- a device is rebuilt in a worker process from its class and constructor arguments
  (:mod:`kernelforge.execute.worker.executor` reads them back as attributes of the same names), so
  constructor arguments must be stored under their own names;
- what the rest of kernelforge may assume of it is stated by its **capabilities**, class
  attributes every device sets and nothing else guesses from its name:

  ``measures_hardware``
      its timings are a GPU's: rooflines, energy and the library lines apply, and the timing
      cross-check uses ``triton.testing.do_bench`` (the interpreter's wall time is no hardware's);
  ``sandbox_role``
      the OS-sandbox role of its worker (:class:`kernelforge.sandbox.roles.Role` value:
      ``"cuda"`` may run the GPU driver, ptxas and the C compiler; ``"interpreter"`` runs nothing);
  ``jit_on_first_call``
      a kernel's first call compiles it, so the first call gets the compile time limit too;
  ``fatal_errors``
      a pattern of messages after which the process's device state is lost (the worker is
      retired; None: never);
  ``address_space_limit``
      whether a worker may run under an address-space limit (a GPU driver maps more virtual
      memory than any limit would allow);
  ``rotates_input_sets``
      whether timing rotates several freshly generated input sets (to keep a cache cold) or
      uses one (the interpreter: no cache to defeat, and its calls are slow);
  ``prepares_every_call``
      whether ``time`` runs ``before(i)`` right before call ``i`` in every phase on one input
      set, so that every call of a round can be verified (a GPU's timed loops and graph replays
      do not);
  ``host_clock``
      True while ``time`` measures calls on the host's clock where a few microseconds of host
      work per call would move the figure (a GPU's launch overhead, its energy round): the
      harness then runs the calls without the checks it makes on a drawn share of the others
      (:mod:`kernelforge.execute.timing.calls`). False on a device whose every figure is host
      time anyway (the interpreter);
  ``round_preparations(n_sets)``
      the most preparations (``before`` calls) one ``time`` round makes on ``n_sets`` input sets:
      the harness copies aside the results of every call of a round (within a memory budget) and
      verifies a draw of them made after the round, so it must know how many calls there can be;
  ``process_memory(pid)`` and ``memory_held()``
      the device memory of its own (a GPU's) that process ``pid`` holds, read from outside it
      (the trusted side), and that this process's allocator holds (the worker, when a
      candidate's session ends); None where the device's memory is the host's (the worker's
      resident and virtual size are watched instead) or cannot be read. A worker that grew past a
      limit is retired (:mod:`kernelforge.execute.worker.memory_watch`).

  ``tests/devices/test_device_contract.py`` runs the contract on every device, and on a skeleton
  device that shows what a new one (a ROCm GPU, say) must provide (docs/devices.md).

The devices are :class:`kernelforge.devices.cuda.CudaDevice` (a real GPU) and
:class:`kernelforge.devices.interpret.InterpretDevice` (Triton's CPU interpreter);
:mod:`kernelforge.devices.registry` maps a device name to one. The ``replay`` device (recorded
measurements) belongs to the search and lives in :mod:`kernelforge.execute.replay`.
"""

from __future__ import annotations

import platform
import re
import statistics
from abc import ABC, abstractmethod
from typing import Any, Callable, Sequence

import torch

from kernelforge.result import Timing

Call = Callable[[], None]
#: Run before call ``i`` outside the timed region (the harness changes an input value there so a
#: cache keyed on input values never hits: EVALUATION.md #4).
Before = Callable[[int], None]


def quantiles(samples: Sequence[float]) -> tuple[float, float, float]:
    """(median, p20, p80) of the samples."""
    ordered = sorted(samples)
    if len(ordered) == 1:
        return ordered[0], ordered[0], ordered[0]
    cuts = statistics.quantiles(ordered, n=10, method="inclusive")
    return statistics.median(ordered), cuts[1], cuts[7]


class MethodUnavailable(RuntimeError):
    """The shape's fixed timing method cannot time this candidate (for example a CUDA graph cannot
    capture a call that synchronises the host): the candidate gets no timing on that shape rather
    than one taken by another method."""


class Device(ABC):
    """Where candidates run. Subclasses say how to prepare, synchronise, time and describe."""

    name: str = ""
    #: the torch device tensors are allocated on
    torch_device: str = "cpu"
    # -- capabilities (see the module docstring) --
    measures_hardware: bool = False
    sandbox_role: str = "interpreter"
    jit_on_first_call: bool = False
    fatal_errors: "re.Pattern[str] | None" = None
    address_space_limit: bool = True
    rotates_input_sets: bool = False
    prepares_every_call: bool = True
    host_clock: bool = False

    def round_preparations(self, n_sets: int) -> int:
        """The most times :meth:`time` runs ``before`` in one round on ``n_sets`` input sets (see
        the module docstring). This default is a device that prepares each of ``warmup`` then
        ``repeats`` calls once (the interpreter's pattern); a device with more phases says so."""
        return int(getattr(self, "warmup", 0) or 0) + int(getattr(self, "repeats", 0) or 0)

    def process_memory(self, pid: int) -> int | None:
        """Bytes of this device's own memory process ``pid`` holds, read from outside it (None:
        none of its own, or not readable; see the module docstring)."""
        return None

    def memory_held(self) -> int | None:
        """Bytes of this device's own memory this process's allocations hold (None: none of its
        own; see the module docstring)."""
        return None

    def prepare(self) -> None:
        """Make the device usable in this process (before any candidate module is loaded)."""

    def synchronize(self) -> None:
        """Wait for all work queued on the device."""

    @abstractmethod
    def time(self, calls: Sequence[Call], *, working_set_bytes: int = 0, before: Before | None = None,
             method: str | None = None) -> Timing:
        """Time the candidate: ``calls[i]`` runs it on the i-th pre-generated input set.

        ``working_set_bytes`` is the memory one call touches; it decides whether rotating the
        sets is enough to keep inputs out of the cache. ``before(i)``, when given, runs before
        the i-th call of every phase (warm-up and timed alike, so the phases look the same to the
        candidate), outside the timed region.

        ``method`` is the timing method fixed for this shape (``Timing.method`` of the shape's
        baseline, see :class:`kernelforge.execute.timing.rounds.TimingPlan`): the device times with
        exactly that method or raises :class:`MethodUnavailable`, never another, since timings
        taken by different methods are not comparable. None: the device chooses from this round
        (the shape's first timing, the baseline's) and ``Timing.method`` says what it chose.
        """

    def ceilings(self):
        """The hardware ceilings (:class:`kernelforge.devices.hardware.Ceilings`) of this device for
        roofline checks, or None when its timings measure no GPU (the interpreter) or the GPU
        is unknown."""
        return None

    @abstractmethod
    def describe(self) -> dict[str, Any]:
        """Device name, versions and whatever else identifies the numbers it produces."""


def library_versions() -> dict[str, str]:
    """The versions that decide what a timing means (part of every device's description)."""
    import triton

    return {
        "python": platform.python_version(),
        "torch": torch.__version__,
        "triton": triton.__version__,
        "kernelforge": __import__("kernelforge").__version__,
    }
