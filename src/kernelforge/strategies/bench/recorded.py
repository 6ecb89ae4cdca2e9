"""Recorded GPU measurements for replay: Kernel Tuner cache files as a :class:`RecordedSpace`.

A Kernel Tuner cache (``.json`` or ``.json.gz``) holds ``tune_params`` (parameter -> values) and
``cache``: one record per measured configuration, keyed ``"v1,v2,..."`` (values in ``tune_params``
order), whose ``time`` is milliseconds or a failure string (``"InvalidConfig"``,
``"CompilationFailedConfig"``, ``"RuntimeFailedConfig"``...). A time that is not a positive finite
number (0, negative, NaN, missing) is no measurement: the record reads as a failure
(``"InvalidRecord"``). Kernel Tuner appends records as it
measures, so a file from an interrupted run ends without its closing braces: the loader keeps every
complete record and drops the partial one.

A configuration absent from the cache was ruled out by the kernel's restrictions (Kernel Tuner never
compiled it): it is infeasible, so the space lists only the recorded configurations
(``Space.feasible``) and a strategy never proposes another. A recorded failure (``"InvalidConfig"``,
``"CompilationFailedConfig"``...) is feasible: proposing it costs an evaluation, told as failed,
as on a device.

Strategies are compared on these files with no device at all (:mod:`kernelforge.strategies.bench.run`);
:func:`cache_files` lists the cache files of a folder.
"""

from __future__ import annotations

import gzip
import json
import math
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Mapping

from kernelforge.errors import UserError
from kernelforge.space import Space

Key = tuple[Any, ...]

_EXPECTED = (
    "expected a Kernel Tuner cache file (.json or .json.gz) with 'tune_params' "
    "(parameter -> list of values) and 'cache' (records keyed \"v1,v2,...\" with a 'time')"
)


@dataclass(frozen=True)
class RecordedSpace:
    """A fully (or partly) measured search space: every recorded configuration and its outcome.

    ``records`` maps a point key (values in ``space.names`` order, typed as in ``tune_params``) to
    the recorded objective in ms (a float) or a failure string. ``space.feasible`` is the set of
    recorded keys: a point that is not recorded is not a point of ``space`` (Kernel Tuner skips
    the configurations its restrictions rule out), while a recorded failure is one.
    """

    name: str
    device: str | None
    objective: str
    space: Space
    records: Mapping[Key, float | str]
    #: Whether the file ended before its closing braces (an interrupted run): ``records`` holds
    #: its complete records, and whoever replays it says so.
    cut_off: bool = False

    def key(self, point: Mapping[str, Any]) -> Key:
        """The record key of ``point`` (its values in parameter order)."""
        return tuple(point[name] for name in self.space.names)

    def outcome(self, point: Mapping[str, Any]) -> float | str:
        """The recorded time (ms) or failure string; ``"NotRecorded"`` for a point with no record."""
        return self.records.get(self.key(point), "NotRecorded")

    def lookup(self, point: Mapping[str, Any]) -> float | None:
        """The recorded time (ms) at ``point``; None for a failed, invalid or unrecorded point."""
        value = self.outcome(point)
        return value if isinstance(value, float) else None

    def valid_points(self) -> list[dict[str, Any]]:
        """Every point with a recorded time, in record order."""
        names = self.space.names
        return [dict(zip(names, key)) for key, value in self.records.items() if isinstance(value, float)]

    def notes(self) -> list[str]:
        """What a replay of this recording should say of it: a file that ended early, a recording
        whose every time is the same (any first evaluation is its optimum: it ranks no strategy)."""
        out = []
        if self.cut_off:
            out.append(f"ends early (an interrupted Kernel Tuner run?): its {len(self.records)} complete records are "
                       "replayed, the cut one is dropped")
        times = {value for value in self.records.values() if isinstance(value, float)}
        if len(times) == 1 and len(self.valid_points()) > 1:
            out.append(f"every recorded time is {times.pop():g} ms: the first evaluation is always the optimum, "
                       "so this recording ranks no strategy")
        return out

    def optimum(self) -> tuple[dict[str, Any], float]:
        """The fastest recorded point and its time (ms)."""
        best = min(
            ((key, value) for key, value in self.records.items() if isinstance(value, float)),
            key=lambda item: item[1],
            default=None,
        )
        if best is None:
            raise UserError(f"{self.name}: no configuration has a recorded time; nothing to optimise")
        return dict(zip(self.space.names, best[0])), best[1]


#: The file names :func:`cache_files` takes from a folder.
CACHE_SUFFIXES = (".json", ".json.gz")


def cache_files(path: str | Path) -> list[Path]:
    """The Kernel Tuner cache files ``path`` names: the file itself, or every ``*.json`` and
    ``*.json.gz`` of a folder (sorted by name). Raises :class:`UserError` naming the path when it
    does not exist or the folder holds no cache file."""
    path = Path(path)
    if path.is_file():
        return [path]
    if not path.is_dir():
        raise UserError(f"{path}: no such file or folder; give a Kernel Tuner cache file or a folder of them")
    found = sorted(p for p in path.iterdir() if p.is_file() and p.name.endswith(CACHE_SUFFIXES))
    if not found:
        raise UserError(f"{path}: the folder holds no cache file (*.json or *.json.gz); {_EXPECTED}")
    return found


