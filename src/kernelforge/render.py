"""Rendering a template body: data, never code.

A template's body is Jinja, and Jinja is a programming language: a plain environment lets an
expression walk from any value to ``__subclasses__()`` and run anything in the process that renders
it, which is the trusted one (the search, ``check``, the LLM route, a resume). So every template
body in kernelforge is parsed and rendered here, and only here (:func:`parse_body`,
:func:`render_body`; ``tests/test_architecture.py`` checks that no other module compiles Jinja
text):

- **A small language.** The body may use only: text, ``{{ expr }}``, ``{% if %}`` / ``elif`` /
  ``else``, ``{% for NAME in range(...) %}``, comments, and in expressions constants, names,
  arithmetic, comparisons, ``and`` / ``or`` / ``not``, ``x if c else y``, ``~``, tuples and lists,
  the tests of :data:`TESTS` and the filters of :data:`FILTERS`. There is no attribute or item
  access, no call but ``range``, no ``set``, macro, block, include, import or filter block: each is
  refused with its line when the template is loaded (:class:`BodyRefused`).
- **Nothing reachable.** It renders in a :class:`jinja2.sandbox.ImmutableSandboxedEnvironment`
  whose only global is ``range`` and whose filters and tests are the pure ones listed; values are
  the declared parameters (numbers, strings, booleans) and loop counters.
- **Bounded.** Arithmetic goes through :func:`kernelforge.limits.bounded_arithmetic` (no
  ``7 ** 7 ** 9``, no string a gigabyte long); loops draw on one budget of
  :data:`~kernelforge.limits.MAX_RENDER_ITERATIONS` per render; the output is cut at
  :data:`~kernelforge.limits.MAX_RENDER_CHARS`; and a wall-clock backstop of
  :data:`~kernelforge.limits.MAX_RENDER_SECONDS` is checked at every iteration and every piece of
  output. A body larger than :data:`~kernelforge.limits.MAX_SOURCE_CHARS` is not parsed at all.
"""

from __future__ import annotations

import contextvars
import functools
import operator
import time
from dataclasses import dataclass
from typing import Any, Iterator, Mapping

import jinja2
from jinja2 import nodes
from jinja2.defaults import DEFAULT_FILTERS, DEFAULT_TESTS
from jinja2.sandbox import ImmutableSandboxedEnvironment, SecurityError

from kernelforge.limits import (MAX_RENDER_CHARS, MAX_RENDER_ITERATIONS, MAX_RENDER_SECONDS, MAX_SOURCE_CHARS,
                                LimitExceeded, bounded_arithmetic)

#: The filters a body may use: pure functions of numbers and strings.
FILTERS = ("abs", "float", "int", "lower", "round", "string", "trim", "upper")
#: The tests a body may use (``{% if X is even %}``).
TESTS = ("divisibleby", "eq", "even", "false", "ge", "gt", "in", "integer", "le", "lt", "ne", "none", "number",
         "odd", "string", "true", "boolean", "float")
#: Jinja's syntax nodes a body may contain (see the module docstring); everything else is refused.
_ALLOWED = (
    nodes.Template, nodes.Output, nodes.TemplateData, nodes.Const, nodes.Name, nodes.If, nodes.For,
    nodes.CondExpr, nodes.Compare, nodes.Operand, nodes.And, nodes.Or, nodes.Not, nodes.Neg, nodes.Pos,
    nodes.Add, nodes.Sub, nodes.Mul, nodes.Div, nodes.FloorDiv, nodes.Mod, nodes.Pow, nodes.Concat,
    nodes.Filter, nodes.Test, nodes.Call, nodes.Tuple, nodes.List,
)
_OPERATORS = {"+": operator.add, "-": operator.sub, "*": operator.mul, "/": operator.truediv,
              "//": operator.floordiv, "%": operator.mod, "**": operator.pow}


class BodyRefused(jinja2.TemplateError):
    """A body that uses something outside the allowed language (:data:`_ALLOWED`), with its line."""

    def __init__(self, message: str, lineno: int | None):
        super().__init__(message)
        self.lineno = lineno


class RenderLimit(SecurityError):
    """A render that went past a limit of :mod:`kernelforge.limits` (the message names it)."""


@dataclass
class _Budget:
    """What one render may still spend: loop iterations and wall time."""

    iterations: int
    deadline: float

    def spend(self) -> None:
        self.iterations -= 1
        if self.iterations < 0:
            raise RenderLimit(f"the template's loops ran over {MAX_RENDER_ITERATIONS} iterations "
                              "(MAX_RENDER_ITERATIONS)")
        if time.monotonic() > self.deadline:
            raise RenderLimit(f"rendering took over {MAX_RENDER_SECONDS:g} s (MAX_RENDER_SECONDS)")


_BUDGET: contextvars.ContextVar[_Budget | None] = contextvars.ContextVar("kernelforge_render_budget", default=None)


def _range(*args: Any) -> Iterator[int]:
    """``range`` whose every step is paid from the current render's budget (nested loops share it)."""
    if not all(isinstance(a, int) for a in args) or not 1 <= len(args) <= 3:
        raise RenderLimit("range takes one to three integers")
    budget = _BUDGET.get()
    for value in range(*args):
        if budget is None:
            raise RenderLimit("range is only available while rendering")
        budget.spend()
        yield value


