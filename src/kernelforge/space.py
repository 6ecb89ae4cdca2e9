"""Search spaces: parameter -> allowed values, plus constraints between parameters.

Constraints are Python expressions over the parameter names (``"BLOCK_N <= BLOCK_M"``,
``"BLOCK_M * BLOCK_K * num_stages <= 65536"``), evaluated by a small interpreter that accepts only
arithmetic, comparisons, boolean logic and ``min``/``max``: a job or template file can never run
code through a constraint. The same evaluator (:class:`Expression`) reads the ``when`` and
``computed`` expressions of a template's baseline rules (:mod:`kernelforge.baselines`). It is
bounded (:mod:`kernelforge.limits`): at most :data:`~kernelforge.limits.MAX_EXPRESSION_CHARS`
characters and :data:`~kernelforge.limits.MAX_EXPRESSION_NODES` nodes, each visited once, and its
arithmetic through :func:`~kernelforge.limits.bounded_arithmetic` (``7 ** 7 ** 9`` is refused, not
computed), so evaluating any header takes microseconds.
"""

from __future__ import annotations

import ast
import datetime
import itertools
import json
import keyword
import math
import numbers
import operator
import random
from dataclasses import dataclass
from typing import Any, Callable, Iterator, Mapping, Sequence

from kernelforge.errors import UserError
from kernelforge.limits import MAX_EXPRESSION_CHARS, MAX_EXPRESSION_NODES, LimitExceeded, bounded_arithmetic

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
_SYMBOLS = {ast.Add: "+", ast.Sub: "-", ast.Mult: "*", ast.Div: "/", ast.FloorDiv: "//", ast.Mod: "%", ast.Pow: "**"}
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
#: The functions a space constraint may call.
SAFE_FUNCTIONS: Mapping[str, Callable[..., Any]] = {"min": min, "max": max, "abs": abs}


def _spoken(names: list[str]) -> str:
    return names[0] if len(names) == 1 else f"{', '.join(names[:-1])} or {names[-1]}"


class Expression:
    """One parsed safe expression: arithmetic, comparisons, and/or/not, tuples and calls of
    ``functions`` only, so a job or template file can never run code through it.

    ``known``: the names it may use (None: any, checked only when it is evaluated); ``what``
    names it in errors ("constraint", "when", ...). :meth:`evaluate` computes it over a mapping
    of names to values (KeyError: a name the mapping lacks).
    """

    def __init__(self, text: str, known: set[str] | None, where: str, *, what: str = "constraint",
                 functions: Mapping[str, Callable[..., Any]] = SAFE_FUNCTIONS):
        self.text = text
        self.what = what
        self.where = where
        self.functions = dict(functions)
        if len(text) > MAX_EXPRESSION_CHARS:
            raise UserError(f"{where}: {what} of {len(text)} characters is over the limit of {MAX_EXPRESSION_CHARS} "
                            "(MAX_EXPRESSION_CHARS)")
        try:
            self._tree = ast.parse(text, mode="eval").body
        except SyntaxError as exc:
            raise UserError(f"{where}: {what} {text!r} is not a valid expression ({exc.msg})") from None
        except (ValueError, RecursionError, MemoryError) as exc:  # null bytes, absurd nesting
            raise UserError(f"{where}: {what} {text!r} cannot be parsed ({type(exc).__name__})") from None
        if sum(1 for _ in ast.walk(self._tree)) > MAX_EXPRESSION_NODES:
            raise UserError(f"{where}: {what} {text!r} has over {MAX_EXPRESSION_NODES} syntax nodes "
                            "(MAX_EXPRESSION_NODES)")
        self._check_nodes(where)  # first: a call of len() is a call refused, not an unknown parameter
        #: The names the expression reads (its functions excluded).
        self.names = frozenset(n.id for n in ast.walk(self._tree) if isinstance(n, ast.Name)) - set(self.functions)
        unknown = sorted(self.names - known) if known is not None else []
        if unknown:
            raise UserError(
                f"{where}: {what} {text!r} names unknown parameter(s) {', '.join(unknown)}; "
                f"parameters are {', '.join(sorted(known or ()))}"
            )

    def _check_nodes(self, where: str) -> None:
        allowed = (
            ast.Expression, ast.BoolOp, ast.And, ast.Or, ast.UnaryOp, ast.Not, ast.USub, ast.UAdd,
            ast.BinOp, ast.Compare, ast.Name, ast.Load, ast.Constant, ast.Call, ast.Tuple, ast.List,
            *_BINOPS, *_CMPOPS,
        )
        names = list(self.functions)
        for node in ast.walk(self._tree):
            if not isinstance(node, allowed):
                raise UserError(
                    f"{where}: {self.what} {self.text!r} uses {type(node).__name__}, which is not "
                    f"allowed; use arithmetic, comparisons, and/or/not, {', '.join(names)}"
                )
            if isinstance(node, ast.Call) and not (
                isinstance(node.func, ast.Name) and node.func.id in self.functions and not node.keywords
            ):
                raise UserError(f"{where}: {self.what} {self.text!r} may only call {_spoken(names)}")

    def evaluate(self, values: Point) -> Any:
        """The expression's value over ``values`` (name -> value); arithmetic past a limit of
        :mod:`kernelforge.limits` is a :class:`UserError` naming the expression and the limit."""
        try:
            return _evaluate(self._tree, values, self.functions)
        except LimitExceeded as exc:
            raise UserError(f"{self.where}: {self.what} {self.text!r}: {exc}") from None

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.text!r})"


