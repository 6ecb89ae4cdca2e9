"""Static policy for candidate sources: what untrusted (LLM-written) kernel code may do.

A candidate is a Python module with Triton kernels and a host ``run(**inputs, **outputs)``. Before
it is imported or executed anywhere (the compile pool, the evaluation worker, the in-process
executor), its source is parsed and checked here. The check is purely syntactic (``ast``): nothing
of the candidate runs, nothing is imported.

What a candidate may use (EVALUATION.md, isolation and exploit #6, #7, #12, #14, #15):

- imports: ``triton``, ``triton.language``, ``torch``, ``math`` (and ``__future__``, ``typing``,
  ``triton.tools.tensor_descriptor``);
- ``torch`` only for allocation, views, dtype names and the handful of integer index operations the
  MoE baseline needs on the host to sort tokens by expert (:data:`TORCH_ALLOWED`); never torch
  compute (``matmul``, ``@``, ``einsum``, ``softmax``, ``nn.functional``, ``linalg``, ...), never
  ``torch.cuda`` (streams, synchronisation), ``torch.ops``/``torch._C``/``torch.library``;
- ``triton`` for ``jit``, ``cdiv``, ``next_power_of_2``, ``heuristics``, ``Config``,
  ``set_allocator`` and the language; not ``autotune`` or ``testing`` (a candidate never times
  itself), ``runtime``, ``knobs``, ``compiler``, ``backends`` (driver access, harness switches).

Always refused: ``os``, ``sys``, ``subprocess``, ``socket``, ``threading``, ``multiprocessing``,
``ctypes``, ``inspect``, ``gc``, ``importlib`` and any other import; ``open``, ``eval``, ``exec``,
``compile``, ``__import__``, ``getattr``/``setattr``/``delattr``, ``globals``/``locals``/``vars``;
any dunder attribute (``__class__``, ``__dict__``, ``__globals__``...), ``__torch_function__`` /
``__torch_dispatch__`` (lazy tensor subclasses); assignment to attributes of an imported module
(harness or library patching: ``torch.allclose = ...``, ``triton.knobs...``); using a module as a
value (``t = torch``), which would hide later attribute uses from this check; broad exception
handlers (bare ``except``, ``except Exception``/``BaseException``) that turn a failure into a silent
fallback; and in host code (outside ``@triton.jit`` functions) the ``@`` operator and tensor
methods that compute (``.matmul``, ``.softmax``, ``.numpy`` ...).

The static check cannot know the types of host values, so torch arithmetic written with operators
(``x * alpha + y``) is caught at run time instead: :mod:`kernelforge.execute.guard` refuses host-side
torch operations on floating-point tensors other than allocation, copies and views. Every shipped
template passes this policy (tests/execute/test_policy.py checks that).
"""

from __future__ import annotations

import ast
from dataclasses import dataclass

#: Modules a candidate may import, and ``from X import`` sources.
ALLOWED_IMPORTS = frozenset({
    "__future__", "typing", "math", "torch", "triton", "triton.language", "triton.language.extra",
    "triton.language.extra.libdevice", "triton.language.math", "triton.tools",
    "triton.tools.tensor_descriptor",
})

#: ``torch.<name>`` a candidate may use: dtypes, tensor types, allocation, views, and the integer
#: index operations of the MoE baseline's host-side routing (kernels/moe/gpt_oss_experts).
TORCH_ALLOWED = frozenset({
    # dtypes and types
    "dtype", "device", "Size", "Tensor", "finfo", "iinfo",
    "float16", "half", "bfloat16", "float32", "float", "float64", "double",
    "int8", "int16", "int32", "int", "int64", "long", "uint8", "uint16", "uint32", "uint64", "bool",
    "float8_e4m3fn", "float8_e5m2", "float8_e4m3fnuz", "float8_e5m2fnuz", "float8_e8m0fnu",
    # allocation
    "empty", "empty_like", "empty_strided", "zeros", "zeros_like", "ones", "ones_like", "full",
    "full_like", "arange", "tensor",
    # views and data movement
    "reshape", "flatten", "transpose", "permute", "narrow", "split", "chunk", "unbind", "squeeze",
    "unsqueeze", "as_strided", "cat", "stack",
    # integer index operations (MoE routing on the host)
    "argsort", "sort", "cumsum", "bincount", "scatter_add", "searchsorted", "index_put", "gather",
    # no-op context managers
    "no_grad", "inference_mode",
})

#: ``triton.<name>`` a candidate may use.
TRITON_ALLOWED = frozenset({
    "jit", "cdiv", "next_power_of_2", "heuristics", "Config", "language", "tools", "set_allocator",
    "constexpr", "constexpr_function", "aggregate",
})

