"""Bring your own kernel: ``kernelforge tune FILE.py::KERNEL`` tunes an existing ``@triton.jit``
kernel over its ``@triton.autotune`` configs with kernelforge's verification, search, store and
report, with no Jinja2 template and no ``Block`` subclass to write.

What FILE.py must hold (the contract; a missing piece is one clear error):

- ``KERNEL``: a ``@triton.jit`` function under ``@triton.autotune(configs=[triton.Config({...},
  num_warps=..., num_stages=...), ...], key=[...])``; the configs are literals.
- ``run(**inputs, out)``: the host wrapper that launches ``KERNEL[grid](...)`` (a grid lambda may
  read the config's ``META``); host code allocates and takes views with torch, never computes.
- ``reference(**inputs)``: the exact result, in fp32.
- ``make_inputs(shape, dtype, device, seed, distribution="normal")``: fresh seeded inputs, the
  keyword arguments of ``run`` (``shape["N"]`` reads a dimension).
- ``make_output(shape, dtype, device)``: the uninitialised output ``run`` fills.
- ``SHAPES``: shape name -> dimensions (``{"n4096": {"N": 4096}}``); all are searched.

:func:`prepare` writes, under the output folder, a kernels folder with one block ``tune/<KERNEL>``:
a copy of FILE.py, a generated ``block.py`` whose :class:`UserFileBlock` reads it, and a template
``baseline.py.j2``: the kernel with the autotune decorator removed and ``run`` launching it at
one config, whose space is the configs' values and whose one constraint keeps exactly the
declared configs (the baseline: the first). Then a job file that searches it; ``kernelforge tune``
runs that job as ``kernelforge search`` runs any other. Nothing of the original file is changed.
"""

from __future__ import annotations

import ast
import hashlib
import importlib.util
import inspect
import itertools
import json
import os
import shutil
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from kernelforge.block import Block, Counts, Shape
from kernelforge.errors import UserError
from kernelforge.space import is_value, toml_value

#: triton.Config's launch keywords, searched and passed at the launch like the config's values,
#: and the Triton defaults that fill those a config leaves out (``num_ctas`` only where another
#: config sets it, so a file that never names it keeps its candidates).
LAUNCH_KEYWORDS = ("num_warps", "num_stages", "num_ctas", "maxnreg")
LAUNCH_DEFAULTS = {"num_warps": 4, "num_stages": 3}
REQUIRED = ("run", "reference", "make_inputs", "make_output", "SHAPES")
#: What the judge reads from FILE.py; never part of a candidate.
JUDGE = ("reference", "make_inputs", "make_output", "SHAPES", "counts")
USER_FILE = "user_kernel.py"
_JIT = ("triton.jit", "jit")
_AUTOTUNE = ("triton.autotune", "autotune")


@dataclass(frozen=True)
class TuneSource:
    """What :func:`parse` reads from FILE.py: the kernel's name, its declared configs (each the
    config's keyword values plus its launch keywords), the candidate body (imports, the
    ``@triton.jit`` functions, what they and ``run`` read of the module, and ``run``) with
    ``{{ NAME }}`` placeholders at the launch, and ``judge``: a hash of what the judge reads (the
    judge's functions and what they read), so a stored verdict is never reused under another."""

    path: Path
    kernel: str
    configs: tuple[dict[str, Any], ...]
    body: str
    judge: str


def split_target(target: str) -> tuple[Path, str]:
    """``FILE.py::KERNEL`` -> (path, kernel name); one clear error for anything else."""
    file, sep, name = target.rpartition("::")
    if not sep or not file or not name.isidentifier():
        raise UserError(f"tune {target}: write FILE.py::KERNEL (the @triton.autotune kernel's name after ::)")
    path = Path(file)
    if not path.is_file():
        raise UserError(f"tune {target}: {path} is not a file")
    return path, name


