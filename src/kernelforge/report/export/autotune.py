"""``triton.Config``s that ``@triton.autotune`` accepts, read off the winners' sources (the Triton
export's ``AUTOTUNE_CONFIGS``).

A template bakes its point into the rendered source, under the template's own names
(``BLOCK_SIZE_N2``), while ``@triton.autotune`` hands a config's values to the kernel's
``tl.constexpr`` parameters by the kernel's names (``BLOCK_SIZE_N``). So each winner's launches
are read statically (the source is parsed, nothing of it runs): at every ``kernel[grid](...)``
of a ``@triton.jit`` function of the module, each keyword that names one of the kernel's
constexpr parameters and whose value is fixed by the point (a literal, or an expression of
module-level constants of which one is a template parameter: ``BLOCK_SIZE_N=BLOCK_SIZE_N2``,
``HALF_N=BLOCK_SIZE_N // 2``) becomes a config value, and ``num_warps``/``num_stages``/
``num_ctas``/``maxnreg`` become its options. Keywords computed at run time (``TOPK=topk``) or
from model constants (``ALPHA=SWIGLU_ALPHA``) stay with the caller's launch.

A meta-parameter that the host code also reads (for the grid, or to prepare inputs such as
the MoE's tokens padded to ``BLOCK_SIZE_M``) is listed in ``host_bound``: ``@triton.autotune``
can tune it only if the caller computes those from the config as well (a grid ``lambda META``
can; a padding done before the launch cannot).
"""

from __future__ import annotations

import ast
import operator
from dataclasses import dataclass
from typing import Any

#: Launch options a triton.Config carries beside its kwargs.
OPTIONS = ("num_warps", "num_stages", "num_ctas", "maxnreg")
_BINARY = {ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul, ast.FloorDiv: operator.floordiv,
           ast.Div: operator.truediv, ast.Mod: operator.mod, ast.Pow: operator.pow, ast.LShift: operator.lshift,
           ast.RShift: operator.rshift}


@dataclass(frozen=True)
class KernelConfig:
    """One launch of a ``@triton.jit`` kernel as a ``triton.Config``: its meta-parameters by the
    kernel's names, its options, and which of the meta-parameters the host code also reads."""

    kernel: str
    kwargs: tuple[tuple[str, Any], ...]
    options: tuple[tuple[str, int], ...]
    host_bound: tuple[str, ...] = ()

    def expr(self, module: str = "triton") -> str:
        """The ``triton.Config({...}, num_warps=...)`` source text."""
        extra = "".join(f", {k}={v!r}" for k, v in self.options)
        return f"{module}.Config({dict(self.kwargs)!r}{extra})"


def launch_configs(source: str, params: dict[str, Any]) -> list[KernelConfig]:
    """Every launch of a ``@triton.jit`` kernel in ``source`` (a candidate rendered at the point
    ``params``) as a :class:`KernelConfig`, in source order. Empty when the source does not parse."""
    try:
        tree = ast.parse(source)
    except SyntaxError:
        return []
    tunable = {name.lower() for name in params}
    consts: dict[str, Any] = {}
    for node in tree.body:
        if isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name):
            value = _evaluate(node.value, consts)
            if value is not None:
                consts[node.targets[0].id] = value
    kernels = {node.name: _constexprs(node) for node in tree.body
               if isinstance(node, ast.FunctionDef) and any(_is_jit(d) for d in node.decorator_list)}
    launches = [call for call in ast.walk(tree) if isinstance(call, ast.Call) and isinstance(call.func, ast.Subscript)
                and isinstance(call.func.value, ast.Name) and call.func.value.id in kernels]
    keyword_values = {id(kw.value) for call in launches for kw in call.keywords}
    host_reads = _host_reads(tree, set(kernels), keyword_values)
    found = []
    for call in sorted(launches, key=lambda c: (c.lineno, c.col_offset)):
        name = call.func.value.id  # type: ignore[attr-defined]
        kwargs, options, bound = [], [], []
        for kw in call.keywords:
            if kw.arg is None:
                continue
            value = _evaluate(kw.value, consts)
            if value is None:
                continue
            if kw.arg in OPTIONS:
                options.append((kw.arg, value))
                continue
            reads = {n.id for n in ast.walk(kw.value) if isinstance(n, ast.Name)}
            if kw.arg in kernels[name] and (not reads or any(r.lower() in tunable for r in reads)):
                kwargs.append((kw.arg, value))
                if reads & host_reads:
                    bound.append(kw.arg)
        found.append(KernelConfig(name, tuple(kwargs), tuple(options), tuple(bound)))
    return found