#: Submodules of triton.language that are implementation, not API (``tl.core.builtins`` is
#: Python's builtins module, for one).
TL_DENIED = frozenset({"core", "standard", "semantic", "target_info", "runtime"})

#: Attribute names refused anywhere in a chain (whatever the receiver).
DENIED_ATTRIBUTES = frozenset({
    "builtins", "sys", "os", "subprocess", "importlib", "inspect", "ctypes", "gc", "threading",
    "multiprocessing", "socket", "knobs", "runtime", "compiler", "backends", "driver", "testing",
    "autotune", "do_bench", "_C", "ops", "library", "func_globals", "gi_frame", "f_globals", "f_back",
    "tb_frame", "cr_frame",
})

#: Builtin names a candidate may not use at all.
DENIED_NAMES = frozenset({
    "eval", "exec", "compile", "open", "__import__", "getattr", "setattr", "delattr", "globals",
    "locals", "vars", "breakpoint", "input", "exit", "quit", "help", "memoryview", "__builtins__",
    "__loader__", "__spec__",
})

#: Methods that compute, refused in host code whatever the receiver (types are unknown statically;
#: inside @triton.jit functions, tensor methods such as ``x.exp()`` are Triton's and allowed).
HOST_DENIED_METHODS = frozenset({
    "matmul", "mm", "bmm", "addmm", "addmv", "addbmm", "baddbmm", "mv", "dot", "vdot", "inner",
    "outer", "ger", "einsum", "tensordot", "kron", "softmax", "log_softmax",
    "scaled_dot_product_attention", "linear", "conv1d", "conv2d", "layer_norm", "rms_norm",
    "group_norm", "silu", "gelu", "relu", "sigmoid", "tanh", "numpy", "backward", "register_hook",
    "cuda", "record_stream", "wait_stream", "synchronize", "set_", "untyped_storage", "storage",
    "data_ptr_", "share_memory_", "__torch_function__", "__torch_dispatch__",
})

#: Dunder attributes that are harmless to read.
SAFE_DUNDERS = frozenset({"__name__", "__doc__"})

#: ``except`` clauses naming these swallow everything, including the verifier's own signals.
BROAD_EXCEPTIONS = frozenset({"Exception", "BaseException"})


@dataclass(frozen=True)
class Violation:
    """One rule the source breaks: where, and what to do instead."""

    line: int
    message: str

    def __str__(self) -> str:
        return f"line {self.line}: {self.message}"


@dataclass(frozen=True)
class PolicyReport:
    """The outcome of :func:`check_source`: ``ok`` when there are no violations."""

    violations: tuple[Violation, ...]

    @property
    def ok(self) -> bool:
        return not self.violations

    def __iter__(self):
        """The violations as lines (``line N: what``): ``list(check_source(src))`` is the list of
        problems, empty when the source is allowed."""
        return iter([str(v) for v in self.violations])

    def __len__(self) -> int:
        return len(self.violations)

    def message(self, limit: int = 5) -> str:
        """One line for a result row: the first ``limit`` violations."""
        if self.ok:
            return ""
        shown = "; ".join(str(v) for v in self.violations[:limit])
        more = f" (and {len(self.violations) - limit} more)" if len(self.violations) > limit else ""
        return f"policy: {shown}{more}"


def _is_jit_decorator(node: ast.expr) -> bool:
    """``@triton.jit``, ``@triton.jit(...)``, ``@jit`` and ``@triton.heuristics(...)``-style
    decorators mark device code."""
    target = node.func if isinstance(node, ast.Call) else node
    parts = []
    while isinstance(target, ast.Attribute):
        parts.append(target.attr)
        target = target.value
    if isinstance(target, ast.Name):
        parts.append(target.id)
    return bool(parts) and parts[0] in {"jit", "constexpr_function"}


