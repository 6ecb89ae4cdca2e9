"""Static policy for candidate sources: an allowlist over the source's syntax tree.

A candidate is a Python module with Triton kernels and a host ``run(**inputs, **outputs)``. Before
any of it is imported, compiled or run, its source is parsed and every import, name, attribute and
call is checked against :mod:`kernelforge.policy.allowlist`. Anything not listed there is refused
with its name and line: a blocklist over a language as dynamic as Python always has a hole (aliases,
``typing``'s string evaluation, ``str.format`` field names, ...), an allowlist does not need to
foresee the route.

The rules, each explained in docs/evaluation.md: imports and module attributes only as listed; a
module name only as the base of an attribute chain; other names bound in the source or allowed
builtins; value attributes as listed per context (host or ``@triton.jit``), never assigned, never
private or dunder; no ``__`` in any string; module level holds imports, constants and functions
only; ``@triton.jit`` functions call only Triton builtins and other ``@triton.jit`` functions of the
source; no classes, ``global``, generators, async code, string annotations or bytes; narrow
``except`` and ``with`` only; no ``@`` on the host.

Torch arithmetic written with operators (``x * alpha + y``) cannot be typed statically; the run-time
guard of :mod:`kernelforge.execute.judge.verify` refuses host-side floating-point torch computation.
"""

from __future__ import annotations

import ast
import builtins
from kernelforge.policy import allowlist as allowed
from kernelforge.policy.violation import PolicyReport, Violation
from kernelforge.limits import source_problem


def _is_dunder(name: str) -> bool:
    return "__" in name


def _chain(node: ast.Attribute) -> tuple[ast.expr, list[str]]:
    parts: list[str] = []
    current: ast.expr = node
    while isinstance(current, ast.Attribute):
        parts.append(current.attr)
        current = current.value
    parts.reverse()
    return current, parts


def _bound_names(body: list[ast.stmt] | ast.expr, args: ast.arguments | None = None) -> set[str]:
    """Names a function (or the module) binds, not descending into nested functions."""
    names: set[str] = set()
    if args is not None:
        for a in [*args.posonlyargs, *args.args, *args.kwonlyargs, args.vararg, args.kwarg]:
            if a is not None:
                names.add(a.arg)
    stack: list[ast.AST] = list(body) if isinstance(body, list) else [body]
    while stack:
        node = stack.pop()
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.add(node.name)
            continue
        if isinstance(node, ast.Lambda):
            continue
        if isinstance(node, ast.Name) and isinstance(node.ctx, (ast.Store, ast.Del)):
            names.add(node.id)
        elif isinstance(node, ast.ExceptHandler) and node.name:
            names.add(node.name)
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            names.update((a.asname or a.name).split(".")[0] for a in node.names)
        stack.extend(ast.iter_child_nodes(node))
    return names


#: Constructs a candidate never needs, refused wherever they appear.
REFUSED: dict[type, str] = {
    ast.ClassDef: "classes", ast.AsyncFunctionDef: "async functions", ast.Await: "await expressions",
    ast.Yield: "generators", ast.YieldFrom: "generators", ast.Global: "global statements",
    ast.Nonlocal: "nonlocal statements", ast.AsyncWith: "async with statements", ast.AsyncFor: "async for loops",
}