def _config(node: ast.AST, where: str) -> dict[str, Any]:
    """One ``triton.Config({...}, num_warps=..., num_stages=...)`` literal."""
    if not (isinstance(node, ast.Call) and ast.unparse(node.func) in ("triton.Config", "Config")
            and len(node.args) == 1):
        raise UserError(f"{where}: each config must be triton.Config({{...}}, num_warps=..., num_stages=...)")
    other = [k.arg or "**" for k in node.keywords if k.arg not in LAUNCH_KEYWORDS]
    if other:
        raise UserError(f"{where}: triton.Config's {other[0]} is not carried by kernelforge tune (it searches the "
                        f"config's values and {', '.join(LAUNCH_KEYWORDS)}); remove it")
    try:
        values = dict(ast.literal_eval(node.args[0]))
        keywords = {k.arg: ast.literal_eval(k.value) for k in node.keywords}
    except (ValueError, TypeError, SyntaxError):
        raise UserError(f"{where}: the configs must be literals (numbers, strings)") from None
    config = {**values, **LAUNCH_DEFAULTS, **keywords}
    for key, value in config.items():
        if not isinstance(key, str) or not key.isidentifier() or not is_value(value):
            raise UserError(f"{where}: {key!r}: {value!r} is not a value kernelforge tune can search; a config's "
                            "keys are parameter names and its values finite numbers, booleans or strings")
    return config


def _configs(nodes: list[ast.expr], where: str) -> tuple[dict[str, Any], ...]:
    """Every config, each with the same keys (``num_ctas`` filled with Triton's 1 where another sets it)."""
    configs = [_config(node, where) for node in nodes]
    if any("num_ctas" in c for c in configs):
        configs = [{**c, "num_ctas": c.get("num_ctas", 1)} for c in configs]
    keys = [set(c) for c in configs]
    uneven = sorted(set().union(*keys) - set.intersection(*keys))
    if uneven:
        raise UserError(f"{where}: the configs must all set the same keys; {', '.join(uneven)} is set in some only")
    return tuple(configs)


def _read(path: Path) -> tuple[str, ast.Module]:
    """FILE.py's text and its syntax tree; one line for a file that is not UTF-8 Python."""
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise UserError(f"{path}: cannot read it as UTF-8 Python ({exc})") from None
    try:
        return text, ast.parse(text, filename=str(path))
    except SyntaxError as exc:
        raise UserError(f"{path}:{exc.lineno}: {exc.msg}; kernelforge tune reads the file as Python") from None


def _decorator(node: ast.expr) -> str:
    """A decorator's name, ``triton.jit`` for ``@triton.jit`` and ``@triton.jit(...)`` alike."""
    return ast.unparse(node.func if isinstance(node, ast.Call) else node)


def _defined(node: ast.stmt) -> set[str]:
    """The module names a top-level statement binds."""
    if isinstance(node, (ast.FunctionDef, ast.ClassDef)):
        return {node.name}
    if isinstance(node, (ast.Assign, ast.AnnAssign, ast.AugAssign)):
        targets = node.targets if isinstance(node, ast.Assign) else [node.target]
        return {n.id for t in targets for n in ast.walk(t) if isinstance(n, ast.Name)}
    return set()


def _closure(tree: ast.Module, roots: list[ast.stmt]) -> list[ast.stmt]:
    """``roots`` and every top-level statement (not an import) binding a name they read, and so on,
    in file order: what those statements need of the module."""
    kept = list(roots)
    wanted = {n.id for root in roots for n in ast.walk(root) if isinstance(n, ast.Name)}
    changed = True
    while changed:
        changed = False
        for node in tree.body:
            if node not in kept and _defined(node) & wanted:
                kept.append(node)
                wanted |= {n.id for n in ast.walk(node) if isinstance(n, ast.Name)}
                changed = True
    return [node for node in tree.body if node in kept]