class Constraint(Expression):
    """One parsed constraint expression over a space's parameters; :meth:`holds` evaluates it at a point."""

    def __init__(self, text: str, known: set[str], where: str):
        super().__init__(text, known, where)

    def holds(self, point: Point) -> bool:
        return bool(self.evaluate(point))


def _evaluate(node: ast.AST, point: Point, functions: Mapping[str, Callable[..., Any]]) -> Any:
    def value(n: ast.AST) -> Any:
        return _evaluate(n, point, functions)

    if isinstance(node, ast.Constant):
        return node.value
    if isinstance(node, ast.Name):
        return functions[node.id] if node.id in functions else point[node.id]
    if isinstance(node, (ast.Tuple, ast.List)):
        return tuple(value(e) for e in node.elts)
    if isinstance(node, ast.BinOp):
        return bounded_arithmetic(_SYMBOLS[type(node.op)], value(node.left), value(node.right), _BINOPS[type(node.op)])
    if isinstance(node, ast.UnaryOp):
        operand = value(node.operand)
        return {ast.Not: operator.not_, ast.USub: operator.neg, ast.UAdd: operator.pos}[type(node.op)](operand)
    if isinstance(node, ast.BoolOp):
        values = (value(v) for v in node.values)
        return all(values) if isinstance(node.op, ast.And) else any(values)
    if isinstance(node, ast.Compare):
        left = value(node.left)
        for op, comparator in zip(node.ops, node.comparators):
            right = value(comparator)
            if not _CMPOPS[type(op)](left, right):
                return False
            left = right
        return True
    if isinstance(node, ast.Call):
        return value(node.func)(*(value(a) for a in node.args))
    raise TypeError(f"unexpected node {type(node).__name__}")  # excluded by _check_nodes