class _Environment(ImmutableSandboxedEnvironment):
    """The sandbox with every arithmetic operator intercepted (so none is folded at parse time,
    either) and computed through :func:`~kernelforge.limits.bounded_arithmetic`."""

    intercepted_binops = frozenset(_OPERATORS)

    def call_binop(self, context: Any, operator: str, left: Any, right: Any) -> Any:
        try:
            return bounded_arithmetic(operator, left, right, _OPERATORS[operator])
        except LimitExceeded as exc:
            raise RenderLimit(str(exc)) from None

    def is_safe_attribute(self, obj: Any, attr: str, value: Any) -> bool:
        return False  # attribute access is refused when parsed; this is the second lock

    def is_safe_callable(self, obj: Any) -> bool:
        return obj is _range


def _environment() -> _Environment:
    env = _Environment(undefined=jinja2.StrictUndefined, keep_trailing_newline=True, autoescape=False)
    env.globals.clear()
    env.globals["range"] = _range
    env.filters = {name: DEFAULT_FILTERS[name] for name in FILTERS}
    env.tests = {name: DEFAULT_TESTS[name] for name in TESTS}
    return env


_ENV = _environment()


def _refuse(node: nodes.Node, why: str) -> BodyRefused:
    return BodyRefused(f"{why}; a template body may use {{{{ expressions }}}} of its parameters, {{% if %}} and "
                       f"{{% for NAME in range(...) %}}, arithmetic, comparisons, the filters {', '.join(FILTERS)}",
                       getattr(node, "lineno", None))


def _check(tree: nodes.Template) -> None:
    for node in tree.find_all(nodes.Node):
        if not isinstance(node, _ALLOWED):
            raise _refuse(node, f"{type(node).__name__} ({_spoken(node)}) is not allowed")
        if isinstance(node, nodes.Call):
            if not (isinstance(node.node, nodes.Name) and node.node.name == "range") or node.kwargs \
                    or node.dyn_args or node.dyn_kwargs:
                raise _refuse(node, "the only call allowed is range(...) with positional arguments")
        elif isinstance(node, nodes.For):
            if node.recursive or node.test is not None or not isinstance(node.target, nodes.Name) \
                    or not (isinstance(node.iter, nodes.Call) and isinstance(node.iter.node, nodes.Name)
                            and node.iter.node.name == "range"):
                raise _refuse(node, "a loop must be {% for NAME in range(...) %}")
        elif isinstance(node, nodes.Filter) and (node.node is None or node.name not in FILTERS):
            raise _refuse(node, f"the filter {node.name!r} is not allowed")
        elif isinstance(node, nodes.Test) and node.name not in TESTS:
            raise _refuse(node, f"the test {node.name!r} is not allowed")
        elif isinstance(node, nodes.Name) and (node.name in ("self", "loop") or node.name.startswith("_")):
            raise _refuse(node, f"the name {node.name!r} is not allowed")


def unreadable(name: str) -> str | None:
    """Why a body cannot read a variable called ``name`` (None: it can): Jinja reads ``true``,
    ``false`` and ``none`` as constants and ``range`` as the loop's function, and
    :func:`parse_body` refuses ``self``, ``loop`` and names starting with ``_``."""
    if name.lower() in ("true", "false", "none"):
        return "a constant in a template body"
    if name == "range":
        return "the body's range(...)"
    if name in ("self", "loop") or name.startswith("_"):
        return "a name a template body may not use"
    return None


def _spoken(node: nodes.Node) -> str:
    names = {nodes.Getattr: "attribute access", nodes.Getitem: "item access", nodes.Assign: "set",
             nodes.Macro: "macro", nodes.Import: "import", nodes.Include: "include", nodes.Extends: "extends"}
    return names.get(type(node), "not in the template language")


def parse_body(text: str) -> nodes.Template:
    """Parse a template's whole text and check it against the allowed language. Raises
    :class:`jinja2.TemplateSyntaxError`, :class:`BodyRefused` (with ``lineno``) or
    :class:`~kernelforge.limits.LimitExceeded` (text over :data:`MAX_SOURCE_CHARS`)."""
    if len(text) > MAX_SOURCE_CHARS:
        raise LimitExceeded(f"the template has {len(text)} characters, over the limit of {MAX_SOURCE_CHARS} "
                            "(MAX_SOURCE_CHARS)")
    tree = _ENV.parse(text)
    _check(tree)
    return tree


@functools.lru_cache(maxsize=256)
def _compiled(text: str) -> jinja2.Template:
    # Parsing dominates rendering (about 1 ms a render for the shipped templates before caching).
    return _ENV.from_string(parse_body(text))


def render_body(text: str, values: Mapping[str, Any]) -> str:
    """Render template ``text`` (checked by :func:`parse_body`) with ``values``, within the render
    limits. Raises :class:`jinja2.TemplateError` (a :class:`RenderLimit` for a limit, naming it),
    :class:`BodyRefused`, or the exception of the body's own arithmetic (``1 // X`` at ``X = 0``)."""
    template = _compiled(text)
    budget = _Budget(MAX_RENDER_ITERATIONS, time.monotonic() + MAX_RENDER_SECONDS)
    token = _BUDGET.set(budget)
    try:
        pieces: list[str] = []
        size = 0
        for piece in template.generate(**values):
            size += len(piece)
            if size > MAX_RENDER_CHARS:
                raise RenderLimit(f"the rendered source is over {MAX_RENDER_CHARS} characters (MAX_RENDER_CHARS)")
            if time.monotonic() > budget.deadline:
                raise RenderLimit(f"rendering took over {MAX_RENDER_SECONDS:g} s (MAX_RENDER_SECONDS)")
            pieces.append(piece)
        return "".join(pieces)
    finally:
        _BUDGET.reset(token)