def parse(path: Path, kernel: str) -> TuneSource:
    """Read FILE.py (see the module docstring for what it must hold)."""
    text, tree = _read(path)
    defs = {n.name: n for n in tree.body if isinstance(n, ast.FunctionDef)}
    names = set().union(*(_defined(n) for n in tree.body))
    missing = [n for n in (kernel, *REQUIRED) if n not in names]
    if missing:
        raise UserError(f"{path}: defines no {', '.join(missing)} (kernelforge tune needs the kernel and "
                        f"{', '.join(REQUIRED)}; see docs/tune.md)")
    for name in (kernel, "run", "reference", "make_inputs", "make_output"):
        if name not in defs:
            raise UserError(f"{path}: {name} must be a function of the module (def {name}(...)), not another name")
    node = defs[kernel]
    if not any(_decorator(d) in _JIT for d in node.decorator_list):
        raise UserError(f"{path}: {kernel} is not a @triton.jit function")
    autotune = next((d for d in node.decorator_list if isinstance(d, ast.Call) and _decorator(d) in _AUTOTUNE), None)
    configs_node = next((k.value for k in autotune.keywords if k.arg == "configs"), None) if autotune else None
    if not isinstance(configs_node, ast.List) or not configs_node.elts:
        raise UserError(f"{path}: {kernel} has no @triton.autotune(configs=[triton.Config(...), ...]) with literal configs")
    configs = _configs(configs_node.elts, f"{path}: {kernel}'s configs")
    jitted = [n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name != "run"
              and any(_decorator(d) in _JIT for d in n.decorator_list)]
    imports = [n for n in tree.body if isinstance(n, (ast.Import, ast.ImportFrom))]
    parts = ["\n".join(ast.get_source_segment(text, n) or "" for n in imports)]
    for n in _closure(tree, [*jitted, defs["run"]]):
        if n is defs["run"]:
            continue
        if n in jitted:  # its decorators as written, but the autotune one (kernelforge searches the configs)
            kept = [d for d in n.decorator_list if d is not autotune]
            lines = text.splitlines()[n.lineno - 1:n.end_lineno]  # from the def line
            parts.append("\n".join(["@" + (ast.get_source_segment(text, d) or "") for d in kept] + lines))
        else:
            parts.append(ast.get_source_segment(text, n) or "")
    parts.append(_launch_at_config(defs["run"], kernel, configs))
    judged = _closure(tree, [n for n in tree.body if _defined(n) & set(JUDGE)])
    judge = hashlib.sha256("\n".join(ast.dump(n) for n in imports + judged).encode()).hexdigest()[:16]
    return TuneSource(path=path, kernel=kernel, configs=configs, body="\n\n\n".join(parts) + "\n", judge=judge)


class _PinLaunch(ast.NodeTransformer):
    """Adds the config's keywords, as Jinja placeholders, to every ``KERNEL[grid](...)`` call."""

    def __init__(self, kernel: str, keys: list[str]):
        self.kernel, self.keys = kernel, keys

    def visit_Call(self, node: ast.Call) -> ast.Call:
        self.generic_visit(node)
        if isinstance(node.func, ast.Subscript) and isinstance(node.func.value, ast.Name) \
                and node.func.value.id == self.kernel:
            node.keywords.extend(ast.keyword(arg=k, value=ast.Name(id=f"__KF_{k}__")) for k in self.keys)
        return node


def _launch_at_config(run: ast.FunctionDef, kernel: str, configs: tuple[dict[str, Any], ...]) -> str:
    """``run`` launching ``kernel`` at ``{{ KEY }}`` of every config key; a string value is rendered
    inside quotes (``'{{ ORDER }}'``), so it is the string the config gave."""
    code = ast.unparse(_PinLaunch(kernel, list(configs[0])).visit(run))
    if "__KF_" not in code:
        raise UserError(f"run never launches {kernel}[grid](...); kernelforge tune pins the config at that launch")
    for key in configs[0]:
        strings = [c[key] for c in configs if isinstance(c[key], str)]
        if any("'" in v or "\\" in v or "\n" in v for v in strings):
            raise UserError(f"{key}: a string config value with a quote, a backslash or a line break cannot be "
                            "pinned at the launch; use another spelling")
        code = code.replace(f"__KF_{key}__", ("'{{ " + key + " }}'") if strings else ("{{ " + key + " }}"))
    return code