def load_kernel_tuner_cache(path: str | Path) -> RecordedSpace:
    """Read a Kernel Tuner cache file (``.json`` or ``.json.gz``, possibly truncated) for replay.

    Raises :class:`UserError` naming the file when it is missing, unreadable or not a Kernel Tuner
    cache.
    """
    path = Path(path)
    try:
        raw = path.read_bytes()
    except OSError as exc:
        raise UserError(f"{path}: cannot read it ({exc.strerror or exc}); {_EXPECTED}") from None
    cut_off = False
    if raw[:2] == b"\x1f\x8b":  # gzip magic, whatever the suffix says
        try:
            raw = gzip.decompress(raw)
        except (OSError, EOFError) as exc:
            # A truncated .gz from an interrupted run: keep what decompresses.
            raw, cut_off = _partial_gunzip(raw), True
            if not raw:
                raise UserError(f"{path}: not a readable gzip file ({exc}); {_EXPECTED}") from None
    try:
        text = raw.decode("utf-8", errors="ignore" if cut_off else "strict")  # a cut may split a character
    except UnicodeDecodeError:
        raise UserError(f"{path}: not a text (UTF-8 JSON) file; {_EXPECTED}") from None
    try:
        data = json.loads(text)
    except json.JSONDecodeError:
        data, cut_off = _repair(text, path), True
    if not isinstance(data, dict):
        raise UserError(f"{path}: the JSON is not an object; {_EXPECTED}")
    return replace(_build(data, path), cut_off=cut_off)


def _partial_gunzip(raw: bytes) -> bytes:
    import zlib

    decompressor = zlib.decompressobj(zlib.MAX_WBITS | 16)
    try:
        return decompressor.decompress(raw)
    except zlib.error:
        return b""


def _repair(text: str, path: Path) -> dict[str, Any]:
    """Parse a cache file whose ``cache`` object was cut off: keep every complete record.

    Kernel Tuner writes the header, then ``"cache": {`` and appends one record at a time, so the
    header before ``"cache"`` is complete and records can be decoded one by one until the cut.
    """
    start = text.find('"cache"')
    if start < 0:
        raise UserError(f"{path}: not valid JSON and has no 'cache' to recover; {_EXPECTED}")
    try:
        header = json.loads(text[:start] + '"cache": {}}')
    except json.JSONDecodeError:
        raise UserError(f"{path}: not valid JSON (the part before 'cache' does not parse); {_EXPECTED}") from None
    decoder = json.JSONDecoder()
    pos = _skip(text, start + len('"cache"'))
    if not text.startswith(":", pos):
        raise UserError(f"{path}: 'cache' is not followed by an object; {_EXPECTED}")
    pos = _skip(text, pos + 1)
    if not text.startswith("{", pos):
        raise UserError(f"{path}: 'cache' is not an object; {_EXPECTED}")
    pos += 1
    cache: dict[str, Any] = {}
    while True:
        pos = _skip(text, pos)
        if text.startswith(",", pos):
            pos = _skip(text, pos + 1)
        if pos >= len(text) or text.startswith("}", pos):
            break
        try:
            key, after_key = decoder.raw_decode(text, pos)
            colon = _skip(text, after_key)
            if not text.startswith(":", colon):
                break
            record, pos = decoder.raw_decode(text, _skip(text, colon + 1))
        except json.JSONDecodeError:
            break  # the record cut off by the interruption
        if not isinstance(key, str):
            break
        cache[key] = record
    header["cache"] = cache
    return header


def _skip(text: str, pos: int) -> int:
    while pos < len(text) and text[pos] in " \t\r\n":
        pos += 1
    return pos


def _build(data: dict[str, Any], path: Path) -> RecordedSpace:
    tune_params = data.get("tune_params")
    cache = data.get("cache")
    if not isinstance(tune_params, dict):
        raise UserError(f"{path}: no 'tune_params' object; {_EXPECTED}")
    if not tune_params:
        raise UserError(f"{path}: 'tune_params' is empty: a cache names at least one parameter; {_EXPECTED}")
    if not isinstance(cache, dict):
        raise UserError(f"{path}: no 'cache' object; {_EXPECTED}")
    order = data.get("tune_params_keys") or list(tune_params)
    if sorted(order) != sorted(tune_params):
        order = list(tune_params)
    space = Space.build({name: tune_params[name] for name in order}, [], where=str(path))
    # Kernel Tuner keys a record by ",".join(str(value)); map each string back to the typed value.
    typed = [{str(value): value for value in space.values(name)} for name in space.names]
    records: dict[Key, float | str] = {}
    for text_key, record in cache.items():
        parts = str(text_key).split(",")
        if len(parts) != len(typed):
            raise UserError(
                f"{path}: cache key {text_key!r} has {len(parts)} values but tune_params has "
                f"{len(typed)} parameters ({', '.join(space.names)})"
            )
        try:
            key = tuple(values[part] for values, part in zip(typed, parts))
        except KeyError as exc:
            raise UserError(f"{path}: cache key {text_key!r} has value {exc.args[0]!r}, not in tune_params") from None
        time = record.get("time") if isinstance(record, dict) else None
        if isinstance(time, (int, float)) and not isinstance(time, bool) and math.isfinite(time) and time > 0:
            records[key] = float(time)
        elif isinstance(time, str):
            records[key] = time
        else:
            records[key] = "InvalidRecord"
    # Only the recorded configurations exist: the others are constraints, never evaluations.
    space = replace(space, feasible=frozenset(records))
    name = path.name.removesuffix(".gz").removesuffix(".json")
    device = data.get("device_name")
    return RecordedSpace(
        name=str(name),
        device=str(device) if device is not None else None,
        objective=str(data.get("objective", "time")),
        space=space,
        records=records,
    )