@dataclass(frozen=True)
class Space:
    """Parameters with their allowed values (in declaration order) and constraints.

    ``feasible``: when given, the only points that exist (their values in parameter order), on
    top of the constraints: a recorded space whose restrictions are known only by the
    configurations that were measured (Kernel Tuner never compiles the others).
    """

    params: tuple[tuple[str, tuple[Any, ...]], ...]
    constraints: tuple[Constraint, ...] = ()
    feasible: frozenset[tuple[Any, ...]] | None = None

    @classmethod
    def build(cls, params: Mapping[str, Any], constraints: list[str] | tuple[str, ...], where: str, *,
              constraints_where: str | None = None) -> "Space":
        """Validate a raw mapping (from TOML) and build a space; ``where`` names the source in errors
        (``constraints_where`` the constraints' source, when it is another field)."""
        built: list[tuple[str, tuple[Any, ...]]] = []
        for name, values in params.items():
            if not name.isidentifier() or keyword.iskeyword(name):
                why = "a Python keyword" if name.isidentifier() else "not a Python identifier"
                raise UserError(f"{where}: parameter name {name!r} is {why}; rename it")
            if not isinstance(values, (list, tuple)) or not values:
                raise UserError(f"{where}: parameter {name} must list its allowed values, e.g. {name} = [32, 64]")
            for value in values:
                if not is_value(value):
                    raise UserError(f"{where}: parameter {name}: {value} is {_kind(value)}, which no parameter "
                                    "takes; values are finite numbers, booleans or strings, e.g. "
                                    f"{name} = [32, 64] or {name} = [\"a\", \"b\"]")
            if len(set(map(repr, values))) != len(values):
                raise UserError(f"{where}: parameter {name} lists a value twice: {list(values)}")
            built.append((name, tuple(values)))
        known = {name for name, _ in built}
        parsed = tuple(Constraint(text, known, constraints_where or where) for text in constraints)
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
            if name in point and not is_one_of(point[name], allowed):
                out.append(f"{name}={point[name]!r} is not one of {list(allowed)}")
        if not out:
            out.extend(f"violates constraint {c.text!r} at {_values(c, point)}" for c in self.constraints
                       if not c.holds(point))
        if not out and self.feasible is not None and tuple(point[n] for n in self.names) not in self.feasible:
            out.append("is not one of the space's feasible configurations")
        return out

    def contains(self, point: Point) -> bool:
        return not self.problems(point)

    def valid_count(self, *, exact_up_to: int = 200_000, samples: int = 20_000) -> tuple[int, bool]:
        """How many points satisfy the constraints, and whether that is exact: counted over the
        grid up to ``exact_up_to`` points, else estimated from ``samples`` uniform draws (seeded,
        so the estimate is the same every time); a million-point space is not listed to count it."""
        if self.feasible is not None:
            return sum(1 for _ in self.points()), True
        if not self.constraints or self.size <= exact_up_to:
            return (self.size if not self.constraints else sum(1 for _ in self.points())), True
        rng = random.Random(0)
        names = self.names
        hits = 0
        for _ in range(samples):
            point = {name: rng.choice(values) for name, values in zip(names, (v for _, v in self.params))}
            hits += all(c.holds(point) for c in self.constraints)
        return round(self.size * hits / samples), False

    def points(self, reverse: bool = False) -> Iterator[dict[str, Any]]:
        """Every point that satisfies the constraints, in grid order (``reverse``: from the grid's
        end, so the last point of a million-point space is found without listing the others)."""
        names = self.names
        feasible = self.feasible
        if feasible is not None and len(feasible) * 4 < self.size:
            # Far fewer feasible points than grid points: order the feasible ones, list nothing else.
            rank = [{value: i for i, value in enumerate(values)} for _, values in self.params]
            combos = sorted(feasible, key=lambda key: tuple(r[v] for r, v in zip(rank, key)), reverse=reverse)
        else:
            combos = itertools.product(*(values[::-1] if reverse else values for _, values in self.params))
        for combo in combos:
            if feasible is not None and combo not in feasible:
                continue
            point = dict(zip(names, combo))
            if all(c.holds(point) for c in self.constraints):
                yield point


def _values(constraint: Constraint, point: Point) -> str:
    """The values ``constraint`` reads at ``point``, in the point's order (``BLOCK_N=64, BLOCK_M=32``)."""
    return ", ".join(f"{name}={value!r}" for name, value in point.items() if name in constraint.names)


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


def is_value(value: Any) -> bool:
    """Whether ``value`` can be a parameter's value: a boolean, a string, an integer or a finite
    float (what renders into a module's source and compares equal to itself). Not a TOML date,
    array or table, and not ``nan`` or ``inf``."""
    if isinstance(value, float):
        return math.isfinite(value)
    if isinstance(value, tuple):  # a space built in Python may pair values (TOML gives lists, refused)
        return all(is_value(item) for item in value)
    return isinstance(value, (bool, int, str))


def toml_value(value: Any) -> str:
    """A parameter value (:func:`is_value`) as a TOML literal, as a header spells it: ``true``,
    ``64``, ``0.5``, ``"tl.float32"``."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, str):
        return json.dumps(value)  # a TOML basic string: JSON's escapes are TOML's
    return repr(value)


def _kind(value: Any) -> str:
    if isinstance(value, float):
        return "not a finite number"
    if isinstance(value, (datetime.date, datetime.time)):
        return "a date or time"
    return {list: "an array", tuple: "an array", dict: "a table"}.get(type(value), f"a {type(value).__name__}")


def is_one_of(value: Any, allowed: Sequence[Any]) -> bool:
    """Whether ``value`` is one of a parameter's ``allowed`` values: equal, and of the same kind where
    the kind changes what renders. Python has ``True == 1`` and ``256.0 == 256``, but a template
    rendered at ``True`` or ``256.0`` is not the one rendered at ``1`` or ``256`` (``tl.arange`` takes
    no float): a boolean matches only a boolean, and an integer value only an integer. An integer
    may stand for a float value (``1`` for ``1.0``)."""
    for option in allowed:
        if value != option:
            continue
        if isinstance(value, bool) or isinstance(option, bool):
            if isinstance(value, bool) and isinstance(option, bool):
                return True
        elif not isinstance(option, numbers.Integral) or isinstance(value, numbers.Integral):
            return True
    return False


def is_number(value: Any) -> bool:
    """Whether a parameter value is a number (an int or a float; a boolean is a switch, not one)."""
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def is_integer(value: Any) -> bool:
    """Whether a parameter value is an integer (not a boolean)."""
    return isinstance(value, int) and not isinstance(value, bool)
