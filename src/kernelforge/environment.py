"""What a stored environment says its timings are: one reading for every report, prompt and warning.

Every result is stored under the environment its executor described
(:meth:`kernelforge.devices.base.Device.describe`, or a replay's): the device kind (``device``:
``cuda``, ``interpret`` or ``replay``), the device's name and a label of how the timings were
taken (``timing``; a replay's names the device its recording was measured on). A report, an LLM
prompt or a warning reads stored environments, not live devices, and must say whether the numbers
under one are a GPU's. This module is where that is decided, once (:func:`timings_of`): a replay
of an interpreter recording is interpreter time, and a replay of a GPU recording is a GPU's time
measured earlier, never now.
"""

from __future__ import annotations

import enum
from typing import Any, Mapping

__all__ = ["Timings", "timings_of"]


class Timings(enum.Enum):
    """What the timings stored under an environment measure."""

    #: Measured on a GPU by the run that stored them.
    GPU = "gpu"
    #: Triton-interpreter wall time on a CPU, measured now or replayed: no GPU's speed.
    INTERPRETER = "interpreter"
    #: A GPU's measurements read back from a recording (``--device replay:PATH``), not measured now.
    REPLAYED = "replayed"


def timings_of(env: Mapping[str, Any]) -> Timings:
    """What the timings stored under ``env`` (a stored environment, :class:`Timings`) measure. Every
    executor describes its device kind, so only an environment stored by hand lacks one; it is read
    as a GPU's, as its timing label, if any, does not say otherwise."""
    if env.get("device") == "interpret" or "interpreter" in str(env.get("timing", "")):
        return Timings.INTERPRETER
    if env.get("device") == "replay":
        return Timings.REPLAYED
    return Timings.GPU