def template_text(src: TuneSource) -> str:
    """The generated ``baseline.py.j2``: the configs' values as the space, the declared configs as
    its one constraint, the first config as the baseline."""
    keys = list(src.configs[0])
    # Each value once, by kind too (True and 1 are one in a set), in a stable order.
    values = {k: [v for _, v in sorted(dict.fromkeys((type(c[k]).__name__, c[k]) for c in src.configs))]
              for k in keys}
    declared = ", ".join("(" + ", ".join(repr(c[k]) for k in keys) + ",)" for c in src.configs)
    constraint = f"({', '.join(keys)},) in ({declared},)"
    description = f"{src.kernel} from {src.path.name} at one of its @triton.autotune configs"
    header = ["{#-", "[template]", 'role = "baseline"', 'origin = "human"', f"description = {json.dumps(description)}",
              f"constraints = [{json.dumps(constraint)}]", "", "[space]"]
    header += [f"{k} = [{', '.join(toml_value(v) for v in values[k])}]" for k in keys]
    header += ["", "[baseline]"] + [f"{k} = {toml_value(src.configs[0][k])}" for k in keys] + ["-#}"]
    return "\n".join(header) + "\n" + src.body


BLOCK_PY = '''"""Generated by `kernelforge tune` from {file}: the block of kernel {kernel} (inputs, output,
reference and shapes are the copy of that file beside this one, {user})."""

from kernelforge.tune import UserFileBlock


class Tuned(UserFileBlock):
    description = {description!r}
    origin_file = {file!r}
    judged_by = {judge!r}  # the hash of the judge's part of {user} (kernelforge.catalog.Catalog.judge reads it here)
'''


class UserFileBlock(Block):
    """A block whose data comes from the user's file copied beside its ``block.py`` (see the module
    docstring): every shape of ``SHAPES`` is in both the ``smoke`` and ``check`` sets."""

    family = "tune"
    dtypes = ("float32", "float16", "bfloat16")
    #: The user's file this block's copy came from (its name, for messages).
    origin_file = USER_FILE
    #: The hash of the judge's part of that file (:attr:`TuneSource.judge`), written into the
    #: generated ``block.py`` so that the block's judge changes with it and only with it.
    judged_by = ""

    @property
    def user(self) -> Any:
        module = getattr(self, "_user", None)
        if module is None:
            path = Path(inspect.getfile(type(self))).parent / USER_FILE
            spec = importlib.util.spec_from_file_location(f"kf_tune_{self.id.replace('/', '_')}", path)
            module = importlib.util.module_from_spec(spec)
            try:
                spec.loader.exec_module(module)  # type: ignore[union-attr]
            except Exception as exc:  # noqa: BLE001 - the user's module: whatever it raises is theirs to fix
                raise UserError(f"{self.origin_file} (copied to {path}): importing it raised "
                                f"{type(exc).__name__}: {exc}") from None
            self._user = module
        return module

    def shape_sets(self):
        shapes = self.user.SHAPES
        example = 'SHAPES = {"n4096": {"N": 4096}}'
        if not isinstance(shapes, dict) or not shapes:
            raise UserError(f"{self.origin_file}: SHAPES must map at least one shape's name to its dimensions, e.g. "
                            f"{example}")
        for name, dims in shapes.items():
            if not isinstance(name, str) or not isinstance(dims, dict) or not all(
                    isinstance(k, str) and isinstance(v, int) and not isinstance(v, bool) for k, v in dims.items()):
                raise UserError(f"{self.origin_file}: SHAPES[{name!r}] must map dimension names to integers, e.g. "
                                f"{example}")
        shapes = [Shape.of(name, **dims) for name, dims in shapes.items()]
        return {"smoke": shapes, "check": shapes}

    def make_inputs(self, shape, dtype, device, seed, distribution="normal"):
        return self.user.make_inputs(shape, dtype, device, seed, distribution)

    def make_output(self, shape, dtype, device):
        return self.user.make_output(shape, dtype, device)

    def reference(self, **inputs):
        return self.user.reference(**inputs)

    def counts(self, shape, dtype) -> Counts:
        counts = getattr(self.user, "counts", None)
        return counts(shape, dtype) if counts else Counts(flops=0.0, bytes=0.0)


