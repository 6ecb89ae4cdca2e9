"""Per-shape baselines: the point a human expert ships for each shape, and where it comes from.

A baseline template's ``[baseline]`` table is its fallback point; an optional array of tables
``[[baselines]]`` holds rules tried in order, the FIRST whose ``when`` holds for a shape giving
that shape's point (parameters a rule leaves out come from ``[baseline]``)::

    [[baselines]]
    source = "vLLM tuned config E=128,N=2880,device_name=NVIDIA_H100_80GB_HBM3.json"   # required
    when = "E == 128 and I == 2880"      # optional: an expression over the shape's dimensions
    nearest = "T"                        # with points: the entry with the nearest integer key
    points = { "1" = { BLOCK_SIZE_M = 16 }, "64" = { BLOCK_SIZE_M = 32 } }

    [[baselines]]
    source = "FlashAttention-2 num_splits_heuristic"
    point = { BLOCK_N = 64 }             # one partial point (instead of nearest/points)
    computed = { NUM_SPLITS = "flash_attn_num_splits(B * H_KV, 132, cdiv(S_KV, 64), 128)" }

``nearest`` follows vLLM's lookup of its tuned files (``fused_moe.py``: the key closest to the
token count, ties going to the smaller key). ``when`` and ``computed`` use the safe evaluator of
the space constraints (:class:`kernelforge.space.Expression`) with :data:`FUNCTIONS`. Everything
that does not depend on a shape is checked when the template is parsed; the rest is checked when a
shape is resolved, and its errors name the shape.
"""

from __future__ import annotations

import math
import struct
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import TYPE_CHECKING, Any, Callable, Mapping

from kernelforge.errors import TemplateError, UserError
from kernelforge.limits import LimitExceeded
from kernelforge.space import Expression, Space

if TYPE_CHECKING:
    from kernelforge.block import Shape

#: The source of the ``[baseline]`` point when ``[template] baseline_source`` does not name one.
DEFAULT_SOURCE = "the template's [baseline] point"
#: The fields of one ``[[baselines]]`` rule.
RULE_FIELDS = ("source", "when", "nearest", "points", "point", "computed")


#: The most split counts :func:`flash_attn_num_splits` tries.
MAX_SPLITS = 1024


