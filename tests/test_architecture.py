"""The package's shape, checked from its source: no import cycle between modules, no module over
the size limit, and no private name imported across modules. Imports inside functions count: a
lazy import hides a cycle from Python, not from the design."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[1] / "src" / "kernelforge"
#: A module does one job; past this many lines it is doing several (issue 9).
MAX_LINES = 400


def _module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _modules() -> dict[str, Path]:
    return {_module_name(p): p for p in sorted(PACKAGE.rglob("*.py"))}


def _imports(name: str, path: Path, known: set[str]) -> list[tuple[str, list[str], int]]:
    """(imported module, names taken from it, line) for every kernelforge import in ``path``."""
    tree = ast.parse(path.read_text(), filename=str(path))
    is_package = path.name == "__init__.py"
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found += [(a.name, [], node.lineno) for a in node.names if a.name.startswith("kernelforge")]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = name.split(".") if is_package else name.split(".")[:-1]
                base = base[: len(base) - node.level + 1]
                module = ".".join(base + ([node.module] if node.module else []))
            else:
                module = node.module or ""
            if not module.startswith("kernelforge"):
                continue
            names = [a.name for a in node.names]
            # ``from pkg import submodule`` depends on the submodule, not on the package.
            subs = [f"{module}.{n}" for n in names if f"{module}.{n}" in known]
            if subs:
                found += [(s, [], node.lineno) for s in subs]
                names = [n for n in names if f"{module}.{n}" not in known]
                if not names:
                    continue
            found.append((module, names, node.lineno))
    return found


def _graph() -> dict[str, set[str]]:
    modules = _modules()
    known = set(modules)
    graph: dict[str, set[str]] = {m: set() for m in modules}
    for name, path in modules.items():
        for target, _, _ in _imports(name, path, known):
            if target in known and target != name:
                graph[name].add(target)
    return graph


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components with more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return found


def test_the_cycle_finder_finds_a_cycle():
    assert _cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert _cycles({"a": {"b"}, "b": set()}) == []


def test_no_import_cycle():
    cycles = _cycles(_graph())
    assert not cycles, "import cycles: " + "; ".join(" <-> ".join(c) for c in cycles)


@pytest.mark.parametrize("name", sorted(_modules()))
def test_module_size(name):
    lines = len(_modules()[name].read_text().splitlines())
    assert lines <= MAX_LINES, f"{name} has {lines} lines (limit {MAX_LINES}): split it by job"


def test_no_private_name_crosses_modules():
    modules = _modules()
    known = set(modules)
    crossings = []
    for name, path in modules.items():
        for target, names, line in _imports(name, path, known):
            crossings += [f"{name}:{line} takes {n} from {target}" for n in names
                          if n.startswith("_") and not n.startswith("__")]
    assert not crossings, "\n".join(crossings)


# -- the declared order of the packages (issue 30) ---------------------------------------------------
#
# Data flows one way: job, candidates, compile, verify, time, store, report; the command line and
# the API sit on top and wire a run. A module may import its own package and anything of a lower
# rank, never a higher one, so no package cycle can form, whatever the modules do. The nouns (the
# top-level modules) come first; a top-level module that wires stages together sits at the top.

#: Rank of each package, lowest first. Top-level modules not listed are nouns (rank 0).
PACKAGE_RANKS: dict[str, int] = {
    "strategies": 0,   # proposers of points: pure, read only the space (the job names them)
    "quant": 1,        # weight formats of the blocks
    "devices": 2,      # where kernels run and how they are timed
    "policy": 3,       # the static policy of candidate sources
    "sandbox": 3,      # the OS sandbox of processes that run candidate code
    "store": 4,        # the results database
    "execute": 5,      # executors, the judge, timing, the worker (reads a recording from the store)
    "compile": 6,      # ahead-of-time compilation (its pool runs in the sandbox)
    "search": 7,       # the search: plan, loop, pipeline, confirmation; seams for proposers and advisers
    "llm": 8,          # the LLM generator, behind the search's seams
    "report": 9,       # reports, projections and exports, read from the store
    "start": 10,       # the wiring of one search run (kernelforge.start)
    "api": 11,         # the Python API
    "cli": 11,         # the command line and its launchers
    "__main__": 12,
}
#: Nouns that depend on a package above them, by design: the job names its strategy from the
#: strategies' table of names (rank 0, so allowed), nothing else.
NOUN_RANK = 0


def _package(module: str) -> str:
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else ""


def _rank(module: str) -> int:
    package = _package(module)
    return PACKAGE_RANKS.get(package, NOUN_RANK) if package else NOUN_RANK


def test_every_package_has_a_declared_rank():
    packages = {_package(m) for m, p in _modules().items() if p.name == "__init__.py" and "." in m}
    assert packages <= set(PACKAGE_RANKS), f"declare a rank for {sorted(packages - set(PACKAGE_RANKS))}"


def test_packages_import_only_downwards():
    modules = _modules()
    known = set(modules)
    upward = []
    for name, path in modules.items():
        if name == "kernelforge":  # the package root hands out the API's names lazily (``kernelforge.run``)
            continue
        for target, _, line in _imports(name, path, known):
            if target in known and _package(target) != _package(name) and _rank(target) > _rank(name):
                upward.append(f"{name}:{line} imports {target} (rank {_rank(target)} > {_rank(name)})")
    assert not upward, "imports against the declared package order:\n" + "\n".join(upward)


def test_the_rank_check_sees_an_upward_import():
    assert _rank("kernelforge.search.search") < _rank("kernelforge.llm.generator") < _rank("kernelforge.cli.main")
    assert _rank("kernelforge.block") == NOUN_RANK and _rank("kernelforge.start") > _rank("kernelforge.report.write")


@pytest.mark.parametrize("init", sorted(p for p in PACKAGE.rglob("__init__.py") if p.parent != PACKAGE),
                         ids=lambda p: str(p.parent.relative_to(PACKAGE)))
def test_every_package_states_its_public_face(init):
    """Each package's ``__init__`` says what it is (a docstring) and names its public modules or
    names (``__all__``), each of which exists."""
    tree = ast.parse(init.read_text())
    assert ast.get_docstring(tree), f"{init}: say what the package is"
    names = next((ast.literal_eval(node.value) for node in tree.body if isinstance(node, ast.Assign)
                  and any(isinstance(t, ast.Name) and t.id == "__all__" for t in node.targets)), None)
    assert names, f"{init}: name the package's public face in __all__"
    defined = {n.name for n in tree.body if isinstance(n, (ast.FunctionDef, ast.ClassDef))}
    for name in names:
        assert (init.parent / f"{name}.py").exists() or (init.parent / name / "__init__.py").exists() \
            or name in defined, f"{init}: __all__ names {name}, which is not there"


def _hand_cuts(tree: ast.AST) -> list[int]:
    """Lines that shorten text with a literal bound of 100 or more (``message[:2000]``)."""
    lines = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Subscript) and isinstance(node.slice, ast.Slice):
            bound = node.slice.upper if node.slice.lower is None else node.slice.lower
            if isinstance(bound, ast.UnaryOp) and isinstance(bound.op, ast.USub):
                bound = bound.operand
            if isinstance(bound, ast.Constant) and isinstance(bound.value, int) and bound.value >= 100:
                lines.append(node.lineno)
    return lines


def test_messages_are_cut_in_one_place():
    """Issue 30: text is shortened by :func:`kernelforge.textsafe.cut` to one of its named limits,
    never by a hand-written ``[:2000]`` (or ``[:500]``, ``[:300]``...) at each site."""
    found = [f"{name}:{line}" for name, path in _modules().items() if name != "kernelforge.textsafe"
             for line in _hand_cuts(ast.parse(path.read_text()))]
    assert not found, "cut with kernelforge.textsafe.cut instead: " + ", ".join(found)


def test_the_cut_finder_sees_a_hand_cut():
    assert _hand_cuts(ast.parse("m = f'{x}'[:2000]\nt = tb[-20000:]\nok = xs[:10]")) == [1, 2]


def test_the_policy_is_asked_in_its_two_places():
    """Issue 30: the search's gate decides whether proposed code may run; every other place that is
    about to compile or run a source asks :func:`kernelforge.policy.wall.refusal`. Nothing else
    calls the checker itself."""
    modules = _modules()
    callers = sorted(name for name, path in modules.items()
                     if any(target == "kernelforge.policy.checker" and "check_source" in names
                            for target, names, _ in _imports(name, path, set(modules))))
    assert callers == ["kernelforge.policy.wall", "kernelforge.search.gate"], callers