class _Checker(ast.NodeVisitor):
    def __init__(self) -> None:
        self.violations: list[Violation] = []
        self.modules: dict[str, str] = {}  # local name -> module path (``tl`` -> ``triton.language``)
        self.module_names: set[str] = set()
        self.jit_functions: set[str] = set()
        self.host_functions: set[str] = set()
        self.scopes: list[set[str]] = []
        self.jit = False

    def flag(self, node: ast.AST, message: str) -> None:
        self.violations.append(Violation(getattr(node, "lineno", 0), message))

    def visit(self, node: ast.AST) -> None:
        refused = REFUSED.get(type(node))
        if refused is not None:
            self.flag(node, f"{refused} are not allowed in candidate code")
            return
        super().visit(node)

    # -- module level ---------------------------------------------------------------------------

    def check_module(self, tree: ast.Module) -> None:
        for statement in tree.body:
            if isinstance(statement, (ast.Import, ast.ImportFrom)):
                self.visit(statement)
        self.module_names = _bound_names(tree.body)
        functions = [s for s in tree.body if isinstance(s, ast.FunctionDef)]
        self.jit_functions = {f.name for f in functions if self._is_jit(f)}
        self.host_functions = {f.name for f in functions} - self.jit_functions
        for index, statement in enumerate(tree.body):
            if isinstance(statement, (ast.Import, ast.ImportFrom)):
                continue
            docstring = (index == 0 and isinstance(statement, ast.Expr) and isinstance(statement.value, ast.Constant)
                         and isinstance(statement.value.value, str))
            if isinstance(statement, (ast.Assign, ast.AnnAssign)):
                self._module_constant(statement)
            if isinstance(statement, (ast.FunctionDef, ast.Assign, ast.AnnAssign, ast.Pass)) or docstring:
                self.visit(statement)
            else:
                self.flag(statement, f"{type(statement).__name__.lower()} statement at module level: a candidate "
                                     "module holds only imports, constants and functions (nothing runs at import)")
                self.visit(statement)  # and whatever else is wrong inside it

    def _module_constant(self, statement: ast.Assign | ast.AnnAssign) -> None:
        """A module constant may call only listed module functions (``tl.constexpr(1.44)``): a call
        of the source's own functions or kernels would run code at import."""
        for node in ast.walk(statement):
            if isinstance(node, ast.Call):
                base = _chain(node.func)[0] if isinstance(node.func, ast.Attribute) else node.func
                if not (isinstance(base, ast.Name) and (base.id in self.modules or self._unknown(base))):
                    self.flag(node, "a module-level constant may call only functions of the allowed modules "
                                    "(nothing of the source runs at import)")

    # -- imports --------------------------------------------------------------------------------

    def visit_Import(self, node: ast.Import) -> None:
        for alias in node.names:
            if alias.name not in allowed.IMPORTS:
                self.flag(node, f"import {alias.name} is not allowed (allowed: {', '.join(sorted(allowed.IMPORTS))})")
            elif alias.asname:
                self.modules[alias.asname] = alias.name
            else:
                self.modules[alias.name.split(".")[0]] = alias.name.split(".")[0]

    def visit_ImportFrom(self, node: ast.ImportFrom) -> None:
        module = node.module or ""
        if node.level == 0 and module == "__future__":
            for alias in node.names:
                if alias.name not in allowed.FUTURE_FEATURES:
                    self.flag(node, f"from __future__ import {alias.name} is not allowed")
            return
        if node.level or module not in allowed.IMPORTS:
            self.flag(node, f"from {'.' * node.level}{module} import ... is not allowed "
                            f"(allowed: {', '.join(sorted(allowed.IMPORTS))})")
            return
        for alias in node.names:
            path = f"{module}.{alias.name}"
            if path in allowed.IMPORTS:
                self.modules[alias.asname or alias.name] = path
            elif alias.name == "*" or not self._listed(module, alias.name):
                self.flag(node, f"from {module} import {alias.name}: not on the allowlist of {module}")
            else:
                self.modules[alias.asname or alias.name] = path  # a function or type of the module

    @staticmethod
    def _listed(module: str, name: str) -> bool:
        names = allowed.MODULE_ATTRIBUTES.get(module, frozenset())
        return name in names or ("*" in names and not name.startswith("_"))

    # -- names and attributes -------------------------------------------------------------------

    def _module_path(self, parts: list[str], node: ast.AST, dotted: str) -> tuple[str | None, list[str]]:
        """Walk ``parts`` from a module path; returns (the last module or listed name reached,
        the remaining value attributes), or (None, []) after flagging."""
        current = parts[0]
        for i, part in enumerate(parts[1:], start=1):
            if f"{current}.{part}" in allowed.IMPORTS:
                current = f"{current}.{part}"
                continue
            if current in allowed.IMPORTS and self._listed(current, part):
                return f"{current}.{part}", parts[i + 1:]
            self.flag(node, f"{dotted}: {part} is not on the allowlist of {current}")
            return None, []
        return current, []

    def visit_Attribute(self, node: ast.Attribute) -> None:
        base, parts = _chain(node)
        shown = ".".join([base.id if isinstance(base, ast.Name) else "(...)", *parts])
        if isinstance(node.ctx, (ast.Store, ast.Del)):
            self.flag(node, f"{shown}: assigning or deleting attributes is not allowed")
        if any(_is_dunder(p) or p.startswith("_") for p in parts):
            self.flag(node, f"{shown}: private and dunder attributes are not allowed")
            return
        values = parts
        if isinstance(base, ast.Name) and base.id in self.modules and not self._shadowed(base.id):
            reached, values = self._module_path(self.modules[base.id].split(".") + parts, node, shown)
            if reached is None:
                return
            if reached in allowed.IMPORTS and not values:
                self.flag(node, f"{shown}: a module may only be used through its attributes, not as a value")
                return
        elif self._unknown(base):
            return  # a NameError when run: nothing can be reached through it
        else:
            self.visit(base)
        listed = allowed.JIT_VALUE_ATTRIBUTES if self.jit else allowed.HOST_VALUE_ATTRIBUTES
        for part in values:
            if part not in listed:
                where = "inside @triton.jit functions" if self.jit else "in host code"
                self.flag(node, f"{shown}: .{part} is not on the allowlist {where}")
                return

    def _unknown(self, node: ast.expr) -> bool:
        """A name bound nowhere in the source and not a builtin: loading it raises NameError."""
        return (isinstance(node, ast.Name) and not self._shadowed(node.id) and node.id not in self.module_names
                and node.id not in self.modules and not hasattr(builtins, node.id) and not _is_dunder(node.id))

    def _shadowed(self, name: str) -> bool:
        return any(name in scope for scope in self.scopes)

    def visit_Name(self, node: ast.Name) -> None:
        name = node.id
        if _is_dunder(name):
            self.flag(node, f"{name}: dunder names are not allowed")
            return
        if not isinstance(node.ctx, ast.Load):
            if name in self.modules:
                self.flag(node, f"rebinding the module name {name} is not allowed")
            return
        if self._shadowed(name):
            return
        if name in self.modules:
            self.flag(node, f"the module {name} may only be used as {name}.name, not as a value")
        elif name in self.module_names:
            if self.jit and name in self.host_functions:
                self.flag(node, f"{name}: a @triton.jit function may use only Triton builtins and other "
                                "@triton.jit functions of this source")
        elif hasattr(builtins, name) and name not in (allowed.JIT_BUILTINS if self.jit else allowed.HOST_BUILTINS):
            self.flag(node, f"the builtin {name} is not allowed "
                            f"{'inside @triton.jit functions' if self.jit else 'in host code'}")

    def visit_Constant(self, node: ast.Constant) -> None:
        if isinstance(node.value, str) and "__" in node.value:
            self.flag(node, "strings may not contain '__' (dunder names reached through format fields or lookups)")
        elif isinstance(node.value, bytes):
            self.flag(node, "bytes literals are not allowed in candidate code")

    # -- calls ----------------------------------------------------------------------------------

    def visit_Call(self, node: ast.Call) -> None:
        if self.jit:
            self._check_jit_callee(node)
        for keyword in node.keywords:
            if keyword.arg is not None and _is_dunder(keyword.arg):
                self.flag(node, f"keyword {keyword.arg}: dunder names are not allowed")
        self.generic_visit(node)

    def _check_jit_callee(self, node: ast.Call) -> None:
        func = node.func
        if isinstance(func, ast.Name):
            ok = func.id in self.jit_functions or (func.id in allowed.JIT_BUILTINS and not self._shadowed(func.id))
            ok = ok or func.id in self.modules  # ``from triton.language import load`` style names
            if not ok:
                self.flag(node, f"{func.id}(...): a @triton.jit function may call only Triton builtins and other "
                                "@triton.jit functions of this source")
        elif not isinstance(func, ast.Attribute):
            self.flag(node, "a @triton.jit function may call only Triton builtins and @triton.jit functions by name")

    # -- functions ------------------------------------------------------------------------------

    def _decorator_path(self, node: ast.expr) -> str:
        target = node.func if isinstance(node, ast.Call) else node
        if isinstance(target, ast.Name):
            return self.modules.get(target.id, target.id)
        if isinstance(target, ast.Attribute):
            base, parts = _chain(target)
            if isinstance(base, ast.Name) and base.id in self.modules:
                return ".".join([self.modules[base.id], *parts])
        return "?"

    def _is_jit(self, node: ast.FunctionDef) -> bool:
        return any(self._decorator_path(d) in allowed.JIT_DECORATORS for d in node.decorator_list)

    def visit_FunctionDef(self, node: ast.FunctionDef) -> None:
        if _is_dunder(node.name):
            self.flag(node, f"def {node.name}: dunder names are not allowed")
        if self.jit:
            self.flag(node, f"def {node.name} inside a @triton.jit function: define kernels and helpers at module level")
            return
        jit = self._is_jit(node)
        for decorator in node.decorator_list:
            path = self._decorator_path(decorator)
            if path not in allowed.JIT_DECORATORS | allowed.WRAPPER_DECORATORS or (path in allowed.WRAPPER_DECORATORS
                                                                                    and not jit):
                self.flag(decorator, f"decorator {path}: only @triton.jit (optionally under @triton.heuristics) is allowed")
            if isinstance(decorator, ast.Call):
                for arg in [*decorator.args, *[k.value for k in decorator.keywords]]:
                    self.visit(arg)
        self._check_annotations(node)
        for default in [*node.args.defaults, *[d for d in node.args.kw_defaults if d is not None]]:
            self.visit(default)
        outer = self.jit
        self.jit = jit
        self.scopes.append(_bound_names(node.body, node.args))
        for arg in [*node.args.posonlyargs, *node.args.args, *node.args.kwonlyargs, node.args.vararg, node.args.kwarg]:
            if arg is not None and _is_dunder(arg.arg):
                self.flag(node, f"argument {arg.arg}: dunder names are not allowed")
        for statement in node.body:
            self.visit(statement)
        self.scopes.pop()
        self.jit = outer

    def _check_annotations(self, node: ast.FunctionDef) -> None:
        args = node.args
        annotations = [a.annotation for a in [*args.posonlyargs, *args.args, *args.kwonlyargs, args.vararg, args.kwarg]
                       if a is not None and a.annotation is not None]
        if node.returns is not None:
            annotations.append(node.returns)
        for annotation in annotations:
            self._annotation(annotation)

    def _annotation(self, annotation: ast.expr) -> None:
        if any(isinstance(n, ast.Constant) and isinstance(n.value, str) for n in ast.walk(annotation)):
            self.flag(annotation, "string annotations are not allowed (they are evaluated at run time); "
                                  "write the annotation as an expression")
        else:
            outer, self.jit = self.jit, False
            self.visit(annotation)
            self.jit = outer

    def visit_AnnAssign(self, node: ast.AnnAssign) -> None:
        self._annotation(node.annotation)
        self.visit(node.target)
        if node.value is not None:
            self.visit(node.value)

    def visit_Lambda(self, node: ast.Lambda) -> None:
        if self.jit:
            self.flag(node, "lambdas are not allowed inside @triton.jit functions")
            return
        for default in [*node.args.defaults, *[d for d in node.args.kw_defaults if d is not None]]:
            self.visit(default)
        self.scopes.append(_bound_names(node.body, node.args))
        self.visit(node.body)
        self.scopes.pop()

    # -- statements and expressions refused or narrowed ------------------------------------------

    def visit_BinOp(self, node: ast.BinOp) -> None:
        if isinstance(node.op, ast.MatMult) and not self.jit:
            self.flag(node, "the @ operator computes a matmul on the host; use tl.dot in a Triton kernel")
        self.generic_visit(node)

    def visit_AugAssign(self, node: ast.AugAssign) -> None:
        if isinstance(node.op, ast.MatMult) and not self.jit:
            self.flag(node, "the @= operator computes a matmul on the host; use tl.dot in a Triton kernel")
        self.generic_visit(node)

    def visit_Try(self, node: ast.Try) -> None:
        for handler in node.handlers:
            types = handler.type.elts if isinstance(handler.type, ast.Tuple) else [handler.type]
            if any(not (isinstance(t, ast.Name) and t.id in allowed.CATCHABLE) for t in types):
                self.flag(handler, "except must name specific exceptions "
                                   f"({', '.join(sorted(allowed.CATCHABLE))}): a failure must fail the candidate, "
                                   "not fall back silently")
        self.generic_visit(node)

    visit_TryStar = visit_Try

    def visit_With(self, node: ast.With) -> None:
        for item in node.items:
            expr = item.context_expr
            path = self._decorator_path(expr) if isinstance(expr, ast.Call) else "?"
            if path not in allowed.CONTEXT_MANAGERS:
                self.flag(node, f"with {ast.unparse(expr)[:60]}: only torch.no_grad() and torch.inference_mode() "
                                "may be used")
        self.generic_visit(node)


def check_source(source: str) -> PolicyReport:
    """Check a candidate's source against the allowlist without importing or running any of it.
    A source that does not parse is one violation (the compile step reports the syntax error in
    detail); one over :data:`~kernelforge.limits.MAX_SOURCE_CHARS`, or holding a control character,
    is refused before it is parsed (:func:`~kernelforge.limits.source_problem`)."""
    line, problem = source_problem(source)
    if problem:
        return PolicyReport((Violation(line, problem),))
    try:
        tree = ast.parse(source)
    except SyntaxError as exc:
        return PolicyReport((Violation(exc.lineno or 0, f"syntax error: {exc.msg}"),))
    except (ValueError, RecursionError, MemoryError) as exc:  # null bytes, absurd nesting
        return PolicyReport((Violation(0, f"source cannot be parsed: {type(exc).__name__}"),))
    checker = _Checker()
    try:
        checker.check_module(tree)
    except RecursionError:
        checker.flag(tree, "source nests too deeply to check")
    return PolicyReport(tuple(checker.violations))


__all__ = ["PolicyReport", "Violation", "check_source"]
