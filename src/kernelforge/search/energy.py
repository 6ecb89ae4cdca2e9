"""The objective a search run tunes for, decided once per run from the environment, and the value
it tells its strategies.

A job asks for time, energy or both (``[job] objective``, :class:`~kernelforge.objective.Objective`);
energy counts only where it is measured: on a CUDA device whose NVML energy counter answered
(its description says ``energy = "NVML energy counter"``, :mod:`kernelforge.devices.nvml`). The
interpreter, or a GPU without NVML, tunes for time, and the run says so once.
"""

from __future__ import annotations

from typing import Any, Iterable, Mapping

from kernelforge.environment import Timings, timings_of
from kernelforge.job import Job
from kernelforge.objective import Objective, energy_ratio, time_ratio
from kernelforge.result import StoredResult

#: What a device's description says under ``energy`` when joules per call are measured.
NVML_ENERGY = "NVML energy counter"


def energy_measurable(env: Mapping[str, Any]) -> bool:
    """Whether the run's environment measures joules per call (NVML's energy counter answered)."""
    return env.get("energy") == NVML_ENERGY


def objective_in_effect(job: Job, env: Mapping[str, Any]) -> tuple[Objective, str | None]:
    """The objective this run tunes for, and the one warning to give when the job's cannot be
    (energy asked for where it is not measurable: time instead)."""
    if job.objective is Objective.TIME or energy_measurable(env):
        return job.objective, None
    device = env.get("device_name") or env.get("device") or job.device
    interpreter = timings_of(env) is Timings.INTERPRETER
    why = env.get("energy") or ("the Triton interpreter has no energy counter" if interpreter else "no NVML")
    return Objective.TIME, f"energy is not measurable on {device} ({why}): tuning for time"


def objective_value(objective: Objective, results: Iterable[StoredResult],
                    baseline: Mapping[str, StoredResult]) -> float | tuple[float, float] | None:
    """The value told for a point's stored results (lower is better; None: it failed).

    TIME: :func:`time_ratio`. ENERGY: :func:`energy_ratio`, or the time ratio for an evaluation
    that has no energy (NVML's counter did not move over a short round). TIME_ENERGY: the pair
    (time ratio, energy ratio), the energy ratio again falling back to the time ratio."""
    results = list(results)
    time = time_ratio(results, baseline)
    if objective is Objective.TIME or time is None:
        return time
    energy = energy_ratio(results, baseline)
    energy = time if energy is None else energy
    return energy if objective is Objective.ENERGY else (time, energy)


def objectives(objective: Objective) -> int:
    """How many values the strategy is told per point under ``objective``."""
    return 2 if objective is Objective.TIME_ENERGY else 1


def study_suffix(objective: Objective) -> str:
    """What a study's name ends with under ``objective`` (none for time, the names of earlier
    runs): a resumed study never mixes objectives."""
    return "" if objective is Objective.TIME else f"|{objective}"
