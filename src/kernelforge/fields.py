"""The checks of the values a user gives, in one place: a job file's fields and the command line's
options that set the same thing run the same check, and say the same thing (with ``where`` naming
the file and field, or the option).

Numbers are finite (``nan`` and ``inf`` are refused wherever a number is expected), counts are
integers (a bool is not one), and names (compile targets, dtypes) are the known ones.
"""

from __future__ import annotations

import math
from typing import Any

from kernelforge.errors import UserError


def typed(where: str, value: Any, kind: type | tuple[type, ...], example: str) -> Any:
    """``value`` when it is a ``kind`` (a bool is not a number; a float is finite), else a
    UserError citing ``example``."""
    if isinstance(value, bool) and bool not in (kind if isinstance(kind, tuple) else (kind,)):
        raise UserError(f"{where}: expected {example}, got {value!r}")
    if not isinstance(value, kind):
        raise UserError(f"{where}: expected {example}, got {value!r}")
    if isinstance(value, float) and not math.isfinite(value):
        raise UserError(f"{where}: expected {example}, got {value!r} (not a finite number)")
    if isinstance(value, int) and not isinstance(value, bool) and not -2**63 <= value < 2**63:
        raise UserError(f"{where}: expected {example}, got {value} (past the 64-bit integers a database stores)")
    return value


def positive_number(where: str, value: Any, example: str) -> float:
    """A finite number above 0, as a float."""
    typed(where, value, (int, float), example)
    if not value > 0:
        raise UserError(f"{where}: must be positive, got {value}")
    return float(value)


def count(where: str, value: Any, least: int = 1, example: str = "a positive integer", most: int | None = None) -> int:
    """An integer of at least ``least`` (and at most ``most``, when given)."""
    typed(where, value, int, example)
    if value < least:
        raise UserError(f"{where}: must be at least {least}, got {value}")
    if most is not None and value > most:
        raise UserError(f"{where}: must be at most {most}, got {value}")
    return value


def device_name(where: str, value: Any) -> str:
    """A device's name as a job or an option gives it: ``cuda``, ``cuda:N`` (N a GPU index),
    ``interpret`` or ``replay:PATH`` (its path and wait are read by the replay executor)."""
    typed(where, value, str, '"cuda", "cuda:N", "interpret" or "replay:PATH"')
    if value in ("cuda", "interpret") or value.startswith("replay:"):
        return value
    if value.startswith("cuda:"):
        if not value[len("cuda:"):].isdigit():
            raise UserError(f"{where}: {value!r}: cuda:N takes a GPU index, e.g. cuda:0")
        return value
    raise UserError(f"{where}: unknown device {value!r}; choose cuda, cuda:N, interpret or replay:PATH")


def compile_target(where: str, value: Any) -> str:
    """A known compile target's name (``sm_90``, ``gfx942``...), as ``kernelforge compile --target``
    accepts it."""
    from kernelforge.targets import parse_target

    typed(where, value, str, '"sm_90"')
    try:
        parse_target(value)
    except UserError as exc:
        raise UserError(f"{where}: {exc}") from None
    return value


def dtype_name(where: str, value: Any) -> str:
    """One of :data:`kernelforge.block.DTYPES`."""
    from kernelforge.block import DTYPES

    typed(where, value, str, '"bfloat16"')
    if value not in DTYPES:
        raise UserError(f"{where}: {value!r} is not one of {', '.join(DTYPES)}")
    return value