JOB = '''# Generated by `kernelforge tune {target}`.
[job]
name = "{name}"
device = "{device}"
dtype = "{dtype}"
tune = "all-shapes"
storage = {storage}

[strategy]
name = "grid"
evaluations = {evaluations}

[[blocks]]
id = "tune/{kernel}"
shapes = "smoke"
'''


@dataclass(frozen=True)
class Prepared:
    """What :func:`prepare` wrote: the job file and the kernels folder; ``kept_apart``: where a
    database of results judged by another file went (None: none was)."""

    job: Path
    kernels: Path
    kept_apart: Path | None


#: The file beside the database naming the judge its results were judged by (:attr:`TuneSource.judge`).
JUDGE_FILE = "judge.txt"


def prepare(target: str, out: Path, device: str, dtype: str, evaluations: int | None = None) -> Prepared:
    """Write the kernels folder and the job of ``target`` (``FILE.py::KERNEL``) under ``out``.
    ``evaluations`` defaults to the number of configs (every declared config is measured: the
    grid strategy walks them). A database under ``out`` whose results were judged by another file
    (another reference, inputs, output or shapes, or by a file not recorded) is moved aside, never
    reused and never deleted: a stored verdict holds only for the judge that gave it."""
    path, kernel = split_target(target)
    src = parse(path, kernel)
    folder = out / "kernels" / "tune" / kernel
    folder.mkdir(parents=True, exist_ok=True)
    kept_apart = _keep_apart(out, src.judge)
    shutil.copyfile(path, folder / USER_FILE)
    (folder / "block.py").write_text(BLOCK_PY.format(file=path.name, kernel=kernel, user=USER_FILE, judge=src.judge,
                                                     description=f"{kernel} from {path.name}"), encoding="utf-8")
    (folder / "baseline.py.j2").write_text(template_text(src), encoding="utf-8")
    job = out / "tune.toml"
    storage = json.dumps(f"sqlite:///{(out / 'kernelforge.db').resolve()}")  # a TOML string, whatever the path
    job.write_text(JOB.format(target=target, name=f"tune-{kernel}", device=device, dtype=dtype, storage=storage,
                              evaluations=evaluations or len(src.configs), kernel=kernel), encoding="utf-8")
    return Prepared(job=job, kernels=out / "kernels", kept_apart=kept_apart)


def _keep_apart(out: Path, judge: str) -> Path | None:
    """Move ``out``'s database (with SQLite's side files) to a new name when its results were
    judged by another judge than ``judge``, or by one not recorded; record ``judge``."""
    marker, db = out / JUDGE_FILE, out / "kernelforge.db"
    before = marker.read_text(encoding="utf-8").strip() if marker.is_file() else None
    moved = None
    if db.exists() and before != judge:
        stamp = time.strftime("%Y%m%d-%H%M%S", time.gmtime())
        moved = out / f"kernelforge-judged-before-{stamp}.db"
        for n in itertools.count(1):
            if not moved.exists():
                break
            moved = out / f"kernelforge-judged-before-{stamp}-{n}.db"
        for suffix in ("", "-wal", "-shm", "-journal"):
            side = out / f"kernelforge.db{suffix}"
            if side.exists():
                os.replace(side, Path(f"{moved}{suffix}"))
    marker.write_text(judge + "\n", encoding="utf-8")
    return moved
