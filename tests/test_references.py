"""Every module the documentation and the docstrings name exists: a dotted ``kernelforge.x.y`` name
resolves to a module, and to a name defined at its top level when it goes further
(``kernelforge.execute.worker.executor.WorkerExecutor``); a path such as ``execute/worker/main.py``
under ``src/kernelforge`` is a file, and so is a test file named by path (the Makefile runs some by
name). Moving a module or a test without its references fails here."""

from __future__ import annotations

import ast
import re
from functools import cache
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "src" / "kernelforge"
DOTTED = re.compile(r"(?<![\w.])kernelforge(?:\.[A-Za-z_][A-Za-z0-9_]*)+")
PATH = re.compile(r"(?<![\w.])(?:src/)?kernelforge/([\w/]+\.py)(?![\w]|\.\w)")
TEST_PATH = re.compile(r"(?<![\w./])(tests/[\w/]+\.py)(?![\w]|\.\w)")
TEXTS = sorted([ROOT / "README.md", *(ROOT / "docs").glob("*.md"), *PACKAGE.rglob("*.py"),
                *(ROOT / "scripts").glob("*.py"), *(ROOT / "scripts").glob("*.sh"), ROOT / "Makefile"])


@cache
def _modules() -> dict[str, Path]:
    found = {}
    for path in PACKAGE.rglob("*.py"):
        parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
        found[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return found


@cache
def _top_level_names(path: Path) -> frozenset[str]:
    tree = ast.parse(path.read_text())
    names: set[str] = set()
    for node in tree.body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.add(node.name)
        elif isinstance(node, (ast.Assign, ast.AnnAssign)):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            names |= {n.id for t in targets for n in ast.walk(t) if isinstance(n, ast.Name)}
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            names |= {(a.asname or a.name).split(".")[0] for a in node.names}
        elif isinstance(node, (ast.If, ast.Try)):
            names |= {n.id for n in ast.walk(node) if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Store)}
            names |= {n.name for n in ast.walk(node) if isinstance(n, (ast.FunctionDef, ast.ClassDef))}
    return frozenset(names)


#: Names that read like modules and are not: the results database's file name, an example.
NOT_MODULES = {"kernelforge.db", "kernelforge.x"}


@cache
def _api_names() -> frozenset[str]:
    """The names the package root hands out on first use (``kernelforge.run``)."""
    tree = ast.parse((PACKAGE / "__init__.py").read_text())
    return frozenset(next(ast.literal_eval(n.value) for n in tree.body if isinstance(n, ast.Assign)
                          and any(isinstance(t, ast.Name) and t.id == "_API" for t in n.targets)))


def unresolved(reference: str) -> str | None:
    """Why ``reference`` (a dotted name) does not resolve, or None."""
    parts = reference.split(".")
    if ".".join(parts[:2]) in NOT_MODULES or (len(parts) == 2 and parts[1] in _api_names()):
        return None
    modules = _modules()
    for k in range(len(parts), 0, -1):
        module = ".".join(parts[:k])
        if module in modules:
            rest = parts[k:]
            if rest and rest[0] not in _top_level_names(modules[module]):
                return f"{module} defines no {rest[0]}"
            return None
    return "no such module"


def _references(path: Path) -> list[tuple[int, str]]:
    return [(n, m.group(0)) for n, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1)
            for m in DOTTED.finditer(line)]


def test_the_resolver_tells_a_moved_module_from_a_real_one():
    assert unresolved("kernelforge.execute.worker.executor.WorkerExecutor") is None
    assert unresolved("kernelforge.execute.worker_main") == "kernelforge.execute defines no worker_main"
    assert unresolved("kernelforge.execute.worker.executor.NoSuchThing") is not None


@pytest.mark.parametrize("path", TEXTS, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_named_module_exists(path):
    broken = [f"{path.relative_to(ROOT)}:{n}: {ref} ({why})" for n, ref in _references(path)
              if (why := unresolved(ref))]
    broken += [f"{path.relative_to(ROOT)}: {m.group(0)} (no such file)"
               for m in PATH.finditer(path.read_text(encoding="utf-8"))
               if not (PACKAGE / m.group(1)).exists()]
    broken += [f"{path.relative_to(ROOT)}: {m.group(1)} (no such test file)"
               for m in TEST_PATH.finditer(path.read_text(encoding="utf-8")) if not (ROOT / m.group(1)).exists()]
    assert not broken, "\n".join(broken)
