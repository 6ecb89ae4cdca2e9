"""Search spaces: parameter -> allowed values, plus constraints between parameters.

Constraints are Python expressions over the parameter names (``"BLOCK_N <= BLOCK_M"``,
``"BLOCK_M * BLOCK_K * num_stages <= 65536"``), evaluated by a small interpreter that accepts only
arithmetic, comparisons, boolean logic and ``min``/``max``: a job or template file can never run
code through a constraint.
"""

from __future__ import annotations

import ast
import itertools
import operator
from dataclasses import dataclass
from typing import Any, Iterator, Mapping

from kernelforge.errors import UserError

Point = Mapping[str, Any]

_BINOPS = {
    ast.Add: operator.add,
    ast.Sub: operator.sub,
    ast.Mult: operator.mul,
    ast.Div: operator.truediv,
    ast.FloorDiv: operator.floordiv,
    ast.Mod: operator.mod,
    ast.Pow: operator.pow,
}
_CMPOPS = {
    ast.Lt: operator.lt,
    ast.LtE: operator.le,
    ast.Gt: operator.gt,
    ast.GtE: operator.ge,
    ast.Eq: operator.eq,
    ast.NotEq: operator.ne,
    ast.In: lambda a, b: a in b,
    ast.NotIn: lambda a, b: a not in b,
}
_FUNCS = {"min": min, "max": max, "abs": abs}


class Constraint:
    """One parsed constraint expression; :meth:`holds` evaluates it at a point."""

    def __init__(self, text: str, known: set[str], where: str):
        self.text = text
        try:
            self._tree = ast.parse(text, mode="eval").body
        except SyntaxError as exc:
            raise UserError(f"{where}: constraint {text!r} is not a valid expression ({exc.msg})") from None
        names = {n.id for n in ast.walk(self._tree) if isinstance(n, ast.Name)} - set(_FUNCS)
        unknown = sorted(names - known)
        if unknown:
            raise UserError(
                f"{where}: constraint {text!r} names unknown parameter(s) {', '.join(unknown)}; "
                f"parameters are {', '.join(sorted(known))}"
            )
        self._check_nodes(where)

    def _check_nodes(self, where: str) -> None:
        allowed = (
            ast.Expression, ast.BoolOp, ast.And, ast.Or, ast.UnaryOp, ast.Not, ast.USub, ast.UAdd,
            ast.BinOp, ast.Compare, ast.Name, ast.Load, ast.Constant, ast.Call, ast.Tuple, ast.List,
            *_BINOPS, *_CMPOPS,
        )
        for node in ast.walk(self._tree):
            if not isinstance(node, allowed):
                raise UserError(
                    f"{where}: constraint {self.text!r} uses {type(node).__name__}, which is not "
                    "allowed; use arithmetic, comparisons, and/or/not, min, max, abs"
                )
            if isinstance(node, ast.Call) and not (
                isinstance(node.func, ast.Name) and node.func.id in _FUNCS and not node.keywords
            ):
                raise UserError(f"{where}: constraint {self.text!r} may only call min, max or abs")

    def holds(self, point: Point) -> bool:
        return bool(_evaluate(self._tree, point))

    def __repr__(self) -> str:
        return f"Constraint({self.text!r})"


def _evaluate(node: ast.AST, point: Point) -> Any:
    if isinstance(node, ast.Constant):
        return node.value
    if isinstance(node, ast.Name):
        return _FUNCS[node.id] if node.id in _FUNCS else point[node.id]
    if isinstance(node, (ast.Tuple, ast.List)):
        return tuple(_evaluate(e, point) for e in node.elts)
    if isinstance(node, ast.BinOp):
        return _BINOPS[type(node.op)](_evaluate(node.left, point), _evaluate(node.right, point))
    if isinstance(node, ast.UnaryOp):
        value = _evaluate(node.operand, point)
        return {ast.Not: operator.not_, ast.USub: operator.neg, ast.UAdd: operator.pos}[type(node.op)](value)
    if isinstance(node, ast.BoolOp):
        values = (_evaluate(v, point) for v in node.values)
        return all(values) if isinstance(node.op, ast.And) else any(values)
    if isinstance(node, ast.Compare):
        left = _evaluate(node.left, point)
        for op, comparator in zip(node.ops, node.comparators):
            right = _evaluate(comparator, point)
            if not _CMPOPS[type(op)](left, right):
                return False
            left = right
        return True
    if isinstance(node, ast.Call):
        return _evaluate(node.func, point)(*(_evaluate(a, point) for a in node.args))
    raise TypeError(f"unexpected node {type(node).__name__}")  # excluded by _check_nodes


@dataclass(frozen=True)
class Space:
    """Parameters with their allowed values (in declaration order) and constraints."""

    params: tuple[tuple[str, tuple[Any, ...]], ...]
    constraints: tuple[Constraint, ...] = ()

    @classmethod
    def build(cls, params: Mapping[str, Any], constraints: list[str] | tuple[str, ...], where: str) -> "Space":
        """Validate a raw mapping (from TOML) and build a space; ``where`` names the source in errors."""
        built: list[tuple[str, tuple[Any, ...]]] = []
        for name, values in params.items():
            if not name.isidentifier():
                raise UserError(f"{where}: parameter name {name!r} is not a Python identifier")
            if not isinstance(values, (list, tuple)) or not values:
                raise UserError(f"{where}: parameter {name} must list its allowed values, e.g. {name} = [32, 64]")
            if len(set(map(repr, values))) != len(values):
                raise UserError(f"{where}: parameter {name} lists a value twice: {list(values)}")
            built.append((name, tuple(values)))
        known = {name for name, _ in built}
        parsed = tuple(Constraint(text, known, where) for text in constraints)
        return cls(tuple(built), parsed)

    @property
    def names(self) -> tuple[str, ...]:
        return tuple(name for name, _ in self.params)

    def values(self, name: str) -> tuple[Any, ...]:
        return dict(self.params)[name]

    @property
    def size(self) -> int:
        """Number of points before constraints."""
        total = 1
        for _, values in self.params:
            total *= len(values)
        return total

    def problems(self, point: Point) -> list[str]:
        """Why ``point`` is not a valid point of this space (empty when it is)."""
        out: list[str] = []
        names = set(self.names)
        missing = [n for n in self.names if n not in point]
        unknown = sorted(set(point) - names)
        if missing:
            out.append(f"missing parameter(s) {', '.join(missing)}")
        if unknown:
            out.append(f"unknown parameter(s) {', '.join(unknown)} (the space has {', '.join(self.names)})")
        for name, allowed in self.params:
            if name in point and point[name] not in allowed:
                out.append(f"{name}={point[name]!r} is not one of {list(allowed)}")
        if not out:
            out.extend(f"violates constraint {c.text!r}" for c in self.constraints if not c.holds(point))
        return out

    def contains(self, point: Point) -> bool:
        return not self.problems(point)

    def points(self) -> Iterator[dict[str, Any]]:
        """Every point that satisfies the constraints, in grid order."""
        names = self.names
        for combo in itertools.product(*(values for _, values in self.params)):
            point = dict(zip(names, combo))
            if all(c.holds(point) for c in self.constraints):
                yield point


def parse_value(text: str) -> Any:
    """Parse a command-line ``PARAM=VALUE`` value: int, float, true/false, else the string."""
    lowered = text.strip().lower()
    if lowered in ("true", "false"):
        return lowered == "true"
    for kind in (int, float):
        try:
            return kind(text)
        except ValueError:
            pass
    return text