def _is_jit(decorator: ast.expr) -> bool:
    target = decorator.func if isinstance(decorator, ast.Call) else decorator
    return ast.unparse(target) in ("triton.jit", "jit")


def _constexprs(fn: ast.FunctionDef) -> set[str]:
    return {a.arg for a in [*fn.args.args, *fn.args.kwonlyargs]
            if a.annotation is not None and ast.unparse(a.annotation).split(".")[-1] == "constexpr"}


def _host_reads(tree: ast.Module, kernels: set[str], skip: set[int]) -> set[str]:
    """Module-level names read by the host code (outside the jit kernels and outside the launch
    keywords themselves): in a grid, a helper call, an allocation."""
    reads: set[str] = set()

    def visit(node: ast.AST) -> None:
        if id(node) in skip:
            return
        if isinstance(node, ast.Name) and isinstance(node.ctx, ast.Load):
            reads.add(node.id)
        for child in ast.iter_child_nodes(node):
            visit(child)

    for node in tree.body:
        if isinstance(node, ast.FunctionDef) and node.name not in kernels:
            visit(node)
    return reads


def _evaluate(node: ast.expr, consts: dict[str, Any]) -> Any:
    """The value of a constant expression over ``consts`` (numbers, strings, bools and arithmetic
    on them), else None. Nothing is executed."""
    if isinstance(node, ast.Constant) and isinstance(node.value, (int, float, str, bool)):
        return node.value
    if isinstance(node, ast.Name):
        return consts.get(node.id)
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub):
        value = _evaluate(node.operand, consts)
        return -value if isinstance(value, (int, float)) and not isinstance(value, bool) else None
    if isinstance(node, ast.BinOp) and type(node.op) in _BINARY:
        left, right = _evaluate(node.left, consts), _evaluate(node.right, consts)
        if all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in (left, right)):
            try:
                return _BINARY[type(node.op)](left, right)
            except (ArithmeticError, ValueError):
                return None
    return None


def kernel_sources(source: str) -> dict[str, str]:
    """Each ``@triton.jit`` function of ``source`` by name -> its text (normalised by the parser)."""
    try:
        tree = ast.parse(source)
    except SyntaxError:
        return {}
    return {node.name: ast.unparse(node) for node in tree.body
            if isinstance(node, ast.FunctionDef) and any(_is_jit(d) for d in node.decorator_list)}


@dataclass(frozen=True)
class AutotuneTable:
    """Per kernel of a block's winner modules: its configs (one per distinct launch), the module
    that defines it, and the meta-parameters its host code also reads. A kernel whose text differs
    between modules is keyed ``<module file>:<kernel>`` (its configs fit that definition only)."""

    configs: dict[str, tuple[KernelConfig, ...]]
    modules: dict[str, str]
    host_bound: dict[str, tuple[str, ...]]


def autotune_table(winners: dict[str, tuple[str, dict[str, Any]]]) -> AutotuneTable:
    """The table of the winner modules ``winners`` (file name -> (source, point))."""
    texts: dict[str, set[str]] = {}
    for source, _ in winners.values():
        for name, text in kernel_sources(source).items():
            texts.setdefault(name, set()).add(text)
    configs: dict[str, list[KernelConfig]] = {}
    modules: dict[str, str] = {}
    bound: dict[str, list[str]] = {}
    for file, (source, params) in winners.items():
        for found in launch_configs(source, params):
            key = found.kernel if len(texts.get(found.kernel, ())) <= 1 else f"{file}:{found.kernel}"
            modules.setdefault(key, file)
            if all((c.kwargs, c.options) != (found.kwargs, found.options) for c in configs.get(key, [])):
                configs.setdefault(key, []).append(found)
            bound.setdefault(key, [])
            bound[key].extend(b for b in found.host_bound if b not in bound[key])
    return AutotuneTable({k: tuple(v) for k, v in configs.items()}, modules,
                         {k: tuple(v) for k, v in bound.items() if v})
