"""Slices of recorded spaces: the part of a space where some parameters are held at one value.

A slice is a space of its own: its optimum is the fastest configuration that takes the held
values, usually elsewhere than the whole space's, and the landscape around it is another one. A
kernel engineer who holds a switch (shared memory on, a fixed vector width) searches exactly such a
slice. The strategy bench (``--fix NAME=V1,V2``) benches slices as it benches whole spaces, which
gives more spaces than there are recordings to judge a strategy on: spaces that it was not tuned
on, though they are parts of spaces it may have been. ``--fix NAME`` alone holds NAME at each of
its values in turn, each space's own (those with a recorded time), so one option slices every
recording of a folder without listing values.

A slice keeps every parameter of its space (the held one with its one value), so a slice is still
a recording of its kernel (:func:`kernelforge.strategies.transfer.same_kernel`) and a warm start
from another GPU's whole space applies to it. Its name is the space's with the held values, as in
``convolution_A4000[use_shmem=1]``.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass, replace
from typing import Any, Sequence

from kernelforge.errors import UserError
from kernelforge.space import is_one_of, parse_value
from kernelforge.strategies.bench.recorded import RecordedSpace

__all__ = ["Fix", "parse_fix", "slice_space", "sliced"]


@dataclass(frozen=True)
class Fix:
    """One ``--fix NAME=V1,V2``: the parameter ``name`` held, in turn, at each of ``values``
    (as written: ``"1"``, ``"0.5"``; matched against a space's values as Kernel Tuner writes
    them in its cache keys, or as a template override of that value is: ``10`` for ``10.0``,
    :func:`kernelforge.space.is_one_of`).
    No values (``--fix NAME``): each of the space's own values of ``name`` that has a recorded
    time."""

    name: str
    values: tuple[str, ...]


def parse_fix(text: str) -> Fix:
    """``NAME=V1[,V2...]`` or ``NAME`` (every value) as a :class:`Fix`; a UserError naming ``--fix``
    and the form otherwise."""
    name, sep, values = text.partition("=")
    parts = tuple(value.strip() for value in values.split(",")) if sep else ()
    if not name.strip() or (sep and not all(parts)):
        raise UserError(f"--fix {text!r}: expected NAME, NAME=VALUE or NAME=V1,V2,... (a parameter of the space and "
                        f"values it takes), e.g. --fix use_shmem=1 or --fix use_shmem for each of its values")
    twice = sorted({part for part in parts if parts.count(part) > 1})
    if twice:
        raise UserError(f"--fix {text}: names {', '.join(twice)} twice, which would bench one slice twice; give each "
                        "value once")
    return Fix(name.strip(), parts)


def slice_space(space: RecordedSpace, held: Sequence[tuple[str, str]]) -> RecordedSpace:
    """The slice of ``space`` where each ``(name, value)`` of ``held`` holds. Raises UserError
    naming the space and the parameter when the space lacks it or a value is not one of its values
    (listing them), or when no configuration of the slice has a recorded time."""
    return _slice(space, held, *_held_records(space, held))


def _slice(space: RecordedSpace, held: Sequence[tuple[str, str]], typed: dict[str, Any], records: dict) -> RecordedSpace:
    """:func:`slice_space` from the held values and records :func:`_held_records` found."""
    label = ",".join(f"{name}={text}" for name, text in held)
    if not _timed(records):
        raise UserError(f"--fix {label}: no configuration of {space.name} with these values has a recorded time; "
                        f"hold other values")
    params = tuple((name, (typed[name],) if name in typed else values) for name, values in space.space.params)
    return replace(space, name=f"{space.name}[{label}]", records=records,
                   space=replace(space.space, params=params, feasible=frozenset(records)))


def _held_records(space: RecordedSpace, held: Sequence[tuple[str, str]]) -> tuple[dict[str, Any], dict]:
    """The ``held`` values as the space's own (matched as written), and the records that take them;
    UserError as :func:`slice_space` says for a parameter or value the space does not have."""
    space_values = dict(space.space.params)
    index = {name: i for i, name in enumerate(space.space.names)}
    typed: dict[str, Any] = {}
    for name, text in held:
        if name not in space_values:
            raise UserError(f"--fix {name}={text}: {space.name} has no parameter {name} (its parameters: "
                            f"{', '.join(space.space.names)})")
        match = ([value for value in space_values[name] if str(value) == text]
                 or [value for value in space_values[name] if is_one_of(parse_value(text), (value,))])
        if not match:
            raise UserError(f"--fix {name}={text}: {space.name} has no such value of {name} (its values: "
                            f"{', '.join(str(value) for value in space_values[name])})")
        typed[name] = match[0]
    records = {key: value for key, value in space.records.items()
               if all(key[index[name]] == value for name, value in typed.items())}
    return typed, records


def _timed(records: dict) -> bool:
    """Whether some configuration of ``records`` has a recorded time (not only failures)."""
    return any(isinstance(value, float) for value in records.values())


def sliced(spaces: Sequence[RecordedSpace], fixes: Sequence[Fix]) -> list[RecordedSpace]:
    """Every slice of ``spaces`` that ``fixes`` name: per space, one for each combination of one
    value per :class:`Fix` (``--fix a=1,2 --fix b=0`` gives ``[a=1,b=0]`` and ``[a=2,b=0]``;
    where some :class:`Fix` names no values, a combination without a recorded time is left out).
    A space that lacks one of the parameters is left out (a folder may hold other kernels); a
    UserError when no space has them all, or as :func:`slice_space` raises."""
    if not fixes:
        return list(spaces)
    names = [fix.name for fix in fixes]
    if len(set(names)) != len(names):
        raise UserError(f"--fix: {', '.join(names)} names a parameter twice; give its values once, as NAME=V1,V2")
    having = [space for space in spaces if set(names) <= set(space.space.names)]
    if not having:
        raise UserError(f"--fix: no space has the parameter(s) {', '.join(names)} (their parameters: "
                        f"{'; '.join(', '.join(space.space.names) for space in spaces)})")
    out = []
    for space in having:
        for held in itertools.product(*[[(fix.name, value) for value in _values(space, fix)] for fix in fixes]):
            typed, records = _held_records(space, held)
            if all(fix.values for fix in fixes) or _timed(records):
                out.append(_slice(space, held, typed, records))
    return out


def _values(space: RecordedSpace, fix: Fix) -> tuple[str, ...]:
    """The values ``fix`` holds in ``space``: those it names, else every value of the space's own."""
    return fix.values or tuple(str(value) for value in dict(space.space.params)[fix.name])