def cdiv(a: int, b: int) -> int:
    """Ceiling division of integers (Triton's ``cdiv``)."""
    return -(-a // b)


def _f32(value: float) -> float:
    # FlashAttention computes its heuristic in C++ floats: round like it does, so a split count
    # on the edge of a threshold comes out the same.
    return struct.unpack("f", struct.pack("f", value))[0]


def flash_attn_num_splits(batch_nheads_mblocks: int, num_sms: int, num_n_blocks: int, max_splits: int) -> int:
    """FlashAttention-2's ``num_splits_heuristic`` (csrc/flash_attn/flash_api.cpp): 1 when
    ``batch_nheads_mblocks >= 0.8 * num_sms``; else, over the splits ``1..min(max_splits, num_sms,
    num_n_blocks)`` that are eligible (``s == 1`` or ``cdiv(n, s) != cdiv(n, s - 1)``: a split
    count that gives as many blocks per split as one fewer is not a new split), the efficiency is
    ``waves / ceil(waves)`` with ``waves = batch_nheads_mblocks * s / num_sms``; the answer is the
    smallest eligible ``s`` whose efficiency is at least 0.85 times the best (1 when none is)."""
    if batch_nheads_mblocks >= _f32(_f32(0.8) * num_sms):
        return 1
    limit = min(max_splits, num_sms, num_n_blocks)
    if limit > MAX_SPLITS:  # a header expression must not loop for long (FlashAttention's cap is 128)
        raise LimitExceeded(f"flash_attn_num_splits would try {limit} splits, over the limit of {MAX_SPLITS}")

    def eligible(s: int) -> bool:
        return s == 1 or cdiv(num_n_blocks, s) != cdiv(num_n_blocks, s - 1)

    efficiency: dict[int, float] = {}
    for s in range(1, limit + 1):
        if eligible(s):
            waves = _f32(batch_nheads_mblocks * s / num_sms)
            efficiency[s] = _f32(waves / math.ceil(waves))
    best = max(efficiency.values(), default=0.0)
    return next((s for s, eff in efficiency.items() if eff >= 0.85 * best), 1)


def next_power_of_2(n: int) -> int:
    """The smallest power of two at least ``n`` (``triton.next_power_of_2``; 1 for ``n <= 1``)."""
    return 1 << max(0, int(n) - 1).bit_length()


def liger_num_warps(block: int) -> int:
    """Liger-Kernel's warps for a row block (``calculate_settings`` in liger_kernel/ops/utils.py, after
    Unsloth's): 32 from 32768 elements, 16 from 8192, 8 from 2048, else 4 (CUDA; ROCm caps at 16)."""
    return 32 if block >= 32768 else 16 if block >= 8192 else 8 if block >= 2048 else 4


#: The functions ``when`` and ``computed`` expressions may call.
FUNCTIONS: Mapping[str, Callable[..., Any]] = MappingProxyType({
    "cdiv": cdiv, "min": min, "max": max, "flash_attn_num_splits": flash_attn_num_splits,
    "next_power_of_2": next_power_of_2, "liger_num_warps": liger_num_warps,
})


@dataclass(frozen=True)
class BaselinePoint:
    """A shape's baseline: a full point of the template's space and where it comes from.

    ``rule`` is the index of the ``[[baselines]]`` rule that gave it (None: the ``[baseline]``
    fallback, whose source is ``[template] baseline_source``)."""

    point: Mapping[str, Any]
    source: str
    rule: int | None


@dataclass(frozen=True)
class BaselineRule:
    """One parsed ``[[baselines]]`` rule (read-only; build with :func:`parse_rules`).

    ``index``: its position in ``[[baselines]]`` (0 first); ``when``: the condition's text (None:
    always); ``point``: a partial point (None unless given); ``nearest`` and ``points``: the shape
    dimension and the partial points by integer key, ascending; ``computed``: parameter ->
    expression text. ``where`` names the template in errors.
    """

    index: int
    source: str
    when: str | None = None
    point: Mapping[str, Any] | None = None
    nearest: str | None = None
    points: Mapping[int, Mapping[str, Any]] | None = None
    computed: Mapping[str, str] = field(default_factory=dict)
    where: str = field(default="", compare=False, repr=False)
    _when: Expression | None = field(default=None, compare=False, repr=False)
    _computed: Mapping[str, Expression] = field(default_factory=dict, compare=False, repr=False)

    @property
    def label(self) -> str:
        """How errors name it: ``<template> [[baselines]][<index>]``."""
        return f"{self.where} [[baselines]][{self.index}]"

    def applies(self, shape: "Shape") -> bool:
        """Whether ``when`` holds for ``shape`` (always without one)."""
        return self._when is None or bool(self._value(self._when, shape, "when"))

    def partial(self, shape: "Shape") -> dict[str, Any]:
        """The parameters this rule sets for ``shape`` (``point`` or the nearest entry of
        ``points``, then ``computed``)."""
        chosen: dict[str, Any] = dict(self.point or {})
        if self.points is not None and self.nearest is not None:
            value = shape.get(self.nearest)
            if isinstance(value, bool) or not isinstance(value, int):
                raise TemplateError(f"{self.label} nearest: shape {shape.name} has no integer dimension "
                                    f"{self.nearest!r} (it has {', '.join(shape.as_dict())}); name one of them")
            # vLLM: min(keys, key=|key - M|) over ascending keys: a tie goes to the smaller key.
            key = min(self.points, key=lambda k: abs(k - value))
            chosen.update(self.points[key])
        for name, expression in self._computed.items():
            chosen[name] = self._value(expression, shape, f"computed {name}")
        return chosen

    def describe(self) -> str:
        """One line for listings: the condition, what the rule sets, its source."""
        parts = [f"when {self.when}" if self.when else "always"]
        if self.point:
            parts.append(" ".join(f"{k}={v}" for k, v in self.point.items()))
        if self.points is not None:
            parts.append(f"nearest {self.nearest} in {', '.join(map(str, self.points))}")
        parts.extend(f"{k}={v}" for k, v in self.computed.items())
        return f"[{self.index}] {'; '.join(parts)} (source: {self.source})"

    def _value(self, expression: Expression, shape: "Shape", what: str) -> Any:
        try:
            return expression.evaluate(shape.as_dict())
        except KeyError as exc:
            raise TemplateError(f"{self.label} {what}: shape {shape.name} has no dimension {exc.args[0]!r} "
                                f"(it has {', '.join(shape.as_dict())}); fix the expression "
                                f"{expression.text!r} or its `when`") from None
        except Exception as exc:  # a division by zero, a call with the wrong arguments...
            raise TemplateError(f"{self.label} {what}: {expression.text!r} fails on shape {shape.name} "
                                f"({type(exc).__name__}: {exc}); fix the expression") from None


def _partial_point(raw: Any, space: Space, label: str) -> dict[str, Any]:
    """A partial point of ``space`` from TOML, each value checked against its parameter's list."""
    if not isinstance(raw, dict):
        raise TemplateError(f"{label}: must be a table of parameter = value, e.g. {{ {space.names[0]} = "
                            f"{space.values(space.names[0])[0]!r} }}")
    for name, value in raw.items():
        if name not in space.names:
            raise TemplateError(f"{label}: unknown parameter {name!r}; the space has {', '.join(space.names)}")
        if value not in space.values(name):
            raise TemplateError(f"{label}: {name}={value!r} is not one of {list(space.values(name))}; "
                                f"use a value of the [space] list (or add it there)")
    return dict(raw)


def _text(raw: Any, label: str, example: str) -> str:
    if not isinstance(raw, str) or not raw.strip():
        raise TemplateError(f"{label}: must be a non-empty string, e.g. {example}")
    return raw


def _expression(text: str, label: str, what: str) -> Expression:
    try:
        return Expression(text, None, label, what=what, functions=FUNCTIONS)
    except UserError as exc:
        raise TemplateError(str(exc)) from None


def _rule(index: int, raw: Any, space: Space, baseline: Mapping[str, Any], where: str) -> BaselineRule:
    label = f"{where} [[baselines]][{index}]"
    if not isinstance(raw, dict):
        raise TemplateError(f"{label}: each rule is a table ([[baselines]] with source = ..., point = ...)")
    unknown = sorted(set(raw) - set(RULE_FIELDS))
    if unknown:
        raise TemplateError(f"{label}: unknown field(s) {', '.join(unknown)}; a rule has {', '.join(RULE_FIELDS)}")
    if "source" not in raw:
        raise TemplateError(f"{label} source: missing; name where the point comes from, e.g. "
                            f'source = "vLLM tuned config <file> (commit <sha>)"')
    source = _text(raw["source"], f"{label} source", 'source = "vLLM get_default_config (fused_moe.py)"')
    when_text = _text(raw["when"], f"{label} when", 'when = "E == 128"') if "when" in raw else None
    when = _expression(when_text, f"{label} when", "when") if when_text is not None else None
    if "point" in raw and ("points" in raw or "nearest" in raw):
        raise TemplateError(f"{label}: give either point or nearest with points, not both")
    if ("points" in raw) != ("nearest" in raw):
        raise TemplateError(f"{label} {'nearest' if 'points' in raw else 'points'}: missing; points needs "
                            f'nearest (the shape dimension whose value picks an entry, e.g. nearest = "T") '
                            f"and nearest needs points")
    if not any(k in raw for k in ("point", "points", "computed")):
        raise TemplateError(f"{label}: sets nothing; give point, nearest with points, or computed")
    point = _partial_point(raw["point"], space, f"{label} point") if "point" in raw else None
    nearest, points = None, None
    if "points" in raw:
        nearest = _text(raw["nearest"], f"{label} nearest", 'nearest = "T"')
        if not nearest.isidentifier():
            raise TemplateError(f"{label} nearest: {nearest!r} is not a dimension name; name one, e.g. nearest = \"T\"")
        if not isinstance(raw["points"], dict) or not raw["points"]:
            raise TemplateError(f'{label} points: must be a table of integer keys, e.g. points = {{ "1" = {{ ... }}, '
                                f'"64" = {{ ... }} }}')
        by_key: dict[int, dict[str, Any]] = {}
        for key, entry in raw["points"].items():
            try:
                number = int(key)
            except ValueError:
                raise TemplateError(f"{label} points: key {key!r} is not an integer; keys are values of "
                                    f"{nearest} (e.g. \"64\")") from None
            if number in by_key:
                raise TemplateError(f"{label} points: key {key!r} is given twice")
            by_key[number] = _partial_point(entry, space, f"{label} points.{key}")
        points = {k: by_key[k] for k in sorted(by_key)}
    computed_raw = raw.get("computed", {})
    if not isinstance(computed_raw, dict) or ("computed" in raw and not computed_raw):
        raise TemplateError(f'{label} computed: must be a table of parameter = "expression", e.g. '
                            f'computed = {{ NUM_SPLITS = "cdiv(S_KV, 256)" }}')
    computed, expressions = {}, {}
    for name, text in computed_raw.items():
        if name not in space.names:
            raise TemplateError(f"{label} computed: unknown parameter {name!r}; the space has {', '.join(space.names)}")
        computed[name] = _text(text, f"{label} computed {name}", f'{name} = "cdiv(S_KV, 256)"')
        expressions[name] = _expression(computed[name], f"{label} computed {name}", f"computed {name}")
    rule = BaselineRule(index=index, source=source, when=when_text, point=point, nearest=nearest, points=points,
                        computed=computed, where=where, _when=when, _computed=expressions)
    if not computed:
        # Nothing depends on the shape but which entry is picked: every point it can give is checked now.
        for partial in ([point] if point is not None else list((points or {}).values())):
            problems = space.problems({**baseline, **partial})
            if problems:
                raise TemplateError(f"{label}: its point {partial} (with [baseline] for the rest) is not in "
                                    f"the space: {'; '.join(problems)}")
    return rule


def parse_rules(raw: Any, space: Space, baseline: Mapping[str, Any], where: str) -> tuple[BaselineRule, ...]:
    """The ``[[baselines]]`` rules of a template (``raw``: the TOML value; ``where``: the template
    file, for errors). Raises TemplateError naming the rule (index) and field, with the fix."""
    if not isinstance(raw, list) or not all(isinstance(r, dict) for r in raw):
        raise TemplateError(f"{where} [[baselines]]: must be an array of tables, one [[baselines]] per rule")
    return tuple(_rule(i, r, space, baseline, where) for i, r in enumerate(raw))


def resolve(rules: tuple[BaselineRule, ...], shape: "Shape", space: Space, baseline: Mapping[str, Any],
            default_source: str, where: str) -> BaselinePoint:
    """The baseline point of ``shape``: the first rule whose ``when`` holds, its parameters over
    ``baseline``; ``baseline`` itself (source ``default_source``) when no rule applies."""
    for rule in rules:
        if rule.applies(shape):
            point = {**baseline, **rule.partial(shape)}
            problems = space.problems(point)
            if problems:
                raise TemplateError(f"{rule.label}: on shape {shape.name} it gives {point}, which is not in "
                                    f"the space: {'; '.join(problems)}; fix the rule or the [space]")
            return BaselinePoint({name: point[name] for name in space.names}, rule.source, rule.index)
    return BaselinePoint(dict(baseline), default_source, None)