class _Checker(ast.NodeVisitor):
    def __init__(self) -> None:
        self.violations: list[Violation] = []
        #: local name -> module path it is bound to (``tl`` -> ``triton.language``)
        self.modules: dict[str, str] = {}
        self.jit_depth = 0
        #: ids of Name nodes that are the base of an Attribute chain (allowed module uses)
        self.chain_bases: set[int] = set()

    def flag(self, node: ast.AST, message: str) -> None:
        self.violations.append(Violation(getattr(node, "lineno", 0), message))

    # -- imports ----------------------------------------------------------------------------

    def visit_Import(self, node: ast.Import) -> None:
        for alias in node.names:
            if alias.name not in ALLOWED_IMPORTS:
                self.flag(node, f"import {alias.name} is not allowed (allowed: triton, triton.language, torch, math)")
                continue
            if alias.asname:
                self.modules[alias.asname] = alias.name
            else:
                top = alias.name.split(".")[0]
                self.modules[top] = top

    def visit_ImportFrom(self, node: ast.ImportFrom) -> None:
        module = "." * node.level + (node.module or "")
        if node.level or module not in ALLOWED_IMPORTS:
            self.flag(node, f"from {module} import ... is not allowed (allowed: triton, triton.language, torch, math)")
            return
        for alias in node.names:
            if alias.name == "*":
                self.flag(node, f"from {module} import * is not allowed; import the names you use")
                continue
            path = f"{module}.{alias.name}"
            if path in ALLOWED_IMPORTS:
                self.modules[alias.asname or alias.name] = path
                continue
            problem = self._path_problem(path.split("."))
            if problem:
                self.flag(node, problem)

    # -- names and attributes ---------------------------------------------------------------

    def _path_problem(self, parts: list[str]) -> str | None:
        """Why the dotted module path ``parts`` (``["torch", "matmul"]``) may not be used."""
        dotted = ".".join(parts)
        for part in parts[1:]:
            if part.startswith("__") and part.endswith("__") and part not in SAFE_DUNDERS:
                return f"{dotted}: dunder attributes are not allowed"
            if part in DENIED_ATTRIBUTES:
                return f"{dotted}: {part} is not available to candidate code"
        root = parts[0]
        if root == "torch" and len(parts) > 2 and parts[1] == "Tensor":
            return f"{dotted}: unbound tensor methods are not allowed; compute in a Triton kernel"
        if root == "torch" and len(parts) > 1:
            if parts[1] not in TORCH_ALLOWED:
                if parts[1] in ("cuda", "backends", "distributed", "cpu", "mps", "xpu"):
                    return f"{dotted}: torch.{parts[1]} is not allowed (streams, synchronisation and backend switches belong to the harness)"
                return (f"{dotted}: torch may only allocate, view and index on the host; compute the result "
                        "in a Triton kernel")
        if root == "triton" and len(parts) > 1:
            if parts[1] not in TRITON_ALLOWED:
                return f"{dotted}: only triton.jit, cdiv, next_power_of_2, heuristics, Config and triton.language may be used"
            if parts[1] == "language" and len(parts) > 2 and parts[2] in TL_DENIED:
                return f"{dotted}: triton.language.{parts[2]} is an implementation module, not API"
            if parts[1] == "tools" and len(parts) > 2 and parts[2] != "tensor_descriptor":
                return f"{dotted}: only triton.tools.tensor_descriptor may be used"
        return None

    def _chain(self, node: ast.Attribute) -> tuple[ast.expr, list[str]]:
        parts: list[str] = []
        current: ast.expr = node
        while isinstance(current, ast.Attribute):
            parts.append(current.attr)
            current = current.value
        parts.reverse()
        return current, parts

    def visit_Attribute(self, node: ast.Attribute) -> None:
        base, parts = self._chain(node)
        dotted = ".".join([base.id, *parts] if isinstance(base, ast.Name) else ["...", *parts])
        for part in parts:
            if part.startswith("__") and part.endswith("__") and part not in SAFE_DUNDERS:
                self.flag(node, f"{dotted}: attribute {part} is not allowed (dunder attributes reach the "
                                "interpreter's internals)")
                break
            if part in DENIED_ATTRIBUTES:
                self.flag(node, f"{dotted}: attribute {part} is not available to candidate code")
                break
        else:
            if isinstance(base, ast.Name) and base.id in self.modules:
                module_path = self.modules[base.id].split(".")
                problem = self._path_problem(module_path + parts)
                if problem:
                    self.flag(node, problem)
        if isinstance(base, ast.Name):
            self.chain_bases.add(id(base))
            if isinstance(node.ctx, (ast.Store, ast.Del)) and base.id in self.modules:
                self.flag(node, f"assigning to {base.id}.{'.'.join(parts)} patches a module; not allowed")
        if isinstance(node.ctx, ast.Store) and parts[-1] in ("data", "grad"):
            self.flag(node, f"assigning .{parts[-1]} swaps a tensor's storage; write into the output instead")
        # The innermost receiver (a name, call, subscript...) is checked like any expression.
        self.visit(base)

    def visit_Name(self, node: ast.Name) -> None:
        if node.id in DENIED_NAMES:
            self.flag(node, f"{node.id} is not allowed in candidate code")
        elif node.id.startswith("__") and node.id.endswith("__") and node.id not in SAFE_DUNDERS:
            self.flag(node, f"{node.id} is not allowed in candidate code")
        elif node.id in self.modules and id(node) not in self.chain_bases:
            if isinstance(node.ctx, ast.Load):
                self.flag(node, f"the module {node.id} may only be used as {node.id}.name, not passed or stored as a value")
            else:
                self.flag(node, f"rebinding the module name {node.id} is not allowed")

    def visit_Call(self, node: ast.Call) -> None:
        func = node.func
        if self.jit_depth == 0 and isinstance(func, ast.Attribute) and func.attr in HOST_DENIED_METHODS:
            base, _ = self._chain(func)
            if not (isinstance(base, ast.Name) and base.id in self.modules):
                self.flag(node, f".{func.attr}(...) computes on the host; compute the result in a Triton kernel")
        self.generic_visit(node)

    # -- statements ---------------------------------------------------------------------------

    def visit_BinOp(self, node: ast.BinOp) -> None:
        if isinstance(node.op, ast.MatMult) and self.jit_depth == 0:
            self.flag(node, "the @ operator computes a matmul on the host; use tl.dot in a Triton kernel")
        self.generic_visit(node)

    def visit_AugAssign(self, node: ast.AugAssign) -> None:
        if isinstance(node.op, ast.MatMult) and self.jit_depth == 0:
            self.flag(node, "the @= operator computes a matmul on the host; use tl.dot in a Triton kernel")
        self.generic_visit(node)

    def visit_FunctionDef(self, node: ast.FunctionDef | ast.AsyncFunctionDef) -> None:
        if node.name in ("__torch_function__", "__torch_dispatch__"):
            self.flag(node, f"defining {node.name} (a lazy tensor subclass) is not allowed")
        for decorator in node.decorator_list:
            self.visit(decorator)
        self.visit(node.args)
        if node.returns is not None:
            self.visit(node.returns)
        jit = any(_is_jit_decorator(d) for d in node.decorator_list)
        self.jit_depth += jit
        for statement in node.body:
            self.visit(statement)
        self.jit_depth -= jit

    def visit_AsyncFunctionDef(self, node: ast.AsyncFunctionDef) -> None:
        self.flag(node, "async functions are not allowed in candidate code")

    def visit_ClassDef(self, node: ast.ClassDef) -> None:
        for base in node.bases:
            root = base
            while isinstance(root, ast.Attribute):
                root = root.value
            if isinstance(root, ast.Name) and self.modules.get(root.id, "").startswith("torch"):
                self.flag(node, f"class {node.name} subclasses a torch type (lazy tensor subclasses are not allowed)")
        self.generic_visit(node)

    def visit_Try(self, node: ast.Try) -> None:
        for handler in node.handlers:
            broad = handler.type is None
            types = handler.type.elts if isinstance(handler.type, ast.Tuple) else [handler.type]
            for t in types:
                if isinstance(t, ast.Name) and t.id in BROAD_EXCEPTIONS:
                    broad = True
            if broad:
                self.flag(handler, "broad exception handler (bare except / except Exception): a failure must "
                                   "fail the candidate, not fall back silently; catch a specific exception")
        self.generic_visit(node)

    visit_TryStar = visit_Try

    def visit_Global(self, node: ast.Global) -> None:
        for name in node.names:
            if name in self.modules:
                self.flag(node, f"global {name} rebinds a module name; not allowed")

    def visit_Delete(self, node: ast.Delete) -> None:
        for target in node.targets:
            if isinstance(target, ast.Attribute):
                self.flag(node, "deleting attributes is not allowed")
        self.generic_visit(node)


def check_source(source: str) -> PolicyReport:
    """Check a candidate's source against the policy without importing or running any of it.

    A source that does not parse is reported as one violation (the import would fail anyway; the
    compile step reports the syntax error in detail).
    """
    try:
        tree = ast.parse(source)
    except SyntaxError as exc:
        return PolicyReport((Violation(exc.lineno or 0, f"syntax error: {exc.msg}"),))
    except (ValueError, RecursionError, MemoryError) as exc:  # null bytes, absurd nesting
        return PolicyReport((Violation(0, f"source cannot be parsed: {type(exc).__name__}"),))
    checker = _Checker()
    try:
        checker.visit(tree)
    except RecursionError:
        checker.flag(tree, "source nests too deeply to check")
    return PolicyReport(tuple(checker.violations))


__all__ = ["ALLOWED_IMPORTS", "PolicyReport", "TORCH_ALLOWED", "Violation", "check_source"]
